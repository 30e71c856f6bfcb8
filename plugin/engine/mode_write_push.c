/*
 * mode_write_push.c - WRITE mode (SPEC §8), P's data movement: posting a
 * transfer's puts once remote_blocks arrived and the D rank is connected,
 * completion, the final flush and the completion (notice, and write_done
 * unless D completes on the notice alone) exactly once, deadlines.
 * Nothing here blocks: a slow transfer never holds up another.
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

/* kvc_write_send_use: a message of type about x's use (its transfer id
 * and xfer_nonce) to x's D rank (lock held). */
static void kvc_write_send_use(const kvc_xfer_t *x, kvc_msg_type_t type,
                               const char *what)
{
    kvc_msg_t m;

    memset(&m, 0, sizeof(m));
    m.type          = type;
    m.consumer_rank = -1;
    m.xfer_nonce    = x->xnonce;
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", x->transfer_id);
    kvc_peer_send_msg(x->src, &m, what);
}

/* kvc_write_send_given_up: engine_destroy ended x (a part serving one D
 * rank) before it was written whole, nothing of it in flight: its D rank
 * is told that none of its puts can land any more (lock held), so it need
 * not wait for its fence's bound (a process that lives on after
 * engine_destroy looks alive to UCX's keepalive). Once per part. */
void kvc_write_send_given_up(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (!eng->closing || !x->is_producer || !x->write || x->nsubs != 0 ||
        x->given_up_sent || !x->have_blocks || x->src == NULL ||
        x->xnonce == 0 || x->ncompleted != x->nposted || x->flushing) {
        /* (a part with puts or a flush in flight says it when they end,
         * from kvc_write_p_finish; if that comes too late, its D rank
         * waits for its fence's bound: never too early) */
        return;
    }
    x->given_up_sent = 1;
    kvc_write_send_use(x, KVC_MSG_GIVEN_UP, "given_up");
}

/* kvc_write_stopped (kvc_mode_t.stopped): every WRITE transfer this P rank
 * still serves was given up by engine_destroy, its endpoints closed: each
 * part's D rank is told (kvc_write_send_given_up). */
void kvc_write_stopped(struct kvx_engine *eng)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            if (!x->is_producer || !x->write || x->state == KVC_XFER_DONE) {
                continue;
            }
            if (x->nsubs == 0) {
                kvc_write_send_given_up(eng, x);
            }
            for (uint32_t k = 0; k < x->nsubs; k++) {
                if (!x->subs[k]->sub_finished) {
                    kvc_write_send_given_up(eng, x->subs[k]);
                }
            }
        }
    }
}

/* P: the transfer is over (sent, failed or released); report and forget. */
static void kvc_write_p_finish(struct kvx_engine *eng, kvc_xfer_t *x,
                               int released)
{
    if (!released && x->status != KVX_OK) {
        kvc_write_send_given_up(eng, x);
    }
    if (x->parent != NULL) {
        /* A sub (one D rank of several): tell the parent, which reports
         * once all its subs are over. */
        kvc_xfer_t *pa = x->parent;

        if (x->sub_finished) {
            return;
        }
        x->sub_finished = 1;
        if (released) {
            /* One D rank's release ends its part only; the request counts
             * as released once every D rank released its part. */
            if (++pa->subs_released == pa->nsubs) {
                pa->state = KVC_XFER_DONE;
            }
        } else if (x->status != KVX_OK && pa->status == KVX_OK) {
            pa->status = x->status;
            snprintf(pa->reason, sizeof(pa->reason), "decode rank %u: %.400s",
                     eng->cfg.tp_rank * pa->nsubs + x->sub_index, x->reason);
        }
        if (--pa->subs_open == 0) {
            if (pa->fanout) {
                pa->finish_pending = 1; /* the loop over subs finishes it */
            } else {
                kvc_write_p_finish(eng, pa, pa->state == KVC_XFER_DONE);
            }
        }
        return;
    }
    if (x->status == KVX_OK || released) {
        kvc_event_push(eng, KVX_EVENT_FINISHED_SENDING, KVX_OK, x,
                       released ? "released by the consumer" : "", 1);
    } else {
        kvc_log_warn("KVX-XFER-FAILED", "transfer %s: %s", x->transfer_id,
                     x->reason);
        kvc_event_push(eng, KVX_EVENT_FAILED, x->status, x, x->reason, 1);
    }
    kvc_idset_add(&eng->terminal, x->transfer_id);
    kvc_xfer_remove(eng, x);
    kvc_xfer_free(x);
}

/* kvc_write_send_done: write_done to x's D rank (lock held): none of x's
 * puts can land any more. */
static void kvc_write_send_done(kvc_xfer_t *x)
{
    kvc_write_send_use(x, KVC_MSG_WRITE_DONE, "write_done");
}

/* kvc_write_counted_all: D could count every byte the counted notice
 * counts: every put went as a checked active message (kvt_op_t.am_bytes),
 * which its authorize admits and counts. Puts UCX moved itself (RMA lanes)
 * it cannot see: only the notice after the flush completes D then. */
static int kvc_write_counted_all(const struct kvx_engine *eng,
                                 const kvc_xfer_t *x)
{
    for (size_t i = 0; i < eng->nlayers; i++) {
        if (x->posted[i] && x->ops[i].op.am_bytes != x->ops[i].op.bytes) {
            return 0;
        }
    }
    return 1;
}

static void kvc_write_flush_done(kvt_op_t *op)
{
    kvc_xfer_t        *x   = op->arg;
    struct kvx_engine *eng = x->src->eng;
    kvx_status_t       st  = (kvx_status_t)atomic_load(&op->status);
    int                released;

    kvc_lock_deferring(eng);
    released = x->state == KVC_XFER_DONE;
    if (released || (st == KVX_OK && x->status == KVX_OK && !x->timed_out)) {
        /* Written, or released by D after some puts: either way none of
         * this transfer's puts can land any more (flushed, or the endpoint
         * failed), which is what D waits for before it reuses the blocks. */

        /* The notice on the data plane reaches D first (no control-plane
         * hop). write_done follows unless D said it completes on the
         * notice alone (remote_blocks' done_by_notice) and the transport
         * took the notice; after a release (a fence) it always does. */
        int noticed = KVD(eng)->notify != NULL && x->src->ep != NULL;

        if (x->count_sent && !kvc_write_counted_all(eng, x)) {
            /* D could not count these puts and waits for the notice below:
             * send that D rank no more counted notices. The notice below
             * goes after a counted one too: the counted notice is D's hint
             * (its count may never fill: a put refused, the distinct
             * ranges D tracks full), this one its last word. */
            x->src->count_off = 1;
        }
        if (noticed &&
            KVD(eng)->notify(x->src->ep, kvc_xfer_tag(x->transfer_id),
                             eng->epoch, x->xnonce, 0,
                             x->transfer_id, NULL) != KVX_OK) {
            kvc_log_debug("KVX-WRITE-NOTICE", "transfer %s: %s (write_done "
                          "follows)", x->transfer_id, kvc_last_error());
            kvc_error_clear();
            noticed = 0;
        }
        /* D can check it only under the session its handshake gave this
         * host (seen_as is kept only with one). */
        if (!noticed || !x->by_notice || released ||
            KVD(eng)->ep_set_session == NULL || x->src->seen_as[0] == '\0') {
            kvc_write_send_done(x);
        } else {
            eng->stats.write_done_skipped++;
        }
    } else {
        kvc_xfer_fail(x, st != KVX_OK ? st : KVX_ERR_TRANSFER_TIMEOUT,
                       "final flush of the puts failed");
    }
    kvc_write_p_finish(eng, x, released);
    kvc_unlock_waking(eng);
}

/* kvc_write_fence: x was released by D after puts were posted: flush the
 * endpoint, then tell D (write_done) that nothing more can land. Returns 0
 * when x was finished instead. */
static int kvc_write_fence(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->src == NULL || x->src->state != KVC_PEER_READY ||
        x->src->ep == NULL) {
        return 0; /* endpoint gone: nothing of it can land */
    }
    x->flushing      = 1;
    x->flush_op.done = kvc_write_flush_done;
    x->flush_op.arg  = x;
    if (KVD(eng)->flush(x->src->ep, &x->flush_op) != KVX_OK) {
        x->flushing = 0;
        return 0;
    }
    return 1;
}

/* kvc_write_count_notice: once every scheduled layer of a sealed x was
 * posted, a counted notice queued right behind its puts
 * (remote_blocks' notice_counted): D completes on it as soon as the bytes
 * it counts landed there, a round trip before the notice after the flush
 * (the puts' acknowledgements, then the flush, then that notice). */
static void kvc_write_count_notice(struct kvx_engine *eng, kvc_xfer_t *x)
{
    uint64_t count = 0;

    if (!x->by_count || x->count_sent || !x->sealed || !x->have_blocks ||
        x->nposted != x->nscheduled || x->status != KVX_OK ||
        x->state != KVC_XFER_PUSHING || x->timed_out || x->src == NULL ||
        x->src->count_off || x->src->state != KVC_PEER_READY ||
        x->src->ep == NULL ||
        KVD(eng)->notify_queued == NULL) {
        return;
    }
    for (size_t i = 0; i < eng->nlayers; i++) {
        count += x->posted[i] ? x->ops[i].op.bytes : 0;
    }
    if (KVD(eng)->notify_queued(x->src->ep, kvc_xfer_tag(x->transfer_id),
                                eng->epoch, x->xnonce, count,
                                x->transfer_id) != KVX_OK) {
        kvc_log_debug("KVX-WRITE-NOTICE", "transfer %s: counted notice: %s "
                      "(the notice after the flush follows)", x->transfer_id,
                      kvc_last_error());
        kvc_error_clear();
        return;
    }
    x->count_sent = 1;
    eng->stats.notices_counted++;
}

/* kvc_write_check finalises x when nothing is in flight and it is either
 * failed, released, or sealed with every scheduled layer written. */
void kvc_write_check(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_write_count_notice(eng, x);
    if (x->flushing || x->ncompleted != x->nposted) {
        return;
    }
    if (x->state == KVC_XFER_DONE) { /* released by D */
        if (x->nposted == 0) {
            kvc_write_p_finish(eng, x, 1);
        } else if (!kvc_write_fence(eng, x)) {
            /* The endpoint failed or closed: its puts completed (or were
             * cancelled) and none can land any more; D fences on this. */
            if (x->src != NULL) {
                kvc_write_send_done(x);
            }
            kvc_write_p_finish(eng, x, 1);
        }
        return;
    }
    if (x->status != KVX_OK) {
        kvc_write_p_finish(eng, x, 0);
        return;
    }
    if (!x->sealed || !x->have_blocks || x->nposted != x->nscheduled ||
        x->src == NULL || x->src->state != KVC_PEER_READY) {
        return;
    }
    x->flushing         = 1;
    x->flush_op.done    = kvc_write_flush_done;
    x->flush_op.arg     = x;
    if (KVD(eng)->flush(x->src->ep, &x->flush_op) != KVX_OK) {
        x->flushing = 0;
        kvc_xfer_fail(x, KVX_ERR_ENDPOINT, kvc_last_error());
        kvc_write_p_finish(eng, x, 0);
    }
}

static void kvc_write_op_done(kvt_op_t *op)
{
    kvc_layer_op_t    *lop = op->arg;
    kvc_xfer_t        *x   = lop->xfer;
    struct kvx_engine *eng = x->src->eng;
    kvx_status_t       st  = (kvx_status_t)atomic_load(&op->status);

    kvc_lock_deferring(eng);
    lop->done   = 1;
    lop->status = st;
    x->ncompleted++;
    if (st == KVX_OK) {
        eng->stats.bytes_written += op->bytes;
    } else {
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "layer %u puts to %.120s failed: %s%s"
                 "%s%.200s", lop->index, x->src->name,
                 kvc_status_string(st),
                 st == KVX_ERR_UNTRUSTED_PEER
                     ? " (the destination holds this transfer for another "
                       "prefill host: this host's handshake came from an "
                       "address its kv_transfer_params do not name)"
                     : "",
                 kvc_peer_why_sep(x->src), kvc_peer_why(x->src));
        kvc_xfer_fail(x, x->timed_out ? KVX_ERR_TRANSFER_TIMEOUT : st, why);
    }
    kvc_write_check(eng, x);
    kvc_unlock_waking(eng);
}

/* kvc_write_pump posts the puts of every scheduled, unposted layer once the
 * destination is known and connected. */
void kvc_write_pump(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_peer_t *peer = x->src;

    if (!x->have_blocks || peer == NULL || peer->state != KVC_PEER_READY ||
        x->status != KVX_OK || x->state != KVC_XFER_PUSHING) {
        return;
    }
    if (x->peer_inst != 0 && peer->inst != 0 && peer->inst != x->peer_inst) {
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "decode rank %s restarted: this transfer "
                 "belongs to its instance %llu, it is now %llu", peer->name,
                 (unsigned long long)x->peer_inst,
                 (unsigned long long)peer->inst);
        kvc_xfer_fail(x, KVX_ERR_ENDPOINT, why);
        kvc_write_check(eng, x);
        return;
    }
    if (x->ops == NULL && x->nremote > x->nlocal) {
        /* SPEC §6 pairs a shorter list with the other's last blocks (a
         * prefix-cache hit at D: fewer D blocks). More D blocks than P
         * holds would leave D's first blocks unwritten, or shift every
         * block by one, and D would end OK: refused, as READ refuses it. */
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "remote_blocks for %s: the decode rank "
                 "names %zu blocks, this prefill rank holds %zu: the decode "
                 "list must not be longer (SPEC 6: a shorter list takes the "
                 "other's last blocks)", x->transfer_id, x->nremote,
                 x->nlocal);
        kvc_xfer_fail(x, KVX_ERR_INVALID_PARAM, why);
        kvc_write_check(eng, x);
        return;
    }
    if (x->ops == NULL) {
        size_t       skip = x->nlocal > x->nremote ? x->nlocal - x->nremote : 0;
        kvx_status_t st   = kvc_xfer_plan(eng, x, x->local_ids + skip,
                                          x->nlocal - skip);

        if (st != KVX_OK) {
            kvc_xfer_fail(x, st, kvc_last_error());
            kvc_write_check(eng, x);
            return;
        }
    }
    for (size_t i = 0; i < eng->nlayers; i++) {
        const kvc_layer_t *l = &eng->layers[i];
        int                j = peer->layer_map[i];
        kvx_status_t       st;

        if (!x->scheduled[i] || x->posted[i]) {
            continue;
        }
        x->posted[i]      = 1;
        x->nposted++;
        x->ops[i].op.done = kvc_write_op_done;
        x->ops[i].op.arg  = &x->ops[i];
        x->ops[i].op.tag  = kvc_xfer_tag(x->transfer_id);
        st = KVD(eng)->post(peer->ep, 1, l->mem, (uint64_t)(uintptr_t)l->base,
                      peer->rkeys[j], peer->meta.layers[j].base,
                      x->ops[i].runs, x->ops[i].nruns, &x->ops[i].op);
        if (st != KVX_OK) {
            x->ncompleted++;
            kvc_xfer_fail(x, st, kvc_last_error());
        }
    }
    kvc_write_check(eng, x);
}

/* kvc_write_blocks applies a remote_blocks message to a P transfer. The
 * message's block list moves into x. */
static void kvc_write_blocks(struct kvx_engine *eng, kvc_xfer_t *x,
                             kvc_msg_t *m, char *reason, size_t len, int *ok_p)
{
    kvx_status_t st;
    kvc_peer_t  *peer;

    if (x->have_blocks || x->sub_finished) {
        return; /* duplicate remote_blocks: the first one wins; or its D
                   rank's part already ended (released) */
    }
    {
        const kvc_xfer_t        *o   = x->parent ? x->parent : x;
        const kvc_xfer_params_t *dp  = &o->dparams;
        uint32_t                 rtp = dp->remote_tp_size ? dp->remote_tp_size
                                                          : eng->cfg.tp_size;

        /* A sub serves D rank tp_rank * q + sub_index (D tp = q x P tp). */
        peer = kvc_target(eng, dp, &o->daddr,
                                dp->has_remote_addr ? "remote_host"
                                                    : "request_id",
                                (uint32_t)m->decode_rank,
                                x->parent ? eng->cfg.tp_rank * x->parent->nsubs +
                                                x->sub_index
                                          : kvc_write_peer_rank(eng, rtp),
                                &st);
    }
    if (peer == NULL) {
        /* Changes nothing: whoever sent it (the sender's host is checked
         * only against a rank it names) must not end the transfer; the
         * real D rank's remote_blocks still can, and defer_timeout bounds
         * the wait. */
        (void)st;
        *ok_p = 0;
        snprintf(reason, len, "remote_blocks for %s: %s", m->transfer_id,
                 kvc_last_error());
        snprintf(x->refused, sizeof(x->refused), "%s", kvc_last_error());
        return;
    }
    if (kvc_from_matches(m->from, peer->host) == 0) {
        *ok_p = 0; /* not from the D rank it names: changes nothing */
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
        snprintf(reason, len, "remote_blocks for '%s' from %s: the decode "
                 "rank of this transfer is %s", m->transfer_id, m->from,
                 peer->name);
        return;
    }
    if (kvc_peer_inst_dead(peer, m->instance)) {
        *ok_p = 0;
        snprintf(reason, len, "remote_blocks for '%s' from instance %llu of "
                 "%s: that instance restarted since", m->transfer_id,
                 (unsigned long long)m->instance, peer->name);
        return;
    }
    x->peer_inst      = m->instance;
    x->xnonce         = m->xfer_nonce;
    x->by_notice      = m->done_by_notice && m->xfer_nonce != 0;
    x->by_count       = x->by_notice && m->notice_counted;
    x->have_blocks    = 1;
    x->decode_rank    = m->decode_rank;
    x->remote_ids     = m->block_ids;
    x->nremote        = m->num_block_ids;
    m->block_ids      = NULL;
    m->num_block_ids  = 0;
    x->src            = peer;
    kvc_xfer_arm(eng, x, kvc_deadline_us(eng, eng->cfg.transfer_timeout));
    if (kvc_peer_note_instance(peer, m->instance)) {
        /* The D rank restarted: what was bound to its old instance fails
         * and this transfer waits for a handshake with the new one (the
         * next tick; kvc_write_peer_ready pumps it). */
    } else if (peer->state == KVC_PEER_READY) {
        kvc_write_pump(eng, x);
    } else {
        kvc_peer_want_handshake(peer);
    }
}

/* kvc_write_route_blocks applies remote_blocks to x, or with D tp = q x
 * P tp to the sub of the sending D rank (consumer_rank). */
void kvc_write_route_blocks(struct kvx_engine *eng, kvc_xfer_t *x,
                                   kvc_msg_t *m, char *reason, size_t len,
                                   int *ok_p)
{
    uint32_t base = eng->cfg.tp_rank * x->nsubs;

    if (x->nsubs == 0) {
        kvc_write_blocks(eng, x, m, reason, len, ok_p);
        return;
    }
    if (m->consumer_rank < 0 || (uint32_t)m->consumer_rank < base ||
        (uint32_t)m->consumer_rank >= base + x->nsubs) {
        *ok_p = 0;
        snprintf(reason, len, "remote_blocks for '%s': consumer_rank %d: this "
                 "P rank serves decode ranks %u..%u (decode tp_size %u x its "
                 "own)", m->transfer_id, m->consumer_rank, base,
                 base + x->nsubs - 1, x->nsubs);
        return;
    }
    kvc_write_blocks(eng, x->subs[(uint32_t)m->consumer_rank - base], m,
                     reason, len, ok_p);
}

/* kvc_write_fanout_end: after a loop over the subs of x (fanout set),
 * finishes x if its last sub finished inside the loop. Returns 1 when x
 * was freed. */
int kvc_write_fanout_end(struct kvx_engine *eng, kvc_xfer_t *x)
{
    x->fanout = 0;
    if (x->finish_pending) {
        kvc_write_p_finish(eng, x, x->state == KVC_XFER_DONE);
        return 1;
    }
    return 0;
}

void kvc_write_peer_ready(struct kvx_engine *eng, kvc_peer_t *peer)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
        kvc_xfer_t *x = eng->xfers[b];

        while (x != NULL) {
            kvc_xfer_t *next = x->hnext;

            /* The pump may end and free x: x is not touched after it (a
             * transfer with subs has no src of its own). */
            if (x->write && x->is_producer && x->nsubs == 0 &&
                x->src == peer) {
                kvc_write_pump(eng, x);
            } else if (x->write && x->is_producer && x->nsubs > 0) {
                x->fanout = 1;
                for (uint32_t k = 0; k < x->nsubs; k++) {
                    if (x->subs[k]->src == peer && !x->subs[k]->sub_finished) {
                        kvc_write_pump(eng, x->subs[k]);
                    }
                }
                kvc_write_fanout_end(eng, x);
            }
            x = next;
        }
    }
}

void kvc_write_peer_failed(struct kvx_engine *eng, kvc_peer_t *peer)
{
    if (!eng->cfg.is_producer) {
        kvc_write_d_peer_failed(eng, peer);
        return;
    }
    for (size_t b = 0; b < eng->nbuckets; b++) {
        kvc_xfer_t *x = eng->xfers[b];

        while (x != NULL) {
            kvc_xfer_t *next = x->hnext;

            if (x->write && x->is_producer && x->src == peer &&
                x->state == KVC_XFER_PUSHING &&
                !kvc_peer_bound_lost(peer, x->peer_inst)) {
                /* Bound to the peer's new instance: handshake with it. */
                kvc_peer_want_handshake(peer);
            } else if (x->write && x->is_producer && x->src == peer &&
                x->state == KVC_XFER_PUSHING) {
                kvc_xfer_fail(x, peer->fail_status, peer->fail_reason);
                kvc_write_check(eng, x);
            } else if (x->write && x->is_producer && x->nsubs > 0) {
                x->fanout = 1;
                for (uint32_t k = 0; k < x->nsubs; k++) {
                    kvc_xfer_t *sub = x->subs[k];

                    if (sub->src == peer && !sub->sub_finished &&
                        sub->state == KVC_XFER_PUSHING &&
                        !kvc_peer_bound_lost(peer, sub->peer_inst)) {
                        kvc_peer_want_handshake(peer);
                    } else if (sub->src == peer && !sub->sub_finished &&
                        sub->state == KVC_XFER_PUSHING) {
                        kvc_xfer_fail(sub, peer->fail_status,
                                       peer->fail_reason);
                        kvc_write_check(eng, sub);
                    }
                }
                kvc_write_fanout_end(eng, x);
            }
            x = next;
        }
    }
}

/* --- deadlines ---------------------------------------------------------- */

static void kvc_write_tick_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    char why[KVX_REASON_MAX];

    x->timed_out = 1;
    if (!x->is_producer && x->aborting) {
        kvc_write_d_deadline(eng, x);
        return;
    }
    if (!x->is_producer) {
        /* Reported once the P ranks confirmed no put can land any more
         * (bounded: kvc_write_d_fence). */
        snprintf(why, sizeof(why), "no write_done (or its data-plane "
                 "notice) within defer_timeout + transfer_timeout (%.3f s)",
                 eng->cfg.defer_timeout + eng->cfg.transfer_timeout);
        kvc_write_d_dp_timeout(eng, x);
        kvc_write_d_fence(eng, x, KVX_ERR_TRANSFER_TIMEOUT, why, NULL);
        return;
    }
    snprintf(why, sizeof(why), x->have_blocks
             ? "transfer_timeout %.3f s expired before every scheduled "
               "layer was written and sealed"
             : "no remote_blocks from the consumer within defer_timeout "
               "%.3f s%s%s%s", x->have_blocks ? eng->cfg.transfer_timeout
                                              : eng->cfg.defer_timeout,
             x->refused[0] != '\0' ? " (one was refused: " : "",
             x->refused, x->refused[0] != '\0' ? ")" : "");
    kvc_xfer_fail(x, x->have_blocks ? KVX_ERR_TRANSFER_TIMEOUT
                                     : KVX_ERR_TIMEOUT, why);
    if ((x->ncompleted != x->nposted || x->flushing) && x->src != NULL &&
        x->src->ep != NULL) {
        char epwhy[KVX_REASON_MAX];

        /* Other transfers on the endpoint fail too: named here. */
        snprintf(epwhy, sizeof(epwhy), "closed when transfer '%.160s' "
                 "timed out with puts in flight: %.200s", x->transfer_id,
                 why);
        KVD(eng)->ep_fail(x->src->ep, KVX_ERR_TRANSFER_TIMEOUT, epwhy);
    } else {
        kvc_write_check(eng, x);
    }
}

/* kvc_write_p_draining: P's x was released by D while puts were in flight
 * or flushing: its deadline still bounds them (the endpoint is
 * force-closed then), so D's fence gets its answer. */
static int kvc_write_p_draining(const kvc_xfer_t *x)
{
    return x->is_producer && x->state == KVC_XFER_DONE &&
           (x->ncompleted != x->nposted || x->flushing);
}

/* kvc_write_on_timer: x's deadline passed (x may be a sub-transfer of a
 * P rank serving several D ranks: each part has its own deadline). */
void kvc_write_on_timer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_xfer_t *parent = x->parent;

    if (parent != NULL) {
        if (!x->sub_finished && !x->timed_out &&
            (x->state == KVC_XFER_PUSHING || kvc_write_p_draining(x))) {
            parent->fanout = 1;
            kvc_write_tick_xfer(eng, x);
            kvc_write_fanout_end(eng, parent); /* may free parent and x */
        }
        return;
    }
    if (x->write && x->nsubs == 0 && !x->timed_out &&
        (x->state == KVC_XFER_PUSHING || x->state == KVC_XFER_WAIT_WRITE ||
         kvc_write_p_draining(x))) {
        kvc_write_tick_xfer(eng, x);
    }
}
