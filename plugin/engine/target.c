/*
 * target.c - target resolution: from a request's params to the peer
 * ranks this engine talks to (resolve the host of each rank, check trust
 * and ports, find or create the peer), and connect_peer.
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

kvx_status_t kvc_read_targets(struct kvx_engine *eng,
                                     const kvc_xfer_params_t *p,
                                     const kvc_peer_addr_t *addr,
                                     const char *field, kvc_xfer_t *x)
{
    uint32_t      rtp = p->remote_tp_size ? p->remote_tp_size
                                          : eng->cfg.tp_size;
    uint32_t      rdp = p->remote_dp_size ? p->remote_dp_size : 1;
    kvc_rankmap_t map;
    kvx_status_t  st;

    if (p->remote_dp_rank >= rdp) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "kv_transfer_params.remote_dp_rank: value %u: must "
                         "be < remote_dp_size %u", p->remote_dp_rank, rdp);
    }
    /* P's heads are not known before the handshake; the sources do not
     * depend on them (kvc_rankmap_heads). */
    st = kvc_rankmap_heads(eng->cfg.tp_size, rtp, kvc_eng_heads(eng),
                           KVC_HEADS_SHARDED, eng->cfg.tp_rank, &map);
    if (st != KVX_OK) {
        return st;
    }
    for (uint32_t i = 0; i <= map.num_release; i++) {
        uint32_t    rank = i == 0 ? map.read_rank : map.release[i - 1];
        kvc_peer_t *peer = kvc_target(eng, p, addr, field, p->remote_dp_rank,
                                      rank, &st);

        if (peer == NULL) {
            return st;
        }
        if (i == 0) {
            x->src = peer;
        } else {
            x->rel[x->nrel++] = peer;
        }
    }
    /* Gathering: part k from rel[k] (the sources come first). */
    x->nsrc = map.gather ? map.num_slices : 1;
    return KVX_OK;
}

size_t kvc_read_connect_targets(struct kvx_engine *eng,
                                const kvc_xfer_params_t *p,
                                const kvc_peer_addr_t *addr,
                                const char *field, kvc_peer_t **peers,
                                kvx_status_t *st_p)
{
    kvc_xfer_t x;

    memset(&x, 0, sizeof(x));
    *st_p = kvc_target_check_host(eng, addr, field);
    if (*st_p == KVX_OK) {
        *st_p = kvc_read_targets(eng, p, addr, field, &x);
    }
    if (*st_p != KVX_OK) {
        return 0;
    }
    for (uint32_t k = 0; k < kvc_xfer_nsrc(&x); k++) {
        peers[k] = kvc_xfer_source(&x, k); /* gathering: every source */
    }
    return kvc_xfer_nsrc(&x);
}

/* kvc_target_check_host: the advertised host is validated up front;
 * each remote_hosts entry is validated when a rank resolves to it (in
 * kvc_target), so an allow-list that excludes one host of a multi-host
 * peer fails exactly the ranks that would dial it (SPEC §4). */
kvx_status_t kvc_target_check_host(struct kvx_engine *eng,
                                   const kvc_peer_addr_t *addr,
                                   const char *field)
{
    return kvc_trust_check(&eng->trust, addr->host, field);
}

/* --- producer (P) ------------------------------------------------------- */

/* kvc_write_same_tp: WRITE needs equal TP, or one TP size a multiple of
 * the other (SPEC §4): P tp = r x D tp, each P rank puts its heads as its
 * part of its D rank's blocks (replicated heads: only the first of the r);
 * D tp = q x P tp, each P rank puts one head slice (replicated: the whole
 * block) to each of its q D ranks. */
kvx_status_t kvc_write_same_tp(struct kvx_engine *eng, uint32_t rtp)
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
uint32_t kvc_write_peer_rank(const struct kvx_engine *eng,
                                    uint32_t rtp)
{
    if (rtp < eng->cfg.tp_size) {
        return eng->cfg.tp_rank / (eng->cfg.tp_size / rtp);
    }
    return eng->cfg.tp_rank;
}

/* kvc_target: the one path from request input to a peer rank (SPEC §4):
 * resolve the rank's host from remote_hosts, check it against the trust
 * rule (naming the field it came from), check both ports, find or create
 * the peer. */
kvc_peer_t *kvc_target(struct kvx_engine *eng, const kvc_xfer_params_t *p,
                       const kvc_peer_addr_t *addr, const char *field,
                       uint32_t dp_rank, uint32_t tp_rank, kvx_status_t *st_p)
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

size_t kvc_write_connect_targets(struct kvx_engine *eng,
                                 const kvc_xfer_params_t *p,
                                 const kvc_peer_addr_t *addr,
                                 const char *field, kvc_peer_t **peers,
                                 kvx_status_t *st_p)
{
    uint32_t rtp = p->remote_tp_size ? p->remote_tp_size : eng->cfg.tp_size;

    *st_p = kvc_target_check_host(eng, addr, field);
    if (*st_p == KVX_OK) {
        *st_p = kvc_write_same_tp(eng, rtp);
    }
    peers[0] = *st_p != KVX_OK
                   ? NULL
                   : kvc_target(eng, p, addr, field, p->remote_dp_rank,
                                      kvc_write_peer_rank(eng, rtp), st_p);
    return peers[0] != NULL;
}

/* kvc_consumer_targets: the P ranks this D rank hands its blocks to: its
 * own TP rank with equal TP, or the r ranks d*r .. d*r+r-1 that each put
 * one part of its heads (sharded, P tp = r x D tp). peers holds
 * KVC_RANKMAP_MAX. */
kvx_status_t kvc_consumer_targets(struct kvx_engine *eng, const char *req_id,
                                  const char *params_json,
                                  kvc_xfer_params_t *p, kvc_peer_t **peers,
                                  uint32_t *n_p)
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
        st = kvc_target_check_host(eng, &addr, field);
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
        peers[k] = kvc_target(eng, p, &addr, field, p->remote_dp_rank,
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

kvx_status_t kvc_consumer_abort(struct kvx_engine *eng, const char *req_id,
                                const char *params_json,
                                void (*on_xfer)(struct kvx_engine *eng,
                                                kvc_xfer_t *x))
{
    kvc_xfer_params_t p;
    kvc_peer_t       *peers[KVC_RANKMAP_MAX];
    uint32_t          npeers = 0;
    kvc_xfer_t       *x;
    kvc_msg_t         m;
    kvx_status_t      st;

    st = kvc_consumer_targets(eng, req_id, params_json, &p, peers, &npeers);
    if (st != KVX_OK) {
        return st;
    }
    kvc_release_msg(eng, p.transfer_id, &m);
    pthread_mutex_lock(&eng->lock);
    x = kvc_xfer_find(eng, p.transfer_id);
    if (x != NULL && on_xfer != NULL) {
        on_xfer(eng, x);
    }
    if (x != NULL) {
        m.xfer_nonce = x->xnonce; /* WRITE: this use of the id */
    }
    kvc_idset_add(&eng->terminal, p.transfer_id);
    if (x != NULL && x->write && !x->is_producer && x->nrel > 0) {
        /* WRITE: the P ranks this transfer is bound to, which its fence
         * waits for, whatever ranks the abort's params would name. */
        kvc_write_d_send(x, &m, "release");
    } else {
        for (uint32_t k = 0; k < npeers; k++) {
            kvc_peer_send_msg(peers[k], &m, "release");
        }
    }
    pthread_mutex_unlock(&eng->lock);
    kvc_params_fini(&p);
    return KVX_OK;
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
    if (st == KVX_OK) {
        n = eng->mode->connect_targets(eng, &p, &addr, field, peers, &st);
    }
    for (size_t k = 0; k < n; k++) {
        kvc_peer_want_handshake(peers[k]); /* a failed peer is tried afresh */
    }
    deadline = kvc_wait_deadline(eng, timeout_ms);
    for (size_t k = 0; k < n && timeout_ms > 0 && st == KVX_OK; k++) {
        kvc_peer_t *peer = peers[k];

        while (peer->want_handshake || peer->state == KVC_PEER_HANDSHAKING) {
            if (atomic_load(&eng->destroying)) {
                st = kvc_error(KVX_ERR_CANCELED, "connect_peer %s: "
                               "engine_destroy began", peer->name);
                break;
            }
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
