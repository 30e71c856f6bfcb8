/*
 * handshake.c - the handshake (SPEC §5): this engine's metadata and the
 * listener that serves it; the initiator's request, the checks of the
 * peer's reply against what was dialled and what this engine holds, the
 * endpoint and rkeys.
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

/* kvc_rank_pos: index of rank in m's release list (sources first). */
static uint32_t kvc_rank_pos(const kvc_rankmap_t *m, uint32_t rank)
{
    uint32_t k = 0;

    while (k < m->num_release && m->release[k] != rank) {
        k++;
    }
    return k;
}

/* kvc_peer_parts_of: kvc_peer_parts with the peer's metadata pm (the
 * handshake reply being checked, or the peer's stored one). The heads each
 * side holds feed the one rank map (kvc_rankmap_heads). */
static void kvc_peer_parts_of(const struct kvx_engine *eng,
                              const kvc_peer_t *peer, const kvc_hs_meta_t *pm,
                              uint32_t *idx_p, uint32_t *n_p, int *gather_p)
{
    uint32_t      mine = kvc_eng_heads(eng), theirs = kvc_meta_heads(pm);
    kvc_rankmap_t m;

    *idx_p    = 0;
    *n_p      = 1;
    *gather_p = 0;
    if (!eng->cfg.read_mode && eng->cfg.is_producer) {
        /* WRITE P, the peer is a D rank. */
        if (kvc_rankmap_heads(peer->tp_size, eng->cfg.tp_size, theirs, mine,
                              peer->tp_rank, &m) != KVX_OK) {
            return;
        }
        if (eng->cfg.tp_size > peer->tp_size) {
            /* P tp = r x D tp: this rank puts part k of n of the D rank's
             * heads, or holds a replica of part k - n.. and puts nothing
             * (*gather_p 3). */
            uint32_t k = kvc_rank_pos(&m, eng->cfg.tp_rank);

            *n_p = m.num_slices;
            if (k >= m.num_slices) {
                uint32_t step = m.num_release / m.num_slices;

                *idx_p    = (k - m.num_slices) / (step - 1);
                *gather_p = 3;
            } else if (m.num_slices > 1) {
                *idx_p    = k;
                *gather_p = 2;
            }
        } else if (m.num_slices > 1) {
            /* D tp = q x P tp: this P rank puts head slice head_slice of
             * its heads into the D rank's whole blocks. */
            *n_p      = m.num_slices;
            *idx_p    = m.head_slice;
            *gather_p = 1;
        }
        return;
    }
    if (!eng->cfg.read_mode || eng->cfg.is_producer ||
        kvc_rankmap_heads(eng->cfg.tp_size, peer->tp_size, mine, theirs,
                          eng->cfg.tp_rank, &m) != KVX_OK) {
        return;
    }
    *n_p      = m.num_slices;
    *gather_p = (int)m.gather;
    *idx_p    = m.gather ? kvc_rank_pos(&m, peer->tp_rank) : m.head_slice;
}

void kvc_peer_parts(const struct kvx_engine *eng, const kvc_peer_t *peer,
                    uint32_t *idx_p, uint32_t *n_p, int *gather_p)
{
    kvc_peer_parts_of(eng, peer, &peer->meta, idx_p, n_p, gather_p);
}

/* kvc_peer_check_origin: the reply is from the engine dialled (its engine
 * id, host and rank port) and every length in it is one this engine
 * accepts: worker address and rkeys bounded, each layer's geometry inside
 * its published length, no address range that wraps. */
static kvx_status_t kvc_peer_check_origin(kvc_peer_t *peer,
                                          const kvc_hs_meta_t *m,
                                          kvc_refusal_t *why_p)
{
    uint64_t rank = (uint64_t)m->dp_rank * m->tp_size + m->tp_rank;
    char     id[KVC_HOST_MAX + 16];

    *why_p = KVC_REFUSE_OTHER_ENGINE;
    snprintf(id, sizeof(id), "%s:%u", m->host, m->handshake_port);
    if (strcmp(id, m->engine_id) != 0 || strcmp(m->host, peer->host) != 0 ||
        (uint64_t)m->handshake_port + rank != peer->hs_port) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer %s: reply names engine_id "
                         "'%s' (host '%s', handshake_port %u + rank %llu): "
                         "must be the engine dialled, %s port %u", peer->name,
                         m->engine_id, m->host, m->handshake_port,
                         (unsigned long long)rank, peer->host, peer->hs_port);
    }
    *why_p = KVC_REFUSE_BAD_METADATA;
    if (m->worker_addr_len == 0 || m->worker_addr_len > KVC_HS_ADDR_MAX) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer %s: worker_addr: %zu "
                         "bytes: must be 1..%u", peer->name,
                         m->worker_addr_len, KVC_HS_ADDR_MAX);
    }
    for (size_t j = 0; j < m->num_layers; j++) {
        const kvc_hs_layer_t *l = &m->layers[j];

        if (l->rkey_len == 0 || l->rkey_len > KVC_HS_RKEY_MAX) {
            return kvc_error(KVX_ERR_HANDSHAKE, "peer %s: layers[%zu].rkey: "
                             "%zu bytes: must be 1..%u", peer->name, j,
                             l->rkey_len, KVC_HS_RKEY_MAX);
        }
        if (l->length == 0 || l->base + l->length < l->base ||
            kvc_geom_extent(&l->geom) > l->length) {
            return kvc_error(KVX_ERR_HANDSHAKE, "peer %s: layers[%zu] '%s': "
                             "base 0x%llx length %llu, its %llu blocks span "
                             "%llu bytes: must be non-empty, not wrap and "
                             "fit the length", peer->name, j, l->name,
                             (unsigned long long)l->base,
                             (unsigned long long)l->length,
                             (unsigned long long)l->geom.num_blocks,
                             (unsigned long long)kvc_geom_extent(&l->geom));
        }
    }
    return KVX_OK;
}

/* Validates the peer's metadata against what we dialled and what we hold.
 * Called without the engine lock: layers are frozen after start(). */
static kvx_status_t kvc_peer_check_meta(kvc_peer_t *peer,
                                        const kvc_hs_meta_t *m, int *map)
{
    struct kvx_engine *eng = peer->eng;
    uint32_t           part, nparts;
    int                gather;

    kvc_peer_parts_of(eng, peer, m, &part, &nparts, &gather);
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
    for (size_t i = 0; i < eng->nlayers && !kvc_peer_ctl_only(eng); i++) {
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
 * ucx.md §0.1-0.3): as direct copies into UCX-allocated shared memory
 * (every layer's rkey maps here; also beside a zero-copy lane such as
 * cma, UCX 1.22), over a hardware/transport RMA lane, or emulated over
 * active messages (shared-memory lanes only, memory that does not map). */
static const char *kvc_peer_rma_mode(kvc_peer_t *peer, const kvc_hs_meta_t *m,
                                     kvt_ep_t *ep, kvt_rkey_t **rkeys)
{
    const struct kvx_engine *eng = peer->eng;
    int                      mapped = m->num_layers > 0;

    if (KVD(eng)->ep_rma_emulated(ep)) {
        return "emulated";
    }
    for (size_t j = 0; j < m->num_layers && mapped; j++) {
        mapped = KVD(eng)->rkey_local(rkeys[j], m->layers[j].base) != NULL;
    }
    return mapped                            ? "direct-shm"
           : !KVD(eng)->ep_rma_shm_only(ep) ? "rma"
                                            : "emulated";
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
    if (KVD(eng)->ep_set_session != NULL) {
        KVD(eng)->ep_set_session(*ep_p, m->session);
    }
    snprintf(peer->seen_as, sizeof(peer->seen_as), "%s",
             m->session != 0 ? m->seen_as : "");
    peer->hs_us[1] = kvc_now_us(eng) - t0;
    t0             = kvc_now_us(eng);
    rkeys = calloc(m->num_layers ? m->num_layers : 1, sizeof(*rkeys));
    st    = rkeys ? kvc_peer_check_lanes(peer, *ep_p)
                  : kvc_error(KVX_ERR_NO_MEMORY, "rkeys: out of memory");
    for (size_t j = 0; st == KVX_OK && !kvc_peer_ctl_only(eng) &&
                       j < m->num_layers; j++) {
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
    if (st == KVX_OK && kvc_peer_ctl_only(eng)) {
        snprintf(peer->rma_mode, sizeof(peer->rma_mode), "control");
        peer->hs_us[2] = kvc_now_us(eng) - t0;
    } else if (st == KVX_OK) {
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
    peer->hs_stale = 0;
    if (!kvc_peer_ctl_only(eng)) {
        eng->mode->peer_failed(eng, peer);
    } else {
        peer->ctl_retry_us = kvc_now_us(eng) + KVC_CTL_RETRY_US;
    }
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
    if (peer->hs_job_queued) { /* a transport bug: one reply per request */
        pthread_mutex_unlock(&eng->lock);
        free(copy);
        kvc_log_error("KVX-HANDSHAKE", "peer %s: duplicate reply ignored",
                      peer->name);
        return;
    }
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
void kvc_peer_hs_start(kvc_peer_t *peer)
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
                                   kvc_config_ctl_sec(&eng->cfg),
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
    kvc_refusal_t why;

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
        pthread_mutex_lock(&eng->lock);
        kvc_refused(eng, KVC_PORT_HS_REPLY, KVC_REFUSE_BAD_MESSAGE);
        pthread_mutex_unlock(&eng->lock);
        return kvc_error(st, "handshake with %s: %s", peer->name,
                         kvc_last_error());
    }
    st = kvc_peer_check_origin(peer, m, &why);
    if (st != KVX_OK) {
        pthread_mutex_lock(&eng->lock);
        kvc_refused(eng, KVC_PORT_HS_REPLY, why);
        pthread_mutex_unlock(&eng->lock);
        kvc_hs_fini(m);
        return st;
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

/* kvc_peers_prefault (tick, lock held) maps the directly attached segments
 * of peers that just connected into our page tables, KVC_PREFAULT_CHUNK
 * bytes per periodic tick (at most every KVC_TICK_FULL_US): the first
 * transfer then does not pay a page fault per page, and the progress owner
 * never stalls for a whole region. */
void kvc_peers_prefault(struct kvx_engine *eng)
{
    uint64_t budget = KVC_PREFAULT_CHUNK;

    for (kvc_peer_t *p = eng->peers; p != NULL && budget > 0; p = p->next) {
        while (p->prefault && p->state == KVC_PEER_READY && budget > 0) {
            const kvc_hs_layer_t *l;
            char                 *base;
            uint64_t              len;

            if (p->pf_layer >= p->meta.num_layers) {
                p->prefault = 0;
                break;
            }
            l    = &p->meta.layers[p->pf_layer];
            base = KVD(eng)->rkey_local(p->rkeys[p->pf_layer], l->base);
            len  = l->length - p->pf_off < budget ? l->length - p->pf_off
                                                   : budget;
            if (base != NULL && len > 0) {
                /* the layer's length is the peer's word: the transport
                 * cuts it to the mapping the rkey lands in */
                KVD(eng)->prefault(p->rkeys[p->pf_layer],
                                   l->base + p->pf_off, len);
            }
            budget    -= len;
            p->pf_off += len;
            if (base == NULL || p->pf_off >= l->length) {
                p->pf_layer++;
                p->pf_off = 0;
            }
        }
    }
}

/* kvc_peer_hs_finish (job, progress owner): the handshake's outcome. */
void kvc_peer_hs_finish(kvt_job_t *job)
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
    } else if (st == KVX_OK &&
               (kvc_peer_inst_dead(peer, m.epoch) ||
                (kvc_peer_ctl_only(eng) && peer->inst != 0 &&
                 !peer->inst_unconfirmed && m.epoch != peer->inst))) {
        /* A reply held up on the way, from an instance that restarted
         * while it travelled: adopting it would make the live instance
         * "dead" and bind transfers to a gone worker. (A control-only
         * peer learns a restart from the control plane, which fails what
         * the old instance held: its endpoint waits for that.) Asked
         * again, a few times. */
        kvc_peer_conn_t c = {m, ep, rkeys, map};
        uint64_t        other = m.epoch;

        kvc_peer_conn_free(eng, &c);
        st = kvc_error(KVX_ERR_HANDSHAKE, "handshake with %s: the metadata "
                       "names instance %llu, this engine knows instance %llu",
                       peer->name, (unsigned long long)other,
                       (unsigned long long)peer->inst);
        if (peer->hs_stale < KVC_HS_STALE_RETRIES) {
            peer->hs_stale++;
            kvc_log_info("KVX-HANDSHAKE", "%s (asked again)",
                         kvc_last_error());
            kvc_error_clear();
            peer->state = KVC_PEER_NEW;
            kvc_peer_want_handshake(peer);
            pthread_mutex_unlock(&eng->lock);
            return;
        }
    }
    if (st != KVX_OK) {
        kvc_peer_hs_failed(peer, st, kvc_last_error());
        pthread_mutex_unlock(&eng->lock);
        return;
    }
    peer->hs_stale  = 0;
    peer->meta      = m;
    peer->ep        = ep;
    peer->rkeys     = rkeys;
    peer->layer_map = map;
    peer->state     = KVC_PEER_READY;
    peer->dp_dead   = 0;
    if (peer->watch_ep != NULL) {
        /* It answered: alive; the transfers fencing it wait for its
         * answer to their release (kept being sent while unanswered). */
        KVD(eng)->ep_close(peer->watch_ep);
        peer->watch_ep = NULL;
    }
    peer->count_off = 0; /* a new endpoint: its lanes may count again */
    kvc_peer_set_inst(peer, m.epoch);
    kvc_peer_claim_settle(peer);
    {
        /* A handshake just reached the peer's address: a control
         * connection lost before it (a restart: the old instance's) gets
         * the grace again from now, to come back to the new instance,
         * rather than making the new one "gone". Only if it is still the
         * same loss (the watch callback may have cleared it). */
        uint64_t down = atomic_load(&peer->conn_down_us);

        if (down != 0) {
            atomic_compare_exchange_strong(&peer->conn_down_us, &down,
                                           kvc_now_us(eng));
        }
    }
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
    eng->mode->peer_ready(eng, peer);
    pthread_cond_broadcast(&eng->cond); /* kvc_engine_connect waiters */
    if (strcmp(peer->rma_mode, "direct-shm") == 0) {
        peer->prefault = 1; /* by the tick, in chunks */
        peer->pf_layer = 0;
        peer->pf_off   = 0;
    }
    pthread_mutex_unlock(&eng->lock);
}

kvx_status_t kvc_meta_build(struct kvx_engine *eng)
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
    free(eng->meta_json); /* a start() tried before */
    eng->meta_json = kvc_hs_encode(&m, &eng->meta_len);
    free(m.layers); /* rkeys and address are borrowed */
    if (eng->meta_json == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "metadata: encode failed");
    }
    return KVX_OK;
}

void kvc_meta_worker_reset(void *arg)
{
    struct kvx_engine *eng = arg;

    pthread_mutex_lock(&eng->lock);
    /* Not once destroy began: the layers' memory (their rkeys) is
     * released before the transport's progress thread stops. */
    if (eng->meta_json != NULL && !eng->closing) {
        /* (else kvx_engine_start builds it) */
        char  *old     = eng->meta_json;
        size_t old_len = eng->meta_len;

        eng->meta_json = NULL;
        if (kvc_meta_build(eng) != KVX_OK) {
            kvc_log_error("KVX-UCX-FIFO", "%s: the handshake metadata keeps "
                          "the retired worker's address: %s", eng->engine_id,
                          kvc_last_error());
            eng->meta_json = old;
            eng->meta_len  = old_len;
        } else {
            free(old);
            kvc_log_info("KVX-UCX-FIFO", "%s: handshakes now publish the new "
                         "worker's address", eng->engine_id);
        }
    }
    pthread_mutex_unlock(&eng->lock);
}

void kvc_from_host(const char *from, char *host, size_t len)
{
    const char *colon = strrchr(from, ':');
    size_t      n     = colon != NULL ? (size_t)(colon - from) : 0;

    if (n >= 2 && from[0] == '[' && from[n - 1] == ']') {
        from++;
        n -= 2;
    }
    snprintf(host, len, "%.*s", (int)(n < len ? n : len - 1), from);
}

void kvc_hs_handler(void *arg, const char *from, const char *msg,
                           size_t len, char **reply_p, size_t *len_p)
{
    struct kvx_engine *eng = arg;
    uint32_t           version;
    char               host[KVC_HOST_MAX];
    kvc_refusal_t      why = KVC_REFUSE_BAD_MESSAGE;
    kvx_status_t       st;

    /* The metadata (worker address, layer addresses, rkeys) goes only to
     * a sender trusted_remote_hosts admits (with TLS the transport has
     * also checked its certificate). */
    kvc_from_host(from, host, sizeof(host));
    st = kvc_trust_check(&eng->trust, host, "the handshake sender");
    if (st != KVX_OK) {
        why = KVC_REFUSE_UNTRUSTED_HOST;
    } else {
        st = kvc_hs_request_decode(msg, len, &version);
    }
    if (st != KVX_OK) {
        kvc_log_warn("KVX-BAD-MESSAGE", "%s handshake listener: from %s: "
                     "%s", eng->engine_id, from, kvc_last_error());
        pthread_mutex_lock(&eng->lock);
        kvc_refused(eng, KVC_PORT_HANDSHAKE, why);
        pthread_mutex_unlock(&eng->lock);
        kvc_reply(0, why == KVC_REFUSE_UNTRUSTED_HOST ? "refused"
                                                      : kvc_last_error(),
                  reply_p, len_p);
        return;
    }
    /* The metadata is rebuilt when the transport replaces its worker
     * (kvc_meta_worker_reset): copied under the lock, with the session of
     * the requester's address, that its gets or puts carry back
     * (expose.c). */
    pthread_mutex_lock(&eng->lock);
    *reply_p = kvc_hs_with_session(eng->meta_json, eng->meta_len,
                                   kvc_host_session(eng->expo.key, from, 1),
                                   from, len_p);
    pthread_mutex_unlock(&eng->lock);
    if (*reply_p == NULL) {
        kvc_reply(0, "out of memory", reply_p, len_p);
    }
}
