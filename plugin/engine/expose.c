/*
 * expose.c - which local blocks a peer may read or write right now, per
 * transfer.
 *
 * A transport that serves a peer's get or put itself (kvxfer's own active
 * messages, transports/ucx) asks kvc_expo_authorize before it touches
 * memory, with the tag the origin's op carried (kvc_xfer_tag: a hash of the
 * transfer id, the same on both sides): every byte must lie in a transfer
 * unit (K or V) of a block that the live transfer of that tag exposes.
 * READ: a P transfer exposes its blocks from producer_request until its
 * FINISHED_SENDING / FAILED event (the framework may reuse them then);
 * WRITE: a D transfer exposes its destination blocks from consumer_request
 * until its terminal event. So a peer reading for one transfer never gets
 * the blocks of another, and a transfer that ended (P's defer_timeout, then
 * its blocks reused by a new transfer) is never served again.
 *
 * Each transfer is also bound to the peer hosts it serves: WRITE, the hosts
 * of the P ranks D's request maps to (rel[]); READ, with
 * read_bind_decode_host, the decode host its request id names (vLLM's proxy
 * format, "___decode_addr_..."; not by default: the ranks of a decode
 * instance spread over several hosts read from P ranks whose request id
 * names only the first host, and P learns no other). A request
 * carries the session its origin got in its handshake reply, a keyed hash
 * of the address the handshake came from (kvc_host_session, key random per
 * engine; handshake.c), and is served only when that session is one of a
 * bound host: a peer that passed the handshake cannot touch the blocks of a
 * transfer bound to another host even when it knows the transfer id and
 * block ids. A transfer whose hosts are not IP literals here (host names,
 * or a READ request id in another format) is bound to no session: any
 * session is served, as before.
 *
 * Answers: KVX_OK; KVX_ERR_NOT_EXPOSED when no transfer of the tag is live
 * and none ended recently (READ: D's gets may reach a P rank before its
 * producer_request, SPEC §7: D retries until its deadline, mode_read.c);
 * KVX_ERR_UNTRUSTED_PEER when live transfers of the tag admit the range but
 * are bound to other sessions (final); KVX_ERR_OUT_OF_BOUNDS otherwise
 * (final).
 *
 * Counted puts: each live transfer counts the bytes of the puts it
 * admitted (put_bytes). The transport copies an admitted put before its
 * handler returns, on the progress owner, and hands notices to the engine
 * on the progress owner after that; so a count read there
 * (kvc_expo_put_bytes: a WRITE D checking a counted notice,
 * mode_write_d.c) holds only bytes that landed.
 *
 * Limits: a transfer id must not be reused while a peer may still ask for
 * the old transfer (an ended id is remembered, KVC_EXPO_ENDED of them: an
 * early get of a reused id is refused for good instead of retried); the
 * check and the copy that follows it are not atomic (a get copied, or a
 * put written, microseconds after the transfer ended on another thread).
 *
 * Locking: the transport calls in from its progress owner with its own locks
 * held, so expo.lock is a leaf: taken under eng->lock (expose, unexpose,
 * stats) and under the transport's locks (authorize), never the other way
 * round; no other lock is taken while it is held (kvc_expose may allocate
 * and log under it).
 */
#include "engine.h"
#include "siphash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvc_expo_init(kvc_expo_t *e)
{
    memset(e, 0, sizeof(*e));
    pthread_mutex_init(&e->lock, NULL);
}

void kvc_expo_fini(kvc_expo_t *e)
{
    for (size_t b = 0; b < KVC_EXPO_BUCKETS; b++) {
        while (e->live[b] != NULL) {
            kvc_expo_xfer_t *t = e->live[b];

            e->live[b] = t->next;
            free(t->puts);
            free(t);
        }
    }
    free(e->layers);
    pthread_mutex_destroy(&e->lock);
}

/* kvc_expo_sync: the layer table follows eng->layers (registration happens
 * before transfers; a later one is picked up at the next exposure).
 * expo.lock held. 0, or -1 without memory. */
static int kvc_expo_sync(struct kvx_engine *eng, kvc_expo_t *e)
{
    kvc_expo_layer_t *l;

    if (e->nlayers == eng->nlayers) {
        return 0;
    }
    l = calloc(eng->nlayers ? eng->nlayers : 1, sizeof(*l));
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
    return 0;
}

/* kvc_expo_wanted: does x open blocks to peers (P READ, D WRITE)? */
static int kvc_expo_wanted(const kvc_xfer_t *x)
{
    return x->parent == NULL &&
           ((x->is_producer && !x->write) || (!x->is_producer && x->write));
}

int kvc_expo_bound_host(const struct kvx_engine *eng, const kvc_xfer_t *x,
                        char *host, size_t len)
{
    kvc_peer_addr_t a;

    if (!eng->cfg.read_bind_decode_host) {
        return -1;
    }
    if (kvc_reqid_parse(x->request_id, 0, &a) != KVX_OK) {
        kvc_error_clear();
        return -1;
    }
    snprintf(host, len, "%s", a.host);
    return 0;
}

/* kvc_expo_bind: t's sessions, from the hosts x is bound to (nsess 0 when
 * none is known, or one of them is no IP literal: then 1 is returned, the
 * transfer is open to any session). */
static int kvc_expo_bind(const struct kvx_engine *eng, const kvc_expo_t *e,
                         const kvc_xfer_t *x, kvc_expo_xfer_t *t)
{
    const char *hosts[KVC_RANKMAP_MAX];
    char        dhost[KVC_HOST_MAX];
    uint32_t    n = 0;

    t->nsess = 0;
    if (x->is_producer) {
        if (kvc_expo_bound_host(eng, x, dhost, sizeof(dhost)) == 0) {
            hosts[n++] = dhost;
        }
    } else {
        for (uint32_t k = 0; k < x->nrel && k < KVC_RANKMAP_MAX; k++) {
            hosts[n++] = x->rel[k]->host;
        }
    }
    for (uint32_t k = 0; k < n; k++) {
        uint64_t s = kvc_host_session(e->key, hosts[k], 0);
        uint32_t j = 0;

        if (s == 0) {
            t->nsess = 0; /* a host name: cannot tell, bound to none */
            return 1;
        }
        while (j < t->nsess && t->sess[j] != s) {
            j++;
        }
        if (j == t->nsess) { /* n <= KVC_RANKMAP_MAX == KVC_EXPO_SESS */
            t->sess[t->nsess++] = s;
        }
    }
    return 0;
}

/* kvc_expo_presize: the set of counted puts (kvc_expo_count_put) sized
 * once here, from an estimate of the puts to come (one per block and
 * layer, within [32, 1024]), so that the first puts of a transfer do not
 * allocate on the progress owner; it still grows if more come. Without
 * memory the set starts empty, as before. */
static void kvc_expo_presize(kvc_expo_xfer_t *t, uint64_t est)
{
    uint32_t cap = 64;

    est = est < 32 ? 32 : est > 1024 ? 1024 : est;
    while (cap < 2 * est) {
        cap *= 2;
    }
    if ((t->puts = calloc(cap, sizeof(*t->puts))) != NULL) {
        t->cap = cap;
    }
}

static int kvc_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

void kvc_expose(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_expo_t      *e = &eng->expo;
    kvc_expo_xfer_t *t;
    uint64_t         tag;
    int              unbound = 0;

    if (x->exposed || !kvc_expo_wanted(x)) {
        return;
    }
    tag = kvc_xfer_tag(x->transfer_id);
    t   = malloc(sizeof(*t) + x->nlocal * sizeof(uint64_t));
    if (t != NULL) { /* e->key is set once, at creation */
        t->put_bytes = 0;
        t->puts      = NULL;
        t->nputs     = 0;
        t->cap       = 0;
        t->puts_full = 0;
        unbound      = kvc_expo_bind(eng, e, x, t);
        if (x->write) { /* D: puts will come; see kvc_expo_presize */
            kvc_expo_presize(t, (uint64_t)x->nlocal * eng->nlayers);
        }
    }
    pthread_mutex_lock(&e->lock);
    if (unbound && e->unbound++ == 0) {
        kvc_log_warn("KVX-EXPOSE", "transfer %s: a peer host it names is "
                     "not an IP address, so its blocks are open to any "
                     "peer that passed the handshake (counted in stats "
                     "data_unbound; name peers by address to bind them)",
                     x->transfer_id);
    }
    if (t != NULL && kvc_expo_sync(eng, e) == 0) {
        t->tag   = tag;
        t->owner = x;
        t->n     = x->nlocal;
        if (x->nlocal > 0) { /* local_ids is NULL for none */
            memcpy(t->ids, x->local_ids, x->nlocal * sizeof(uint64_t));
        }
        qsort(t->ids, t->n, sizeof(uint64_t), kvc_u64_cmp);
        t->next = e->live[tag % KVC_EXPO_BUCKETS];
        e->live[tag % KVC_EXPO_BUCKETS] = t;
        x->exposed = 1;
        t          = NULL;
    } else {
        /* Not exposed: peers' software gets/puts of x are refused (as not
         * exposed yet) and x fails at its deadline; said loudly. */
        kvc_log_error("KVX-EXPOSE", "transfer %s: no memory to expose its "
                      "blocks", x->transfer_id);
    }
    pthread_mutex_unlock(&e->lock);
    if (t != NULL) {
        free(t->puts);
        free(t);
    }
}

void kvc_unexpose(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_expo_t       *e = &eng->expo;
    uint64_t          tag;
    kvc_expo_xfer_t **pp;

    if (!x->exposed) {
        return;
    }
    tag = kvc_xfer_tag(x->transfer_id);
    pthread_mutex_lock(&e->lock);
    for (pp = &e->live[tag % KVC_EXPO_BUCKETS]; *pp != NULL;
         pp = &(*pp)->next) {
        if ((*pp)->owner == x) { /* not by tag: two ids may collide */
            kvc_expo_xfer_t *t = *pp;

            *pp = t->next;
            free(t->puts);
            free(t);
            break;
        }
    }
    /* Remembered (bounded ring): later requests of this tag are refused
     * for good instead of retried. */
    e->ended[e->nended++ % KVC_EXPO_ENDED] = tag;
    x->exposed = 0;
    pthread_mutex_unlock(&e->lock);
}

uint64_t kvc_expo_put_bytes(struct kvx_engine *eng, const kvc_xfer_t *x)
{
    kvc_expo_t      *e = &eng->expo;
    uint64_t         tag, n = 0;
    kvc_expo_xfer_t *t;

    if (!x->exposed) {
        return 0;
    }
    tag = kvc_xfer_tag(x->transfer_id);
    pthread_mutex_lock(&e->lock);
    for (t = e->live[tag % KVC_EXPO_BUCKETS]; t != NULL; t = t->next) {
        if (t->owner == x) {
            n = t->puts_full ? 0 : t->put_bytes;
            break;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return n;
}

/* kvc_expo_count_put: an admitted put of len bytes at addr counts once
 * per start address (expo.lock held): a replayed put (a captured one sent
 * again, mac and all) writes the same bytes again but adds nothing, so it
 * cannot fill a counted notice's count ahead of the puts still on their
 * way. Past KVC_EXPO_PUTS_MAX distinct puts (or without memory) the
 * transfer is no longer counted: its counted notice then waits for the
 * notice after P's flush. */
static void kvc_expo_count_put(kvc_expo_xfer_t *t, uint64_t addr,
                               uint64_t len)
{
    uint32_t i;

    if (t->puts_full) {
        return;
    }
    if (2 * (t->nputs + 1) > t->cap) {
        uint32_t  ncap = t->cap ? 2 * t->cap : 64;
        uint64_t *n;

        if (ncap > 2 * KVC_EXPO_PUTS_MAX ||
            (n = calloc(ncap, sizeof(*n))) == NULL) {
            t->puts_full = 1;
            return;
        }
        for (uint32_t j = 0; j < t->cap; j++) {
            if (t->puts[j] != 0) {
                i = (uint32_t)((t->puts[j] * UINT64_C(0x9e3779b97f4a7c15)) >>
                               32) & (ncap - 1);
                while (n[i] != 0) {
                    i = (i + 1) & (ncap - 1);
                }
                n[i] = t->puts[j];
            }
        }
        free(t->puts);
        t->puts = n;
        t->cap  = ncap;
    }
    i = (uint32_t)((addr * UINT64_C(0x9e3779b97f4a7c15)) >> 32) &
        (t->cap - 1);
    while (t->puts[i] != 0) {
        if (t->puts[i] == addr) {
            return; /* counted before */
        }
        i = (i + 1) & (t->cap - 1);
    }
    t->puts[i] = addr; /* never 0: inside a registration */
    t->nputs++;
    t->put_bytes += len;
}

static int kvc_expo_block_ok(void *arg, uint64_t block)
{
    const kvc_expo_xfer_t *t = arg;

    return bsearch(&block, t->ids, t->n, sizeof(uint64_t), kvc_u64_cmp) !=
           NULL;
}

/* kvc_expo_ended: tag ended recently (expo.lock held). */
static int kvc_expo_ended(const kvc_expo_t *e, uint64_t tag)
{
    size_t n = e->nended < KVC_EXPO_ENDED ? e->nended : KVC_EXPO_ENDED;

    for (size_t i = 0; i < n; i++) {
        if (e->ended[i] == tag) {
            return 1;
        }
    }
    return 0;
}

/* kvc_expo_mac_ok: was the request (mac over tag, nonce, addr, len,
 * is_put) made with the session of one of t's hosts? */
static int kvc_expo_mac_ok(const kvc_expo_xfer_t *t, uint64_t mac,
                           uint64_t tag, uint64_t nonce, uint64_t addr,
                           uint64_t len, int is_put)
{
    for (uint32_t j = 0; j < t->nsess; j++) {
        if (kvc_req_mac(t->sess[j], tag, nonce, addr, len, is_put) == mac) {
            return 1;
        }
    }
    return t->nsess == 0;
}

kvx_status_t kvc_expo_authorize(void *arg, uint64_t tag, uint64_t mac,
                                uint64_t nonce, uint64_t addr, uint64_t len,
                                int is_put)
{
    struct kvx_engine *eng = arg;
    kvc_expo_t        *e   = &eng->expo;
    kvc_expo_xfer_t   *t;
    kvx_status_t       st    = KVX_ERR_OUT_OF_BOUNDS;
    int                found = 0, other = 0;

    /* The transport checked the access of the role; is_put is only part
     * of what the mac covers. */
    pthread_mutex_lock(&e->lock);
    /* Every live transfer of the tag (two ids may hash alike) may admit. */
    for (t = e->live[tag % KVC_EXPO_BUCKETS]; t != NULL && st != KVX_OK;
         t = t->next) {
        if (t->tag != tag) {
            continue;
        }
        found = 1;
        for (size_t i = 0; i < e->nlayers && st != KVX_OK; i++) {
            const kvc_expo_layer_t *l = &e->layers[i];

            if (addr >= l->base && addr - l->base < l->len &&
                len <= l->len - (addr - l->base) &&
                kvc_geom_cover(&l->geom, addr - l->base, len,
                               kvc_expo_block_ok, t)) {
                if (kvc_expo_mac_ok(t, mac, tag, nonce, addr, len,
                                    is_put)) {
                    st = KVX_OK;
                    if (is_put) {
                        kvc_expo_count_put(t, addr, len);
                    }
                } else {
                    other = 1; /* its blocks, another peer's transfer */
                }
            }
        }
    }
    if (!found) {
        st = tag != 0 && !kvc_expo_ended(e, tag) ? KVX_ERR_NOT_EXPOSED
                                                 : KVX_ERR_OUT_OF_BOUNDS;
    } else if (st != KVX_OK && other) {
        st = KVX_ERR_UNTRUSTED_PEER;
    }
    if (st != KVX_OK) {
        e->refused[st == KVX_ERR_NOT_EXPOSED     ? 1
                   : st == KVX_ERR_UNTRUSTED_PEER ? 2
                                                   : 0]++;
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}
