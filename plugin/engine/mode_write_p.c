/*
 * mode_write_p.c - WRITE mode (SPEC §8), P's requests: producer_request
 * (with one sub-transfer per D rank when D tp = q x P tp), layer_ready,
 * seal, and the remote_blocks / release messages from D.
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
        st = kvc_target_check_host(eng, &addr, field);
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
        resp         = kvc_xfer_response(eng, x);
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
    kvc_xfer_arm(eng, x, kvc_deadline_us(eng, eng->cfg.defer_timeout));
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
        if (kvc_idset_contains(&eng->failed, tid)) {
            return kvc_error(KVX_ERR_BAD_STATE, "transfer '%s': failed "
                             "(reported by its FAILED event): nothing more "
                             "is sent for it", tid);
        }
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
    if (x->status != KVX_OK) {
        /* Failed, its last operations still completing: the framework can
         * stop computing for it. */
        return kvc_error(x->status, "transfer '%s': failed: %s", tid,
                         x->reason);
    }
    *x_p = x;
    return KVX_OK;
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
    if (x->have_blocks && x->state != KVC_XFER_DONE) {
        /* (released: its deadline bounds the puts still in flight, and
         * layers that come later must not move it) */
        kvc_xfer_arm(eng, x, kvc_deadline_us(eng, eng->cfg.transfer_timeout));
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
    if (x->have_blocks && x->state != KVC_XFER_DONE) {
        kvc_xfer_arm(eng, x, kvc_deadline_us(eng, eng->cfg.transfer_timeout));
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

/* kvc_write_use_key: "id#xfer_nonce", the one use of a transfer id by one
 * D rank that m (remote_blocks or release) belongs to; "" without a nonce
 * (a legacy D: its messages are not told apart by use). */
static void kvc_write_use_key(const kvc_msg_t *m, char *buf, size_t len)
{
    buf[0] = '\0';
    if (m->xfer_nonce != 0) {
        snprintf(buf, len, "%s#%llu", m->transfer_id,
                 (unsigned long long)m->xfer_nonce);
    }
}

static void kvc_write_on_remote_blocks(struct kvx_engine *eng,
                                       kvc_msg_t *m, char *reason,
                                       size_t len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);
    char        use[KVX_ID_MAX + 24];

    *ok_p = 1;
    kvc_write_use_key(m, use, sizeof(use));
    if (use[0] != '\0' && kvc_idset_contains(&eng->released, use)) {
        /* D released this use before P knew the id: a delayed or
         * duplicated remote_blocks (also one arriving after P's request,
         * once the early release expired) must not start puts into
         * blocks D freed. */
        kvc_log_debug("KVX-EARLY-DROP", "remote_blocks for '%s' "
                      "(xfer_nonce %llu) dropped: the consumer released "
                      "that use", m->transfer_id,
                      (unsigned long long)m->xfer_nonce);
        eng->stats.early_dropped++;
        return;
    }
    if (x == NULL) {
        if (!kvc_idset_contains(&eng->terminal, m->transfer_id)) {
            /* remote_blocks can overtake P's own request (the proxy sends
             * to both at once): keep it, bounded, until P registers. */
            kvc_early_keep(eng, m);
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
     * (x has no subs: a plain transfer, or one D rank's part). */
    x->state = KVC_XFER_DONE;
    kvc_write_check(eng, x);
}

/* kvc_write_on_release_msg (P): D released the transfer before its
 * blocks were written (it finished or aborted early). With subs (D tp =
 * q x P tp) the release ends only the part of the D rank that sent it
 * (consumer_rank): the other D ranks still wait for every layer. */
static void kvc_write_on_release_msg(struct kvx_engine *eng, kvc_msg_t *m,
                                     char *reason, size_t len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);

    *ok_p = 1;
    if (x == NULL || !x->is_producer) {
        char use[KVX_ID_MAX + 24];

        if (!kvc_idset_contains(&eng->terminal, m->transfer_id)) {
            kvc_early_keep(eng, m); /* it overtook producer_request */
        }
        kvc_write_use_key(m, use, sizeof(use));
        if (x == NULL && use[0] != '\0') {
            /* Also for an id P already finished: this may be a new use of
             * it whose remote_blocks the release overtook. */
            kvc_idset_add(&eng->released, use);
        }
        m->reply_fenced = 1; /* nothing of it was ever posted, or all of it
                                completed */
        return;
    }
    if (x->nsubs > 0) {
        uint32_t base = eng->cfg.tp_rank * x->nsubs;

        if (m->consumer_rank < 0 || (uint32_t)m->consumer_rank < base ||
            (uint32_t)m->consumer_rank >= base + x->nsubs) {
            *ok_p = 0; /* changes nothing */
            kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
            snprintf(reason, len, "release for '%s': consumer_rank %d: this "
                     "P rank serves decode ranks %u..%u, and a release ends "
                     "only its sender's part", m->transfer_id,
                     m->consumer_rank, base, base + x->nsubs - 1);
            return;
        }
        x = x->subs[(uint32_t)m->consumer_rank - base];
        if (x->sub_finished) {
            m->reply_fenced = 1; /* that part is over */
            return;
        }
    }
    if (x->have_blocks && x->xnonce != 0 && m->xfer_nonce == 0) {
        /* A release of no use (the plain form, or D's abort of an id it
         * did not hold yet): not of this use, which D began with a nonce.
         * Fencing on it would end the use OK at D with blocks unwritten
         * (P's write_done and notice after a fence say what they say after
         * the last put). */
        *ok_p = 0; /* changes nothing */
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
        snprintf(reason, len, "release for '%s' without an xfer_nonce: this "
                 "use of the id has one (D's remote_blocks); not applied",
                 m->transfer_id);
        return;
    }
    if (!x->have_blocks && m->xfer_nonce != 0) {
        /* That use's remote_blocks may still come (the data plane and the
         * control plane do not keep each other's order): dropped, as one
         * for an id P did not know yet, even once the framework reuses
         * the id. */
        char use[KVX_ID_MAX + 24];

        kvc_write_use_key(m, use, sizeof(use));
        kvc_idset_add(&eng->released, use);
    }
    if (x->have_blocks && x->xnonce != 0 && m->xfer_nonce != 0 &&
        m->xfer_nonce != x->xnonce) {
        /* A release of another use of this transfer id (late, after the
         * framework reused the id): not this transfer's. */
        kvc_log_debug("KVX-WRITE-RELEASE-IGNORED", "release for '%s': "
                      "xfer_nonce %llu, this transfer's is %llu",
                      m->transfer_id, (unsigned long long)m->xfer_nonce,
                      (unsigned long long)x->xnonce);
        return;
    }
    if (x->have_blocks && x->src != NULL &&
        (kvc_from_matches(m->from, x->src->host) == 0 ||
         (m->instance != 0 && x->peer_inst != 0 &&
          m->instance != x->peer_inst))) {
        *ok_p = 0; /* changes nothing */
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
        snprintf(reason, len, "release for '%s' from %s (instance %llu): "
                 "this transfer is bound to %s (instance %llu)",
                 m->transfer_id, m->from, (unsigned long long)m->instance,
                 x->src->name, (unsigned long long)x->peer_inst);
        return;
    }
    m->reply_fenced = x->nposted == 0;
    kvc_write_on_release(eng, x);
}

/* kvc_write_on_given_up_msg (D). */
static void kvc_write_on_given_up_msg(struct kvx_engine *eng, kvc_msg_t *m,
                                      char *reason, size_t len, int *ok_p)
{
    kvc_write_on_given_up(eng, m, reason, len, ok_p);
}

/* kvc_write_on_write_done_msg (D). */
static void kvc_write_on_write_done_msg(struct kvx_engine *eng, kvc_msg_t *m,
                                        char *reason, size_t len, int *ok_p)
{
    kvc_write_on_write_done(eng, m, reason, len, ok_p);
}

const kvc_mode_t kvc_mode_write = {
    .name             = "WRITE",
    .producer_request = kvc_write_producer,
    .consumer_request = kvc_write_consumer,
    .layer_ready      = kvc_write_layer_ready,
    .seal             = kvc_write_seal,
    .abort            = kvc_write_abort,
    .connect_targets  = kvc_write_connect_targets,
    .peer_ready       = kvc_write_peer_ready,
    .peer_failed      = kvc_write_peer_failed,
    .on_reply         = kvc_write_d_on_reply,
    .on_notice        = kvc_write_on_notice,
    .on_tick          = kvc_write_on_tick,
    .on_msg = {
        [KVC_MSG_REMOTE_BLOCKS] = kvc_write_on_remote_blocks,
        [KVC_MSG_WRITE_DONE]    = kvc_write_on_write_done_msg,
        [KVC_MSG_RELEASE]       = kvc_write_on_release_msg,
        [KVC_MSG_HEARTBEAT]     = kvc_msg_ignore,
        [KVC_MSG_GIVEN_UP]      = kvc_write_on_given_up_msg,
    },
    .on_timer         = kvc_write_on_timer,
    .stopped          = kvc_write_stopped,
    .destroy_xfer     = kvc_write_d_destroy,
};
