/*
 * peer.c - a peer rank: its control channel (queue of control messages,
 * up to KVC_CTL_INFLIGHT in flight), its data-plane connection (endpoint,
 * rkeys), and its service job on the progress owner.
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- peers -------------------------------------------------------------- */

/* kvc_peer_conn_t: what a READY peer holds in UCX, detached from the peer
 * under the engine lock so that exactly one thread releases it. */
static void kvc_peer_detach(kvc_peer_t *peer, kvc_peer_conn_t *c)
{
    c->meta         = peer->meta;
    c->ep           = peer->ep;
    c->rkeys        = peer->rkeys;
    c->layer_map    = peer->layer_map;
    memset(&peer->meta, 0, sizeof(peer->meta));
    peer->ep        = NULL;
    peer->rkeys     = NULL;
    peer->layer_map = NULL;
}

/* kvc_peer_conn_free: rkeys first, then the endpoint (ucp.h: an rkey is
 * destroyed before the endpoint it was unpacked on; the transport holds one
 * that UCX requests still in flight may read until they completed:
 * kvu_rkey_destroy). */
/* kvc_rkeys_destroy: layers of one region share one unpacked rkey
 * (kvc_peer_connect); each handle is destroyed once. */
void kvc_rkeys_destroy(struct kvx_engine *eng, kvt_rkey_t **rkeys,
                              size_t n)
{
    for (size_t i = 0; rkeys != NULL && i < n; i++) {
        size_t k = 0;

        while (k < i && rkeys[k] != rkeys[i]) {
            k++;
        }
        if (k == i && rkeys[i] != NULL) {
            KVD(eng)->rkey_destroy(rkeys[i]);
        }
    }
}

void kvc_peer_conn_free(struct kvx_engine *eng, kvc_peer_conn_t *c)
{
    kvc_rkeys_destroy(eng, c->rkeys, c->meta.num_layers);
    free(c->rkeys);
    free(c->layer_map);
    KVD(eng)->ep_close(c->ep);
    kvc_hs_fini(&c->meta);
}

int kvc_peer_lost(kvc_peer_t *peer, kvx_status_t status, const char *reason,
                  kvc_peer_conn_t *c)
{
    struct kvx_engine *eng  = peer->eng;
    int                have = 0;

    if (eng->stopping) {
        peer->lost_inst = 0;
        return 0;
    }
    kvc_log_warn("KVX-PEER-FAILED", "peer %s: %s", peer->name, reason);
    if (peer->lost_inst == 0) {
        peer->lost_inst = peer->inst;
    }
    peer->fail_status = status;
    snprintf(peer->fail_reason, sizeof(peer->fail_reason), "%s", reason);
    if (peer->state == KVC_PEER_READY) {
        /* In-flight ops complete with errors once the endpoint is closed;
         * a later transfer handshakes afresh (new instance, new rkeys). */
        peer->state = KVC_PEER_FAILED;
        kvc_peer_detach(peer, c);
        have = 1;
    }
    eng->mode->peer_failed(eng, peer);
    peer->lost_inst = 0;
    return have;
}

/* kvc_peer_add_dead: inst is gone (kvc_peer_inst_dead); the oldest of the
 * list makes room (older ones are dead by their order anyway). */
static void kvc_peer_add_dead(kvc_peer_t *peer, uint64_t inst)
{
    const uint32_t n = sizeof(peer->dead_inst) / sizeof(peer->dead_inst[0]);

    if (peer->ndead == n) {
        memmove(peer->dead_inst, peer->dead_inst + 1,
                (n - 1) * sizeof(peer->dead_inst[0]));
        peer->ndead--;
    }
    peer->dead_inst[peer->ndead++] = inst;
}

void kvc_peer_set_inst(kvc_peer_t *peer, uint64_t inst)
{
    if (peer->inst != 0 && inst != peer->inst) {
        kvc_peer_add_dead(peer, peer->inst);
    }
    peer->inst             = inst;
    peer->inst_unconfirmed = 0; /* an instance answered: it is the live one */
}

int kvc_peer_inst_dead(const kvc_peer_t *peer, uint64_t inst)
{
    if (inst != 0 && peer->inst != 0 && inst < peer->inst) {
        return 1; /* started before the live one (kvt_clock_t.random64) */
    }
    for (uint32_t i = 0; i < peer->ndead; i++) {
        if (peer->dead_inst[i] == inst) {
            return 1;
        }
    }
    return 0;
}

int kvc_peer_note_instance(kvc_peer_t *peer, uint64_t inst)
{
    if (inst == 0 || peer->inst == 0 || inst == peer->inst) {
        return 0;
    }
    if (kvc_peer_inst_dead(peer, inst)) {
        return 2;
    }
    peer->new_inst = inst;
    return 1;
}

int kvc_peer_saw_instance(kvc_peer_t *peer, uint64_t inst, kvc_peer_conn_t *c)
{
    char why[KVX_REASON_MAX];

    if (inst == 0 || inst == peer->inst || kvc_peer_inst_dead(peer, inst)) {
        /* The same one, or a late reply of one already replaced: not a
         * restart of the live one. */
        if (inst != 0 && inst == peer->inst) {
            peer->inst_unconfirmed = 0;
        }
        return 0;
    }
    if (peer->inst == 0 || peer->inst_unconfirmed) {
        /* First answer, or the first since the peer was declared gone
         * (its transfers already failed then): adopt it; the one before
         * is dead from now on (kvc_peer_set_inst). */
        kvc_peer_set_inst(peer, inst);
        peer->inst_unconfirmed = 0;
        return 0;
    }
    snprintf(why, sizeof(why), "restarted: instance %llu answered where "
             "instance %llu was bound", (unsigned long long)inst,
             (unsigned long long)peer->inst);
    peer->lost_inst = peer->inst;
    kvc_peer_set_inst(peer, inst);
    return kvc_peer_lost(peer, KVX_ERR_ENDPOINT, why, c);
}

void kvc_peer_claim_settle(kvc_peer_t *peer)
{
    uint64_t claim = peer->claimed_inst;

    if (claim == 0) {
        return;
    }
    peer->claimed_inst  = 0;
    peer->claim_settled = 1; /* the tick pumps the peer's transfers */
    if (claim == peer->inst || peer->inst == 0 ||
        kvc_peer_inst_dead(peer, claim)) {
        return; /* confirmed (a restart, handled), unknown, or gone */
    }
    kvc_log_warn("KVX-PEER-CLAIM", "peer %s answered as instance %llu, not "
                 "as instance %llu that a request or message claimed: "
                 "transfers bound to that one fail", peer->name,
                 (unsigned long long)peer->inst, (unsigned long long)claim);
    kvc_peer_add_dead(peer, claim);
}

void kvc_peer_ctl_lost(kvc_peer_t *peer, kvx_status_t status,
                       const char *reason)
{
    struct kvx_engine *eng = peer->eng;
    kvc_peer_conn_t    c;

    /* Only the data-plane path of remote_blocks is lost. */
    kvc_log_warn("KVX-PEER-EP", "peer %s: control endpoint given up (%s): "
                 "remote_blocks go over the control plane", peer->name,
                 reason);
    peer->state          = KVC_PEER_FAILED;
    peer->fail_status    = status;
    peer->dp_dead        = 1;
    peer->dp_dead_inst   = peer->meta.epoch; /* (the failed endpoint's) */
    peer->ctl_retry_us   = kvc_now_us(eng) + KVC_CTL_RETRY_US;
    peer->dp_unconfirmed = 0; /* (their transfers settle against a new
                                 endpoint's count: at worst it lets that
                                 many more through) */
    snprintf(peer->fail_reason, sizeof(peer->fail_reason), "%s", reason);
    kvc_peer_detach(peer, &c);
    kvc_peer_conn_free(eng, &c);
}

void kvc_peer_ep_error(void *arg, kvt_ep_t *ep, kvx_status_t status,
                       const char *reason)
{
    kvc_peer_t        *peer = arg;
    struct kvx_engine *eng  = peer->eng;
    kvc_peer_conn_t    c;

    pthread_mutex_lock(&eng->lock);
    /* This runs on the progress owner, where ep_close never waits. */
    if (peer->ep == ep && peer->state == KVC_PEER_READY &&
        kvc_peer_ctl_only(eng) && !eng->stopping) {
        kvc_peer_ctl_lost(peer, status, reason);
    } else if (peer->ep == ep && peer->state == KVC_PEER_READY &&
               kvc_peer_lost(peer, status, reason, &c)) {
        kvc_peer_conn_free(eng, &c);
    } else if (ep == peer->watch_ep && !eng->stopping) {
        /* The endpoint kept for a peer lost on the control plane alone
         * failed too: the instance it reached is gone (or every path to
         * it is), so none of its puts can land any more; the WRITE
         * transfers bound to it that wait for its confirmation count it
         * fenced. (Another instance answering meanwhile is a restart,
         * handled as one.) */
        peer->watch_ep = NULL;
        if (peer->watch_inst != 0 && peer->watch_inst == peer->inst) {
            kvc_log_warn("KVX-PEER-FAILED", "peer %s: its data-plane "
                         "endpoint failed too (%s): its process is taken "
                         "as gone", peer->name,
                         reason != NULL ? reason : "");
            peer->lost_inst = peer->watch_inst;
            eng->mode->peer_failed(eng, peer);
            peer->lost_inst = 0;
        }
        KVD(eng)->ep_close(ep);
    }
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_peer_conn_event (control-plane thread, no engine lock): the notify
 * connection came up or was lost; the tick acts on it. */
static void kvc_peer_conn_event(void *arg, int up)
{
    kvc_peer_t *peer = arg;

    if (up) {
        atomic_store(&peer->conn_down_us, 0);
        if (atomic_fetch_add(&peer->conn_ups, 1) > 0) {
            atomic_store(&peer->conn_up_evt, 1); /* a reconnect */
        }
    } else {
        uint64_t zero = 0;

        atomic_compare_exchange_strong(&peer->conn_down_us, &zero,
                                       kvc_now_us(peer->eng) | 1u);
    }
}

/* kvc_peer_schedule hands the peer's service job to the progress owner
 * unless it is already queued; lock held. */
static void kvc_peer_schedule(kvc_peer_t *peer)
{
    struct kvx_engine *eng = peer->eng;

    if (peer->job_queued || eng->stopping) {
        return;
    }
    peer->job_queued = 1;
    eng->jobs_queued++;
    KVD(eng)->defer(eng->ucx, &peer->job);
}

/* Control messages to one peer: up to KVC_CTL_INFLIGHT requests are in
 * flight at once (one context each), so a release never waits behind
 * another message's round trip. Messages are independent (each names its
 * transfer; the receiver remembers ones that overtake its own
 * bookkeeping), so their order across contexts does not matter. */
#define KVC_CTL_INFLIGHT 8

static void kvc_ctlout_free(kvc_ctlout_t *out)
{
    free(out->buf);
    free(out);
}

static void kvc_peer_drain(kvc_peer_t *peer);

/* kvc_ctl_done: the reply (or failure) of one control message, on a
 * control-plane thread. */
static void kvc_ctl_done(void *arg, kvx_status_t st, const char *reply,
                         size_t rlen, const char *err)
{
    kvc_ctlout_t      *out  = arg;
    kvc_peer_t        *peer = out->peer;
    struct kvx_engine *eng  = peer->eng;
    char               reason[KVX_REASON_MAX] = "";
    kvc_reply_info_t   info = {0};
    kvc_peer_conn_t    c;
    int                lost = 0;

    if (st == KVX_OK) {
        st = kvc_reply_decode_info(reply, rlen, &info, reason, sizeof(reason));
        if (st != KVX_OK) {
            err = kvc_last_error();
        } else if (!info.ok) {
            kvc_log_warn("KVX-CTL-REFUSED", "%s to %s: refused: %s",
                         out->what, peer->name, reason);
        }
    }
    if (st != KVX_OK) {
        kvc_log_warn("KVX-CTL-SEND", "%s to %s failed: %s", out->what,
                     peer->name, err != NULL ? err : kvc_status_name(st));
    }
    pthread_mutex_lock(&eng->lock);
    eng->stats.tx_msgs++;
    eng->stats.tx_fail += st != KVX_OK || !info.ok;
    if (st == KVX_OK) {
        kvc_lat_add(&eng->stats.ctl_rtt, kvc_now_us(eng) - out->t_queued);
        lost = kvc_peer_saw_instance(peer, info.instance, &c);
        if (info.instance != 0 && out->t_queued >= peer->claim_us) {
            /* (a refusal's reply names no instance; a reply to a message
             * sent before the claim may come from the instance before a
             * real restart) */
            kvc_peer_claim_settle(peer);
        }
    }
    if (eng->mode->on_reply != NULL && out->type != 0 && !eng->stopping) {
        if (st != KVX_OK) {
            memset(&info, 0, sizeof(info));
            snprintf(reason, sizeof(reason), "%s",
                     err != NULL ? err : kvc_status_name(st));
        }
        info.delivered   = st == KVX_OK;
        info.sent_xnonce = out->xnonce;
        info.sent_us     = out->t_queued;
        info.reason      = reason;
        eng->mode->on_reply(eng, peer, out->type, out->tid, &info);
    }
    peer->ctl_inflight--;
    if (st != KVX_OK && eng->stopping_sends) {
        peer->drop_out = 1;
    }
    if (st != KVX_ERR_CANCELED) {
        kvc_peer_drain(peer);
    }
    pthread_cond_broadcast(&eng->cond);
    pthread_mutex_unlock(&eng->lock);
    if (lost) {
        kvc_peer_conn_free(eng, &c); /* outside the lock: may wait */
    }
    kvc_ctlout_free(out);
}

/* kvc_ctl_unsent: out was never sent (lock held); the mode hears of it as
 * of a reply that did not come, then out is freed. */
static void kvc_ctl_unsent(kvc_peer_t *peer, kvc_ctlout_t *out,
                           const char *why)
{
    struct kvx_engine *eng = peer->eng;
    char               reason[KVX_REASON_MAX];

    snprintf(reason, sizeof(reason), "not sent: %s", why);
    kvc_log_warn("KVX-CTL-SEND", "%s to %s failed: %s", out->what,
                 peer->name, why);
    eng->stats.tx_msgs++;
    eng->stats.tx_fail++;
    if (eng->mode->on_reply != NULL && out->type != 0 && !eng->stopping) {
        kvc_reply_info_t info = {0};

        info.sent_xnonce = out->xnonce;
        info.sent_us     = out->t_queued;
        info.reason      = reason;
        eng->mode->on_reply(eng, peer, out->type, out->tid, &info);
    }
    kvc_ctlout_free(out);
}

/* kvc_peer_post sends out on a free context; engine lock held (the
 * transport never calls kvc_ctl_done inside client_post). */
static void kvc_peer_post(kvc_peer_t *peer, kvc_ctlout_t *out)
{
    struct kvx_engine *eng = peer->eng;
    int timeout_ms = (int)(eng->cfg.handshake_timeout * 1000.0);

    out->peer = peer;
    peer->ctl_inflight++;
    if (KVN(eng)->client_post(peer->notify_cli, out->buf, out->len,
                              timeout_ms, kvc_ctl_done, out) != KVX_OK) {
        char why[KVX_REASON_MAX];

        peer->ctl_inflight--;
        snprintf(why, sizeof(why), "%s", kvc_last_error());
        kvc_ctl_unsent(peer, out, why);
    }
}

static int kvc_peer_can_post(const kvc_peer_t *peer)
{
    return peer->notify_cli != NULL && peer->ctl_inflight < KVC_CTL_INFLIGHT;
}

/* kvc_peer_drop_queue fails what is queued (lock held). */
static void kvc_peer_drop_queue(kvc_peer_t *peer, const char *why)
{
    kvc_ctlout_t *out = peer->out_head;

    /* (detached first: what the mode queues meanwhile stays queued) */
    peer->out_head = NULL;
    peer->out_tail = NULL;
    while (out != NULL) {
        kvc_ctlout_t *next = out->next;

        kvc_ctl_unsent(peer, out, why);
        out = next;
    }
}

/* kvc_peer_drain posts queued messages while contexts are free (lock
 * held). */
static void kvc_peer_drain(kvc_peer_t *peer)
{
    if (peer->drop_out) {
        kvc_peer_drop_queue(peer, "peer unreachable while stopping");
        return;
    }
    while (peer->out_head != NULL && kvc_peer_can_post(peer)) {
        kvc_ctlout_t *out = peer->out_head;

        peer->out_head = out->next;
        if (peer->out_head == NULL) {
            peer->out_tail = NULL;
        }
        kvc_peer_post(peer, out);
    }
}

/* kvc_peer_service (job, progress owner): dial the control channel (a
 * non-blocking dial: it is up before the first release), start a wanted
 * handshake, post what is queued. */
static void kvc_peer_service(kvt_job_t *job)
{
    kvc_peer_t        *peer = job->arg;
    struct kvx_engine *eng  = peer->eng;

    pthread_mutex_lock(&eng->lock);
    peer->job_queued = 0;
    eng->jobs_queued--;
    if (peer->notify_cli == NULL && !peer->notify_failed && !eng->closing) {
        if (KVN(eng)->client_open(peer->host, peer->notify_port,
                                  KVC_CTL_INFLIGHT,
                                  kvc_config_ctl_sec(&eng->cfg),
                                  &peer->notify_cli) !=
            KVX_OK) {
            peer->notify_failed = 1;
            peer->notify_cli    = NULL;
        } else if (KVN(eng)->client_watch != NULL) {
            KVN(eng)->client_watch(peer->notify_cli, kvc_peer_conn_event,
                                   peer);
        }
    }
    if (peer->notify_cli == NULL) {
        kvc_peer_drop_queue(peer, peer->notify_failed
                                      ? "cannot open the control channel"
                                      : "engine destroyed");
        peer->notify_failed = 0; /* the next message dials again */
    }
    if (!eng->closing && peer->want_handshake &&
        peer->state != KVC_PEER_READY && peer->state != KVC_PEER_HANDSHAKING) {
        kvc_peer_hs_start(peer);
    }
    kvc_peer_drain(peer);
    pthread_cond_broadcast(&eng->cond);
    pthread_mutex_unlock(&eng->lock);
}

kvc_peer_t *kvc_peer_get(struct kvx_engine *eng, const char *host,
                         const kvc_peer_addr_t *base, uint32_t dp_rank,
                         uint32_t tp_rank, uint32_t dp_size, uint32_t tp_size)
{
    uint32_t    off = dp_rank * tp_size + tp_rank;
    kvc_peer_t *p;

    for (p = eng->peers; p != NULL; p = p->next) {
        if (strcmp(p->host, host) == 0 &&
            p->hs_port == base->handshake_port + off &&
            p->notify_port == base->notify_port + off &&
            p->tp_size == tp_size && p->dp_size == dp_size &&
            p->tp_rank == tp_rank && p->dp_rank == dp_rank) {
            return p;
        }
    }
    if (eng->closing) {
        kvc_error(KVX_ERR_BAD_STATE, "peer %s: engine destroyed", host);
        return NULL;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        kvc_error(KVX_ERR_NO_MEMORY, "peer: out of memory");
        return NULL;
    }
    p->eng         = eng;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->hs_port     = base->handshake_port + off;
    p->notify_port = base->notify_port + off;
    p->dp_rank     = dp_rank;
    p->tp_rank     = tp_rank;
    p->dp_size     = dp_size;
    p->tp_size     = tp_size;
    snprintf(p->name, sizeof(p->name), "%s:%u(dp%u,tp%u)", host, p->hs_port,
             dp_rank, tp_rank);
    p->job.fn      = kvc_peer_service;
    p->job.arg     = p;
    p->hs_job.fn   = kvc_peer_hs_finish;
    p->hs_job.arg  = p;
    p->next        = eng->peers;
    eng->peers     = p;
    kvc_peer_schedule(p); /* dial the control channel now */
    return p;
}

/* kvc_peer_queue queues buf (owned) to peer; type and tid name the
 * message for mode->on_reply (0 / NULL: nobody wants the reply). */
static void kvc_peer_queue(kvc_peer_t *peer, char *buf, size_t len,
                           const char *what, kvc_msg_type_t type,
                           const char *tid, uint64_t xnonce)
{
    struct kvx_engine *eng = peer->eng;
    kvc_ctlout_t      *out = calloc(1, sizeof(*out));

    if (out == NULL) {
        free(buf);
        kvc_log_error("KVX-CTL-SEND", "%s to %s: out of memory", what,
                      peer->name);
        return;
    }
    out->buf      = buf;
    out->len      = len;
    out->t_queued = kvc_now_us(eng);
    out->type     = type;
    out->xnonce   = xnonce;
    snprintf(out->tid, sizeof(out->tid), "%s", tid != NULL ? tid : "");
    snprintf(out->what, sizeof(out->what), "%s", what);
    if (peer->out_tail != NULL) {
        peer->out_tail->next = out;
    } else {
        peer->out_head = out;
    }
    peer->out_tail = out;
    /* From a pass (a transfer just completed: release, write_done) straight
     * out: no hop on the completion path. That pass may run on a framework
     * thread waiting in the API (caller-driven progress), which then sends
     * it; other API calls only queue. */
    if (KVD(eng)->in_progress_thread(eng->ucx)) {
        kvc_peer_drain(peer);
        if (peer->out_head == NULL) {
            return;
        }
    }
    kvc_peer_schedule(peer);
}

void kvc_peer_send(kvc_peer_t *peer, char *buf, size_t len, const char *what)
{
    kvc_peer_queue(peer, buf, len, what, 0, NULL, 0);
}

void kvc_peer_want_handshake(kvc_peer_t *peer)
{
    if (peer->state == KVC_PEER_READY || peer->state == KVC_PEER_HANDSHAKING) {
        return;
    }
    peer->want_handshake = 1;
    kvc_peer_schedule(peer);
}

/* kvc_peers_disconnect closes every peer's endpoint (ep_close: queued
 * runs canceled, in-flight ones flushed for a bounded time, then the
 * endpoint closed): in-flight ops complete while transfers and peers still
 * exist. Each connection is detached under the lock (an endpoint error
 * delivered concurrently then finds nothing to release) and freed outside
 * it (ep_close may wait for that delivery). */
void kvc_peers_disconnect(struct kvx_engine *eng)
{
    for (kvc_peer_t *p = eng->peers; p != NULL; p = p->next) {
        kvc_peer_conn_t c;
        kvt_ep_t       *watch;

        pthread_mutex_lock(&eng->lock);
        p->state = KVC_PEER_FAILED;
        snprintf(p->fail_reason, sizeof(p->fail_reason), "engine destroyed");
        p->fail_status = KVX_ERR_CANCELED;
        kvc_peer_detach(p, &c);
        watch       = p->watch_ep;
        p->watch_ep = NULL;
        pthread_mutex_unlock(&eng->lock);
        kvc_peer_conn_free(eng, &c);
        if (watch != NULL) {
            KVD(eng)->ep_close(watch);
        }
    }
}

void kvc_peers_collect(struct kvx_engine *eng)
{
    for (;;) {
        kvt_client_t *hs = NULL, *cli = NULL;
        kvc_peer_t   *p;

        pthread_mutex_lock(&eng->lock);
        for (p = eng->peers; p != NULL && !p->gc; p = p->next) {
        }
        if (p != NULL && !eng->closing) {
            p->gc         = 0;
            hs            = p->hs_cli;
            cli           = p->notify_cli;
            p->hs_cli     = NULL;
            p->notify_cli = NULL;
            /* Closed, not lost: the next client's first connection then
             * counts as a reconnect (the heartbeat checks the instance). */
            atomic_store(&p->conn_down_us, 0);
            eng->stats.peers_collected++;
            kvc_log_info("KVX-PEER-IDLE", "peer %s: gone for %.0f s with "
                         "nothing to send: its control clients are closed "
                         "until something is sent to it", p->name,
                         KVC_PEER_IDLE_S);
        }
        pthread_mutex_unlock(&eng->lock);
        if (p == NULL || (hs == NULL && cli == NULL)) {
            return;
        }
        if (hs != NULL) {
            KVN(eng)->client_close(hs);
        }
        if (cli != NULL) {
            KVN(eng)->client_close(cli);
        }
    }
}

/* kvc_peers_flush: destroy delivers what is queued to each peer (a release
 * just queued by a finished transfer), each message within its deadline;
 * after the first failure to a peer the rest to it is dropped. */
void kvc_peers_flush(struct kvx_engine *eng)
{
    uint64_t deadline = kvc_deadline_us(eng, eng->cfg.handshake_timeout + 1.0);

    pthread_mutex_lock(&eng->lock);
    eng->stopping_sends = 1;
    for (;;) {
        int busy = eng->jobs_queued > 0;

        for (kvc_peer_t *p = eng->peers; p != NULL && !busy; p = p->next) {
            /* A peer gone past the grace gets nothing in time. */
            busy = !p->drop_out && !p->conn_gone &&
                   (p->out_head != NULL || p->ctl_inflight > 0);
        }
        if (!busy || kvc_now_us(eng) >= deadline) {
            break;
        }
        kvc_wait_until(eng, deadline);
    }
    eng->closing = 1;
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_peers_free closes the control clients (pending requests complete as
 * canceled), waits for the jobs they queued, and closes the peers'
 * endpoints; kvc_peers_release frees them later. */
void kvc_peers_free(struct kvx_engine *eng)
{
    kvc_peer_t *p;
    uint64_t    deadline;

    for (p = eng->peers; p != NULL; p = p->next) {
        kvt_client_t *hs, *cli;

        pthread_mutex_lock(&eng->lock);
        hs            = p->hs_cli;
        cli           = p->notify_cli;
        p->hs_cli     = NULL;
        p->notify_cli = NULL;
        pthread_mutex_unlock(&eng->lock);
        if (hs != NULL) {
            KVN(eng)->client_close(hs);
        }
        if (cli != NULL) {
            KVN(eng)->client_close(cli);
        }
    }
    deadline = kvc_deadline_us(eng, 5.0);
    pthread_mutex_lock(&eng->lock);
    while (eng->jobs_queued > 0 && kvc_now_us(eng) < deadline) {
        KVD(eng)->kick(eng->ucx);
        kvc_wait_until(eng, kvc_now_us(eng) + 10000u);
    }
    if (eng->jobs_queued > 0) {
        /* A job still queued would run on a freed peer: keep the peers
         * (a bounded leak at shutdown) rather than risk it. */
        kvc_log_error("KVX-DESTROY", "engine %s: %u peer jobs still queued "
                      "after 5 s; peers not freed", eng->engine_id,
                      eng->jobs_queued);
        pthread_mutex_unlock(&eng->lock);
        kvc_peers_disconnect(eng);
        eng->peers = NULL;
        return;
    }
    pthread_mutex_unlock(&eng->lock);
    kvc_peers_disconnect(eng); /* none can connect any more */
}

/* kvc_peers_release frees the peers (destroy, after the data plane's
 * context: an operation UCX completes late, e.g. a put it still sent with
 * error mode none, reaches its transfer's peer). */
void kvc_peers_release(struct kvx_engine *eng)
{
    kvc_peer_t *p;

    while ((p = eng->peers) != NULL) {
        eng->peers = p->next;
        kvc_peer_drop_queue(p, "engine destroyed");
        free(p->hs_reply);
        free(p);
    }
}

void kvc_release_msg(const struct kvx_engine *eng, const char *tid,
                     kvc_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    m->type             = KVC_MSG_RELEASE;
    m->consumer_tp_size = (int32_t)eng->cfg.tp_size;
    m->consumer_rank    = (int32_t)eng->cfg.tp_rank;
    snprintf(m->transfer_id, sizeof(m->transfer_id), "%s", tid);
}

void kvc_peer_send_msg(kvc_peer_t *peer, const kvc_msg_t *m, const char *what)
{
    kvc_msg_t mm = *m;
    size_t    len;
    char     *buf;

    /* Every message names this engine's instance and, once known, the
     * instance it is meant for (a restarted peer refuses it). */
    mm.instance    = peer->eng->epoch;
    mm.to_instance = peer->inst;
    buf            = kvc_msg_encode(&mm, &len);
    if (buf != NULL) {
        kvc_peer_queue(peer, buf, len, what, m->type, m->transfer_id,
                       m->xfer_nonce);
    }
}

/* kvc_peer_heartbeat: a heartbeat to peer; its reply tells the instance
 * that answers (kvc_ctl_done). */
static void kvc_peer_heartbeat(kvc_peer_t *peer)
{
    kvc_msg_t m;

    memset(&m, 0, sizeof(m));
    m.type          = KVC_MSG_HEARTBEAT;
    m.consumer_rank = -1;
    kvc_peer_send_msg(peer, &m, "heartbeat");
}

/* kvc_peers_check_conn (tick): a peer whose control connection stayed lost
 * past the grace is gone (its process died: a stopped process keeps its
 * connections); one that came back answers a heartbeat with its instance
 * (a restart shows as a new one). */
void kvc_peers_check_conn(struct kvx_engine *eng)
{
    uint64_t now = kvc_now_us(eng);

    for (kvc_peer_t *p = eng->peers; p != NULL; p = p->next) {
        uint64_t        down = atomic_load(&p->conn_down_us);
        kvc_peer_conn_t c;

        if (down == 0) {
            p->conn_gone = 0;
        } else if (!p->conn_gone &&
                   now >= down + (uint64_t)(KVC_CONN_GRACE_S * 1e6)) {
            /* (not now - down: down is the loss's time made odd, so a tick
             * in the same microsecond would see it ahead of now, and the
             * difference wrapped: gone at once, with no grace) */
            char why[KVX_REASON_MAX];

            p->conn_gone = 1;
            snprintf(why, sizeof(why), "gone: its control connection was "
                     "lost and did not come back within %.1f s",
                     KVC_CONN_GRACE_S);
            /* A WRITE D fences a peer lost on the control plane alone
             * (the process may live: a cut network) unless D's data-plane
             * endpoint to that instance failed before (dp_dead: gone, as
             * a dead process is). An endpoint that stands is kept
             * (watch_ep): its failure (UCX's keepalive) then says gone.
             * Without one (no handshake yet, release_on_data_plane off,
             * error mode none) nothing tells a death from a cut, and the
             * fence waits for its bound (plugin/engine/README.md, "A P
             * rank lost on the control plane alone"). */
            p->lost_by_ctl = !eng->cfg.is_producer && !eng->cfg.read_mode &&
                             !(p->dp_dead && p->dp_dead_inst == p->inst);
            int watch = p->lost_by_ctl && p->state == KVC_PEER_READY &&
                        p->ep != NULL && p->watch_ep == NULL;

            if (kvc_peer_lost(p, KVX_ERR_ENDPOINT, why, &c)) {
                if (watch) {
                    /* Kept: its failure tells that the process is gone
                     * (kvc_peer_ep_error); the rkeys go. */
                    p->watch_ep   = c.ep;
                    p->watch_inst = c.meta.epoch;
                    c.ep          = NULL;
                }
                kvc_peer_conn_free(eng, &c); /* progress owner */
            }
            p->lost_by_ctl = 0;
            p->inst_unconfirmed = p->inst != 0;
        }
        if (p->conn_gone && down != 0 && p->out_head == NULL &&
            p->ctl_inflight == 0 && !p->job_queued && !p->hs_job_queued &&
            p->state != KVC_PEER_HANDSHAKING && p->state != KVC_PEER_READY &&
            now >= down + (uint64_t)(KVC_PEER_IDLE_S * 1e6) &&
            (p->hs_cli != NULL || p->notify_cli != NULL)) {
            p->gc = 1; /* kvc_peers_collect, outside the lock */
        }
        if (p->claim_settled) {
            /* Transfers bound to a refuted claim fail; those bound to a
             * confirmed one (a restart) handshake with it. */
            p->claim_settled = 0;
            if (p->state == KVC_PEER_READY) {
                eng->mode->peer_ready(eng, p);
            } else {
                kvc_peer_want_handshake(p);
            }
        }
        if (p->new_inst != 0) {
            /* A request or a message claims the peer restarted: the claim
             * may be false (a framework's params, a forged message), so
             * the peer is asked and its answer decides (kvc_ctl_done or
             * kvc_peer_hs_finish, then kvc_peer_claim_settle). Taking the
             * claim as a restart made the live instance "dead": every
             * later handshake with it was refused as stale. */
            p->claimed_inst = p->new_inst;
            p->claim_us     = now;
            p->new_inst     = 0;
            if (p->state == KVC_PEER_READY) {
                kvc_peer_heartbeat(p);
            } else {
                kvc_peer_want_handshake(p);
            }
        }
        if (atomic_exchange(&p->conn_up_evt, 0) && p->inst != 0) {
            kvc_peer_heartbeat(p);
        }
    }
}
