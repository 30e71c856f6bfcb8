/*
 * engine.c - engine lifetime, layers, listeners, peers (handshake and
 * control-message sending), transfer table and events.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "clock.h"
#include "proxy.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t kvc_now_us(const struct kvx_engine *eng)
{
    return eng->env.clock.now_us(eng->env.clock.arg);
}

uint64_t kvc_deadline_us(const struct kvx_engine *eng, double seconds)
{
    return kvc_now_us(eng) + (uint64_t)(seconds * 1e6);
}

void kvc_wait_until(struct kvx_engine *eng, uint64_t deadline_us)
{
    eng->env.clock.wait(eng->env.clock.arg, &eng->cond, &eng->lock,
                        deadline_us);
}

/* --- transfers and events ----------------------------------------------- */

static size_t kvc_xfer_bucket(const char *tid)
{
    uint64_t h = 1469598103934665603ull;

    for (const unsigned char *p = (const unsigned char *)tid; *p; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return (size_t)(h % KVC_XFER_BUCKETS);
}

kvc_xfer_t *kvc_xfer_find(struct kvx_engine *eng, const char *tid)
{
    for (kvc_xfer_t *x = eng->xfers[kvc_xfer_bucket(tid)]; x; x = x->hnext) {
        if (strcmp(x->transfer_id, tid) == 0) {
            return x;
        }
    }
    return NULL;
}

kvx_status_t kvc_xfer_insert(struct kvx_engine *eng, kvc_xfer_t *x)
{
    size_t b = kvc_xfer_bucket(x->transfer_id);

    if (kvc_xfer_find(eng, x->transfer_id) != NULL) {
        return kvc_error(KVX_ERR_EXISTS,
                         "transfer_id '%s': a transfer with this id is "
                         "already active on this rank", x->transfer_id);
    }
    x->hnext        = eng->xfers[b];
    eng->xfers[b]   = x;
    eng->nxfers++;
    return KVX_OK;
}

void kvc_xfer_remove(struct kvx_engine *eng, kvc_xfer_t *x)
{
    for (kvc_xfer_t **pp = &eng->xfers[kvc_xfer_bucket(x->transfer_id)];
         *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == x) {
            *pp = x->hnext;
            eng->nxfers--;
            return;
        }
    }
}

void kvc_xfer_free(kvc_xfer_t *x)
{
    if (x == NULL) {
        return;
    }
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

void kvc_event_push(struct kvx_engine *eng, kvx_event_type_t type,
                    kvx_status_t status, const kvc_xfer_t *x,
                    const char *reason, int with_blocks)
{
    kvc_event_node_t *n = calloc(1, sizeof(*n));

    if (n == NULL) {
        kvc_log_error("KVX-EVENT-LOST", "transfer %s: event lost (no memory)",
                      x->transfer_id);
        return;
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
    }
    eng->ev_tail = n;
    eng->nevents++;
    pthread_cond_broadcast(&eng->cond);
}

/* --- peers -------------------------------------------------------------- */

/* kvc_peer_conn_t: what a READY peer holds in UCX, detached from the peer
 * under the engine lock so that exactly one thread releases it. */
typedef struct kvc_peer_conn {
    kvc_hs_meta_t meta;
    kvt_ep_t     *ep;
    kvt_rkey_t  **rkeys;
    int          *layer_map;
} kvc_peer_conn_t;

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
 * destroyed before the endpoint it was unpacked on). */
/* kvc_rkeys_destroy: layers of one region share one unpacked rkey
 * (kvc_peer_connect); each handle is destroyed once. */
static void kvc_rkeys_destroy(struct kvx_engine *eng, kvt_rkey_t **rkeys,
                              size_t n)
{
    for (size_t i = 0; rkeys != NULL && i < n; i++) {
        size_t k = 0;

        while (k < i && rkeys[k] != rkeys[i]) {
            k++;
        }
        if (k == i) {
            KVD(eng)->rkey_destroy(rkeys[i]);
        }
    }
}

static void kvc_peer_conn_free(struct kvx_engine *eng, kvc_peer_conn_t *c)
{
    kvc_rkeys_destroy(eng, c->rkeys, c->meta.num_layers);
    free(c->rkeys);
    free(c->layer_map);
    KVD(eng)->ep_close(c->ep);
    kvc_hs_fini(&c->meta);
}

static void kvc_peer_ep_error(void *arg, kvt_ep_t *ep, kvx_status_t status,
                              const char *reason)
{
    kvc_peer_t        *peer = arg;
    struct kvx_engine *eng  = peer->eng;

    pthread_mutex_lock(&eng->lock);
    if (peer->ep == ep && peer->state == KVC_PEER_READY) {
        kvc_log_warn("KVX-PEER-FAILED", "peer %s: %s", peer->name, reason);
        peer->state       = KVC_PEER_FAILED;
        peer->fail_status = status;
        snprintf(peer->fail_reason, sizeof(peer->fail_reason), "%s", reason);
        /* In-flight ops complete with errors once the endpoint is closed;
         * a later transfer handshakes afresh (new epoch, new rkeys). This
         * runs on the progress thread, where kvu_ep_close never waits. */
        kvc_peer_conn_t c;

        kvc_peer_detach(peer, &c);
        kvc_peer_conn_free(eng, &c);
    }
    pthread_mutex_unlock(&eng->lock);
}

void kvc_peer_parts(const struct kvx_engine *eng, const kvc_peer_t *peer,
                    uint32_t *idx_p, uint32_t *n_p, int *gather_p)
{
    kvc_rankmap_t m;

    *idx_p    = 0;
    *n_p      = 1;
    *gather_p = 0;
    if (!eng->cfg.read_mode && eng->cfg.is_producer) {
        /* WRITE, P tp = r x D tp, sharded: this P rank puts its heads into
         * part (tp_rank - read_rank) of its D rank's blocks. */
        if (kvc_rankmap(peer->tp_size, eng->cfg.tp_size, eng->replicated,
                        peer->tp_rank, &m) == KVX_OK && m.gather) {
            *n_p      = m.num_slices;
            *idx_p    = eng->cfg.tp_rank - m.read_rank;
            *gather_p = 2;
        } else if (kvc_rankmap(peer->tp_size, eng->cfg.tp_size,
                               eng->replicated, peer->tp_rank, &m) == KVX_OK &&
                   m.num_slices > 1) {
            /* D tp = q x P tp: this P rank puts head slice head_slice of
             * its heads into the D rank's whole blocks. */
            *n_p      = m.num_slices;
            *idx_p    = m.head_slice;
            *gather_p = 1;
        } else if (eng->replicated && peer->tp_size < eng->cfg.tp_size &&
                   eng->cfg.tp_size % peer->tp_size == 0) {
            /* Replicated heads, P tp = r x D tp: the r P ranks of a D rank
             * hold the same cache; only the first one puts it. */
            *n_p      = eng->cfg.tp_size / peer->tp_size;
            *idx_p    = eng->cfg.tp_rank % *n_p;
            *gather_p = 2;
        }
        return;
    }
    if (!eng->cfg.read_mode || eng->cfg.is_producer ||
        kvc_rankmap(eng->cfg.tp_size, peer->tp_size, eng->replicated,
                    eng->cfg.tp_rank, &m) != KVX_OK) {
        return;
    }
    *n_p      = m.num_slices;
    *gather_p = (int)m.gather;
    *idx_p    = m.gather ? peer->tp_rank - m.read_rank : m.head_slice;
}

/* Validates the peer's metadata against what we dialled and what we hold.
 * Called without the engine lock: layers are frozen after start(). */
static kvx_status_t kvc_peer_check_meta(kvc_peer_t *peer,
                                        const kvc_hs_meta_t *m, int *map)
{
    struct kvx_engine *eng = peer->eng;
    uint32_t           part, nparts;
    int                gather;

    kvc_peer_parts(eng, peer, &part, &nparts, &gather);
    (void)part;
    if (m->version != KVC_PROTO_VERSION) {
        return kvc_error(KVX_ERR_PEER_VERSION,
                         "peer %s: protocol version %u, this engine speaks %u",
                         peer->name, m->version, KVC_PROTO_VERSION);
    }
    if (m->is_producer == (uint32_t)eng->cfg.is_producer) {
        return kvc_error(KVX_ERR_HANDSHAKE,
                         "peer %s: is a %s like this engine", peer->name,
                         m->is_producer ? "kv_producer" : "kv_consumer");
    }
    if (m->tp_rank != peer->tp_rank || m->dp_rank != peer->dp_rank ||
        m->tp_size != peer->tp_size || m->dp_size != peer->dp_size) {
        return kvc_error(KVX_ERR_HANDSHAKE,
                         "peer %s: answered as dp %u/%u tp %u/%u but "
                         "dp %u/%u tp %u/%u was expected (port or host "
                         "resolution mismatch)", peer->name, m->dp_rank,
                         m->dp_size, m->tp_rank, m->tp_size, peer->dp_rank,
                         peer->dp_size, peer->tp_rank, peer->tp_size);
    }
    for (size_t i = 0; i < eng->nlayers; i++) {
        kvx_status_t st;

        map[i] = -1;
        for (size_t j = 0; j < m->num_layers; j++) {
            if (strcmp(m->layers[j].name, eng->layers[i].name) == 0) {
                map[i] = (int)j;
                break;
            }
        }
        if (map[i] < 0) {
            return kvc_error(KVX_ERR_PEER_INCOMPATIBLE,
                             "peer %s: has no layer named '%s'", peer->name,
                             eng->layers[i].name);
        }
        /* Sharded heads with another TP size: this rank reads a slice of
         * each P block's heads (D tp > P tp) or each P rank holds a part of
         * this rank's heads (D tp < P tp); key-only layers are replicated
         * and read whole. */
        if (nparts > 1 && !eng->layers[i].geom.key_only) {
            st = gather == 1
                     ? kvc_geom_gatherable(&eng->layers[i].geom,
                                           &m->layers[map[i]].geom, nparts)
                     : kvc_geom_sliceable(&eng->layers[i].geom,
                                          &m->layers[map[i]].geom, nparts);
        } else {
            st = kvc_geom_compatible(&eng->layers[i].geom,
                                     &m->layers[map[i]].geom);
        }
        if (st != KVX_OK) {
            return kvc_error(st, "peer %s: layer '%s': %s", peer->name,
                             eng->layers[i].name, kvc_last_error());
        }
    }
    if (m->num_layers != eng->nlayers) {
        return kvc_error(KVX_ERR_PEER_INCOMPATIBLE,
                         "peer %s: registers %zu layers, this engine %zu",
                         peer->name, m->num_layers, eng->nlayers);
    }
    return KVX_OK;
}

static kvx_status_t kvc_peer_check_lanes(kvc_peer_t *peer, kvt_ep_t *ep)
{
    const kvc_config_t *cfg = &peer->eng->cfg;
    const char         *tls = KVD(peer->eng)->ep_transports(ep);

    for (size_t i = 0; i < cfg->num_ucx_required_transports; i++) {
        if (strstr(tls, cfg->ucx_required_transports[i]) == NULL) {
            return kvc_error(KVX_ERR_TRANSPORT,
                             "peer %s: endpoint lanes '%s' do not include "
                             "required transport '%s' "
                             "(ucx_required_transports)", peer->name, tls,
                             cfg->ucx_required_transports[i]);
        }
    }
    return KVX_OK;
}

/* kvc_peer_rma_mode: how gets/puts to this peer really move (research/
 * ucx.md §0.1-0.3): over a hardware/transport RMA lane, as direct copies
 * into UCX-allocated shared memory, or emulated over active messages. */
static const char *kvc_peer_rma_mode(kvc_peer_t *peer, const kvc_hs_meta_t *m,
                                     kvt_ep_t *ep, kvt_rkey_t **rkeys)
{
    const struct kvx_engine *eng = peer->eng;

    if (KVD(eng)->ep_rma_emulated(ep)) {
        return "emulated";
    }
    if (!KVD(eng)->ep_rma_shm_only(ep)) {
        return "rma";
    }
    for (size_t j = 0; j < m->num_layers; j++) {
        if (KVD(eng)->rkey_local(rkeys[j], m->layers[j].base) == NULL) {
            return "emulated";
        }
    }
    return "direct-shm";
}

static kvx_status_t kvc_peer_connect(kvc_peer_t *peer, kvc_hs_meta_t *m,
                                     kvt_ep_t **ep_p, kvt_rkey_t ***rkeys_p)
{
    struct kvx_engine *eng = peer->eng;
    uint64_t     t0 = kvc_now_us(eng);
    kvt_rkey_t **rkeys;
    kvx_status_t st;

    /* The wire-up is not waited for: the first gets/puts queue behind it
     * in UCX (bounded by transfer_timeout) instead of the handshake paying
     * its round trips first. */
    st = KVD(eng)->ep_create(eng->ucx, m->worker_addr, m->worker_addr_len,
                       peer->name, kvc_peer_ep_error, peer, ep_p);
    if (st != KVX_OK) {
        return st;
    }
    peer->hs_us[1] = kvc_now_us(eng) - t0;
    t0             = kvc_now_us(eng);
    rkeys = calloc(m->num_layers ? m->num_layers : 1, sizeof(*rkeys));
    st    = rkeys ? kvc_peer_check_lanes(peer, *ep_p)
                  : kvc_error(KVX_ERR_NO_MEMORY, "rkeys: out of memory");
    for (size_t j = 0; st == KVX_OK && j < m->num_layers; j++) {
        size_t k = 0;

        /* Layers carved from one UCX-allocated region carry the same packed
         * rkey: unpack it once (one attachment of the peer's segment). */
        while (k < j && (m->layers[k].rkey_len != m->layers[j].rkey_len ||
                         memcmp(m->layers[k].rkey, m->layers[j].rkey,
                                m->layers[j].rkey_len) != 0)) {
            k++;
        }
        st = k < j ? KVX_OK
                   : KVD(eng)->rkey_unpack(*ep_p, m->layers[j].rkey,
                                     m->layers[j].rkey_len, &rkeys[j]);
        rkeys[j] = k < j ? rkeys[k] : rkeys[j];
    }
    if (st == KVX_OK) {
        const char *mode = kvc_peer_rma_mode(peer, m, *ep_p, rkeys);

        snprintf(peer->rma_mode, sizeof(peer->rma_mode), "%s", mode);
        peer->hs_us[2] = kvc_now_us(eng) - t0;

        if (strcmp(mode, "emulated") == 0) {
            kvc_log_warn("KVX-RMA-EMULATED",
                         "peer %s: one-sided ops are emulated over active "
                         "messages (lanes %s%s)", peer->name,
                         KVD(eng)->ep_transports(*ep_p),
                         KVD(eng)->ep_rma_shm_only(*ep_p)
                             ? "; the peer's memory is not UCX-allocated, "
                               "see alloc_region" : "");
        }
    }
    if (st != KVX_OK) {
        kvc_rkeys_destroy(peer->eng, rkeys, m->num_layers);
        free(rkeys);
        KVD(eng)->ep_close(*ep_p);
        *ep_p = NULL;
        return st;
    }
    *rkeys_p = rkeys;
    return KVX_OK;
}

/* kvc_peer_schedule hands the peer's service job to the progress owner
 * unless it is already queued; lock held. */
static void kvc_peer_schedule(kvc_peer_t *peer)
{
    struct kvx_engine *eng = peer->eng;

    if (peer->job_queued) {
        return;
    }
    peer->job_queued = 1;
    eng->jobs_queued++;
    KVD(eng)->defer(eng->ucx, &peer->job);
}

/* kvc_peer_hs_failed records a failed handshake; lock held. */
static void kvc_peer_hs_failed(kvc_peer_t *peer, kvx_status_t st,
                               const char *reason)
{
    struct kvx_engine *eng = peer->eng;

    peer->state       = KVC_PEER_FAILED;
    peer->fail_status = st;
    snprintf(peer->fail_reason, sizeof(peer->fail_reason), "%s", reason);
    kvc_log_warn("KVX-HANDSHAKE", "%s", peer->fail_reason);
    eng->stats.handshakes_failed++;
    kvc_read_peer_failed(eng, peer);
    kvc_write_peer_failed(eng, peer);
    pthread_cond_broadcast(&eng->cond);
}

/* kvc_hs_reply: the handshake reply (or its failure), on a control-plane
 * thread. It is processed on the progress owner (endpoint creation and
 * rkeys are data-plane calls). */
static void kvc_hs_reply(void *arg, kvx_status_t st, const char *reply,
                         size_t len, const char *err)
{
    kvc_peer_t        *peer = arg;
    struct kvx_engine *eng  = peer->eng;
    char              *copy = NULL;

    if (st == KVX_OK && (copy = malloc(len + 1)) == NULL) {
        st  = KVX_ERR_NO_MEMORY;
        err = "out of memory";
    }
    if (copy != NULL) {
        memcpy(copy, reply, len);
        copy[len] = '\0';
    }
    pthread_mutex_lock(&eng->lock);
    peer->hs_reply     = copy;
    peer->hs_reply_len = len;
    peer->hs_status    = st;
    snprintf(peer->hs_err, sizeof(peer->hs_err), "%s",
             err != NULL ? err : kvc_status_name(st));
    peer->hs_job_queued = 1;
    eng->jobs_queued++;
    KVD(eng)->defer(eng->ucx, &peer->hs_job);
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_peer_hs_start sends the handshake request; lock held, progress
 * owner. */
static void kvc_peer_hs_start(kvc_peer_t *peer)
{
    struct kvx_engine *eng = peer->eng;
    int    timeout_ms = (int)(eng->cfg.handshake_timeout * 1000.0);
    size_t len;
    char  *req;
    kvx_status_t st = KVX_OK;

    peer->want_handshake = 0;
    peer->state          = KVC_PEER_HANDSHAKING;
    peer->hs_t0          = kvc_now_us(eng);
    if (peer->hs_cli == NULL) {
        st = KVN(eng)->client_open(peer->host, peer->hs_port, 1,
                                   &peer->hs_cli);
    }
    req = st == KVX_OK ? kvc_hs_request_encode(&len) : NULL;
    if (st == KVX_OK && req == NULL) {
        st = kvc_error(KVX_ERR_NO_MEMORY, "handshake: out of memory");
    }
    if (st == KVX_OK) {
        st = KVN(eng)->client_post(peer->hs_cli, req, len, timeout_ms,
                                   kvc_hs_reply, peer);
    }
    free(req);
    if (st != KVX_OK) {
        char reason[KVX_REASON_MAX];

        snprintf(reason, sizeof(reason), "handshake with %s: %s",
                 peer->name, kvc_last_error());
        kvc_peer_hs_failed(peer, KVX_ERR_HANDSHAKE, reason);
    }
}

/* kvc_peer_hs_check decodes and checks the reply and connects; no lock
 * (peer is HANDSHAKING: nothing else touches its connection fields, and
 * layers are frozen after start()). */
static kvx_status_t kvc_peer_hs_check(kvc_peer_t *peer, kvc_hs_meta_t *m,
                                      int **map_p, kvt_ep_t **ep_p,
                                      kvt_rkey_t ***rkeys_p)
{
    struct kvx_engine *eng = peer->eng;
    char       reason[KVX_REASON_MAX];
    int        ok = 1, *map;
    const char *reply = peer->hs_reply;
    size_t      rlen  = peer->hs_reply_len;
    kvx_status_t st   = peer->hs_status;

    if (st != KVX_OK) {
        return kvc_error(st == KVX_ERR_TIMEOUT ? KVX_ERR_HANDSHAKE_TIMEOUT
                                               : KVX_ERR_HANDSHAKE,
                         "handshake with %s: %s (handshake_timeout %.3f s)",
                         peer->name, peer->hs_err,
                         eng->cfg.handshake_timeout);
    }
    /* Only an error reply starts with {"ok": parse the metadata once. */
    if (rlen >= 5 && memcmp(reply, "{\"ok\"", 5) == 0 &&
        kvc_reply_decode(reply, rlen, &ok, reason, sizeof(reason)) == KVX_OK &&
        !ok) {
        return kvc_error(KVX_ERR_HANDSHAKE, "handshake with %s: refused: %s",
                         peer->name, reason);
    }
    peer->hs_us[0] = kvc_now_us(eng) - peer->hs_t0;
    st = kvc_hs_decode(reply, rlen, m);
    if (st != KVX_OK) {
        return kvc_error(st, "handshake with %s: %s", peer->name,
                         kvc_last_error());
    }
    map = calloc(eng->nlayers ? eng->nlayers : 1, sizeof(int));
    st  = map ? kvc_peer_check_meta(peer, m, map)
              : kvc_error(KVX_ERR_NO_MEMORY, "handshake: out of memory");
    if (st == KVX_OK) {
        st = kvc_peer_connect(peer, m, ep_p, rkeys_p);
    }
    if (st != KVX_OK) {
        free(map);
        kvc_hs_fini(m);
        return st;
    }
    *map_p         = map;
    peer->hs_us[3] = kvc_now_us(eng) - peer->hs_t0;
    return KVX_OK;
}

/* kvc_peer_prefault maps the peer's directly attached segments into our
 * page tables after the handshake (not inside it, and outside the lock):
 * the first transfer then does not pay a page fault per page. Called and
 * returns with the engine lock held. */
static void kvc_peer_prefault(kvc_peer_t *peer)
{
    struct kvx_engine *eng = peer->eng;
    size_t  n   = peer->meta.num_layers;
    void  **ptr = calloc(n ? n : 1, sizeof(*ptr));
    size_t *len = calloc(n ? n : 1, sizeof(*len));

    for (size_t j = 0; ptr != NULL && len != NULL && j < n; j++) {
        ptr[j] = KVD(eng)->rkey_local(peer->rkeys[j],
                                      peer->meta.layers[j].base);
        len[j] = peer->meta.layers[j].length;
    }
    pthread_mutex_unlock(&eng->lock);
    for (size_t j = 0; ptr != NULL && len != NULL && j < n; j++) {
        KVD(eng)->prefault(ptr[j], len[j]);
    }
    free(ptr);
    free(len);
    pthread_mutex_lock(&eng->lock);
}

/* kvc_peer_hs_finish (job, progress owner): the handshake's outcome. */
static void kvc_peer_hs_finish(kvt_job_t *job)
{
    kvc_peer_t        *peer = job->arg;
    struct kvx_engine *eng  = peer->eng;
    kvc_hs_meta_t      m;
    kvt_ep_t          *ep    = NULL;
    kvt_rkey_t       **rkeys = NULL;
    int               *map   = NULL;
    kvx_status_t       st;

    memset(&m, 0, sizeof(m));
    pthread_mutex_lock(&eng->lock);
    st = eng->closing ? kvc_error(KVX_ERR_CANCELED, "peer %s: engine "
                                  "destroyed", peer->name)
                      : KVX_OK;
    pthread_mutex_unlock(&eng->lock);
    if (st == KVX_OK) {
        st = kvc_peer_hs_check(peer, &m, &map, &ep, &rkeys);
    }
    pthread_mutex_lock(&eng->lock);
    free(peer->hs_reply);
    peer->hs_reply      = NULL;
    peer->hs_job_queued = 0;
    eng->jobs_queued--;
    if (st == KVX_OK && eng->closing) {
        kvc_peer_conn_t c = {m, ep, rkeys, map};

        kvc_peer_conn_free(eng, &c);
        st = kvc_error(KVX_ERR_CANCELED, "peer %s: engine destroyed",
                       peer->name);
    }
    if (st != KVX_OK) {
        kvc_peer_hs_failed(peer, st, kvc_last_error());
        pthread_mutex_unlock(&eng->lock);
        return;
    }
    peer->meta      = m;
    peer->ep        = ep;
    peer->rkeys     = rkeys;
    peer->layer_map = map;
    peer->state     = KVC_PEER_READY;
    eng->stats.handshakes_ok++;
    memcpy(eng->stats.hs_last_us, peer->hs_us, sizeof(peer->hs_us));
    kvc_log_info("KVX-HANDSHAKE-OK", "peer %s: epoch %llu, %zu layers, %s; "
                 "%llu us (metadata %llu, endpoint %llu, rkeys %llu)",
                 peer->name, (unsigned long long)m.epoch, m.num_layers,
                 KVD(eng)->ep_transports(ep),
                 (unsigned long long)peer->hs_us[3],
                 (unsigned long long)peer->hs_us[0],
                 (unsigned long long)peer->hs_us[1],
                 (unsigned long long)peer->hs_us[2]);
    kvc_read_peer_ready(eng, peer);
    kvc_write_peer_ready(eng, peer);
    pthread_cond_broadcast(&eng->cond); /* kvc_engine_connect waiters */
    if (strcmp(peer->rma_mode, "direct-shm") == 0) {
        kvc_peer_prefault(peer);
    }
    pthread_mutex_unlock(&eng->lock);
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
    int                ok = 0;

    if (st == KVX_OK) {
        st = kvc_reply_decode(reply, rlen, &ok, reason, sizeof(reason));
        if (st != KVX_OK) {
            err = kvc_last_error();
        } else if (!ok) {
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
    eng->stats.tx_fail += st != KVX_OK || !ok;
    if (st == KVX_OK) {
        kvc_lat_add(&eng->stats.ctl_rtt, kvc_now_us(eng) - out->t_queued);
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
        peer->ctl_inflight--;
        kvc_log_warn("KVX-CTL-SEND", "%s to %s failed: %s", out->what,
                     peer->name, kvc_last_error());
        eng->stats.tx_msgs++;
        eng->stats.tx_fail++;
        kvc_ctlout_free(out);
    }
}

static int kvc_peer_can_post(const kvc_peer_t *peer)
{
    return peer->notify_cli != NULL && peer->ctl_inflight < KVC_CTL_INFLIGHT;
}

/* kvc_peer_drop_queue fails what is queued (lock held). */
static void kvc_peer_drop_queue(kvc_peer_t *peer, const char *why)
{
    struct kvx_engine *eng = peer->eng;

    while (peer->out_head != NULL) {
        kvc_ctlout_t *out = peer->out_head;

        peer->out_head = out->next;
        kvc_log_warn("KVX-CTL-SEND", "%s to %s failed: %s", out->what,
                     peer->name, why);
        eng->stats.tx_msgs++;
        eng->stats.tx_fail++;
        kvc_ctlout_free(out);
    }
    peer->out_tail = NULL;
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
                                  KVC_CTL_INFLIGHT, &peer->notify_cli) !=
            KVX_OK) {
            peer->notify_failed = 1;
            peer->notify_cli    = NULL;
        }
    }
    if (peer->notify_cli == NULL) {
        kvc_peer_drop_queue(peer, peer->notify_failed
                                      ? "cannot open the control channel"
                                      : "engine destroyed");
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

void kvc_peer_send(kvc_peer_t *peer, char *buf, size_t len, const char *what)
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
    snprintf(out->what, sizeof(out->what), "%s", what);
    if (peer->out_tail != NULL) {
        peer->out_tail->next = out;
    } else {
        peer->out_head = out;
    }
    peer->out_tail = out;
    /* From the progress owner (a transfer just completed: release,
     * write_done) straight out: no hop on the completion path. API callers
     * only queue (the send then stays off the framework's thread). */
    if (KVD(eng)->in_progress_thread(eng->ucx)) {
        kvc_peer_drain(peer);
        if (peer->out_head == NULL) {
            return;
        }
    }
    kvc_peer_schedule(peer);
}

void kvc_peer_want_handshake(kvc_peer_t *peer)
{
    if (peer->state == KVC_PEER_READY || peer->state == KVC_PEER_HANDSHAKING) {
        return;
    }
    peer->want_handshake = 1;
    kvc_peer_schedule(peer);
}

/* kvc_peers_disconnect force-closes every peer's endpoint: in-flight ops
 * then complete (as canceled) while transfers and peers still exist. Each
 * connection is detached under the lock (an endpoint error delivered
 * concurrently then finds nothing to release) and freed outside it
 * (ep_close may wait for that delivery). */
static void kvc_peers_disconnect(struct kvx_engine *eng)
{
    for (kvc_peer_t *p = eng->peers; p != NULL; p = p->next) {
        kvc_peer_conn_t c;

        pthread_mutex_lock(&eng->lock);
        p->state = KVC_PEER_FAILED;
        snprintf(p->fail_reason, sizeof(p->fail_reason), "engine destroyed");
        p->fail_status = KVX_ERR_CANCELED;
        kvc_peer_detach(p, &c);
        pthread_mutex_unlock(&eng->lock);
        kvc_peer_conn_free(eng, &c);
    }
}

/* kvc_peers_flush: destroy delivers what is queued to each peer (a release
 * just queued by a finished transfer), each message within its deadline;
 * after the first failure to a peer the rest to it is dropped. */
static void kvc_peers_flush(struct kvx_engine *eng)
{
    uint64_t deadline = kvc_deadline_us(eng, eng->cfg.handshake_timeout + 1.0);

    pthread_mutex_lock(&eng->lock);
    eng->stopping_sends = 1;
    for (;;) {
        int busy = eng->jobs_queued > 0;

        for (kvc_peer_t *p = eng->peers; p != NULL && !busy; p = p->next) {
            busy = !p->drop_out &&
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
 * canceled), waits for the jobs they queued, and frees the peers. */
static void kvc_peers_free(struct kvx_engine *eng)
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
    pthread_mutex_unlock(&eng->lock);
    kvc_peers_disconnect(eng); /* none can connect any more */
    while ((p = eng->peers) != NULL) {
        eng->peers = p->next;
        kvc_peer_drop_queue(p, "engine destroyed");
        free(p->hs_reply);
        free(p);
    }
}

kvx_status_t kvc_events_wait(struct kvx_engine *eng, int64_t timeout_ms)
{
    uint64_t     deadline = kvc_now_us(eng) + (uint64_t)timeout_ms * 1000u;
    kvx_status_t st       = KVX_OK;

    pthread_mutex_lock(&eng->lock);
    while (eng->ev_head == NULL) {
        if (kvc_now_us(eng) >= deadline) {
            st = kvc_error(KVX_ERR_TIMEOUT, "wait_events: no event within "
                           "%lld ms", (long long)timeout_ms);
            break;
        }
        kvc_wait_until(eng, deadline);
    }
    pthread_mutex_unlock(&eng->lock);
    return st;
}

/* --- connecting ahead ---------------------------------------------------- */

kvx_status_t kvc_engine_connect(struct kvx_engine *eng,
                                const char *params_json, int64_t timeout_ms)
{
    const int         initiator = eng->cfg.read_mode ? !eng->cfg.is_producer
                                                     : eng->cfg.is_producer;
    kvc_xfer_params_t p;
    kvc_peer_addr_t   addr;
    const char       *field = "remote_host";
    kvc_peer_t       *peers[KVC_RANKMAP_MAX];
    size_t            n = 0;
    kvx_status_t      st;
    uint64_t          deadline;

    if (!initiator) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED,
                         "connect_peer: a %s in %s mode issues no one-sided "
                         "operations, so it has no handshake to make (the "
                         "other side connects to it)",
                         eng->cfg.is_producer ? "kv_producer" : "kv_consumer",
                         eng->cfg.read_mode ? "READ" : "WRITE");
    }
    st = kvc_params_parse(params_json, &p);
    if (st != KVX_OK) {
        return st;
    }
    if (!p.has_remote_addr) {
        kvc_params_fini(&p);
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "connect_peer params: remote_host, "
                         "remote_handshake_port and remote_notify_port are "
                         "required (there is no request_id to derive them "
                         "from)");
    }
    st = kvc_params_peer_addr(&p, NULL, eng->cfg.read_mode, &addr, &field);
    pthread_mutex_lock(&eng->lock);
    if (st == KVX_OK && !eng->started) {
        st = kvc_error(KVX_ERR_BAD_STATE, "connect_peer: call start() first");
    }
    if (st == KVX_OK && eng->cfg.read_mode) {
        n = kvc_read_connect_targets(eng, &p, &addr, field, peers, &st);
    } else if (st == KVX_OK) {
        peers[0] = kvc_write_connect_target(eng, &p, &addr, field, &st);
        n        = peers[0] != NULL;
    }
    for (size_t k = 0; k < n; k++) {
        kvc_peer_want_handshake(peers[k]); /* a failed peer is tried afresh */
    }
    deadline = kvc_now_us(eng) + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) *
                                  1000u;
    for (size_t k = 0; k < n && timeout_ms > 0 && st == KVX_OK; k++) {
        kvc_peer_t *peer = peers[k];

        while (peer->want_handshake || peer->state == KVC_PEER_HANDSHAKING) {
            if (kvc_now_us(eng) >= deadline) {
                st = kvc_error(KVX_ERR_TIMEOUT, "connect_peer %s: handshake "
                               "still running after %lld ms", peer->name,
                               (long long)timeout_ms);
                break;
            }
            kvc_wait_until(eng, deadline);
        }
        if (st == KVX_OK && peer->state != KVC_PEER_READY) {
            st = kvc_error(peer->fail_status ? peer->fail_status
                                             : KVX_ERR_HANDSHAKE,
                           "connect_peer: %s", peer->fail_reason);
        }
    }
    pthread_mutex_unlock(&eng->lock);
    kvc_params_fini(&p);
    return st;
}

/* --- listeners ---------------------------------------------------------- */

static void kvc_reply(int ok, const char *reason, char **reply_p, size_t *len_p)
{
    *reply_p = kvc_reply_encode(ok, reason, len_p);
    if (*reply_p == NULL) {
        *len_p = 0;
    }
}

static void kvc_hs_handler(void *arg, const char *from, const char *msg,
                           size_t len, char **reply_p, size_t *len_p)
{
    struct kvx_engine *eng = arg;
    uint32_t           version;

    if (kvc_hs_request_decode(msg, len, &version) != KVX_OK) {
        kvc_log_warn("KVX-BAD-MESSAGE", "%s handshake listener: from %s: "
                     "%s", eng->engine_id, from, kvc_last_error());
        kvc_reply(0, kvc_last_error(), reply_p, len_p);
        return;
    }
    *reply_p = malloc(eng->meta_len);
    if (*reply_p == NULL) {
        kvc_reply(0, "out of memory", reply_p, len_p);
        return;
    }
    memcpy(*reply_p, eng->meta_json, eng->meta_len);
    *len_p = eng->meta_len;
}

static void kvc_notify_handler(void *arg, const char *from, const char *msg,
                               size_t len, char **reply_p, size_t *len_p)
{
    struct kvx_engine *eng = arg;
    char               reason[KVX_REASON_MAX] = "";
    kvc_msg_t          m;
    int                ok = 1;

    if (kvc_msg_decode(msg, len, eng->cfg.is_producer, &m) != KVX_OK) {
        kvc_log_warn("KVX-BAD-MESSAGE", "%s notify listener: from %s: %s",
                     eng->engine_id, from, kvc_last_error());
        pthread_mutex_lock(&eng->lock);
        eng->stats.rx_bad++;
        pthread_mutex_unlock(&eng->lock);
        kvc_reply(0, kvc_last_error(), reply_p, len_p);
        return;
    }
    pthread_mutex_lock(&eng->lock);
    eng->stats.rx_msgs[m.type]++;
    switch (m.type) {
    case KVC_MSG_RELEASE:
        kvc_read_on_release(eng, &m, reason, sizeof(reason), &ok);
        break;
    case KVC_MSG_REMOTE_BLOCKS:
        kvc_write_on_remote_blocks(eng, &m, reason, sizeof(reason), &ok);
        break;
    case KVC_MSG_WRITE_DONE:
        kvc_write_on_write_done(eng, &m);
        break;
    case KVC_MSG_HEARTBEAT:
        break;
    }
    pthread_mutex_unlock(&eng->lock);
    if (!ok) {
        kvc_log_warn("KVX-CTL-REJECT", "%s: %s", eng->engine_id, reason);
    }
    kvc_msg_fini(&m);
    kvc_reply(ok, reason, reply_p, len_p);
}

static kvx_status_t kvc_meta_build(struct kvx_engine *eng)
{
    kvc_hs_meta_t m;
    const void   *addr;
    size_t        addr_len;

    memset(&m, 0, sizeof(m));
    m.version        = KVC_PROTO_VERSION;
    snprintf(m.engine_id, sizeof(m.engine_id), "%.200s", eng->engine_id);
    snprintf(m.host, sizeof(m.host), "%s", eng->cfg.host_ip);
    m.handshake_port = eng->cfg.handshake_port;
    m.notify_port    = eng->cfg.notify_port;
    m.dp_rank        = eng->cfg.dp_rank;
    m.dp_size        = eng->cfg.dp_size;
    m.tp_rank        = eng->cfg.tp_rank;
    m.tp_size        = eng->cfg.tp_size;
    m.is_producer    = (uint32_t)eng->cfg.is_producer;
    m.epoch          = eng->epoch;
    KVD(eng)->worker_address(eng->ucx, &addr, &addr_len);
    m.worker_addr     = (uint8_t *)addr;
    m.worker_addr_len = addr_len;
    m.num_layers      = eng->nlayers;
    m.layers = calloc(eng->nlayers ? eng->nlayers : 1, sizeof(*m.layers));
    if (m.layers == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "metadata: out of memory");
    }
    for (size_t i = 0; i < eng->nlayers; i++) {
        const void *rk;
        size_t      rk_len;

        snprintf(m.layers[i].name, sizeof(m.layers[i].name), "%s",
                 eng->layers[i].name);
        m.layers[i].base     = (uint64_t)(uintptr_t)eng->layers[i].base;
        m.layers[i].length   = eng->layers[i].length;
        m.layers[i].mem_type = (uint32_t)eng->layers[i].mem_type;
        m.layers[i].geom     = eng->layers[i].geom;
        KVD(eng)->mem_rkey(eng->layers[i].mem, &rk, &rk_len);
        m.layers[i].rkey     = (uint8_t *)rk;
        m.layers[i].rkey_len = rk_len;
    }
    m.digest       = kvc_hs_digest(m.layers, m.num_layers);
    eng->meta_json = kvc_hs_encode(&m, &eng->meta_len);
    free(m.layers); /* rkeys and address are borrowed */
    if (eng->meta_json == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "metadata: encode failed");
    }
    return KVX_OK;
}

/* kvc_reg_setup: rank 0 of an instance with proxy_ip set registers with
 * the proxy every proxy_ping_interval (SPEC §3), the first time at once.
 * The proxy address passes the same trust rule as any peer. */
static kvx_status_t kvc_reg_setup(struct kvx_engine *eng)
{
    kvx_status_t st;

    if (eng->cfg.proxy_ip[0] == '\0' || kvc_config_rank(&eng->cfg) != 0) {
        return KVX_OK;
    }
    st = kvc_trust_check(&eng->trust, eng->cfg.proxy_ip, "proxy_ip");
    if (st == KVX_OK) {
        st = kvc_registration_build(&eng->cfg, &eng->reg_payload);
    }
    if (st == KVX_OK) {
        eng->reg_len = strlen(eng->reg_payload);
        st = KVN(eng)->client_open(eng->cfg.proxy_ip, eng->cfg.proxy_ping_port,
                                   1, &eng->proxy_cli);
    }
    if (st != KVX_OK) {
        free(eng->reg_payload);
        eng->reg_payload = NULL;
        return kvc_error(st == KVX_ERR_UNTRUSTED_PEER ? KVX_ERR_CONFIG : st,
                         "proxy registration: %s", kvc_last_error());
    }
    eng->reg_next_us = kvc_now_us(eng);
    KVD(eng)->kick(eng->ucx);
    return KVX_OK;
}

static void kvc_server_close(struct kvx_engine *eng, kvt_server_t **srv)
{
    if (*srv != NULL) {
        KVN(eng)->server_destroy(*srv);
        *srv = NULL;
    }
}

kvx_status_t kvx_engine_start(struct kvx_engine *eng)
{
    uint32_t     off = kvc_config_rank(&eng->cfg);
    kvx_status_t st;

    pthread_mutex_lock(&eng->lock);
    if (eng->started) {
        pthread_mutex_unlock(&eng->lock);
        return kvc_error(KVX_ERR_BAD_STATE, "engine %s: already started",
                         eng->engine_id);
    }
    st = kvc_meta_build(eng);
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        return st;
    }
    st = KVN(eng)->server_create(eng->cfg.host_ip, eng->cfg.handshake_port + off, 4,
                           KVC_MSG_MAX_BYTES * 2, kvc_hs_handler, eng,
                           &eng->hs_srv);
    if (st == KVX_OK) {
        st = KVN(eng)->server_create(eng->cfg.host_ip, eng->cfg.notify_port + off, 4,
                               KVC_MSG_MAX_BYTES * 2, kvc_notify_handler, eng,
                               &eng->notify_srv);
    }
    if (st != KVX_OK) {
        kvc_server_close(eng, &eng->hs_srv);
        return kvc_error(st, "engine %s: %s (ports: handshake_port %u + rank "
                         "%u, notify_port %u + rank %u)", eng->engine_id,
                         kvc_last_error(), eng->cfg.handshake_port, off,
                         eng->cfg.notify_port, off);
    }
    if (st == KVX_OK) {
        st = kvc_reg_setup(eng);
    }
    if (st != KVX_OK) {
        kvc_server_close(eng, &eng->hs_srv);
        kvc_server_close(eng, &eng->notify_srv);
        return st;
    }
    pthread_mutex_lock(&eng->lock);
    eng->started = 1;
    pthread_mutex_unlock(&eng->lock);
    kvc_log_info("KVX-STARTED", "engine %s rank dp%u tp%u listening on %s:%u "
                 "(handshake) and :%u (notify), UCX %s", eng->engine_id,
                 eng->cfg.dp_rank, eng->cfg.tp_rank, eng->cfg.host_ip,
                 eng->cfg.handshake_port + off, eng->cfg.notify_port + off,
                 KVD(eng)->version());
    return KVX_OK;
}

/* --- create / destroy --------------------------------------------------- */

/* kvc_reg_done: the proxy's answer to a registration (nng thread). Any
 * reply counts as delivered; failures are logged when they start and when
 * they end, not every interval. */
static void kvc_reg_done(void *arg, kvx_status_t st, const char *reply,
                         size_t len, const char *err)
{
    struct kvx_engine *eng = arg;

    (void)reply;
    (void)len;
    pthread_mutex_lock(&eng->lock);
    eng->reg_inflight = 0;
    if (st == KVX_OK) {
        eng->stats.reg_sent++;
        if (eng->reg_failing) {
            kvc_log_info("KVX-PROXY", "registration to %s:%u delivered again",
                         eng->cfg.proxy_ip, eng->cfg.proxy_ping_port);
        }
        eng->reg_failing = 0;
    } else if (st != KVX_ERR_CANCELED) {
        eng->stats.reg_failed++;
        if (!eng->reg_failing) {
            kvc_log_warn("KVX-PROXY", "registration to %s:%u failed: %s; "
                         "retrying every %.1f s", eng->cfg.proxy_ip,
                         eng->cfg.proxy_ping_port, err ? err : "",
                         eng->cfg.proxy_ping_interval);
        }
        eng->reg_failing = 1;
    }
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_reg_tick sends the registration when it is due and the previous one
 * was answered (lock held; kvn never calls kvc_reg_done inside the post). */
static void kvc_reg_tick(struct kvx_engine *eng)
{
    uint64_t now = kvc_now_us(eng);
    double   tmo = eng->cfg.proxy_ping_interval < eng->cfg.handshake_timeout
                       ? eng->cfg.proxy_ping_interval
                       : eng->cfg.handshake_timeout;

    if (eng->proxy_cli == NULL || eng->reg_inflight || now < eng->reg_next_us) {
        return;
    }
    eng->reg_next_us = now + (uint64_t)(eng->cfg.proxy_ping_interval * 1e6);
    if (KVN(eng)->client_post(eng->proxy_cli, eng->reg_payload, eng->reg_len,
                        tmo * 1000.0 < 50 ? 50 : (int)(tmo * 1000.0),
                        kvc_reg_done, eng) == KVX_OK) {
        eng->reg_inflight = 1;
    }
}

static void kvc_engine_tick(void *arg)
{
    struct kvx_engine *eng = arg;

    pthread_mutex_lock(&eng->lock);
    if (!eng->stopping) {
        kvc_read_tick(eng);
        kvc_write_tick(eng);
        kvc_reg_tick(eng);
    }
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_engine_place: with gpu_bus_id set, hwloc picks the NIC nearest the
 * rank's GPU (unless ucx_net_devices names one) and the CPUs local to it
 * for the progress thread (SPEC §11). A bus id that is not in the topology
 * (or an unreadable topology file) is a configuration error; a topology
 * without any NIC only warns. */
static kvx_status_t kvc_engine_place(struct kvx_engine *eng, char *nic,
                                     size_t nlen, char *cpus, size_t clen)
{
    const kvc_config_t *c = &eng->cfg;
    kvx_status_t        st;

    snprintf(nic, nlen, "%s", c->ucx_net_devices);
    cpus[0] = '\0';
    if (c->gpu_bus_id[0] == '\0') {
        return KVX_OK;
    }
    if (KVD(eng)->cpuset == NULL || KVD(eng)->pick_nic == NULL) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED,
                         "kv_connector_extra_config.gpu_bus_id: the %s data "
                         "plane has no device placement", KVD(eng)->name);
    }
    st = KVD(eng)->cpuset(c->hwloc_topology, c->gpu_bus_id, cpus, clen);
    if (st != KVX_OK) {
        return kvc_error(st, "kv_connector_extra_config.gpu_bus_id: %s",
                         kvc_last_error());
    }
    if (nic[0] == '\0') {
        st = KVD(eng)->pick_nic(c->hwloc_topology, c->gpu_bus_id, nic, nlen);
        if (st == KVX_ERR_NOT_FOUND) {
            kvc_log_warn("KVX-TOPO", "gpu_bus_id %s: %s; UCX chooses devices",
                         c->gpu_bus_id, kvc_last_error());
            nic[0] = '\0';
        } else if (st != KVX_OK) {
            return kvc_error(st, "kv_connector_extra_config.gpu_bus_id: %s",
                             kvc_last_error());
        }
    }
    kvc_log_info("KVX-TOPO", "gpu %s: NIC '%s', progress thread on CPUs '%s'",
                 c->gpu_bus_id, nic, cpus);
    kvc_error_clear();
    return KVX_OK;
}

kvx_status_t kvx_engine_create(const kvt_env_t *env, const char *json,
                               struct kvx_engine **eng_p)
{
    struct kvx_engine *eng = calloc(1, sizeof(*eng));
    kvt_data_params_t       up;
    char               nic[256], cpus[256];
    kvx_status_t       st;

    if (eng == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "engine: out of memory");
    }
    eng->env = *env;
    pthread_mutex_init(&eng->lock, NULL);
    pthread_cond_init(&eng->cond, NULL);
    st = kvc_config_parse(json, &eng->cfg, NULL, NULL);
    if (st != KVX_OK) {
        goto err_free;
    }
    st = kvc_trust_init(&eng->trust, eng->cfg.trusted_remote_hosts,
                        eng->cfg.num_trusted_remote_hosts,
                        eng->cfg.trusted_set);
    if (st != KVX_OK) {
        goto err_cfg;
    }
    st = kvc_idset_init(&eng->terminal, KVC_TERMINAL_MAX);
    if (st != KVX_OK) {
        goto err_trust;
    }
    eng->epoch = eng->env.clock.random64(eng->env.clock.arg);
    snprintf(eng->engine_id, sizeof(eng->engine_id), "%s:%u", eng->cfg.host_ip,
             eng->cfg.handshake_port);
    memset(&up, 0, sizeof(up));
    st = kvc_engine_place(eng, nic, sizeof(nic), cpus, sizeof(cpus));
    if (st != KVX_OK) {
        goto err_idset;
    }
    up.tls                = eng->cfg.ucx_tls;
    up.net_devices        = nic;
    up.cpus               = cpus;
    up.err_mode_peer      = eng->cfg.ucx_error_mode == KVC_ERR_MODE_PEER;
    up.spin_us            = eng->cfg.progress_spin_us;
    up.max_inflight_bytes = eng->cfg.max_inflight_bytes;
    up.tick               = kvc_engine_tick;
    up.tick_arg           = eng;
    up.name               = eng->engine_id;
    st = KVD(eng)->ctx_create(&up, &eng->ucx);
    if (st != KVX_OK) {
        goto err_idset;
    }
    *eng_p = eng;
    return KVX_OK;

err_idset:
    kvc_idset_fini(&eng->terminal);
err_trust:
    kvc_trust_fini(&eng->trust);
err_cfg:
    kvc_config_fini(&eng->cfg);
err_free:
    pthread_cond_destroy(&eng->cond);
    pthread_mutex_destroy(&eng->lock);
    free(eng);
    return st;
}

static void kvc_engine_free_state(struct kvx_engine *eng)
{
    for (size_t b = 0; b < KVC_XFER_BUCKETS; b++) {
        while (eng->xfers[b] != NULL) {
            kvc_xfer_t *x = eng->xfers[b];

            eng->xfers[b] = x->hnext;
            kvc_xfer_free(x);
        }
    }
    while (eng->ev_head != NULL) {
        kvc_event_node_t *n = eng->ev_head;

        eng->ev_head = n->next;
        free(n->ev.block_ids);
        free(n);
    }
    while (eng->early != NULL) {
        kvc_early_release_t *e = eng->early;

        eng->early = e->next;
        free(e);
    }
    while (eng->early_blocks != NULL) {
        kvc_early_blocks_t *e = eng->early_blocks;

        eng->early_blocks = e->next;
        kvc_msg_fini(&e->msg);
        free(e);
    }
}

/* Waits (bounded) until no D transfer has operations in flight, so that
 * no completion callback can touch a freed transfer. */
static void kvc_engine_quiesce(struct kvx_engine *eng)
{
    uint64_t deadline = kvc_now_us(eng) + 5000000u;

    pthread_mutex_lock(&eng->lock);
    for (;;) {
        int busy = 0;

        for (size_t b = 0; b < KVC_XFER_BUCKETS && !busy; b++) {
            for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
                if ((x->state == KVC_XFER_INFLIGHT && x->layers_pending > 0) ||
                    (x->write && (x->ncompleted != x->nposted ||
                                  x->flushing))) {
                    busy = 1;
                    break;
                }
            }
        }
        if (!busy || kvc_now_us(eng) >= deadline) {
            break;
        }
        kvc_wait_until(eng, kvc_now_us(eng) + 10000u);
    }
    pthread_mutex_unlock(&eng->lock);
}

void kvx_engine_destroy(struct kvx_engine *eng)
{
    if (eng == NULL) {
        return;
    }
    kvt_client_t *proxy;

    pthread_mutex_lock(&eng->lock);
    proxy          = eng->proxy_cli; /* no registration after this */
    eng->proxy_cli = NULL;
    pthread_mutex_unlock(&eng->lock);
    if (proxy != NULL) {
        KVN(eng)->client_close(proxy);
    }
    free(eng->reg_payload);
    kvc_server_close(eng, &eng->hs_srv);
    kvc_server_close(eng, &eng->notify_srv);
    /* Queued control messages go out (bounded); then no new connection.
     * Peers close their endpoints (force-close in peer mode): in-flight
     * gets complete as canceled before transfers and peers are freed. */
    kvc_peers_flush(eng);
    kvc_peers_disconnect(eng);
    kvc_engine_quiesce(eng);
    kvc_peers_free(eng);
    pthread_mutex_lock(&eng->lock);
    eng->stopping = 1;
    pthread_mutex_unlock(&eng->lock);
    for (size_t i = 0; i < eng->nlayers; i++) {
        if (eng->layers[i].mem_owned) {
            KVD(eng)->mem_release(eng->layers[i].mem);
        }
    }
    while (eng->regions != NULL) {
        kvc_region_t *r = eng->regions;

        eng->regions = r->next;
        KVD(eng)->mem_release(r->mem);
        free(r);
    }
    KVD(eng)->ctx_destroy(eng->ucx);
    kvc_engine_free_state(eng);
    free(eng->layers);
    free(eng->meta_json);
    kvc_idset_fini(&eng->terminal);
    kvc_trust_fini(&eng->trust);
    kvc_config_fini(&eng->cfg);
    pthread_cond_destroy(&eng->cond);
    pthread_mutex_destroy(&eng->lock);
    free(eng);
}
