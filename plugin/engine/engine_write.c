/*
 * engine_write.c - WRITE mode (SPEC §8): P pushes layer by layer.
 *
 * D allocates and sends remote_blocks to the P rank mapped to it. P
 * schedules a layer when the framework says its KV is ready (twice = no-op),
 * posts its puts once remote_blocks arrived and the handshake with the D rank
 * is done, and when the framework sealed the transfer and every scheduled
 * layer's puts completed, flushes the endpoint (remote visibility) and sends
 * write_done exactly once. Nothing here blocks: a slow transfer never holds
 * up another.
 *
 * Every function runs with the engine lock held unless it says otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVC_EARLY_BLOCKS_MAX 1024

static void kvc_write_fail(kvc_xfer_t *x, kvx_status_t st, const char *why)
{
    if (x->status == KVX_OK) {
        x->status = st;
        snprintf(x->reason, sizeof(x->reason), "%s", why);
    }
}

static void kvc_write_send(kvc_peer_t *peer, kvc_msg_t *m, const char *what)
{
    size_t len;
    char  *buf = kvc_msg_encode(m, &len);

    if (buf != NULL) {
        kvc_peer_send(peer, buf, len, what);
    }
}

/* P: the transfer is over (sent, failed or released); report and forget. */
static void kvc_write_p_finish(struct kvx_engine *eng, kvc_xfer_t *x,
                               int released)
{
    if (x->parent != NULL) {
        /* A sub (one D rank of several): tell the parent, which reports
         * once all its subs are over. */
        kvc_xfer_t *pa = x->parent;

        if (x->sub_finished) {
            return;
        }
        x->sub_finished = 1;
        if (released) {
            pa->state = KVC_XFER_DONE;
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

static void kvc_write_flush_done(kvt_op_t *op)
{
    kvc_xfer_t        *x   = op->arg;
    struct kvx_engine *eng = x->src->eng;
    kvx_status_t       st  = (kvx_status_t)atomic_load(&op->status);

    pthread_mutex_lock(&eng->lock);
    if (st == KVX_OK && x->status == KVX_OK && !x->timed_out) {
        kvc_msg_t m;

        memset(&m, 0, sizeof(m));
        m.type          = KVC_MSG_WRITE_DONE;
        m.consumer_rank = -1;
        snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", x->transfer_id);
        kvc_write_send(x->src, &m, "write_done");
    } else {
        kvc_write_fail(x, st != KVX_OK ? st : KVX_ERR_TRANSFER_TIMEOUT,
                       "final flush of the puts failed");
    }
    kvc_write_p_finish(eng, x, 0);
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_write_check finalises x when nothing is in flight and it is either
 * failed, released, or sealed with every scheduled layer written. */
static void kvc_write_check(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->flushing || x->ncompleted != x->nposted) {
        return;
    }
    if (x->state == KVC_XFER_DONE) { /* released by D */
        kvc_write_p_finish(eng, x, 1);
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
        kvc_write_fail(x, KVX_ERR_ENDPOINT, kvc_last_error());
        kvc_write_p_finish(eng, x, 0);
    }
}

static void kvc_write_op_done(kvt_op_t *op)
{
    kvc_layer_op_t    *lop = op->arg;
    kvc_xfer_t        *x   = lop->xfer;
    struct kvx_engine *eng = x->src->eng;
    kvx_status_t       st  = (kvx_status_t)atomic_load(&op->status);

    pthread_mutex_lock(&eng->lock);
    lop->done   = 1;
    lop->status = st;
    x->ncompleted++;
    if (st == KVX_OK) {
        eng->stats.bytes_written += op->bytes;
    } else {
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "layer %u puts to %s failed: %s",
                 lop->index, x->src->name, kvc_status_string(st));
        kvc_write_fail(x, x->timed_out ? KVX_ERR_TRANSFER_TIMEOUT : st, why);
    }
    kvc_write_check(eng, x);
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_write_pump posts the puts of every scheduled, unposted layer once the
 * destination is known and connected. */
static void kvc_write_pump(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_peer_t *peer = x->src;

    if (!x->have_blocks || peer == NULL || peer->state != KVC_PEER_READY ||
        x->status != KVX_OK || x->state != KVC_XFER_PUSHING) {
        return;
    }
    if (x->ops == NULL) {
        size_t       skip = x->nlocal > x->nremote ? x->nlocal - x->nremote : 0;
        kvx_status_t st   = kvc_xfer_plan(eng, x, x->local_ids + skip,
                                          x->nlocal - skip);

        if (st != KVX_OK) {
            kvc_write_fail(x, st, kvc_last_error());
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
        st = KVD(eng)->post(peer->ep, 1, l->mem, (uint64_t)(uintptr_t)l->base,
                      peer->rkeys[j], peer->meta.layers[j].base,
                      x->ops[i].runs, x->ops[i].nruns, &x->ops[i].op);
        if (st != KVX_OK) {
            x->ncompleted++;
            kvc_write_fail(x, st, kvc_last_error());
        }
    }
    kvc_write_check(eng, x);
}

/* --- producer (P) ------------------------------------------------------- */

/* kvc_write_check_hosts: as kvc_read_check_hosts - remote_hosts entries are
 * validated when a rank resolves to them (kvc_write_target). */
static kvx_status_t kvc_write_check_hosts(struct kvx_engine *eng,
                                          const kvc_xfer_params_t *p,
                                          const kvc_peer_addr_t *addr,
                                          const char *field)
{
    (void)p;
    return kvc_trust_check(&eng->trust, addr->host, field);
}

/* kvc_write_same_tp: WRITE needs equal TP, or one TP size a multiple of
 * the other (SPEC §4): P tp = r x D tp, each P rank puts its heads as its
 * part of its D rank's blocks (replicated heads: only the first of the r);
 * D tp = q x P tp, each P rank puts one head slice (replicated: the whole
 * block) to each of its q D ranks. */
static kvx_status_t kvc_write_same_tp(struct kvx_engine *eng, uint32_t rtp)
{
    uint32_t tp = eng->cfg.tp_size;
    uint32_t hi = rtp > tp ? rtp : tp, lo = rtp > tp ? tp : rtp;

    if (rtp == tp || (lo != 0 && hi % lo == 0 && hi / lo <= KVC_RANKMAP_MAX)) {
        return KVX_OK;
    }
    return kvc_error(KVX_ERR_NOT_SUPPORTED,
                     "kv_transfer_params.remote_tp_size: value %u: WRITE mode "
                     "needs the same tp_size on both sides (%u here) or one "
                     "a multiple of the other (at most %d times)", rtp, tp,
                     KVC_RANKMAP_MAX);
}

/* kvc_write_peer_rank: the TP rank of the peer this rank talks to in WRITE
 * mode when there is one: the same rank with equal TP, else rank / ratio of
 * the side with more ranks (a P rank's D rank, or a D rank's P rank). */
static uint32_t kvc_write_peer_rank(const struct kvx_engine *eng,
                                    uint32_t rtp)
{
    if (rtp < eng->cfg.tp_size) {
        return eng->cfg.tp_rank / (eng->cfg.tp_size / rtp);
    }
    return eng->cfg.tp_rank;
}

static kvc_peer_t *kvc_write_target(struct kvx_engine *eng,
                                    const kvc_xfer_params_t *p,
                                    const kvc_peer_addr_t *addr,
                                    const char *field, uint32_t dp_rank,
                                    uint32_t tp_rank, kvx_status_t *st_p)
{
    uint32_t    rtp = p->remote_tp_size ? p->remote_tp_size : eng->cfg.tp_size;
    uint32_t    rdp = p->remote_dp_size ? p->remote_dp_size : 1;
    const char *host;
    char        fld[64];
    int         idx;
    uint32_t    off = dp_rank * rtp + tp_rank;

    *st_p = dp_rank >= rdp
                ? kvc_error(KVX_ERR_INVALID_PARAM, "dp rank %u: must be < "
                            "remote_dp_size %u", dp_rank, rdp)
                : kvc_host_resolve(addr->host, p->remote_hosts,
                                   p->num_remote_hosts, rdp, rtp, dp_rank,
                                   tp_rank, &host, &idx);
    if (*st_p != KVX_OK) {
        return NULL;
    }
    snprintf(fld, sizeof(fld), "%s", field);
    if (idx >= 0) {
        snprintf(fld, sizeof(fld), "remote_hosts[%d]", idx);
    }
    *st_p = kvc_trust_check(&eng->trust, host, fld);
    if (*st_p == KVX_OK) {
        *st_p = kvc_port_check(addr->handshake_port + off,
                               "remote_handshake_port");
    }
    if (*st_p == KVX_OK) {
        *st_p = kvc_port_check(addr->notify_port + off, "remote_notify_port");
    }
    if (*st_p != KVX_OK) {
        return NULL;
    }
    kvc_peer_t *peer = kvc_peer_get(eng, host, addr, dp_rank, tp_rank, rdp,
                                    rtp);
    if (peer == NULL) {
        *st_p = KVX_ERR_NO_MEMORY;
    }
    return peer;
}

kvc_peer_t *kvc_write_connect_target(struct kvx_engine *eng,
                                     const kvc_xfer_params_t *p,
                                     const kvc_peer_addr_t *addr,
                                     const char *field, kvx_status_t *st_p)
{
    *st_p = kvc_write_check_hosts(eng, p, addr, field);
    if (*st_p == KVX_OK) {
        *st_p = kvc_write_same_tp(eng, p->remote_tp_size ? p->remote_tp_size
                                                         : eng->cfg.tp_size);
    }
    return *st_p == KVX_OK
               ? kvc_write_target(eng, p, addr, field, p->remote_dp_rank,
                                  kvc_write_peer_rank(eng, p->remote_tp_size
                                                               ? p->remote_tp_size
                                                               : eng->cfg.tp_size),
                                  st_p)
               : NULL;
}

/* kvc_write_blocks applies a remote_blocks message to a P transfer. The
 * message's block list moves into x. */
static void kvc_write_blocks(struct kvx_engine *eng, kvc_xfer_t *x,
                             kvc_msg_t *m, char *reason, size_t len, int *ok_p)
{
    kvx_status_t st;
    kvc_peer_t  *peer;

    if (x->have_blocks) {
        return; /* duplicate remote_blocks: the first one wins */
    }
    {
        const kvc_xfer_t        *o   = x->parent ? x->parent : x;
        const kvc_xfer_params_t *dp  = &o->dparams;
        uint32_t                 rtp = dp->remote_tp_size ? dp->remote_tp_size
                                                          : eng->cfg.tp_size;

        /* A sub serves D rank tp_rank * q + sub_index (D tp = q x P tp). */
        peer = kvc_write_target(eng, dp, &o->daddr,
                                dp->has_remote_addr ? "remote_host"
                                                    : "request_id",
                                (uint32_t)m->decode_rank,
                                x->parent ? eng->cfg.tp_rank * x->parent->nsubs +
                                                x->sub_index
                                          : kvc_write_peer_rank(eng, rtp),
                                &st);
    }
    if (peer == NULL) {
        *ok_p = 0;
        snprintf(reason, len, "remote_blocks for %s: %s", m->transfer_id,
                 kvc_last_error());
        kvc_write_fail(x, st, reason);
        kvc_write_check(eng, x);
        return;
    }
    x->have_blocks    = 1;
    x->decode_rank    = m->decode_rank;
    x->remote_ids     = m->block_ids;
    x->nremote        = m->num_block_ids;
    m->block_ids      = NULL;
    m->num_block_ids  = 0;
    x->src            = peer;
    x->deadline_us    = kvc_deadline_us(eng, eng->cfg.transfer_timeout);
    if (peer->state == KVC_PEER_READY) {
        kvc_write_pump(eng, x);
    } else {
        kvc_peer_want_handshake(peer);
    }
}

static int kvc_write_fanout_end(struct kvx_engine *eng, kvc_xfer_t *x);

/* kvc_write_route_blocks applies remote_blocks to x, or with D tp = q x
 * P tp to the sub of the sending D rank (consumer_rank). */
static void kvc_write_route_blocks(struct kvx_engine *eng, kvc_xfer_t *x,
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

void kvc_write_early_apply(struct kvx_engine *eng, kvc_xfer_t *x)
{
    /* Every early remote_blocks of x (one per D rank when it has subs; x
     * cannot finish inside the loop: fanout holds it). */
    x->fanout = x->nsubs > 0;
    for (kvc_early_blocks_t **pp = &eng->early_blocks; *pp != NULL;) {
        kvc_early_blocks_t *e = *pp;
        char                reason[KVX_REASON_MAX];
        int                 ok = 1;

        if (strcmp(e->msg.transfer_id, x->transfer_id) != 0) {
            pp = &e->next;
            continue;
        }
        *pp = e->next;
        eng->nearly_blocks--;
        kvc_write_route_blocks(eng, x, &e->msg, reason, sizeof(reason), &ok);
        if (!ok) {
            kvc_log_warn("KVX-CTL-REJECT", "%s: %s", eng->engine_id, reason);
        }
        kvc_msg_fini(&e->msg);
        free(e);
        if (x->nsubs == 0) {
            return;
        }
    }
    if (x->nsubs > 0) {
        kvc_write_fanout_end(eng, x); /* may finish and free x */
    }
}

/* kvc_write_make_subs: with D tp = q x P tp (sharded), x gets one sub per
 * D rank it serves: each receives that rank's remote_blocks and puts one
 * head slice to it (SPEC §4). */
static kvx_status_t kvc_write_make_subs(struct kvx_engine *eng, kvc_xfer_t *x,
                                        const uint64_t *ids, size_t n)
{
    uint32_t rtp = x->dparams.remote_tp_size ? x->dparams.remote_tp_size
                                             : eng->cfg.tp_size;
    uint32_t q   = rtp > eng->cfg.tp_size ? rtp / eng->cfg.tp_size : 1;

    if (q < 2) {
        return KVX_OK;
    }
    x->subs = calloc(q, sizeof(*x->subs));
    if (x->subs == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "transfer: out of memory");
    }
    for (uint32_t k = 0; k < q; k++) {
        kvc_xfer_t *sub = kvc_xfer_new(x->transfer_id, x->request_id, ids, n);

        if (sub == NULL || (sub->scheduled = calloc(eng->nlayers, 1)) == NULL ||
            (sub->posted = calloc(eng->nlayers, 1)) == NULL) {
            kvc_xfer_free(sub);
            return kvc_error(KVX_ERR_NO_MEMORY, "transfer: out of memory");
        }
        sub->is_producer = 1;
        sub->write       = 1;
        sub->state       = KVC_XFER_PUSHING;
        sub->deadline_us = x->deadline_us;
        sub->parent      = x;
        sub->sub_index   = k;
        x->subs[k]       = sub;
        x->nsubs         = k + 1;
    }
    x->subs_open = q;
    return KVX_OK;
}

kvx_status_t kvc_write_producer(struct kvx_engine *eng, const char *req_id,
                                const char *params_json, const uint64_t *ids,
                                size_t n, char **response_p)
{
    kvc_xfer_params_t p;
    kvc_peer_addr_t   addr;
    const char       *field = "remote_host";
    kvc_xfer_t       *x     = NULL;
    kvx_status_t      st    = kvc_params_parse(params_json, &p);
    char             *resp  = NULL;

    if (st != KVX_OK) {
        return st;
    }
    if (p.transfer_id[0] == '\0') {
        st = kvc_error(KVX_ERR_INVALID_PARAM,
                       "kv_transfer_params.transfer_id: missing");
    }
    if (st == KVX_OK) {
        st = kvc_params_peer_addr(&p, req_id, 0, &addr, &field);
    }
    if (st == KVX_OK) {
        st = kvc_write_check_hosts(eng, &p, &addr, field);
    }
    if (st == KVX_OK) {
        st = kvc_write_same_tp(eng, p.remote_tp_size ? p.remote_tp_size
                                                     : eng->cfg.tp_size);
    }
    if (st == KVX_OK) {
        st = kvc_xfer_check_ids(eng, ids, n);
    }
    x = st == KVX_OK ? kvc_xfer_new(p.transfer_id, req_id, ids, n) : NULL;
    if (x != NULL) {
        x->scheduled = calloc(eng->nlayers, 1);
        x->posted    = calloc(eng->nlayers, 1);
        resp         = kvc_read_response(eng, x);
    }
    if (st == KVX_OK &&
        (x == NULL || !x->scheduled || !x->posted || resp == NULL)) {
        st = kvc_error(KVX_ERR_NO_MEMORY, "transfer: out of memory");
    }
    if (st != KVX_OK) {
        free(resp);
        kvc_xfer_free(x);
        kvc_params_fini(&p);
        return st;
    }
    x->is_producer = 1;
    x->write       = 1;
    x->state       = KVC_XFER_PUSHING;
    x->dparams     = p; /* owns p's lists from here */
    x->daddr       = addr;
    x->deadline_us = kvc_deadline_us(eng, eng->cfg.defer_timeout);
    if ((st = kvc_write_make_subs(eng, x, ids, n)) != KVX_OK) {
        free(resp);
        kvc_xfer_free(x);
        return st;
    }
    /* Applies an early remote_blocks and an early release (D aborted
     * before this request reached P: the proxy sends to both at once). */
    return kvc_xfer_publish(eng, x, resp, response_p);
}

static kvx_status_t kvc_write_find_p(struct kvx_engine *eng, const char *tid,
                                     kvc_xfer_t **x_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, tid);

    *x_p = NULL;
    if (x == NULL) {
        if (kvc_idset_contains(&eng->terminal, tid)) {
            return KVX_OK; /* finished or released: calls are no-ops */
        }
        return kvc_error(KVX_ERR_NOT_FOUND, "transfer_id '%s': no such "
                         "transfer on this rank", tid);
    }
    if (!x->is_producer || !x->write) {
        return kvc_error(KVX_ERR_BAD_STATE, "transfer_id '%s': not a WRITE "
                         "transfer of this producer", tid);
    }
    *x_p = x;
    return KVX_OK;
}

/* kvc_write_fanout_end: after a loop over the subs of x (fanout set),
 * finishes x if its last sub finished inside the loop. Returns 1 when x
 * was freed. */
static int kvc_write_fanout_end(struct kvx_engine *eng, kvc_xfer_t *x)
{
    x->fanout = 0;
    if (x->finish_pending) {
        kvc_write_p_finish(eng, x, x->state == KVC_XFER_DONE);
        return 1;
    }
    return 0;
}

/* kvc_write_schedule: layer of x is computed (x has no subs). */
static void kvc_write_schedule(struct kvx_engine *eng, kvc_xfer_t *x,
                               uint32_t layer)
{
    if (x->scheduled[layer] || x->sub_finished) {
        return;
    }
    x->scheduled[layer] = 1;
    x->nscheduled++;
    if (x->have_blocks) {
        x->deadline_us = kvc_deadline_us(eng, eng->cfg.transfer_timeout);
    }
    kvc_write_pump(eng, x);
}

/* kvc_write_do_seal: no more layers for x (x has no subs). */
static void kvc_write_do_seal(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (x->sealed || x->sub_finished) {
        return;
    }
    /* Expected writes = distinct layers scheduled, not registered. */
    x->sealed = 1;
    if (x->have_blocks) {
        x->deadline_us = kvc_deadline_us(eng, eng->cfg.transfer_timeout);
    }
    kvc_write_check(eng, x);
}

kvx_status_t kvc_write_layer_ready(struct kvx_engine *eng, const char *tid,
                                   uint32_t layer)
{
    kvc_xfer_t  *x;
    kvx_status_t st;

    if (layer >= eng->nlayers) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %u: must be < %zu "
                         "registered layers", layer, eng->nlayers);
    }
    pthread_mutex_lock(&eng->lock);
    st = kvc_write_find_p(eng, tid, &x);
    if (st == KVX_OK && x != NULL && !x->scheduled[layer]) {
        if (x->sealed) {
            st = kvc_error(KVX_ERR_BAD_STATE, "transfer '%s': layer %u "
                           "scheduled after seal", tid, layer);
        } else if (x->nsubs == 0) {
            kvc_write_schedule(eng, x, layer);
        } else {
            x->scheduled[layer] = 1; /* the parent keeps the API's view */
            x->nscheduled++;
            x->fanout = 1;
            for (uint32_t k = 0; k < x->nsubs; k++) {
                kvc_write_schedule(eng, x->subs[k], layer);
            }
            kvc_write_fanout_end(eng, x);
        }
    }
    pthread_mutex_unlock(&eng->lock);
    return st;
}

kvx_status_t kvc_write_seal(struct kvx_engine *eng, const char *tid)
{
    kvc_xfer_t  *x;
    kvx_status_t st;

    pthread_mutex_lock(&eng->lock);
    st = kvc_write_find_p(eng, tid, &x);
    if (st == KVX_OK && x != NULL && !x->sealed && x->nsubs == 0) {
        kvc_write_do_seal(eng, x);
    } else if (st == KVX_OK && x != NULL && !x->sealed) {
        x->sealed = 1;
        x->fanout = 1;
        for (uint32_t k = 0; k < x->nsubs; k++) {
            kvc_write_do_seal(eng, x->subs[k]);
        }
        kvc_write_fanout_end(eng, x);
    }
    pthread_mutex_unlock(&eng->lock);
    return st;
}

static void kvc_write_remember(struct kvx_engine *eng, kvc_msg_t *m)
{
    kvc_early_blocks_t *e = calloc(1, sizeof(*e));

    if (e == NULL) {
        return;
    }
    if (eng->nearly_blocks >= KVC_EARLY_BLOCKS_MAX) {
        kvc_early_blocks_t **pp = &eng->early_blocks;

        while ((*pp)->next != NULL) {
            pp = &(*pp)->next;
        }
        kvc_log_warn("KVX-EARLY-DROP", "early remote_blocks for %s dropped "
                     "(cap %d)", (*pp)->msg.transfer_id, KVC_EARLY_BLOCKS_MAX);
        kvc_msg_fini(&(*pp)->msg);
        free(*pp);
        *pp = NULL;
        eng->nearly_blocks--;
    }
    e->msg           = *m;
    m->block_ids     = NULL;
    m->num_block_ids = 0;
    e->expires_us    = kvc_deadline_us(eng, eng->cfg.defer_timeout);
    e->next           = eng->early_blocks;
    eng->early_blocks = e;
    eng->nearly_blocks++;
}

void kvc_write_on_remote_blocks(struct kvx_engine *eng, kvc_msg_t *m,
                                char *reason, size_t len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);

    *ok_p = 1;
    if (x == NULL) {
        if (!kvc_idset_contains(&eng->terminal, m->transfer_id)) {
            /* remote_blocks can overtake P's own request (the proxy sends
             * to both at once): keep it, bounded, until P registers. */
            kvc_write_remember(eng, m);
        }
        return;
    }
    if (!x->is_producer || !x->write) {
        *ok_p = 0;
        snprintf(reason, len, "remote_blocks for '%s': not a WRITE transfer "
                 "on this rank (read_mode mismatch?)", m->transfer_id);
        return;
    }
    kvc_write_route_blocks(eng, x, m, reason, len, ok_p);
}

void kvc_write_on_release(struct kvx_engine *eng, kvc_xfer_t *x)
{
    /* D finished or aborted before allocating: free without a timeout
     * (with subs: every D rank's part of the request is over). */
    x->state = KVC_XFER_DONE;
    if (x->nsubs == 0) {
        kvc_write_check(eng, x);
        return;
    }
    x->fanout = 1;
    for (uint32_t k = 0; k < x->nsubs; k++) {
        if (!x->subs[k]->sub_finished) {
            x->subs[k]->state = KVC_XFER_DONE;
            kvc_write_check(eng, x->subs[k]);
        }
    }
    kvc_write_fanout_end(eng, x);
}

void kvc_write_peer_ready(struct kvx_engine *eng, kvc_peer_t *peer)
{
    for (size_t b = 0; b < KVC_XFER_BUCKETS; b++) {
        kvc_xfer_t *x = eng->xfers[b];

        while (x != NULL) {
            kvc_xfer_t *next = x->hnext;

            if (x->write && x->is_producer && x->src == peer) {
                kvc_write_pump(eng, x);
            }
            if (x->write && x->is_producer && x->nsubs > 0) {
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
    for (size_t b = 0; b < KVC_XFER_BUCKETS; b++) {
        kvc_xfer_t *x = eng->xfers[b];

        while (x != NULL) {
            kvc_xfer_t *next = x->hnext;

            if (x->write && x->is_producer && x->src == peer &&
                x->state == KVC_XFER_PUSHING) {
                kvc_write_fail(x, peer->fail_status, peer->fail_reason);
                kvc_write_check(eng, x);
            } else if (x->write && x->is_producer && x->nsubs > 0) {
                x->fanout = 1;
                for (uint32_t k = 0; k < x->nsubs; k++) {
                    kvc_xfer_t *sub = x->subs[k];

                    if (sub->src == peer && !sub->sub_finished &&
                        sub->state == KVC_XFER_PUSHING) {
                        kvc_write_fail(sub, peer->fail_status,
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

/* --- consumer (D) ------------------------------------------------------- */

/* kvc_write_d_prepare: the P ranks this D rank hands its blocks to: its
 * own TP rank with equal TP, or the r ranks d*r .. d*r+r-1 that each put
 * one part of its heads (sharded, P tp = r x D tp). peers holds
 * KVC_RANKMAP_MAX. */
static kvx_status_t kvc_write_d_prepare(struct kvx_engine *eng,
                                        const char *req_id,
                                        const char *params_json,
                                        kvc_xfer_params_t *p,
                                        kvc_peer_t **peers, uint32_t *n_p)
{
    kvc_peer_addr_t addr;
    const char     *field = "remote_host";
    kvx_status_t    st    = kvc_params_parse(params_json, p);
    uint32_t        rtp, r;

    *n_p = 0;
    if (st != KVX_OK) {
        return st;
    }
    if (p->transfer_id[0] == '\0') {
        st = kvc_error(KVX_ERR_INVALID_PARAM,
                       "kv_transfer_params.transfer_id: missing");
    }
    if (st == KVX_OK) {
        st = kvc_params_peer_addr(p, req_id, 1, &addr, &field);
    }
    if (st == KVX_OK) {
        st = kvc_write_check_hosts(eng, p, &addr, field);
    }
    rtp = p->remote_tp_size ? p->remote_tp_size : eng->cfg.tp_size;
    if (st == KVX_OK) {
        st = kvc_write_same_tp(eng, rtp);
    }
    r = rtp > eng->cfg.tp_size ? rtp / eng->cfg.tp_size : 1;
    pthread_mutex_lock(&eng->lock);
    for (uint32_t k = 0; st == KVX_OK && k < r; k++) {
        /* P DP rank remote_dp_rank; TP rank d*r + k (P tp = r x D tp), or
         * d / q (D tp = q x P tp), or d. */
        peers[k] = kvc_write_target(eng, p, &addr, field, p->remote_dp_rank,
                                    r > 1 ? eng->cfg.tp_rank * r + k
                                          : kvc_write_peer_rank(eng, rtp),
                                    &st);
        *n_p += st == KVX_OK;
    }
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        kvc_params_fini(p);
    }
    return st;
}

/* kvc_write_d_send sends m to every P rank of x (lock held). */
static void kvc_write_d_send(kvc_xfer_t *x, kvc_msg_t *m, const char *what)
{
    for (uint32_t k = 0; k < x->nrel; k++) {
        kvc_write_send(x->rel[k], m, what);
    }
}

kvx_status_t kvc_write_consumer(struct kvx_engine *eng, const char *req_id,
                                const char *params_json, const uint64_t *ids,
                                size_t n)
{
    kvc_xfer_params_t p;
    kvc_peer_t       *peers[KVC_RANKMAP_MAX];
    uint32_t          npeers = 0;
    kvc_xfer_t       *x;
    kvc_msg_t         m;
    kvx_status_t      st;

    st = kvc_write_d_prepare(eng, req_id, params_json, &p, peers, &npeers);
    if (st == KVX_OK) {
        st = kvc_xfer_check_ids(eng, ids, n);
        if (st != KVX_OK) {
            kvc_params_fini(&p);
        }
    }
    if (st != KVX_OK) {
        return st;
    }
    x = kvc_xfer_new(p.transfer_id, req_id, ids, n);
    kvc_params_fini(&p);
    if (x == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "transfer: out of memory");
    }
    x->write        = 1;
    x->src          = peers[0];
    x->nrel         = npeers;
    memcpy(x->rel, peers, npeers * sizeof(peers[0]));
    x->state        = KVC_XFER_WAIT_WRITE;
    x->waiting_done = npeers; /* one write_done from every P rank */
    x->deadline_us  = kvc_deadline_us(eng, (eng->cfg.defer_timeout +
                                 eng->cfg.transfer_timeout));
    memset(&m, 0, sizeof(m));
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", x->transfer_id);
    m.consumer_rank = (int32_t)eng->cfg.tp_rank; /* P routes by it */
    pthread_mutex_lock(&eng->lock);
    st = kvc_xfer_insert(eng, x);
    if (st == KVX_OK && n == 0) {
        /* Nothing to allocate (full prefix hit): release P at once. */
        m.type             = KVC_MSG_RELEASE;
        m.consumer_tp_size = (int32_t)eng->cfg.tp_size;
        kvc_write_d_send(x, &m, "release");
        x->state = KVC_XFER_DONE;
        kvc_event_push(eng, KVX_EVENT_FINISHED_RECVING, KVX_OK, x, "", 0);
        kvc_idset_add(&eng->terminal, x->transfer_id);
    } else if (st == KVX_OK) {
        m.type          = KVC_MSG_REMOTE_BLOCKS;
        m.block_ids     = x->local_ids;
        m.num_block_ids = x->nlocal;
        m.decode_rank   = (int32_t)eng->cfg.dp_rank;
        snprintf(m.req_id, sizeof(m.req_id), "%s",
                 req_id && req_id[0] ? req_id : x->transfer_id);
        kvc_write_d_send(x, &m, "remote_blocks");
    }
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        kvc_xfer_free(x);
    }
    return st;
}

void kvc_write_on_write_done(struct kvx_engine *eng, const kvc_msg_t *m)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);

    if (x == NULL || !x->write || x->is_producer ||
        x->state != KVC_XFER_WAIT_WRITE) {
        /* Finished, failed or unknown: ignore (SPEC §9). */
        kvc_log_debug("KVX-WRITE-DONE-IGNORED", "write_done for '%s' ignored",
                      m->transfer_id);
        return;
    }
    if (--x->waiting_done == 0) {
        x->state = KVC_XFER_DONE;
        kvc_event_push(eng, KVX_EVENT_FINISHED_RECVING, KVX_OK, x, "", 0);
        kvc_idset_add(&eng->terminal, x->transfer_id);
    }
}

kvx_status_t kvc_write_abort(struct kvx_engine *eng, const char *req_id,
                             const char *params_json)
{
    kvc_xfer_params_t p;
    kvc_peer_t       *peers[KVC_RANKMAP_MAX];
    uint32_t          npeers = 0;
    kvc_xfer_t       *x;
    kvc_msg_t         m;
    kvx_status_t      st;

    st = kvc_write_d_prepare(eng, req_id, params_json, &p, peers, &npeers);
    if (st != KVX_OK) {
        return st;
    }
    memset(&m, 0, sizeof(m));
    m.type             = KVC_MSG_RELEASE;
    m.consumer_tp_size = (int32_t)eng->cfg.tp_size;
    m.consumer_rank    = (int32_t)eng->cfg.tp_rank;
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", p.transfer_id);
    pthread_mutex_lock(&eng->lock);
    x = kvc_xfer_find(eng, p.transfer_id);
    if (x != NULL && !x->is_producer && x->write &&
        x->state == KVC_XFER_WAIT_WRITE) {
        x->state  = KVC_XFER_FAILED;
        x->status = KVX_ERR_CANCELED;
        snprintf(x->reason, sizeof(x->reason), "aborted by the framework");
        kvc_event_push(eng, KVX_EVENT_FAILED, KVX_ERR_CANCELED, x, x->reason,
                       1);
    }
    kvc_idset_add(&eng->terminal, p.transfer_id);
    for (uint32_t k = 0; k < npeers; k++) {
        kvc_write_send(peers[k], &m, "release");
    }
    pthread_mutex_unlock(&eng->lock);
    kvc_params_fini(&p);
    return KVX_OK;
}

/* --- deadlines ---------------------------------------------------------- */

static void kvc_write_tick_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    char why[KVX_REASON_MAX];

    x->timed_out = 1;
    if (!x->is_producer) {
        kvc_msg_t m;

        snprintf(why, sizeof(why), "no write_done within defer_timeout + "
                 "transfer_timeout (%.3f s)",
                 eng->cfg.defer_timeout + eng->cfg.transfer_timeout);
        x->state  = KVC_XFER_FAILED;
        x->status = KVX_ERR_TRANSFER_TIMEOUT;
        snprintf(x->reason, sizeof(x->reason), "%s", why);
        kvc_event_push(eng, KVX_EVENT_FAILED, x->status, x, why, 1);
        kvc_idset_add(&eng->terminal, x->transfer_id);
        memset(&m, 0, sizeof(m));
        m.type             = KVC_MSG_RELEASE;
        m.consumer_tp_size = (int32_t)eng->cfg.tp_size;
        m.consumer_rank    = (int32_t)eng->cfg.tp_rank;
        snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", x->transfer_id);
        kvc_write_d_send(x, &m, "release");
        return;
    }
    snprintf(why, sizeof(why), x->have_blocks
             ? "transfer_timeout %.3f s expired before every scheduled "
               "layer was written and sealed"
             : "no remote_blocks from the consumer within defer_timeout "
               "%.3f s", x->have_blocks ? eng->cfg.transfer_timeout
                                        : eng->cfg.defer_timeout);
    kvc_write_fail(x, x->have_blocks ? KVX_ERR_TRANSFER_TIMEOUT
                                     : KVX_ERR_TIMEOUT, why);
    if ((x->ncompleted != x->nposted || x->flushing) && x->src != NULL &&
        x->src->ep != NULL) {
        KVD(eng)->ep_fail(x->src->ep, KVX_ERR_TRANSFER_TIMEOUT, why);
    } else {
        kvc_write_check(eng, x);
    }
}

void kvc_write_tick(struct kvx_engine *eng)
{
    uint64_t now = kvc_now_us(eng);

    for (size_t b = 0; b < KVC_XFER_BUCKETS; b++) {
        kvc_xfer_t *x = eng->xfers[b];

        while (x != NULL) {
            kvc_xfer_t *next = x->hnext;

            if (x->write && x->nsubs > 0) {
                /* Each D rank's part has its own deadline. */
                x->fanout = 1;
                for (uint32_t k = 0; k < x->nsubs; k++) {
                    kvc_xfer_t *sub = x->subs[k];

                    if (!sub->sub_finished && !sub->timed_out &&
                        now > sub->deadline_us &&
                        sub->state == KVC_XFER_PUSHING) {
                        kvc_write_tick_xfer(eng, sub);
                    }
                }
                kvc_write_fanout_end(eng, x);
            } else if (x->write && !x->timed_out && now > x->deadline_us &&
                       (x->state == KVC_XFER_PUSHING ||
                        x->state == KVC_XFER_WAIT_WRITE)) {
                kvc_write_tick_xfer(eng, x);
            }
            x = next;
        }
    }
    for (kvc_early_blocks_t **pp = &eng->early_blocks; *pp != NULL;) {
        if ((*pp)->expires_us < now) {
            kvc_early_blocks_t *e = *pp;

            *pp = e->next;
            kvc_msg_fini(&e->msg);
            free(e);
            eng->nearly_blocks--;
        } else {
            pp = &(*pp)->next;
        }
    }
}
