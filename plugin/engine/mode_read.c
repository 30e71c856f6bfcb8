/*
 * mode_read.c - READ mode (SPEC §7): D pulls with one-sided gets, then
 * releases the P ranks it maps to; P holds its blocks until its ack quorum
 * released them (or defer_timeout).
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

/* A get refused because the source has not exposed the blocks yet is
 * retried after 100 us, then twice as long each time up to 25.6 ms: a
 * source rank whose producer_request runs a little after its peers' costs
 * the transfer about that much, not a whole tick. */
#define KVC_READ_RETRY_US 100u
/* Retries due within this much of a tick are posted by it: the refusals of
 * one transfer's layers come microseconds apart, and each asking for a
 * tick of its own would walk eng->retry once per get. */
#define KVC_READ_RETRY_SLACK_US 50u

/* --- consumer (D) ------------------------------------------------------- */

/* kvc_read_hold_why: the reason of a transfer that P's hold outlasted,
 * "... ended <when>". */
static void kvc_read_hold_why(const struct kvx_engine *eng, const char *when,
                              char *buf, size_t len)
{
    snprintf(buf, len, "the producer's hold of the blocks (remote_hold_ms "
             "from its producer_request, less clock_skew %.3f s, or what a "
             "P rank asked answered) ended %s", eng->cfg.clock_skew, when);
}

/* kvc_read_release_on_dp: x's release to P rank peer goes as a notice on
 * the data plane (kvc_read_on_notice) instead of over the control plane:
 * saves both processes the control plane's thread hand-offs and round trip
 * per transfer (perf/README.md, "Per-transfer overhead"). Only when x read
 * OK, some of it from that instance of peer over the endpoint the notice
 * takes, and P told this engine the address its session is keyed by. (On a
 * direct RMA lane D may read before P's producer_request: P keeps such a
 * notice as an early release.) A notice the transport refuses (endpoint
 * gone, KVU_NOTICE_PENDING_MAX unsent) falls back to the message. The
 * notice carries this engine's instance and a stamp (kvc_dp_next_nonce)
 * under its mac, by which P refuses a copy captured on the unencrypted
 * data plane and replayed (kvc_dp_fresh): so also with control-plane TLS,
 * whose handshake gave the session. Returns 1 when the notice was handed
 * over. */
static int kvc_read_release_on_dp(struct kvx_engine *eng, kvc_xfer_t *x,
                                  kvc_peer_t *peer)
{
    int read_from = 0;

    if (x->status != KVX_OK || x->ops == NULL || KVD(eng)->notify == NULL ||
        KVD(eng)->ep_set_session == NULL ||
        peer->state != KVC_PEER_READY || peer->ep == NULL ||
        peer->seen_as[0] == '\0' || eng->cfg.tp_rank >= 64 ||
        !eng->cfg.release_on_data_plane) {
        return 0;
    }
    for (size_t o = 0; o < eng->nlayers * kvc_xfer_nsrc(x) && !read_from;
         o++) {
        const kvc_layer_op_t *lop = &x->ops[o];

        read_from = lop->peer == peer && lop->runs != NULL && lop->done &&
                    lop->status == KVX_OK && lop->inst == peer->inst;
    }
    if (!read_from) {
        return 0;
    }
    if (KVD(eng)->notify(peer->ep, kvc_xfer_tag(x->transfer_id),
                         (uint64_t)eng->cfg.tp_size << 32 | eng->cfg.tp_rank,
                         eng->epoch, kvc_dp_next_nonce(eng), x->transfer_id,
                         peer->seen_as) != KVX_OK) {
        kvc_log_debug("KVX-READ-NOTICE", "transfer %s: %s (the release goes "
                      "as a message)", x->transfer_id, kvc_last_error());
        kvc_error_clear();
        return 0;
    }
    eng->stats.releases_on_dp++;
    return 1;
}

static void kvc_read_send_releases(struct kvx_engine *eng, kvc_xfer_t *x)
{
    for (uint32_t i = 0; i < x->nrel; i++) {
        kvc_msg_t m;

        if (x->rel[i]->state == KVC_PEER_FAILED &&
            (x->rel[i]->fail_status == KVX_ERR_HANDSHAKE_TIMEOUT ||
             x->rel[i]->fail_status == KVX_ERR_CONTROL)) {
            /* Unreachable: a release would only wait for its deadline. */
            continue;
        }
        if (kvc_read_release_on_dp(eng, x, x->rel[i])) {
            continue;
        }
        kvc_release_msg(eng, x->transfer_id, &m);
        kvc_peer_send_msg(x->rel[i], &m, "release");
    }
}

/* kvc_read_end: x is over: its releases go out and its event is queued. */
static void kvc_read_end(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->holdq_early != 0) {
        eng->holdq_waiting--;
        x->holdq_early = 0;
    }
    x->holdq_mask = 0;
    x->state = x->status == KVX_OK ? KVC_XFER_DONE : KVC_XFER_FAILED;
    kvc_read_send_releases(eng, x);
    if (x->status == KVX_OK) {
        kvc_event_push(eng, KVX_EVENT_FINISHED_RECVING, KVX_OK, x, "", 0);
    } else {
        kvc_log_warn("KVX-XFER-FAILED", "transfer %s: %s", x->transfer_id,
                     x->reason);
        kvc_event_push(eng, KVX_EVENT_FAILED, x->status, x, x->reason, 1);
    }
    kvc_idset_add(&eng->terminal, x->transfer_id);
    kvc_wake(eng);
}

/* kvc_read_finish: every get of x completed (or none was posted, or x
 * failed before). Gets that completed after the hold's end (on our clock)
 * fail x, whether or not the deadline's timer ran. A transfer whose gets
 * all completed is OK only once every source rank asked
 * (kvc_read_ask_holds) said its hold covered them: until then it waits,
 * bounded by its deadline. */
static void kvc_read_finish(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->status == KVX_OK && x->state == KVC_XFER_INFLIGHT &&
        x->hold_end_us != 0 && kvc_now_us(eng) >= x->hold_end_us) {
        /* The gets ended after the hold did, before the deadline's timer
         * ran: they may have read blocks already reported free. */
        char why[KVX_REASON_MAX];

        kvc_read_hold_why(eng, "before the reads did", why, sizeof(why));
        kvc_xfer_fail(x, KVX_ERR_TRANSFER_TIMEOUT, why);
    }
    if (x->status == KVX_OK && x->holdq_mask != 0) {
        x->gets_done_us = kvc_now_us(eng);
        return;
    }
    kvc_read_end(eng, x);
}

/* kvc_read_retry_wanted: a get refused because the source has not exposed
 * the blocks yet is retried while x is in flight and healthy (SPEC §7: D
 * may read before P's own bookkeeping; the deadline bounds the wait). */
static int kvc_read_retry_wanted(const kvc_xfer_t *x, const kvc_layer_op_t *lop,
                                 kvx_status_t st)
{
    return st == KVX_ERR_NOT_EXPOSED && x->status == KVX_OK &&
           !x->timed_out && x->state == KVC_XFER_INFLIGHT &&
           lop->peer->state == KVC_PEER_READY && lop->peer->inst == lop->inst;
}

static void kvc_read_op_done(kvt_op_t *op)
{
    kvc_layer_op_t    *lop = op->arg;
    kvc_xfer_t        *x   = lop->xfer;
    struct kvx_engine *eng = lop->peer->eng;
    kvx_status_t       st  = (kvx_status_t)atomic_load(&op->status);

    kvc_lock_deferring(eng);
    if (kvc_read_retry_wanted(x, lop, st)) {
        /* 0.1, 0.2, 0.4 .. 25.6 ms, then every 25.6 ms. */
        uint32_t shift = lop->retries < 8 ? lop->retries : 8;

        if (lop->retries == 0) {
            kvc_log_info("KVX-READ-RETRY", "transfer %s: layer %u: %s has "
                         "not exposed the blocks yet (its producer_request "
                         "has not run): retrying until the deadline",
                         x->transfer_id, lop->index, lop->peer->name);
        }
        lop->retries++;
        eng->stats.read_retries++;
        lop->retry_us = kvc_now_us(eng) + (KVC_READ_RETRY_US << shift);
        lop->waiting  = 1;
        lop->rnext    = eng->retry;
        eng->retry    = lop;
        if (KVD(eng)->tick_at != NULL) { /* not the next period's tick */
            KVD(eng)->tick_at(eng->ucx, lop->retry_us);
        }
        kvc_unlock_waking(eng);
        return;
    }
    lop->done   = 1;
    lop->status = st;
    if (st == KVX_OK) {
        eng->stats.bytes_read += op->bytes;
    } else {
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "layer %u gets from %.120s failed: %s%s"
                 "%s%.200s", lop->index, lop->peer->name,
                 kvc_status_string(st),
                 st == KVX_ERR_OUT_OF_BOUNDS
                     ? " (or outside what the source holds for this "
                       "transfer: its hold ended, or not these blocks)"
                 : st == KVX_ERR_UNTRUSTED_PEER
                     ? " (the source holds this transfer for another "
                       "decode host: the request id names it)"
                     : "",
                 kvc_peer_why_sep(lop->peer), kvc_peer_why(lop->peer));
        kvc_xfer_fail(x, x->timed_out ? KVX_ERR_TRANSFER_TIMEOUT : st, why);
    }
    if (--x->layers_pending == 0) {
        kvc_read_finish(eng, x);
    }
    kvc_wake(eng);
    kvc_unlock_waking(eng);
}

/* kvc_read_sources_ready: every source of x has handshaken. */
static int kvc_read_sources_ready(const kvc_xfer_t *x)
{
    for (uint32_t k = 0; k < kvc_xfer_nsrc(x); k++) {
        if (kvc_xfer_source(x, k)->state != KVC_PEER_READY) {
            return 0;
        }
    }
    return 1;
}

/* kvc_read_has_source: peer is one of x's sources. */
static int kvc_read_has_source(const kvc_xfer_t *x, const kvc_peer_t *peer)
{
    for (uint32_t k = 0; k < kvc_xfer_nsrc(x); k++) {
        if (kvc_xfer_source(x, k) == peer) {
            return 1;
        }
    }
    return 0;
}

/* kvc_read_bound_inst: the instance x is bound to on source peer (0:
 * none: only the P rank that answered the request is known). */
static uint64_t kvc_read_bound_inst(const kvc_xfer_t *x,
                                    const kvc_peer_t *peer)
{
    return x->src_inst != 0 && peer->tp_rank == x->src_tp ? x->src_inst : 0;
}

/* kvc_read_bound_check: before x reads, every source must be the P
 * instance that accepted the request: returns 1 (go), 0 (wait: a restart
 * of the source that D has not seen yet is being handled, or it is not
 * READY), -1 (x failed: the instance that holds its blocks is gone).
 * after_hs: called because a handshake just completed (a mismatch then is
 * final). */
static int kvc_read_bound_check(struct kvx_engine *eng, kvc_xfer_t *x,
                                int after_hs)
{
    for (uint32_t k = 0; k < kvc_xfer_nsrc(x); k++) {
        kvc_peer_t *peer = kvc_xfer_source(x, k);
        uint64_t    inst = kvc_read_bound_inst(x, peer);
        int         n;

        if (inst == 0 && x->accepted != 0 && peer->inst > x->accepted &&
            peer->state == KVC_PEER_READY) {
            char why[KVX_REASON_MAX];

            /* Not the rank that answered: its instance is not known, but
             * one started after P accepted the request never computed
             * nor held these blocks. */
            snprintf(why, sizeof(why), "P rank %.200s: instance %llu "
                     "started after the request was accepted (%llu): it "
                     "does not hold the blocks", peer->name,
                     (unsigned long long)peer->inst,
                     (unsigned long long)x->accepted);
            kvc_xfer_fail(x, KVX_ERR_ENDPOINT, why);
            kvc_read_finish(eng, x);
            return -1;
        }
        if (inst == 0 || peer->inst == inst ||
            (peer->inst == 0 && peer->state != KVC_PEER_READY)) {
            continue;
        }
        n = after_hs || peer->state != KVC_PEER_READY
                ? (kvc_peer_inst_dead(peer, inst) ||
                   peer->state == KVC_PEER_READY ? 2 : 0)
                : kvc_peer_note_instance(peer, inst);
        if (n == 2) {
            char why[KVX_REASON_MAX];

            snprintf(why, sizeof(why), "P rank %.200s: instance %llu that "
                     "accepted the request (its blocks) is gone; instance "
                     "%llu answers", peer->name, (unsigned long long)inst,
                     (unsigned long long)peer->inst);
            kvc_xfer_fail(x, KVX_ERR_ENDPOINT, why);
            kvc_read_finish(eng, x);
            return -1;
        }
        if (n == 1 || peer->state != KVC_PEER_READY) {
            return 0;
        }
    }
    return 1;
}

/* kvc_read_post_op posts lop's gets (a failure to post fails x). */
static void kvc_read_post_op(struct kvx_engine *eng, kvc_layer_op_t *lop)
{
    kvc_xfer_t        *x    = lop->xfer;
    kvc_peer_t        *peer = lop->peer;
    const kvc_layer_t *l    = &eng->layers[lop->index];
    int                j    = peer->layer_map[lop->index];
    kvx_status_t       st;

    lop->op.done = kvc_read_op_done;
    lop->op.arg  = lop;
    lop->op.tag  = kvc_xfer_tag(x->transfer_id);
    if (!lop->waiting && lop->retries == 0) {
        lop->inst = peer->inst;
    }
    atomic_store(&lop->op.status, KVX_OK);
    st = KVD(eng)->post(peer->ep, 0, l->mem, (uint64_t)(uintptr_t)l->base,
                        peer->rkeys[j], peer->meta.layers[j].base, lop->runs,
                        lop->nruns, &lop->op);
    if (st != KVX_OK) {
        lop->done   = 1;
        lop->status = st;
        kvc_xfer_fail(x, st, kvc_last_error());
        x->layers_pending--;
    }
}

/* kvc_read_send_hold: x's hold message to P rank peer (its answer:
 * kvc_read_on_reply, also at once when it cannot be sent). */
static void kvc_read_send_hold(struct kvx_engine *eng, kvc_xfer_t *x,
                               kvc_peer_t *peer)
{
    kvc_msg_t m;

    memset(&m, 0, sizeof(m));
    m.type       = KVC_MSG_HOLD;
    m.xfer_nonce = x->holdq_nonce;
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", x->transfer_id);
    eng->stats.hold_asked++;
    kvc_peer_send_msg(peer, &m, "hold");
}

/* kvc_read_ask_holds: x's deadline bounds its reads by the hold of the
 * P rank whose response D got (remote_accepted + remote_hold_ms, less
 * clock_skew). Every other P rank x reads from took the request on its
 * own, maybe long before, and on a direct RMA lane nothing at P refuses a
 * get once that rank's hold ended. So each of them is asked, beside the
 * gets, how much longer it holds the blocks (a hold message): the answer
 * sets that rank's own deadline (from when the question was queued, so no
 * clock is compared), and x is OK only once every answer came and its
 * gets completed within every deadline (kvc_read_on_reply). A P without
 * instance or hold in its response (legacy) is not asked. */
static void kvc_read_ask_holds(struct kvx_engine *eng, kvc_xfer_t *x)
{
    size_t nops = eng->nlayers * kvc_xfer_nsrc(x);

    if (x->src_inst == 0 || x->hold_end_us == 0) {
        return;
    }
    for (uint32_t k = 0; k < kvc_xfer_nsrc(x) && k < 64; k++) {
        kvc_peer_t *peer  = kvc_xfer_source(x, k);
        int         reads = 0;

        if (peer->tp_rank == x->src_tp) {
            continue; /* its own stamp bounds x already */
        }
        for (size_t o = 0; o < nops && !reads; o++) {
            reads = x->ops[o].peer == peer && x->ops[o].runs != NULL;
        }
        if (!reads) {
            continue;
        }
        if (x->holdq_nonce == 0) {
            x->holdq_nonce = kvc_use_nonce(eng);
        }
        x->holdq_mask |= 1ull << k;
        kvc_read_send_hold(eng, x, peer);
    }
}

/* kvc_read_on_reply (D): P rank peer answered x's hold message. */
static void kvc_read_on_reply(struct kvx_engine *eng, kvc_peer_t *peer,
                              kvc_msg_type_t type, const char *tid,
                              const kvc_reply_info_t *info)
{
    kvc_xfer_t *x = type == KVC_MSG_HOLD ? kvc_xfer_find(eng, tid) : NULL;
    char        why[KVX_REASON_MAX] = "";
    uint32_t    k;
    size_t      nops;

    if (x == NULL || x->is_producer || x->write ||
        x->state != KVC_XFER_INFLIGHT || x->holdq_nonce == 0 ||
        info->sent_xnonce != x->holdq_nonce) {
        return; /* over, or an earlier use of the id */
    }
    for (k = 0; k < kvc_xfer_nsrc(x) && k < 64; k++) {
        if (kvc_xfer_source(x, k) == peer && (x->holdq_mask >> k & 1)) {
            break;
        }
    }
    if (k == kvc_xfer_nsrc(x) || k == 64) {
        return;
    }
    x->holdq_mask &= ~(1ull << k);
    nops = eng->nlayers * kvc_xfer_nsrc(x);
    if (!info->delivered || !info->ok) {
        snprintf(why, sizeof(why), "P rank %.120s did not confirm that it "
                 "still holds the blocks (asked because another P rank "
                 "answered the request): %s%.200s", peer->name,
                 info->delivered ? "" : "no answer: ", info->reason);
        kvc_xfer_fail(x, info->delivered ? KVX_ERR_NOT_EXPOSED
                                         : KVX_ERR_CONTROL, why);
    } else {
        for (size_t o = 0; o < nops; o++) {
            const kvc_layer_op_t *lop = &x->ops[o];

            if (lop->peer == peer && lop->runs != NULL &&
                lop->inst != info->instance) {
                snprintf(why, sizeof(why), "P rank %.200s: instance %llu "
                         "answered whether it holds the blocks, but they "
                         "were read from instance %llu", peer->name,
                         (unsigned long long)info->instance,
                         (unsigned long long)lop->inst);
                kvc_xfer_fail(x, KVX_ERR_ENDPOINT, why);
                break;
            }
        }
    }
    if (why[0] == '\0' && !info->has_hold) {
        /* That rank has not taken the request yet: what D read is only
         * known to be its blocks once it holds them. Asked again after 1,
         * 2, 4 .. 32 ms (kvc_read_reask_holds); the deadline bounds it. */
        uint32_t shift = x->holdq_tries < 5 ? x->holdq_tries : 5;

        x->holdq_mask |= 1ull << k;
        if (x->holdq_early == 0) {
            eng->holdq_waiting++;
            x->holdq_at = kvc_now_us(eng) + (1000u << shift);
            x->holdq_tries++;
            if (KVD(eng)->tick_at != NULL) {
                KVD(eng)->tick_at(eng->ucx, x->holdq_at);
            }
        }
        x->holdq_early |= 1ull << k;
        return;
    }
    if (why[0] == '\0') {
        /* That rank's hold ends hold_ms after it answered, which was after
         * the question was queued; less a thousandth for the two clocks'
         * rates. */
        uint64_t left = (uint64_t)info->hold_ms * 1000u;
        uint64_t end  = info->sent_us + left - left / 1000u;

        if (x->gets_done_us != 0 && x->gets_done_us >= end) {
            snprintf(why, sizeof(why), "P rank %.200s: its hold of the "
                     "blocks (%u ms more when asked) ended before the "
                     "reads did", peer->name, info->hold_ms);
            kvc_xfer_fail(x, KVX_ERR_TRANSFER_TIMEOUT, why);
        } else if (x->gets_done_us == 0) {
            /* The reads end before that rank's hold does: checked when
             * they end (kvc_read_finish), and at this deadline the gets
             * still in flight are cancelled (kvc_read_tick_xfer). */
            x->hold_end_us = end < x->hold_end_us ? end : x->hold_end_us;
            if (end < x->deadline_us) {
                kvc_xfer_arm(eng, x, end);
            }
        }
    }
    if (x->gets_done_us != 0 && (x->holdq_mask == 0 || x->status != KVX_OK)) {
        kvc_read_end(eng, x);
    }
    /* else the gets still in flight report x (kvc_read_finish) */
}

static void kvc_read_post(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvx_status_t st    = kvc_xfer_plan(eng, x, x->local_ids, x->nlocal);
    size_t       nops = eng->nlayers * kvc_xfer_nsrc(x);

    if (st == KVX_OK && x->hold_end_us != 0 &&
        kvc_now_us(eng) >= x->hold_end_us) {
        /* The handshake ended after P's hold did (the timer had not run
         * yet): nothing is posted. */
        char why[KVX_REASON_MAX];

        x->timed_out = 1;
        kvc_read_hold_why(eng, "before the handshake finished", why,
                          sizeof(why));
        st = kvc_error(KVX_ERR_TRANSFER_TIMEOUT, "%s", why);
    }
    if (st != KVX_OK) {
        kvc_xfer_fail(x, st, kvc_last_error());
        kvc_read_finish(eng, x);
        return;
    }
    x->state          = KVC_XFER_INFLIGHT;
    x->layers_pending = (uint32_t)nops; /* ops, not layers, when gathering */
    kvc_read_ask_holds(eng, x);
    for (size_t o = 0; o < nops; o++) {
        kvc_layer_op_t *lop = &x->ops[o];

        if (lop->runs == NULL) { /* nothing to read from this source */
            lop->done = 1;
            x->layers_pending--;
            continue;
        }
        kvc_read_post_op(eng, lop);
    }
    if (x->layers_pending == 0) {
        kvc_read_finish(eng, x);
    }
}

/* kvc_read_on_tick: re-posts the ops whose retry time came; one whose
 * transfer failed, timed out or lost its source in the meantime completes
 * with that failure. */
static void kvc_read_on_tick(struct kvx_engine *eng, uint64_t now)
{
    kvc_layer_op_t **pp   = &eng->retry;
    uint64_t         next = 0; /* the earliest retry still waiting */

    while (*pp != NULL) {
        kvc_layer_op_t *lop = *pp;
        kvc_xfer_t     *x   = lop->xfer;

        if (kvc_read_retry_wanted(x, lop, KVX_ERR_NOT_EXPOSED) &&
            now + KVC_READ_RETRY_SLACK_US < lop->retry_us) {
            next = next == 0 || lop->retry_us < next ? lop->retry_us : next;
            pp   = &lop->rnext;
            continue;
        }
        *pp          = lop->rnext;
        lop->rnext   = NULL;
        lop->waiting = 0;
        if (kvc_read_retry_wanted(x, lop, KVX_ERR_NOT_EXPOSED)) {
            kvc_read_post_op(eng, lop);
        } else {
            char         why[KVX_REASON_MAX];
            kvx_status_t st = x->timed_out ? KVX_ERR_TRANSFER_TIMEOUT
                              : lop->peer->state != KVC_PEER_READY ||
                                      lop->peer->inst != lop->inst
                                  ? KVX_ERR_ENDPOINT
                                  : KVX_ERR_NOT_EXPOSED;

            snprintf(why, sizeof(why), "layer %u: %s had not exposed the "
                     "blocks after %u tries%s", lop->index, lop->peer->name,
                     lop->retries, st == KVX_ERR_ENDPOINT
                                       ? " and the connection to it was lost"
                                       : "");
            lop->done   = 1;
            lop->status = st;
            kvc_xfer_fail(x, st, why);
            x->layers_pending--;
        }
        if (x->layers_pending == 0) {
            kvc_read_finish(eng, x);
        }
    }
    if (next != 0 && KVD(eng)->tick_at != NULL) {
        KVD(eng)->tick_at(eng->ucx, next);
    }
}

/* kvc_read_reask_holds: asks again the P ranks that had not taken their
 * transfer's request yet (kvc_read_on_reply), once their time came. */
static void kvc_read_reask_holds(struct kvx_engine *eng, uint64_t now)
{
    uint64_t next = 0;

    for (size_t b = 0; b < eng->nbuckets && eng->holdq_waiting > 0; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            if (x->holdq_early == 0) {
                continue;
            }
            if (now < x->holdq_at) {
                next = next == 0 || x->holdq_at < next ? x->holdq_at : next;
                continue;
            }
            /* Taken off the waiting ones before sending: a message that
             * cannot be sent reaches kvc_read_on_reply at once, which may
             * end x (kvc_read_end). */
            uint64_t early = x->holdq_early;

            x->holdq_early = 0;
            eng->holdq_waiting--;
            for (uint32_t k = 0; k < kvc_xfer_nsrc(x) && k < 64 &&
                                x->state == KVC_XFER_INFLIGHT;
                 k++) {
                if (early >> k & 1) {
                    kvc_read_send_hold(eng, x, kvc_xfer_source(x, k));
                }
            }
        }
    }
    if (next != 0 && KVD(eng)->tick_at != NULL) {
        KVD(eng)->tick_at(eng->ucx, next);
    }
}

static void kvc_read_tick(struct kvx_engine *eng, uint64_t now)
{
    kvc_read_on_tick(eng, now);
    if (eng->holdq_waiting > 0) {
        kvc_read_reask_holds(eng, now);
    }
}

/* kvc_read_hold (D): P holds x's blocks for hold_ms from x->accepted (its
 * stamp at producer_request) and then reports them free (defer_timeout),
 * whatever D's gets are doing: on a direct RMA lane P cannot tell. So D's
 * deadline for reading is that moment less clock_skew (the stamps are
 * CLOCK_REALTIME of two hosts), on our monotonic clock; at that deadline
 * gets in flight are cancelled (the endpoints force-closed) and x fails,
 * never OK. hold_ms 0: a P that does not say (no cap). */
static void kvc_read_hold(struct kvx_engine *eng, kvc_xfer_t *x,
                          uint32_t hold_ms)
{
    const kvt_clock_t *c     = &eng->env.clock;
    uint64_t           stamp = c->stamp(c->arg);
    uint64_t           since, left, skew;

    if (hold_ms == 0 || x->accepted == 0) {
        return;
    }
    since = stamp > x->accepted ? (stamp - x->accepted) >> c->stamp_shift
                                : 0;
    skew  = (uint64_t)(eng->cfg.clock_skew * 1e6);
    left  = (uint64_t)hold_ms * 1000u;
    left  = left > since + skew ? left - since - skew : 0;
    x->hold_end_us = kvc_now_us(eng) + left; /* left 0: over already */
}

static kvx_status_t kvc_read_consumer_locked(struct kvx_engine *eng,
                                             kvc_xfer_t *x,
                                             const kvc_xfer_params_t *p,
                                             const kvc_peer_addr_t *addr,
                                             const char *field)
{
    kvx_status_t st = kvc_read_targets(eng, p, addr, field, x);
    int          ready;

    if (st == KVX_OK) {
        st = kvc_xfer_insert(eng, x);
    }
    if (st != KVX_OK) {
        return st;
    }
    {
        uint64_t deadline = kvc_deadline_us(eng, eng->cfg.transfer_timeout);

        /* Reads end before P's hold does (kvc_read_hold). */
            kvc_xfer_arm(eng, x, x->hold_end_us != 0 && x->hold_end_us < deadline
                                 ? x->hold_end_us : deadline);
    }
    if (x->hold_end_us != 0 && x->hold_end_us <= kvc_now_us(eng) &&
        x->nlocal > 0) {
        char why[KVX_REASON_MAX];

        /* Too late to read anything: no get is posted. */
        kvc_read_hold_why(eng, "before the request reached this rank: "
                          "nothing was read (or the P and D hosts' clocks "
                          "disagree by more than that)", why, sizeof(why));
        x->timed_out = 1;
        kvc_xfer_fail(x, KVX_ERR_TRANSFER_TIMEOUT, why);
        kvc_read_finish(eng, x);
    } else if (x->nlocal == 0) {
        /* Nothing to read (full prefix hit): still release P (SPEC §7). */
        kvc_read_finish(eng, x);
    } else if (kvc_read_sources_ready(x) &&
               (ready = kvc_read_bound_check(eng, x, 0)) != 0) {
        if (ready > 0) {
            kvc_read_post(eng, x);
        }
    } else {
        x->state = KVC_XFER_WAIT_PEER;
        for (uint32_t k = 0; k < kvc_xfer_nsrc(x); k++) {
            kvc_peer_want_handshake(kvc_xfer_source(x, k));
        }
    }
    return KVX_OK;
}

kvx_status_t kvc_read_consumer(struct kvx_engine *eng, const char *req_id,
                               const char *params_json, const uint64_t *ids,
                               size_t n)
{
    kvc_xfer_params_t p;
    kvc_peer_addr_t   addr;
    const char       *field = "remote_host";
    kvc_xfer_t       *x     = NULL;
    kvx_status_t      st;

    st = kvc_params_parse(params_json, &p);
    if (st != KVX_OK) {
        return st;
    }
    if (p.transfer_id[0] == '\0') {
        st = kvc_error(KVX_ERR_INVALID_PARAM,
                       "kv_transfer_params.transfer_id: missing");
        goto out;
    }
    st = kvc_params_peer_addr(&p, req_id, 1, &addr, &field);
    if (st == KVX_OK) {
        st = kvc_target_check_host(eng, &addr, field);
    }
    if (st == KVX_OK && n > 0 && !p.has_remote_block_ids) {
        st = kvc_error(KVX_ERR_INVALID_PARAM,
                       "kv_transfer_params.remote_block_ids: missing, but "
                       "READ mode needs the producer's blocks for %zu local "
                       "blocks", n);
    }
    if (st == KVX_OK && n > p.num_remote_block_ids) {
        st = kvc_error(KVX_ERR_INVALID_PARAM,
                       "block_ids: %zu local blocks but only %zu "
                       "remote_block_ids", n, p.num_remote_block_ids);
    }
    if (st != KVX_OK) {
        goto out;
    }
    x = kvc_xfer_new(p.transfer_id, req_id, ids, n);
    if (x == NULL) {
        st = kvc_error(KVX_ERR_NO_MEMORY, "transfer: out of memory");
        goto out;
    }
    if (p.has_remote_instance) {
        x->src_inst = p.remote_instance;
        x->src_tp   = p.remote_tp_rank;
    }
    if (p.has_remote_accepted) {
        x->accepted = p.remote_accepted;
        kvc_read_hold(eng, x, p.remote_hold_ms);
    }
    x->remote_ids          = p.remote_block_ids;
    x->nremote             = p.num_remote_block_ids;
    p.remote_block_ids     = NULL;
    p.num_remote_block_ids = 0;
    pthread_mutex_lock(&eng->lock);
    st = kvc_read_consumer_locked(eng, x, &p, &addr, field);
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        kvc_xfer_free(x);
    }
out:
    kvc_params_fini(&p);
    return st;
}

void kvc_read_peer_ready(struct kvx_engine *eng, kvc_peer_t *peer)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            if (x->state == KVC_XFER_WAIT_PEER &&
                kvc_read_has_source(x, peer) && kvc_read_sources_ready(x) &&
                kvc_read_bound_check(eng, x, 1) > 0) {
                kvc_read_post(eng, x);
            }
        }
    }
}

void kvc_read_peer_failed(struct kvx_engine *eng, kvc_peer_t *peer)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            if (x->state == KVC_XFER_WAIT_PEER &&
                kvc_read_has_source(x, peer) &&
                kvc_peer_bound_lost(peer, kvc_read_bound_inst(x, peer))) {
                kvc_xfer_fail(x, peer->fail_status, peer->fail_reason);
                kvc_read_finish(eng, x);
            }
        }
    }
}

/* --- producer (P) ------------------------------------------------------- */

static void kvc_read_released(struct kvx_engine *eng, kvc_xfer_t *x,
                              int32_t consumer_tp_size, int32_t consumer_rank)
{
    if (x->quorum == 0) {
        uint32_t q = 1;

        if (kvc_ack_quorum((uint32_t)consumer_tp_size, eng->cfg.tp_size,
                           eng->replicated, eng->cfg.tp_rank, &q) != KVX_OK ||
            q == 0) {
            q = 1;
        }
        x->quorum = q;
    }
    if (consumer_rank >= 0 && consumer_rank < 64) {
        uint64_t bit = 1ull << consumer_rank;

        if (x->released_mask & bit) {
            return; /* duplicate release from the same consumer rank */
        }
        x->released_mask |= bit;
    }
    if (++x->released >= x->quorum) {
        kvc_event_push(eng, KVX_EVENT_FINISHED_SENDING, KVX_OK, x, "", 1);
        kvc_idset_add(&eng->terminal, x->transfer_id);
        kvc_xfer_remove(eng, x);
        kvc_xfer_free(x);
    }
}

/* kvc_read_from_dhost (P): m about x comes from the decode host x's
 * request id names (when it names one as an address); else it is refused
 * (*ok_p 0, reason) and 0 returned. */
static int kvc_read_from_dhost(struct kvx_engine *eng, const kvc_xfer_t *x,
                               const kvc_msg_t *m, char *reason,
                               size_t reason_len, int *ok_p)
{
    char dhost[KVC_HOST_MAX];

    if (kvc_expo_bound_host(eng, x, dhost, sizeof(dhost)) == 0 &&
        kvc_from_matches(m->from, dhost) == 0) {
        *ok_p = 0;
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
        snprintf(reason, reason_len, "%s for '%s' from %s: the decode host "
                 "of this transfer is %s (its request id)",
                 kvc_msg_desc(m->type)->name, x->transfer_id, m->from, dhost);
        return 0;
    }
    return 1;
}

/* kvc_read_on_release (P): a D rank released x's blocks. */
static void kvc_read_on_release(struct kvx_engine *eng, kvc_msg_t *m,
                                char *reason, size_t reason_len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);

    *ok_p = 1;
    if (x == NULL || !x->is_producer) {
        if (!kvc_idset_contains(&eng->terminal, m->transfer_id)) {
            /* A release can overtake P's own bookkeeping (SPEC §7). */
            kvc_early_keep(eng, m);
        }
        return;
    }
    /* Only the decode host the request id names (when it names one as an
     * address) may release the blocks; a replayed early release too. */
    if (!kvc_read_from_dhost(eng, x, m, reason, reason_len, ok_p)) {
        return;
    }
    kvc_read_released(eng, x, m->consumer_tp_size, m->consumer_rank);
}

/* kvc_read_on_hold (P): a D rank asks how much longer this rank holds
 * the blocks of a transfer it reads from this rank while another P rank
 * answered the request (kvc_read_ask_holds). Held: the time left to its
 * defer_timeout (hold_ms); not taken yet: ok without hold_ms (D asks again
 * until this rank took it, bounded by D's deadline); ended here (released,
 * or its hold ran out): refused, and D fails the transfer. Only the decode
 * host the request id names may ask, as only it may release. */
static void kvc_read_on_hold(struct kvx_engine *eng, kvc_msg_t *m,
                             char *reason, size_t reason_len, int *ok_p)
{
    kvc_xfer_t *x    = kvc_xfer_find(eng, m->transfer_id);
    uint64_t    now  = kvc_now_us(eng);
    uint64_t    left = 0;

    *ok_p = 1;
    if (x != NULL && x->is_producer && x->state == KVC_XFER_HELD) {
        if (!kvc_read_from_dhost(eng, x, m, reason, reason_len, ok_p)) {
            return;
        }
        left = x->deadline_us == 0 ? UINT32_MAX /* held until released */
               : x->deadline_us > now ? (x->deadline_us - now) / 1000u
                                      : 0;
    } else if (x == NULL &&
               !kvc_idset_contains(&eng->terminal, m->transfer_id)) {
        return; /* not taken yet: ok without hold_ms, D asks again */
    } else {
        *ok_p = 0;
        snprintf(reason, reason_len, "hold for '%s': this P rank no longer "
                 "holds its blocks (released, or no release within "
                 "defer_timeout %.3f s)", m->transfer_id,
                 eng->cfg.defer_timeout);
        return;
    }
    m->reply_has_hold = 1;
    m->reply_hold_ms  = left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

/* kvc_read_on_notice (P): a D rank's release on the data plane
 * (kvc_read_release_on_dp). It counts as that rank's release only when its
 * mac is the one the session this engine gave the address the notice
 * claims (kvc_hs_handler's seen_as) gives: the sender handshook from there,
 * past trusted_remote_hosts (with control-plane TLS: over TLS, so the
 * session is the sender's secret), and when its stamp from that sender
 * instance (xnonce) is fresh (kvc_dp_fresh: a replay is refused). The rank
 * and tp size it names travel in the instance field, under the mac. */
static void kvc_read_on_notice(struct kvx_engine *eng, const kvc_notice_t *nt)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, nt->id);
    char        dhost[KVC_HOST_MAX];
    uint32_t    tp = (uint32_t)(nt->instance >> 32);
    uint32_t    rank = (uint32_t)nt->instance;

    if (x != NULL && (!x->is_producer || x->state != KVC_XFER_HELD)) {
        return; /* ended here (its deadline, or this rank's release) */
    }
    if (kvc_xfer_tag(nt->id) != nt->tag || tp == 0 || tp > 65535u ||
        rank >= tp || nt->xnonce == 0 || nt->count != KVC_COUNT_NONE ||
        !kvc_notice_from_ok(eng->expo.key, nt->from, nt->tag, nt->nonce,
                            nt->instance, nt->xnonce, nt->mac)) {
        eng->stats.notices_refused++;
        kvc_log_debug("KVX-READ-NOTICE", "release notice (tag %llx) "
                      "refused: not authenticated by the session of the "
                      "address it claims", (unsigned long long)nt->tag);
        return;
    }
    if (kvc_dp_fresh(eng, kvc_host_session(eng->expo.key, nt->from, 1),
                     nt->xnonce, nt->nonce, "release notice",
                     nt->from) != NULL) {
        eng->stats.notices_refused++;
        return;
    }
    if (x == NULL) {
        /* D read before this P's producer_request ran (a direct RMA lane
         * never asks P): kept as an early release, exactly as one over the
         * control plane (SPEC §7), unless the id ended here. */
        kvc_msg_t m;

        if (strlen(nt->id) < sizeof(m.transfer_id) &&
            !kvc_idset_contains(&eng->terminal, nt->id)) {
            memset(&m, 0, sizeof(m));
            m.type             = KVC_MSG_RELEASE;
            m.consumer_tp_size = (int32_t)tp;
            m.consumer_rank    = (int32_t)rank;
            m.from             = nt->from;
            snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", nt->id);
            eng->stats.notices_done++;
            kvc_early_keep(eng, &m);
        }
        return;
    }
    if (kvc_expo_bound_host(eng, x, dhost, sizeof(dhost)) == 0 &&
        kvc_from_matches(nt->from, dhost) == 0) {
        eng->stats.notices_refused++;
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
        kvc_log_debug("KVX-READ-NOTICE", "release notice for '%s' refused: "
                      "the decode host of this transfer is %s",
                      x->transfer_id, dhost);
        return;
    }
    eng->stats.notices_done++;
    kvc_read_released(eng, x, (int32_t)tp, (int32_t)rank);
}

kvx_status_t kvc_read_producer(struct kvx_engine *eng, const char *req_id,
                               const char *params_json, const uint64_t *ids,
                               size_t n, char **response_p)
{
    kvc_xfer_params_t p;
    kvc_xfer_t       *x;
    kvx_status_t      st;
    char             *resp;

    st = kvc_params_parse(params_json, &p);
    if (st != KVX_OK) {
        return st;
    }
    if (p.transfer_id[0] == '\0') {
        kvc_params_fini(&p);
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "kv_transfer_params.transfer_id: missing");
    }
    st = kvc_xfer_check_ids(eng, ids, n);
    x  = st == KVX_OK ? kvc_xfer_new(p.transfer_id, req_id, ids, n) : NULL;
    kvc_params_fini(&p);
    if (x == NULL) {
        return st != KVX_OK ? st
                            : kvc_error(KVX_ERR_NO_MEMORY, "out of memory");
    }
    x->is_producer = 1;
    x->state       = KVC_XFER_HELD;
    x->accepted    = eng->env.clock.stamp(eng->env.clock.arg);
    kvc_xfer_arm(eng, x, kvc_deadline_us(eng, eng->cfg.defer_timeout));
    resp           = kvc_xfer_response(eng, x);
    if (resp == NULL) {
        kvc_xfer_free(x);
        return kvc_error(KVX_ERR_NO_MEMORY, "response: no memory");
    }
    return kvc_xfer_publish(eng, x, resp, response_p);
}

/* --- deadlines ---------------------------------------------------------- */

/* kvc_read_inflight: ops of x posted and not completed (retries waiting
 * in eng->retry are not in flight). */
static int kvc_read_inflight(const struct kvx_engine *eng, const kvc_xfer_t *x)
{
    size_t nops = eng->nlayers * kvc_xfer_nsrc(x);

    for (size_t o = 0; x->ops != NULL && o < nops; o++) {
        if (!x->ops[o].done && !x->ops[o].waiting) {
            return 1;
        }
    }
    return 0;
}

static void kvc_read_tick_xfer(struct kvx_engine *eng, kvc_xfer_t *x,
                               uint64_t now)
{
    char why[KVX_REASON_MAX];

    if (x->is_producer) {
        snprintf(why, sizeof(why), "no release from the consumer within "
                 "defer_timeout %.3f s; the blocks may be freed",
                 eng->cfg.defer_timeout);
        kvc_log_warn("KVX-DEFER-TIMEOUT", "transfer %s: %s", x->transfer_id,
                     why);
        kvc_event_push(eng, KVX_EVENT_FAILED, KVX_ERR_TIMEOUT, x, why, 1);
        kvc_idset_add(&eng->terminal, x->transfer_id);
        kvc_xfer_remove(eng, x);
        kvc_xfer_free(x);
        return;
    }
    if (x->gets_done_us != 0) {
        /* Every get completed; a source rank asked about its hold did not
         * answer in time. */
        snprintf(why, sizeof(why), "%s after the reads: %u P rank(s) "
                 "asked whether they hold the blocks did not answer, or had "
                 "not taken the request (%u tries)",
                 x->hold_end_us != 0 && now >= x->hold_end_us
                     ? "the producer's hold of the blocks ended"
                     : "transfer_timeout expired",
                 (unsigned)__builtin_popcountll(x->holdq_mask),
                 x->holdq_tries + 1);
        x->timed_out = 1;
        kvc_xfer_fail(x, KVX_ERR_TRANSFER_TIMEOUT, why);
        kvc_read_end(eng, x);
        return;
    }
    if (x->hold_end_us != 0 && now >= x->hold_end_us &&
        x->hold_end_us < x->deadline_us + 1) {
        kvc_read_hold_why(eng, x->state == KVC_XFER_WAIT_PEER
                                   ? "before the handshake finished"
                               : kvc_read_inflight(eng, x)
                                   ? "with gets in flight"
                                   : "before the reads ended",
                          why, sizeof(why));
    } else {
        snprintf(why, sizeof(why), "transfer_timeout %.3f s expired %s",
                 eng->cfg.transfer_timeout,
                 x->state == KVC_XFER_WAIT_PEER
                     ? "before the handshake finished"
                 : kvc_read_inflight(eng, x) ? "with gets in flight"
                                             : "before the source exposed "
                                               "the blocks");
    }
    x->timed_out = 1;
    kvc_xfer_fail(x, KVX_ERR_TRANSFER_TIMEOUT, why);
    if (x->state == KVC_XFER_WAIT_PEER) {
        kvc_read_finish(eng, x);
    } else if (!kvc_read_inflight(eng, x)) {
        /* Only gets waiting to be retried: nothing can touch the blocks,
         * the endpoints (shared with other transfers) stay up. */
        kvc_read_on_tick(eng, now);
    } else {
        /* Force-close the endpoints: in-flight gets complete with errors and
         * only then are the blocks reported (SPEC §10). Other transfers on
         * them fail too; the reason names the one that timed out. */
        char epwhy[KVX_REASON_MAX];

        snprintf(epwhy, sizeof(epwhy), "closed when transfer '%.160s' "
                 "timed out with gets in flight: %.200s", x->transfer_id,
                 why);
        for (uint32_t k = 0; k < kvc_xfer_nsrc(x); k++) {
            if (kvc_xfer_source(x, k)->ep != NULL) {
                KVD(eng)->ep_fail(kvc_xfer_source(x, k)->ep,
                            KVX_ERR_TRANSFER_TIMEOUT, epwhy);
            }
        }
    }
}

/* kvc_read_on_timer: x's deadline passed. */
static void kvc_read_on_timer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if ((x->state == KVC_XFER_HELD || x->state == KVC_XFER_WAIT_PEER ||
         x->state == KVC_XFER_INFLIGHT) && !x->timed_out) {
        kvc_read_tick_xfer(eng, x, kvc_now_us(eng));
    }
}

/* kvc_read_abort_xfer (D): the framework gives up on x. Its blocks may be
 * reported free, and P's released, only when no get can touch them any
 * more (SPEC §14): gets in flight are awaited (bounded by
 * transfer_timeout, which force-closes the endpoint) and x then ends
 * CANCELED, never OK; a transfer still waiting for its handshake ends at
 * once. */
static void kvc_read_abort_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->is_producer || x->write) {
        return;
    }
    if (x->state == KVC_XFER_INFLIGHT) {
        kvc_xfer_fail(x, KVX_ERR_CANCELED, "aborted by the framework");
        if (x->gets_done_us != 0) { /* only answers were awaited */
            kvc_read_end(eng, x);
        }
    } else if (x->state == KVC_XFER_WAIT_PEER) {
        kvc_xfer_fail(x, KVX_ERR_CANCELED, "aborted by the framework");
        kvc_read_finish(eng, x);
    }
}

/* kvc_read_abort (D): a live transfer releases its P ranks when its gets
 * are over (kvc_read_finish); one this rank does not hold (aborted before
 * its request, or already over) releases the mapped P ranks at once. */
static kvx_status_t kvc_read_abort(struct kvx_engine *eng, const char *req_id,
                                   const char *params_json)
{
    kvc_xfer_params_t p;
    kvc_xfer_t       *x;
    int               live;

    if (kvc_params_parse(params_json, &p) == KVX_OK) {
        pthread_mutex_lock(&eng->lock);
        x    = p.transfer_id[0] ? kvc_xfer_find(eng, p.transfer_id) : NULL;
        live = x != NULL && !x->is_producer &&
               (x->state == KVC_XFER_INFLIGHT ||
                x->state == KVC_XFER_WAIT_PEER);
        if (live) {
            kvc_read_abort_xfer(eng, x);
        }
        pthread_mutex_unlock(&eng->lock);
        kvc_params_fini(&p);
        if (live) {
            return KVX_OK;
        }
    }
    return kvc_consumer_abort(eng, req_id, params_json, NULL);
}

/* kvc_read_destroy_xfer (P): blocks D may still be reading; D's release
 * (sent once its gets completed) ends the wait of engine_destroy. */
static int kvc_read_destroy_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (!x->is_producer && x->state == KVC_XFER_INFLIGHT &&
        x->holdq_mask != 0) {
        /* (D) Answers about holds would come too late (no reply is taken
         * once stopping): x ends now, or when its gets complete, and its
         * releases go out before the control channels close. */
        kvc_xfer_fail(x, KVX_ERR_CANCELED, "engine destroyed");
        if (x->gets_done_us != 0) {
            kvc_read_end(eng, x);
        }
    }
    return x->is_producer && x->state == KVC_XFER_HELD;
}

const kvc_mode_t kvc_mode_read = {
    .name             = "READ",
    .producer_request = kvc_read_producer,
    .consumer_request = kvc_read_consumer,
    .abort            = kvc_read_abort,
    .connect_targets  = kvc_read_connect_targets,
    .peer_ready       = kvc_read_peer_ready,
    .peer_failed      = kvc_read_peer_failed,
    .on_notice        = kvc_read_on_notice,
    .on_msg = {
        [KVC_MSG_RELEASE]   = kvc_read_on_release,
        [KVC_MSG_HEARTBEAT] = kvc_msg_ignore,
        [KVC_MSG_HOLD]      = kvc_read_on_hold,
    },
    .on_reply         = kvc_read_on_reply,
    .on_timer         = kvc_read_on_timer,
    .on_tick          = kvc_read_tick,
    .destroy_xfer     = kvc_read_destroy_xfer,
};
