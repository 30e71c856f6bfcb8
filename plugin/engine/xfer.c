/*
 * xfer.c - the transfer table and a transfer's lifecycle shared by both
 * modes: lookup by id, creation and freeing, publishing a producer transfer
 * (with the control messages that overtook it), events, and the waits of
 * the API (wait_layer, wait_transfer, wait_events).
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "jsonw.h"

#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

static void kvc_xfer_disarm(kvc_xfer_t *x);

/* --- transfers and events ----------------------------------------------- */

static size_t kvc_xfer_hash(const char *tid, size_t nbuckets)
{
    uint64_t h = 1469598103934665603ull;

    for (const unsigned char *p = (const unsigned char *)tid; *p; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return (size_t)(h % nbuckets);
}

static size_t kvc_xfer_bucket(const struct kvx_engine *eng, const char *tid)
{
    return kvc_xfer_hash(tid, eng->nbuckets);
}

kvx_status_t kvc_xfers_init(struct kvx_engine *eng)
{
    eng->nbuckets = KVC_XFER_BUCKETS;
    eng->xfers    = calloc(eng->nbuckets, sizeof(*eng->xfers));
    return eng->xfers != NULL
               ? KVX_OK
               : kvc_error(KVX_ERR_NO_MEMORY, "transfer table: out of memory");
}

/* kvc_xfers_grow doubles the table when chains average more than two
 * transfers, so lookups stay O(1) however many transfers are held (a P
 * holding 100,000 idle ones). Without memory it keeps the old table. */
static void kvc_xfers_grow(struct kvx_engine *eng)
{
    size_t       n = eng->nbuckets * 2;
    kvc_xfer_t **t = calloc(n, sizeof(*t));

    if (t == NULL) {
        return;
    }
    for (size_t b = 0; b < eng->nbuckets; b++) {
        while (eng->xfers[b] != NULL) {
            kvc_xfer_t *x = eng->xfers[b];
            size_t      nb = kvc_xfer_hash(x->transfer_id, n);

            eng->xfers[b] = x->hnext;
            x->hnext      = t[nb];
            t[nb]         = x;
        }
    }
    free(eng->xfers);
    eng->xfers    = t;
    eng->nbuckets = n;
}

kvc_xfer_t *kvc_xfer_find(struct kvx_engine *eng, const char *tid)
{
    for (kvc_xfer_t *x = eng->xfers[kvc_xfer_bucket(eng, tid)]; x;
         x = x->hnext) {
        if (strcmp(x->transfer_id, tid) == 0) {
            return x;
        }
    }
    return NULL;
}

kvx_status_t kvc_xfer_insert(struct kvx_engine *eng, kvc_xfer_t *x)
{
    size_t b;

    if (kvc_xfer_find(eng, x->transfer_id) != NULL) {
        return kvc_error(KVX_ERR_EXISTS,
                         "transfer_id '%s': a transfer with this id is "
                         "already active on this rank", x->transfer_id);
    }
    if (eng->nxfers >= eng->nbuckets * 2) {
        kvc_xfers_grow(eng);
    }
    b = kvc_xfer_bucket(eng, x->transfer_id);
    x->hnext        = eng->xfers[b];
    eng->xfers[b]   = x;
    eng->nxfers++;
    /* Deadlines set before x was visible start counting in the queue. */
    x->tq = &eng->timers;
    kvc_xfer_arm(eng, x, x->deadline_us);
    for (uint32_t k = 0; k < x->nsubs; k++) {
        x->subs[k]->tq = &eng->timers;
        kvc_xfer_arm(eng, x->subs[k], x->subs[k]->deadline_us);
    }
    kvc_expose(eng, x); /* P READ, D WRITE: peers may touch its blocks */
    return KVX_OK;
}

void kvc_xfer_arm(struct kvx_engine *eng, kvc_xfer_t *x, uint64_t deadline_us)
{
    x->deadline_us = deadline_us;
    if (x->tq != NULL && deadline_us != 0 &&
        kvc_timerq_set(x->tq, &x->timer, deadline_us) != KVX_OK) {
        /* No memory to grow the queue: the transfer has no deadline
         * (known limit; said loudly). */
        kvc_log_error("KVX-TIMER", "transfer %s: no deadline: %s",
                      x->transfer_id, kvc_last_error());
        (void)eng;
    }
}

kvc_xfer_t *kvc_xfer_of_timer(kvc_timer_t *t)
{
    return (kvc_xfer_t *)(void *)((char *)t - offsetof(kvc_xfer_t, timer));
}

/* kvc_xfer_disarm takes x and its subs out of the timer queue. */
static void kvc_xfer_disarm(kvc_xfer_t *x)
{
    for (uint32_t k = 0; k < x->nsubs; k++) {
        kvc_xfer_disarm(x->subs[k]);
    }
    if (x->tq != NULL) {
        kvc_timerq_cancel(x->tq, &x->timer);
        x->tq = NULL;
    }
}

void kvc_xfer_remove(struct kvx_engine *eng, kvc_xfer_t *x)
{
    for (kvc_xfer_t **pp = &eng->xfers[kvc_xfer_bucket(eng, x->transfer_id)];
         *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == x) {
            *pp = x->hnext;
            eng->nxfers--;
            kvc_xfer_disarm(x);
            kvc_unexpose(eng, x);
            return;
        }
    }
}

void kvc_xfer_free(kvc_xfer_t *x)
{
    if (x == NULL) {
        return;
    }
    kvc_xfer_disarm(x);
    for (size_t i = 0; i < x->nplans; i++) {
        free(x->plans[i]);
    }
    free(x->plans);
    free(x->ops);
    for (uint32_t k = 0; k < x->nsubs; k++) {
        kvc_xfer_free(x->subs[k]);
    }
    free(x->subs);
    free(x->scheduled);
    free(x->posted);
    kvc_params_fini(&x->dparams);
    free(x->local_ids);
    free(x->remote_ids);
    free(x);
}

kvc_xfer_t *kvc_xfer_new(const char *tid, const char *req_id,
                                const uint64_t *ids, size_t n)
{
    kvc_xfer_t *x = calloc(1, sizeof(*x));

    if (x == NULL) {
        return NULL;
    }
    snprintf(x->transfer_id, sizeof(x->transfer_id), "%s", tid);
    snprintf(x->request_id, sizeof(x->request_id), "%s",
             req_id ? req_id : "");
    if (n > 0) {
        x->local_ids = malloc(n * sizeof(uint64_t));
        if (x->local_ids == NULL) {
            free(x);
            return NULL;
        }
        memcpy(x->local_ids, ids, n * sizeof(uint64_t));
    }
    x->nlocal = n;
    return x;
}

void kvc_xfer_fail(kvc_xfer_t *x, kvx_status_t st, const char *why)
{
    if (x->status == KVX_OK) {
        x->status = st;
        snprintf(x->reason, sizeof(x->reason), "%s", why);
    }
}

kvx_status_t kvc_xfer_check_ids(struct kvx_engine *eng, const uint64_t *ids,
                                size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t l = 0; l < eng->nlayers; l++) {
            if (ids[i] >= eng->layers[l].geom.num_blocks) {
                return kvc_error(KVX_ERR_OUT_OF_BOUNDS,
                                 "block_ids[%zu] = %llu: must be < num_blocks "
                                 "%llu of layer '%s'", i,
                                 (unsigned long long)ids[i],
                                 (unsigned long long)
                                     eng->layers[l].geom.num_blocks,
                                 eng->layers[l].name);
            }
        }
    }
    return KVX_OK;
}

/* kvc_xfer_response: a producer's kv_transfer_params for D, written
 * directly (kvc_jw_*, the same bytes json-c printed for these members):
 * it is built once per transfer on the framework's thread, where json-c's
 * object tree cost most of producer_request (perf/README.md, "The
 * framework's share"). */
char *kvc_xfer_response(struct kvx_engine *eng, const kvc_xfer_t *x)
{
    kvc_jw_t w = KVC_JW_INIT;
    char     num[24];

    kvc_jw_open(&w, '{');
    kvc_jw_key(&w, "do_remote_prefill");
    kvc_jw_bool(&w, 1);
    kvc_jw_key(&w, "do_remote_decode");
    kvc_jw_bool(&w, 0);
    kvc_jw_key(&w, "transfer_id");
    kvc_jw_str(&w, x->transfer_id);
    kvc_jw_key(&w, "remote_block_ids");
    kvc_jw_open(&w, '[');
    for (size_t i = 0; i < x->nlocal; i++) {
        kvc_jw_int(&w, (int64_t)x->local_ids[i]);
    }
    kvc_jw_close(&w, ']');
    kvc_jw_key(&w, "remote_engine_id");
    kvc_jw_str(&w, eng->engine_id);
    kvc_jw_key(&w, "remote_host");
    kvc_jw_str(&w, eng->cfg.host_ip);
    kvc_jw_key(&w, "remote_handshake_port");
    kvc_jw_int(&w, (int)eng->cfg.handshake_port);
    kvc_jw_key(&w, "remote_notify_port");
    kvc_jw_int(&w, (int)eng->cfg.notify_port);
    kvc_jw_key(&w, "tp_size");
    kvc_jw_int(&w, (int)eng->cfg.tp_size);
    kvc_jw_key(&w, "remote_dp_size");
    kvc_jw_int(&w, (int)eng->cfg.dp_size);
    kvc_jw_key(&w, "remote_dp_rank");
    kvc_jw_int(&w, (int)eng->cfg.dp_rank);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)eng->epoch);
    kvc_jw_key(&w, "remote_instance");
    kvc_jw_str(&w, num);
    kvc_jw_key(&w, "remote_tp_rank");
    kvc_jw_int(&w, (int)eng->cfg.tp_rank);
    if (x->accepted != 0) {
        double hold = eng->cfg.defer_timeout * 1000.0;

        snprintf(num, sizeof(num), "%llu", (unsigned long long)x->accepted);
        kvc_jw_key(&w, "remote_accepted");
        kvc_jw_str(&w, num);
        /* How long from then the blocks stay held (kvc_read_hold). */
        kvc_jw_key(&w, "remote_hold_ms");
        kvc_jw_int(&w, hold >= 4294967295.0 ? (int64_t)4294967295
                                            : (int64_t)hold);
    }
    kvc_jw_key(&w, "remote_hosts");
    kvc_jw_open(&w, '[');
    for (size_t i = 0; i < eng->cfg.num_node_hosts; i++) {
        kvc_jw_str(&w, eng->cfg.node_hosts[i]);
    }
    kvc_jw_close(&w, ']');
    kvc_jw_close(&w, '}');
    return kvc_jw_take(&w);
}

kvx_status_t kvc_xfer_publish(struct kvx_engine *eng, kvc_xfer_t *x,
                              char *resp, char **response_p)
{
    char         tid[KVX_ID_MAX];
    kvx_status_t st;

    snprintf(tid, sizeof(tid), "%s", x->transfer_id);
    pthread_mutex_lock(&eng->lock);
    st = kvc_xfer_insert(eng, x);
    if (st == KVX_OK) {
        kvc_early_replay(eng, tid); /* may finish and free x */
    }
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        free(resp);
        kvc_xfer_free(x);
        return st;
    }
    *response_p = resp;
    return KVX_OK;
}

void kvc_event_push(struct kvx_engine *eng, kvx_event_type_t type,
                    kvx_status_t status, kvc_xfer_t *x,
                    const char *reason, int with_blocks)
{
    kvc_event_node_t *n;

    kvc_unexpose(eng, x);
    n = calloc(1, sizeof(*n));

    if (n == NULL) {
        kvc_log_error("KVX-EVENT-LOST", "transfer %s: event lost (no memory)",
                      x->transfer_id);
        return;
    }
    if (type == KVX_EVENT_FAILED && x->is_producer && x->write) {
        kvc_idset_add(&eng->failed, x->transfer_id);
    }
    n->ev.type   = type;
    n->ev.status = status;
    snprintf(n->ev.transfer_id, sizeof(n->ev.transfer_id), "%s",
             x->transfer_id);
    snprintf(n->ev.request_id, sizeof(n->ev.request_id), "%s",
             x->request_id);
    snprintf(n->ev.reason, sizeof(n->ev.reason), "%s", reason ? reason : "");
    if (with_blocks && x->nlocal > 0) {
        n->ev.block_ids = malloc(x->nlocal * sizeof(uint64_t));
        if (n->ev.block_ids != NULL) {
            memcpy(n->ev.block_ids, x->local_ids, x->nlocal * sizeof(uint64_t));
            n->ev.num_block_ids = x->nlocal;
        }
    }
    if (eng->ev_tail != NULL) {
        eng->ev_tail->next = n;
    } else {
        eng->ev_head = n;
        kvc_evfd_signal(eng); /* ABI 1.3 event_fd: queue became non-empty */
    }
    eng->ev_tail = n;
    eng->nevents++;
    kvc_wake(eng);
}

/* --- caller-driven waits ------------------------------------------------- */

/* A wait drives the data plane itself (kvt drive_*: the completion is seen
 * on the waiting thread, with no hand-off from the progress thread) while
 * passes keep finding work, and sleeps on eng->cond once they have been
 * idle for progress_drive_us; a wake-up drives again. A pass refused because
 * another thread holds it has yielded the CPU to that thread (kvu_drive). */
typedef struct kvc_drive {
    int      on;        /* between drive_begin and drive_end */
    int      idle;      /* idle for progress_drive_us: sleep next */
    uint64_t last_busy; /* last pass with activity (kvc_now_us) */
} kvc_drive_t;

/* kvc_wait_step: one step of a wait (eng->lock held; dropped meanwhile). */
static void kvc_wait_step(struct kvx_engine *eng, kvc_drive_t *d,
                          uint64_t deadline)
{
    const kvt_data_ops_t *ops = KVD(eng);
    uint64_t              now;
    int                   n;

    if (!eng->drive_waits || ops->drive == NULL || eng->ucx == NULL ||
        d->idle) {
        kvc_wait_until(eng, deadline);
        d->idle = 0;
        return;
    }
    if (!d->on) {
        ops->drive_begin(eng->ucx);
        d->on        = 1;
        d->last_busy = kvc_now_us(eng);
    }
    pthread_mutex_unlock(&eng->lock); /* completion callbacks take it */
    n = ops->drive(eng->ucx);
    pthread_mutex_lock(&eng->lock);
    now = kvc_now_us(eng);
    if (n > 0) {
        d->last_busy = now;
    } else if (now - d->last_busy >= eng->cfg.progress_drive_us) {
        ops->drive_end(eng->ucx, 0); /* the progress thread takes over */
        d->on   = 0;
        d->idle = 1;
    }
}

static void kvc_wait_end(struct kvx_engine *eng, kvc_drive_t *d)
{
    if (d->on) {
        KVD(eng)->drive_end(eng->ucx, 1); /* its next wait comes soon */
        d->on = 0;
    }
}

kvx_status_t kvc_events_wait(struct kvx_engine *eng, int64_t timeout_ms)
{
    uint64_t     deadline = kvc_wait_deadline(eng, timeout_ms);
    kvx_status_t st       = KVX_OK;
    kvc_drive_t  d        = {0};

    pthread_mutex_lock(&eng->lock);
    while (eng->ev_head == NULL) {
        if (atomic_load(&eng->destroying)) {
            st = kvc_error(KVX_ERR_CANCELED, "wait_events: engine_destroy "
                           "began");
            break;
        }
        if (kvc_now_us(eng) >= deadline) {
            st = kvc_error(KVX_ERR_TIMEOUT, "wait_events: no event within "
                           "%lld ms", (long long)timeout_ms);
            break;
        }
        kvc_wait_step(eng, &d, deadline);
    }
    kvc_wait_end(eng, &d);
    pthread_mutex_unlock(&eng->lock);
    if (st == KVX_OK) {
        kvc_error_clear(); /* nothing a driven callback said is ours */
    }
    return st;
}

/* --- waits -------------------------------------------------------------- */

static kvx_status_t kvc_xfer_poll(struct kvx_engine *eng, const char *tid,
                                  int64_t layer, uint64_t *deadline_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, tid);

    if (x == NULL) {
        return kvc_error(KVX_ERR_NOT_FOUND, "transfer_id '%s': %s", tid,
                         kvc_idset_contains(&eng->terminal, tid)
                             ? "finished and its event was already consumed"
                             : "no such transfer on this rank");
    }
    if (x->is_producer) {
        return kvc_error(KVX_ERR_BAD_STATE, "transfer_id '%s': waits are for "
                         "the consumer side", tid);
    }
    if (layer >= (int64_t)eng->nlayers) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %lld: must be < %zu",
                         (long long)layer, eng->nlayers);
    }
    if (*deadline_p == 0) {
        *deadline_p = x->deadline_us + 1000000u;
    }
    if (layer >= 0 && x->ops != NULL &&
        (x->write ||
         (x->status == KVX_OK && x->holdq_mask == 0 &&
          (x->hold_end_us == 0 || kvc_now_us(eng) < x->hold_end_us)))) {
        /* (READ: a layer's bytes count only while x is healthy, every other
         * P rank asked confirmed its hold, and the hold has not ended: its
         * gets completed before; else the transfer's end decides) */
        uint32_t ns = kvc_xfer_nsrc(x), k;

        for (k = 0; k < ns; k++) {
            const kvc_layer_op_t *lop = &x->ops[(size_t)layer * ns + k];

            if (!lop->done || lop->status != KVX_OK) {
                break;
            }
        }
        if (k == ns) {
            return KVX_OK; /* every part of the layer has landed */
        }
    }
    if (x->state == KVC_XFER_DONE) {
        return KVX_OK;
    }
    if (x->state == KVC_XFER_FAILED) {
        return kvc_error(x->status, "transfer %s: %s", tid, x->reason);
    }
    return KVX_INPROGRESS;
}

kvx_status_t kvc_xfer_wait(struct kvx_engine *eng, const char *tid,
                           int64_t layer, int64_t timeout_ms)
{
    uint64_t     deadline = timeout_ms >= 0
                                ? kvc_wait_deadline(eng, timeout_ms)
                                : 0;
    kvx_status_t st;
    kvc_drive_t  d = {0};

    pthread_mutex_lock(&eng->lock);
    while ((st = kvc_xfer_poll(eng, tid, layer, &deadline)) ==
           KVX_INPROGRESS) {
        if (atomic_load(&eng->destroying)) {
            st = kvc_error(KVX_ERR_CANCELED, "transfer %s: engine_destroy "
                           "began", tid);
            break;
        }
        if (kvc_now_us(eng) >= deadline) {
            st = kvc_error(KVX_ERR_TIMEOUT, "transfer %s: wait timed out",
                           tid);
            break;
        }
        kvc_wait_step(eng, &d, deadline);
    }
    kvc_wait_end(eng, &d);
    pthread_mutex_unlock(&eng->lock);
    if (st == KVX_OK) {
        kvc_error_clear(); /* nothing a driven callback said is ours */
    }
    return st;
}
