/*
 * expose.c - which local blocks peers may read or write right now.
 *
 * A transport that serves a peer's get or put itself (kvxfer's own active
 * messages, transports/ucx) asks kvc_expo_authorize before it touches
 * memory: every byte must lie in a unit of a block that a live transfer
 * exposes. READ: a P transfer exposes its blocks from producer_request until
 * its FINISHED_SENDING / FAILED event (the framework may reuse them then);
 * WRITE: a D transfer exposes its destination blocks from consumer_request
 * until its terminal event. Blocks of several transfers are counted.
 *
 * Locking: the transport calls in from its progress owner with its own locks
 * held, so expo.lock is a leaf: taken under eng->lock (expose, unexpose)
 * and under the transport's locks (authorize), never the other way round;
 * no other lock is taken while it is held (kvc_expose may allocate and log
 * under it).
 *
 * In READ, D's gets may reach a P rank before that rank's producer_request
 * (SPEC §7): they are answered "not exposed" and D retries them until its
 * deadline (mode_read.c). Without producer_request nothing of P is ever
 * served.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

void kvc_expo_init(kvc_expo_t *e)
{
    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->lock, NULL);
}

void kvc_expo_fini(kvc_expo_t *e)
{
    free(e->cnt);
    free(e->layers);
    pthread_mutex_destroy(&e->lock);
}

/* kvc_expo_sync: the layer table and counter array follow eng->layers
 * (registration happens before transfers; a later one is picked up at the
 * next exposure). expo.lock held. 0, or -1 without memory. */
static int kvc_expo_sync(struct kvx_engine *eng, kvc_expo_t *e)
{
    uint64_t nb = 0;

    if (e->nlayers != eng->nlayers) {
        kvc_expo_layer_t *l = calloc(eng->nlayers ? eng->nlayers : 1,
                                     sizeof(*l));

        if (l == NULL) {
            return -1;
        }
        for (size_t i = 0; i < eng->nlayers; i++) {
            l[i].base = (uint64_t)(uintptr_t)eng->layers[i].base;
            l[i].len  = eng->layers[i].length;
            l[i].geom = eng->layers[i].geom;
        }
        free(e->layers);
        e->layers  = l;
        e->nlayers = eng->nlayers;
    }
    for (size_t i = 0; i < e->nlayers; i++) {
        nb = e->layers[i].geom.num_blocks > nb ? e->layers[i].geom.num_blocks
                                               : nb;
    }
    if (nb > e->nblocks) {
        uint32_t *c = realloc(e->cnt, nb * sizeof(*c));

        if (c == NULL) {
            return -1;
        }
        memset(c + e->nblocks, 0, (nb - e->nblocks) * sizeof(*c));
        e->cnt     = c;
        e->nblocks = nb;
    }
    return 0;
}

/* kvc_expo_wanted: does x open blocks to peers (P READ, D WRITE)? */
static int kvc_expo_wanted(const kvc_xfer_t *x)
{
    return x->parent == NULL &&
           ((x->is_producer && !x->write) || (!x->is_producer && x->write));
}

void kvc_expose(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_expo_t *e = &eng->expo;

    if (x->exposed || !kvc_expo_wanted(x) || x->nlocal == 0) {
        return;
    }
    pthread_mutex_lock(&e->lock);
    if (kvc_expo_sync(eng, e) == 0) {
        for (size_t i = 0; i < x->nlocal; i++) {
            if (x->local_ids[i] < e->nblocks) {
                e->cnt[x->local_ids[i]]++;
            }
        }
        x->exposed = 1;
    } else {
        /* Not exposed: peers' software gets/puts of x are refused and x
         * fails at its deadline; said loudly. */
        kvc_log_error("KVX-EXPOSE", "transfer %s: no memory to expose its "
                      "blocks", x->transfer_id);
    }
    pthread_mutex_unlock(&e->lock);
}

void kvc_unexpose(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_expo_t *e = &eng->expo;

    if (!x->exposed) {
        return;
    }
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < x->nlocal; i++) {
        if (x->local_ids[i] < e->nblocks && e->cnt[x->local_ids[i]] > 0) {
            e->cnt[x->local_ids[i]]--;
        }
    }
    x->exposed = 0;
    pthread_mutex_unlock(&e->lock);
}

static int kvc_expo_block_ok(void *arg, uint64_t block)
{
    const kvc_expo_t *e = arg;

    return block < e->nblocks && e->cnt[block] > 0;
}

int kvc_expo_authorize(void *arg, uint64_t addr, uint64_t len, int is_put)
{
    struct kvx_engine *eng = arg;
    kvc_expo_t        *e   = &eng->expo;
    int                ok  = 0;

    (void)is_put; /* the transport checked the access of the role */
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < e->nlayers && !ok; i++) {
        const kvc_expo_layer_t *l = &e->layers[i];

        if (addr >= l->base && addr - l->base < l->len &&
            len <= l->len - (addr - l->base)) {
            ok = kvc_geom_cover(&l->geom, addr - l->base, len,
                                kvc_expo_block_ok, e);
        }
    }
    if (!ok) {
        e->refused++;
    }
    pthread_mutex_unlock(&e->lock);
    return ok;
}
