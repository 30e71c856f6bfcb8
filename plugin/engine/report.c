/*
 * report.c - what an engine tells about itself: stats (counters, control
 * round trips, the last handshake, queue sizes) and transports (each peer's
 * state and lanes), as JSON.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

static const char *const kvc_port_names[KVC_PORT_N] = {
    "handshake", "notify", "handshake_reply"};
static const char *const kvc_refusal_names[KVC_REFUSE_N] = {
    "untrusted_host", "bad_message", "not_accepted", "wrong_peer",
    "bad_metadata", "other_engine"};

void kvc_refused(struct kvx_engine *eng, kvc_port_t port, kvc_refusal_t why)
{
    eng->stats.refused[port][why]++;
}

/* kvc_report_refused: {"handshake": {"untrusted_host": n, ...}, ...}. */
static json_object *kvc_report_refused(const struct kvx_engine *eng)
{
    json_object *o = json_object_new_object();

    for (int p = 0; p < KVC_PORT_N; p++) {
        json_object *r = json_object_new_object();

        for (int w = 0; w < KVC_REFUSE_N; w++) {
            json_object_object_add(r, kvc_refusal_names[w],
                                   json_object_new_int64(
                                       (int64_t)eng->stats.refused[p][w]));
        }
        json_object_object_add(o, kvc_port_names[p], r);
    }
    return o;
}

kvx_status_t kvc_report_stats(struct kvx_engine *eng, char **json_p)
{
    json_object *o, *rx;

    if (eng == NULL || json_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "stats: NULL argument");
    }
    o  = json_object_new_object();
    rx = json_object_new_object();
    pthread_mutex_lock(&eng->lock);
    for (int t = 1; t <= KVC_MSG_NTYPES; t++) {
        json_object_object_add(rx, kvc_msg_desc((kvc_msg_type_t)t)->stats_name,
                               json_object_new_int64(
                                   (int64_t)eng->stats.rx_msgs[t]));
    }
    json_object_object_add(o, "rx", rx);
    json_object_object_add(o, "refused", kvc_report_refused(eng));
#define KVC_STAT(name) \
    json_object_object_add(o, #name, \
                           json_object_new_int64((int64_t)eng->stats.name))
    KVC_STAT(rx_bad);
    KVC_STAT(rx_refused);
    KVC_STAT(early_kept);
    KVC_STAT(early_dropped);
    KVC_STAT(tx_msgs);
    KVC_STAT(tx_fail);
    KVC_STAT(reg_sent);
    KVC_STAT(reg_failed);
    KVC_STAT(handshakes_ok);
    KVC_STAT(handshakes_failed);
    KVC_STAT(peers_collected);
    KVC_STAT(bytes_read);
    KVC_STAT(bytes_written);
    KVC_STAT(read_retries);
    KVC_STAT(notices_done);
    KVC_STAT(notices_refused);
    KVC_STAT(hold_asked);
    KVC_STAT(releases_on_dp);
    KVC_STAT(write_done_skipped);
    KVC_STAT(blocks_on_dp);
    KVC_STAT(dp_msgs_refused);
    KVC_STAT(dp_stale);
    KVC_STAT(notices_early);
    KVC_STAT(early_completed);
    KVC_STAT(fences_unconfirmed);
    KVC_STAT(fence_resends);
    KVC_STAT(given_up);
    KVC_STAT(notices_counted);
    KVC_STAT(notices_landing);
    KVC_STAT(counted_done);
#undef KVC_STAT
    pthread_mutex_lock(&eng->expo.lock);
    /* Peers' software gets/puts outside the blocks of live transfers. */
    json_object_object_add(o, "data_refused",
                           json_object_new_int64(
                               (int64_t)eng->expo.refused[0]));
    /* Early gets (READ before P's producer_request), retried by D. */
    json_object_object_add(o, "data_not_exposed",
                           json_object_new_int64(
                               (int64_t)eng->expo.refused[1]));
    /* Gets/puts of a transfer bound to another peer host's session. */
    json_object_object_add(o, "data_wrong_peer",
                           json_object_new_int64(
                               (int64_t)eng->expo.refused[2]));
    /* Transfers open to any session (a peer host named, not an IP). */
    json_object_object_add(o, "data_unbound",
                           json_object_new_int64(
                               (int64_t)eng->expo.unbound));
    pthread_mutex_unlock(&eng->expo.lock);
    {
        const kvc_lat_t *l = &eng->stats.ctl_rtt;
        json_object     *r = json_object_new_object();
        json_object     *h = json_object_new_object();
        const char *hk[4]  = {"metadata_us", "endpoint_us", "rkeys_us",
                              "total_us"};

        /* Round trip of the control messages this engine sent (queued ->
         * reply), over the last KVC_LAT_WINDOW replies. */
        json_object_object_add(r, "count", json_object_new_int64(
                                               (int64_t)l->count));
        json_object_object_add(r, "avg_us", json_object_new_double(
            l->count ? (double)l->sum_us / (double)l->count : 0.0));
        json_object_object_add(r, "p50_us", json_object_new_int64(
            (int64_t)kvc_lat_quantile(l, 0.5)));
        json_object_object_add(r, "p99_us", json_object_new_int64(
            (int64_t)kvc_lat_quantile(l, 0.99)));
        json_object_object_add(r, "max_us", json_object_new_int64(
                                                (int64_t)l->max_us));
        json_object_object_add(o, "ctl_rtt", r);
        for (int i = 0; i < 4; i++) {
            json_object_object_add(h, hk[i], json_object_new_int64(
                (int64_t)eng->stats.hs_last_us[i]));
        }
        json_object_object_add(o, "last_handshake", h);
    }
    json_object_object_add(o, "transfers",
                           json_object_new_int64((int64_t)eng->nxfers));
    json_object_object_add(o, "events",
                           json_object_new_int64((int64_t)eng->nevents));
    json_object_object_add(o, "timers", json_object_new_int64(
                               (int64_t)kvc_timerq_size(&eng->timers)));
    json_object_object_add(o, "early", json_object_new_int64(
                               (int64_t)eng->nearly));
    /* calls of the API in progress, this one included (threads in a wait
     * among them) */
    json_object_object_add(o, "api_calls", json_object_new_int64(
                               (int64_t)atomic_load(&eng->api_users)));
    /* Do waits drive the progress (progress_caller, "auto" resolved, on a
     * data plane that can be driven)? And the passes threads waiting in
     * the API ran. */
    json_object_object_add(o, "waits_drive", json_object_new_int64(
        eng->drive_waits && eng->ucx != NULL && KVD(eng)->drive != NULL));
    json_object_object_add(o, "driven_passes", json_object_new_int64(
        eng->ucx != NULL && KVD(eng)->driven != NULL
            ? (int64_t)KVD(eng)->driven(eng->ucx)
            : 0));
    pthread_mutex_unlock(&eng->lock);
    *json_p = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return *json_p ? KVX_OK : kvc_error(KVX_ERR_NO_MEMORY, "out of memory");
}

kvx_status_t kvc_report_transports(struct kvx_engine *eng, char **json_p)
{
    static const char *states[] = {"new", "handshaking", "ready", "failed"};
    json_object       *arr;

    if (eng == NULL || json_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "transports: NULL");
    }
    arr = json_object_new_array();
    pthread_mutex_lock(&eng->lock);
    for (kvc_peer_t *p = eng->peers; p != NULL; p = p->next) {
        json_object *o = json_object_new_object();

        json_object_object_add(o, "peer", json_object_new_string(p->name));
        json_object_object_add(o, "state",
                               json_object_new_string(states[p->state]));
        if (p->state == KVC_PEER_READY) {
            json_object_object_add(o, "transports", json_object_new_string(
                                       KVD(eng)->ep_transports(p->ep)));
            json_object_object_add(o, "rma", json_object_new_string(
                                       p->rma_mode));
            json_object_object_add(o, "rma_emulated", json_object_new_boolean(
                                       strcmp(p->rma_mode, "emulated") == 0));
            if (KVD(eng)->settings != NULL) {
                json_object_object_add(o, "settings", json_object_new_string(
                                           KVD(eng)->settings(eng->ucx)));
            }
        } else if (p->state == KVC_PEER_FAILED) {
            json_object_object_add(o, "error",
                                   json_object_new_string(p->fail_reason));
        }
        json_object_array_add(arr, o);
    }
    pthread_mutex_unlock(&eng->lock);
    *json_p = strdup(json_object_to_json_string_ext(arr,
                                                    JSON_C_TO_STRING_PLAIN));
    json_object_put(arr);
    return *json_p ? KVX_OK : kvc_error(KVX_ERR_NO_MEMORY, "out of memory");
}
