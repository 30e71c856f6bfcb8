/*
 * dispatch.c - inbound control messages (SPEC §9): decode, dispatch by
 * type to the engine's mode, reply.
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "siphash.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- listeners ---------------------------------------------------------- */

void kvc_msg_ignore(struct kvx_engine *eng, kvc_msg_t *m, char *reason,
                    size_t reason_len, int *ok_p)
{
    (void)eng;
    (void)m;
    (void)reason;
    (void)reason_len;
    *ok_p = 1;
}

void kvc_reply(int ok, const char *reason, char **reply_p, size_t *len_p)
{
    *reply_p = kvc_reply_encode(ok, reason, len_p);
    if (*reply_p == NULL) {
        *len_p = 0;
    }
}

void kvc_notify_handler(void *arg, const char *from, const char *msg,
                        size_t len, char **reply_p, size_t *len_p)
{
    struct kvx_engine *eng = arg;
    char               reason[KVX_REASON_MAX] = "";
    kvc_reply_info_t   info = {.ok = 1};
    kvc_msg_t          m;
    char               host[KVC_HOST_MAX];

    kvc_from_host(from, host, sizeof(host));
    if (kvc_trust_check(&eng->trust, host, "the message sender") != KVX_OK) {
        kvc_log_warn("KVX-CTL-UNTRUSTED", "%s notify listener: %s",
                     eng->engine_id, kvc_last_error());
        pthread_mutex_lock(&eng->lock);
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_UNTRUSTED_HOST);
        pthread_mutex_unlock(&eng->lock);
        kvc_reply(0, "refused", reply_p, len_p);
        return;
    }
    if (kvc_msg_decode(msg, len, eng->cfg.is_producer, &m) != KVX_OK) {
        kvc_log_warn("KVX-BAD-MESSAGE", "%s notify listener: from %s: %s",
                     eng->engine_id, from, kvc_last_error());
        pthread_mutex_lock(&eng->lock);
        eng->stats.rx_bad++;
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_BAD_MESSAGE);
        pthread_mutex_unlock(&eng->lock);
        kvc_reply(0, kvc_last_error(), reply_p, len_p);
        return;
    }
    m.from = from != NULL ? from : "";
    pthread_mutex_lock(&eng->lock);
    kvc_dispatch(eng, &m, reason, sizeof(reason), &info.ok);
    pthread_mutex_unlock(&eng->lock);
    if (!info.ok) {
        kvc_log_warn("KVX-CTL-REJECT", "%s: from %s: %s", eng->engine_id,
                     m.from, reason);
    }
    info.instance = eng->epoch;
    info.fenced   = info.ok && m.reply_fenced;
    info.has_hold = info.ok && m.reply_has_hold;
    info.hold_ms  = m.reply_hold_ms;
    kvc_msg_fini(&m);
    *reply_p = kvc_reply_encode_info(&info, reason, len_p);
    if (*reply_p == NULL) {
        *len_p = 0;
    }
}

void kvc_dispatch(struct kvx_engine *eng, kvc_msg_t *m, char *reason,
                  size_t reason_len, int *ok_p)
{
    eng->stats.rx_msgs[m->type]++;
    if (m->to_instance != 0 && m->to_instance != eng->epoch) {
        /* Meant for an earlier instance of this engine (it restarted):
         * nothing here is bound to it. */
        *ok_p = 0;
        eng->stats.rx_refused++;
        snprintf(reason, reason_len, "%s for '%s': addressed to instance "
                 "%llu, this engine is instance %llu (restarted)",
                 kvc_msg_desc(m->type)->name, m->transfer_id,
                 (unsigned long long)m->to_instance,
                 (unsigned long long)eng->epoch);
    } else if (eng->mode->on_msg[m->type] != NULL) {
        eng->mode->on_msg[m->type](eng, m, reason, reason_len, ok_p);
        eng->stats.rx_refused += !*ok_p;
    } else {
        *ok_p = 0;
        eng->stats.rx_refused++;
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_NOT_ACCEPTED);
        snprintf(reason, reason_len, "%s for '%s': not accepted by a %s "
                 "in %s mode", kvc_msg_desc(m->type)->name, m->transfer_id,
                 eng->cfg.is_producer ? "kv_producer" : "kv_consumer",
                 eng->mode->name);
    }
}

uint64_t kvc_dp_next_nonce(struct kvx_engine *eng)
{
    uint64_t stamp = eng->env.clock.stamp(eng->env.clock.arg);

    eng->dp_nonce = stamp > eng->dp_nonce ? stamp : eng->dp_nonce + 1;
    return eng->dp_nonce;
}

const char *kvc_dp_fresh(struct kvx_engine *eng, uint64_t session,
                         uint64_t inst, uint64_t nonce, const char *what,
                         const char *from)
{
    const kvt_clock_t *c = &eng->env.clock;
    const char        *why;
    uint64_t           n;

    if (eng->dp_replay == NULL &&
        (eng->dp_replay = calloc(1, sizeof(*eng->dp_replay))) == NULL) {
        return "out of memory";
    }
    /* A sender is an engine instance of a host (its session): its stamps
     * increase, and one taken before is a replay. */
    why = kvc_replay_check(eng->dp_replay, session, inst, nonce,
                           c->stamp(c->arg), c->stamp_shift,
                           (uint64_t)(eng->cfg.clock_skew * 1e6) +
                               KVC_DP_FRESH_US);
    if (why == NULL) {
        return NULL;
    }
    /* Authentic but refused: a replay, or the hosts' clocks further apart
     * than the window. Worth a warning (rate limited: powers of two), since
     * the transfer it serves then waits for its deadline. */
    n = ++eng->stats.dp_stale;
    if ((n & (n - 1)) == 0) {
        kvc_log_warn("KVX-DP-CTL", "%s: %s from %s on the data plane "
                     "refused: %s (%llu so far; clocks must agree within "
                     "%.1f s)", eng->engine_id, what, from, why,
                     (unsigned long long)n,
                     eng->cfg.clock_skew + KVC_DP_FRESH_US / 1e6);
    }
    return why;
}

void kvc_dp_ctl_handler(void *arg, const char *msg, size_t len,
                        uint64_t nonce, uint64_t mac, const char *from)
{
    struct kvx_engine *eng = arg;
    char               reason[KVX_REASON_MAX] = "";
    char               host[KVC_HOST_MAX];
    const char        *why = NULL;
    kvc_msg_t          m;
    int                ok = 1, decoded = 0;
    uint64_t           s  = kvc_host_session(eng->expo.key, from, 1);

    if (s == 0 || kvc_msg_mac(s, nonce, msg, len) != mac) {
        why = "not authenticated by the session of the address it claims";
    } else {
        kvc_from_host(from, host, sizeof(host));
        if (kvc_trust_check(&eng->trust, host, "the message sender") !=
            KVX_OK) {
            why = kvc_last_error();
        } else if (kvc_msg_decode(msg, len, eng->cfg.is_producer, &m) !=
                   KVX_OK) {
            why = kvc_last_error();
        } else if ((decoded = 1, m.type != KVC_MSG_REMOTE_BLOCKS)) {
            why = "only remote_blocks travels on the data plane";
        }
    }
    pthread_mutex_lock(&eng->lock);
    if (why == NULL) {
        why = kvc_dp_fresh(eng, s, m.instance, nonce, "remote_blocks", from);
    }
    if (why != NULL) {
        eng->stats.dp_msgs_refused++;
    } else if (!eng->stopping) {
        /* (not once destroy freed the peers: the progress thread still
         * delivers until the transport is destroyed) */
        m.from = from;
        kvc_dispatch(eng, &m, reason, sizeof(reason), &ok);
    }
    pthread_mutex_unlock(&eng->lock);
    if (why != NULL) {
        /* Debug only: whoever reaches the worker could flood the log. */
        kvc_log_debug("KVX-DP-CTL", "%s: data-plane control message (%zu "
                      "bytes) claiming %s refused: %s", eng->engine_id, len,
                      from, why);
    } else if (!ok) {
        kvc_log_warn("KVX-CTL-REJECT", "%s: from %s (data plane): %s",
                     eng->engine_id, from, reason);
    }
    if (decoded) {
        kvc_msg_fini(&m);
    }
}
