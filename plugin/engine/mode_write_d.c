/*
 * mode_write_d.c - WRITE mode (SPEC §8), D's side: hand the blocks to the
 * P ranks mapped to this rank (remote_blocks), wait for write_done, abort.
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

/* --- consumer (D) ------------------------------------------------------- */

/* kvc_write_d_send sends m to every P rank of x (lock held). */
void kvc_write_d_send(kvc_xfer_t *x, kvc_msg_t *m, const char *what)
{
    for (uint32_t k = 0; k < x->nrel; k++) {
        kvc_peer_send_msg(x->rel[k], m, what);
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

    st = kvc_consumer_targets(eng, req_id, params_json, &p, peers, &npeers);
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
    kvc_xfer_arm(eng, x, kvc_deadline_us(eng, (eng->cfg.defer_timeout +
                                 eng->cfg.transfer_timeout)));
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

/* kvc_write_abort_xfer: D aborts a transfer still waiting for its
 * writes. */
static void kvc_write_abort_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (!x->is_producer && x->write && x->state == KVC_XFER_WAIT_WRITE) {
        x->state  = KVC_XFER_FAILED;
        x->status = KVX_ERR_CANCELED;
        snprintf(x->reason, sizeof(x->reason), "aborted by the framework");
        kvc_event_push(eng, KVX_EVENT_FAILED, KVX_ERR_CANCELED, x, x->reason,
                       1);
    }
}

kvx_status_t kvc_write_abort(struct kvx_engine *eng, const char *req_id,
                             const char *params_json)
{
    return kvc_consumer_abort(eng, req_id, params_json, kvc_write_abort_xfer);
}
