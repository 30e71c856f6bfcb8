/*
 * mode_write_d.c - WRITE mode (SPEC §8), D's side: hand the blocks to the
 * P ranks mapped to this rank (remote_blocks), wait for their completion
 * (the data-plane notice, or write_done), abort.
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "siphash.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- consumer (D) ------------------------------------------------------- */

/* kvc_write_d_send sends m to every P rank of x (lock held). */
void kvc_write_d_send(kvc_xfer_t *x, kvc_msg_t *m, const char *what)
{
    m->xfer_nonce = x->xnonce;
    for (uint32_t k = 0; k < x->nrel; k++) {
        kvc_peer_send_msg(x->rel[k], m, what);
    }
}

/* kvc_write_d_by_notice: this D can complete P rank peer on its
 * data-plane notice alone (kvc_write_on_notice authenticates it by the
 * session of the rank's host, so that host must be an address), so P need
 * not send write_done after one (remote_blocks' done_by_notice). */
static int kvc_write_d_by_notice(const struct kvx_engine *eng,
                                 const kvc_peer_t *peer)
{
    return eng->cfg.release_on_data_plane && KVD(eng)->notify != NULL &&
           kvc_host_session(eng->expo.key, peer->host, 0) != 0;
}

/* kvc_write_d_dp_on: does this engine send remote_blocks on the data
 * plane at all (kvc_write_d_blocks_on_dp)? */
static int kvc_write_d_dp_on(const struct kvx_engine *eng)
{
    return KVD(eng)->ctl_send != NULL && KVD(eng)->ep_set_session != NULL &&
           eng->cfg.release_on_data_plane;
}

/* kvc_write_d_blocks_on_dp: remote_blocks m to x's P rank k goes on the
 * data plane (kvc_dp_ctl_handler at P) instead of over the control plane:
 * saves both processes the control plane's thread hand-offs and round
 * trip per transfer (perf/README.md, "remote_blocks on the data plane").
 * Only over an endpoint to the rank's current instance (handshake done),
 * when P told this engine the address its session is keyed by (seen_as),
 * and with release_on_data_plane. Also with control-plane TLS: the session
 * came inside the TLS handshake, and P refuses a replayed copy by its
 * stamp (kvc_dp_fresh). The endpoint
 * reaches that instance's worker only, so the rank is bound to it at once
 * (no reply comes: as if it had answered). A message the transport
 * refuses (endpoint failed or closed, 256 unsent, longer than
 * KVT_CTL_MAX) goes over the control plane. Returns 1 when handed over. */
static int kvc_write_d_blocks_on_dp(struct kvx_engine *eng, kvc_xfer_t *x,
                                    uint32_t k, const kvc_msg_t *m)
{
    kvc_peer_t  *peer = x->rel[k];
    kvc_msg_t    mm   = *m;
    char        *buf;
    size_t       len = 0;
    kvx_status_t st;

    if (!kvc_write_d_dp_on(eng) || peer->state != KVC_PEER_READY ||
        peer->ep == NULL || peer->inst == 0 ||
        peer->meta.epoch != peer->inst || peer->seen_as[0] == '\0' ||
        atomic_load(&peer->conn_down_us) != 0 || peer->conn_gone ||
        peer->dp_unconfirmed >= KVC_DP_UNCONFIRMED_MAX || k >= 64 ||
        kvc_now_us(eng) < peer->dp_off_until) {
        /* (nor while its control connection is down: the rank may be
         * about to be declared gone, and a message of the data plane
         * would bind a transfer to it) */
        return 0;
    }
    mm.instance    = eng->epoch;
    mm.to_instance = peer->inst;
    /* One P rank: every byte put into x's blocks is its (kvc_write_on_notice
     * checks a counted notice against them all), and this message binds the
     * rank to the endpoint's instance at once (so the notice is matched,
     * never held as early). */
    mm.notice_counted = mm.done_by_notice && x->nrel == 1 && x->exposed;
    buf            = kvc_msg_encode(&mm, &len);
    if (buf == NULL) {
        kvc_error_clear();
        return 0;
    }
    if (len <= KVT_CTL_MAX) {
        /* Its nonce is a stamp, strictly increasing: P refuses one it
         * took before, or one outside its freshness window (a replay). */
        st = KVD(eng)->ctl_send(peer->ep, buf, len, peer->seen_as,
                                kvc_dp_next_nonce(eng));
    } else {
        st = KVX_ERR_INVALID_PARAM;
    }
    free(buf);
    if (st != KVX_OK) {
        kvc_log_debug("KVX-WRITE-BLOCKS", "transfer %s: remote_blocks of "
                      "%zu bytes to %s over the control plane: %s",
                      x->transfer_id, len, peer->name,
                      len <= KVT_CTL_MAX ? kvc_last_error() : "too long");
        kvc_error_clear();
        return 0;
    }
    x->rel_inst[k] = peer->meta.epoch; /* the instance of ep's worker */
    x->rel_dp |= 1ull << k;
    peer->dp_unconfirmed++;
    eng->stats.blocks_on_dp++;
    return 1;
}

/* kvc_use_nonce: a new use of a transfer id at this D: SipHash of a
 * counter under the engine's secret key, so a peer that knows D's instance
 * id (public: every message carries it) cannot tell the next one; never 0.
 * Distinct uses collide with probability 2^-64. */
uint64_t kvc_use_nonce(struct kvx_engine *eng)
{
    uint64_t seq = ++eng->xnonce_seq;
    uint64_t v   = kvc_siphash24(eng->expo.key, &seq, sizeof(seq));

    return v != 0 ? v : 1;
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
    x->xnonce = kvc_use_nonce(eng); /* this use of the id */
    st        = kvc_xfer_insert(eng, x);
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
        m.xfer_nonce = x->xnonce;
        for (uint32_t k = 0; k < x->nrel; k++) {
            m.done_by_notice = kvc_write_d_by_notice(eng, x->rel[k]);
            if (!kvc_write_d_blocks_on_dp(eng, x, k, &m)) {
                kvc_peer_send_msg(x->rel[k], &m, "remote_blocks");
            }
            if (kvc_write_d_dp_on(eng) &&
                (x->rel[k]->state == KVC_PEER_NEW ||
                 (x->rel[k]->state == KVC_PEER_FAILED &&
                  kvc_now_us(eng) >= x->rel[k]->ctl_retry_us))) {
                /* The endpoint the next transfers' remote_blocks take
                 * (in the background: this one went over nng); again a
                 * while after it was lost. */
                kvc_peer_want_handshake(x->rel[k]);
            }
        }
    }
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        kvc_xfer_free(x);
    }
    return st;
}

static void kvc_write_d_dp_settle(kvc_xfer_t *x, int k);

/* kvc_write_d_all: the mask of x's nrel P ranks. */
static uint64_t kvc_write_d_all(const kvc_xfer_t *x)
{
    return x->nrel >= 64 ? ~0ull : (1ull << x->nrel) - 1;
}

/* kvc_write_d_abort_check: an aborted D transfer reports CANCELED once
 * every P rank confirmed that none of its puts can land any more (its
 * write_done, a fenced release reply, or it is gone). */
static void kvc_write_d_abort_check(struct kvx_engine *eng, kvc_xfer_t *x,
                                    const char *why)
{
    if (!x->aborting || x->state != KVC_XFER_WAIT_WRITE ||
        (why == NULL &&
         ((x->rel_fenced | x->rel_done) & kvc_write_d_all(x)) !=
             kvc_write_d_all(x))) {
        return;
    }
    x->state = KVC_XFER_FAILED;
    kvc_write_d_dp_settle(x, -1);
    if (why != NULL) {
        snprintf(x->reason, sizeof(x->reason), "%s", why);
    }
    if (x->status == KVX_OK) {
        x->status = KVX_ERR_CANCELED;
    }
    kvc_event_push(eng, KVX_EVENT_FAILED, x->status, x, x->reason, 1);
    kvc_idset_add(&eng->terminal, x->transfer_id);
}

/* kvc_write_d_rank: which of x's P ranks sent m, or -1 (none); -3 when
 * m comes from another host than its rank's (reason set); -2
 * when m's sender may be a rank whose instance is not known yet (its
 * reply to remote_blocks has not arrived: the write_done overtook it). */
static int kvc_write_d_rank(const kvc_xfer_t *x, const kvc_msg_t *m,
                            char *reason, size_t len)
{
    int k       = -1;
    int unbound = 0;

    for (uint32_t i = 0; i < x->nrel && k < 0; i++) {
        uint64_t inst = x->rel_inst[i] != 0 ? x->rel_inst[i] : x->rel[i]->inst;

        if (m->instance != 0 ? inst == m->instance : !(x->rel_done >> i & 1)) {
            k = (int)i;
        } else if (m->instance != 0 && inst == 0 &&
                   kvc_from_matches(m->from, x->rel[i]->host) != 0) {
            unbound = 1;
        }
    }
    if (k >= 0 && kvc_from_matches(m->from, x->rel[k]->host) == 0) {
        snprintf(reason, len, "%s for '%s' from %s: the P rank of this "
                 "transfer is %s", kvc_msg_desc(m->type)->name,
                 x->transfer_id, m->from, x->rel[k]->name);
        return -3;
    }
    if (k < 0 && unbound) {
        return -2;
    }
    if (k < 0) {
        snprintf(reason, len, "%s for '%s' from %s (instance %llu): not "
                 "from a P rank instance this transfer is bound to",
                 kvc_msg_desc(m->type)->name, x->transfer_id, m->from,
                 (unsigned long long)m->instance);
    }
    return k;
}

/* kvc_write_d_dp_settle: rank k of x (every rank: k < 0) no longer waits
 * on a remote_blocks sent on the data plane. */
static void kvc_write_d_dp_settle(kvc_xfer_t *x, int k)
{
    for (uint32_t i = 0; i < x->nrel && i < 64; i++) {
        if ((k < 0 || (uint32_t)k == i) && (x->rel_dp >> i & 1)) {
            x->rel_dp &= ~(1ull << i);
            if (x->rel[i]->dp_unconfirmed > 0) {
                x->rel[i]->dp_unconfirmed--;
            }
        }
    }
}

void kvc_write_d_dp_timeout(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (eng->stopping) {
        return;
    }
    for (uint32_t i = 0; i < x->nrel && i < 64; i++) {
        kvc_peer_t *peer = x->rel[i];

        if ((x->rel_dp >> i & 1) && !(x->rel_done >> i & 1) &&
            peer->state == KVC_PEER_READY &&
            kvc_now_us(eng) >= peer->dp_off_until) {
            /* Not closed: over tcp UCX may have matched it with P's own
             * endpoint to this worker (one connection both ways), and a
             * close (forced, with P not answering) cut P's puts to us
             * (fault campaign stop_p). Just not used for a while. */
            kvc_log_warn("KVX-PEER-EP", "peer %s: a remote_blocks sent on "
                         "its control endpoint was not completed by the "
                         "transfer's deadline: the control plane carries "
                         "them for %.0f s", peer->name,
                         KVC_CTL_RETRY_US / 1e6);
            peer->dp_off_until   = kvc_now_us(eng) + KVC_CTL_RETRY_US;
            peer->dp_unconfirmed = 0;
        }
    }
    kvc_write_d_dp_settle(x, -1);
}

/* kvc_write_d_done: P rank k wrote everything (or was fenced). */
static void kvc_write_d_done(struct kvx_engine *eng, kvc_xfer_t *x, int k)
{
    x->landing = 0;
    kvc_write_d_dp_settle(x, k);
    x->rel_done |= 1ull << k;
    if (x->aborting) {
        kvc_write_d_abort_check(eng, x, NULL);
    } else if ((x->rel_done & kvc_write_d_all(x)) == kvc_write_d_all(x)) {
        x->state = KVC_XFER_DONE;
        kvc_event_push(eng, KVX_EVENT_FINISHED_RECVING, KVX_OK, x, "", 0);
        kvc_idset_add(&eng->terminal, x->transfer_id);
    }
}

/* kvc_write_d_keep_early: a completion (write_done or notice) from
 * instance inst, which no rank of x is bound to yet, held for the reply that
 * binds one of ranks (those of the host it came from) to it
 * (kvc_early_done_t). A drop (the store full) is logged: P may send nothing
 * more, so the transfer then ends at its deadline. Returns 1 when kept. */
static int kvc_write_d_keep_early(kvc_xfer_t *x, uint64_t inst,
                                  uint64_t ranks)
{
    if (kvc_early_done_keep(&x->early, inst, ranks)) {
        return 1;
    }
    kvc_log_debug("KVX-WRITE-EARLY", "transfer %s: completion of instance "
                  "%llu not kept (ranks %llx; %d held)", x->transfer_id,
                  (unsigned long long)inst, (unsigned long long)ranks,
                  KVC_RANKMAP_MAX);
    return 0;
}

/* kvc_write_d_unbound: the mask of x's ranks not bound to an instance
 * yet (no reply to remote_blocks) and not done. */
static uint64_t kvc_write_d_unbound(const kvc_xfer_t *x)
{
    uint64_t m = 0;

    for (uint32_t i = 0; i < x->nrel && i < 64; i++) {
        if (x->rel_inst[i] == 0 && !(x->rel_done >> i & 1)) {
            m |= 1ull << i;
        }
    }
    return m;
}

void kvc_write_on_write_done(struct kvx_engine *eng, const kvc_msg_t *m,
                             char *reason, size_t len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);
    int         k;

    *ok_p = 1;
    if (x == NULL || !x->write || x->is_producer ||
        x->state != KVC_XFER_WAIT_WRITE) {
        /* Finished, failed or unknown: ignore (SPEC §9). */
        kvc_log_debug("KVX-WRITE-DONE-IGNORED", "write_done for '%s' ignored",
                      m->transfer_id);
        return;
    }
    if (x->xnonce != 0 && m->xfer_nonce != 0 && m->xfer_nonce != x->xnonce) {
        /* Another use of this transfer id (the framework reused it and
         * the earlier one's write_done is late): ignored. A write_done
         * without xfer_nonce (a legacy P) is checked as before. */
        kvc_log_debug("KVX-WRITE-DONE-IGNORED", "write_done for '%s': "
                      "xfer_nonce %llu, this use of the id is %llu",
                      m->transfer_id, (unsigned long long)m->xfer_nonce,
                      (unsigned long long)x->xnonce);
        return;
    }
    if (x->xnonce != 0 && m->xfer_nonce == 0 && m->instance != 0) {
        /* A write_done naming an instance is a kvxfer P's, which echoes
         * the use's xfer_nonce: without it, it names no use (nor is it
         * kept for a rank not bound yet, to end this one later). */
        *ok_p = 0;
        snprintf(reason, len, "write_done for '%s' from instance %llu "
                 "without an xfer_nonce: this use of the id has one",
                 x->transfer_id, (unsigned long long)m->instance);
        return;
    }
    k = kvc_write_d_rank(x, m, reason, len);
    if (k == -2) {
        /* Held until a reply binds a rank of m's host to this instance. */
        uint64_t ranks = 0, unbound = kvc_write_d_unbound(x);

        for (uint32_t i = 0; i < x->nrel && i < 64; i++) {
            if ((unbound >> i & 1) &&
                kvc_from_matches(m->from, x->rel[i]->host) != 0) {
                ranks |= 1ull << i;
            }
        }
        kvc_write_d_keep_early(x, m->instance, ranks);
        return;
    }
    if (k == -3) {
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
    }
    if (k < 0) {
        *ok_p = 0; /* changes nothing */
        return;
    }
    if (x->xnonce != 0 && m->xfer_nonce == 0 && x->rel_inst[k] == 0 &&
        k < 64 && !(x->rel_replied >> k & 1)) {
        /* The rank has not answered remote_blocks yet: whether it is a
         * kvxfer P (its answer names an instance, and this write_done then
         * names no use) or a legacy one is not known. Held until the
         * answer comes (kvc_write_d_on_reply); the deadline bounds it. */
        x->plain_done |= 1ull << k;
        return;
    }
    if (x->xnonce != 0 && m->xfer_nonce == 0 && x->rel_inst[k] != 0) {
        /* A rank bound to an instance is a kvxfer P, whose write_done
         * echoes the xfer_nonce of the remote_blocks it served: one
         * without it (SPEC 9's plain string, or JSON without the field)
         * names no use and ends none. Ranks that never named an instance
         * (a legacy P) are served as before. */
        *ok_p = 0;
        snprintf(reason, len, "write_done for '%s' without an xfer_nonce: "
                 "this use of the id has one, which its P rank %s echoes",
                 x->transfer_id, x->rel[k]->name);
        return;
    }
    kvc_write_d_done(eng, x, k);
}

/* kvc_write_on_given_up (D): a P rank's engine stopped before it wrote
 * its part of this use whole, after its endpoints closed: none of its
 * puts can land any more. The transfer fails (the other ranks are fenced
 * as for any failed rank); while it fences already, the rank counts as
 * confirmed. Only from the rank bound to this use (instance, nonce,
 * host); anything else changes nothing. */
void kvc_write_on_given_up(struct kvx_engine *eng, const kvc_msg_t *m,
                           char *reason, size_t len, int *ok_p)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, m->transfer_id);
    int         k;

    *ok_p = 1;
    if (x == NULL || !x->write || x->is_producer ||
        x->state != KVC_XFER_WAIT_WRITE) {
        return; /* finished, failed or unknown: nothing to do */
    }
    if (x->xnonce == 0 || m->xfer_nonce != x->xnonce || m->instance == 0) {
        *ok_p = 0;
        snprintf(reason, len, "given_up for '%s': names no instance or "
                 "not this use of the id (xfer_nonce %llu)", x->transfer_id,
                 (unsigned long long)m->xfer_nonce);
        return;
    }
    k = kvc_write_d_rank(x, m, reason, len);
    if (k == -3) {
        kvc_refused(eng, KVC_PORT_NOTIFY, KVC_REFUSE_WRONG_PEER);
    }
    if (k < 0 || k >= 64 || x->rel_inst[k] != m->instance) {
        /* Changes nothing (a rank not bound to that instance yet: its
         * fence's bound covers it). */
        *ok_p = 0;
        if (k >= 0 || reason[0] == '\0') {
            snprintf(reason, len, "given_up for '%s' from %s (instance "
                     "%llu): not the instance a rank of this use is bound "
                     "to", x->transfer_id, m->from,
                     (unsigned long long)m->instance);
        }
        return;
    }
    eng->stats.given_up++;
    if (x->aborting) {
        x->rel_fenced |= 1ull << k;
        kvc_write_d_abort_check(eng, x, NULL);
    } else {
        char why[KVX_REASON_MAX];

        snprintf(why, sizeof(why), "P rank %.200s gave the transfer up: its "
                 "engine stopped before it was written", x->rel[k]->name);
        kvc_write_d_fence(eng, x, KVX_ERR_ENDPOINT, why, x->rel[k]);
    }
}

/* kvc_write_d_notice_early: a notice from an instance no rank of x is
 * bound to yet (it overtook the reply to remote_blocks, which binds it):
 * kept, as an early write_done is, when its mac is the one the session of
 * the host of such an unbound rank gives; the reply that binds a rank to
 * that instance completes the rank. Returns 1 when kept, -1 when an
 * unbound rank's host could have sent it but none did (refused), 0 when it
 * cannot be told (no unbound rank, host names, the early store full).
 * hosts: the n hosts of x's ranks. */
static int kvc_write_d_notice_early(struct kvx_engine *eng, kvc_xfer_t *x,
                                    const kvc_notice_t *nt,
                                    const char *const *hosts, uint32_t n)
{
    uint64_t ranks;
    int      checked = 0;

    ranks = kvc_notice_ranks(eng->expo.key, hosts, n, kvc_write_d_unbound(x),
                             nt->tag, nt->nonce, nt->instance, nt->xnonce,
                             nt->mac, &checked);
    if (ranks != 0) {
        return kvc_write_d_keep_early(x, nt->instance, ranks);
    }
    return checked ? -1 : 0;
}

#define KVC_LANDING_MAX_US 10000 /* the period tick's: no sooner after */

/* kvc_write_d_release_to: x's release (this use: its xfer_nonce) to P rank
 * peer, which stops and fences its puts into x's blocks. */
static void kvc_write_d_release_to(struct kvx_engine *eng, const kvc_xfer_t *x,
                                   kvc_peer_t *peer)
{
    kvc_msg_t m;

    kvc_release_msg(eng, x->transfer_id, &m);
    m.xfer_nonce = x->xnonce;
    kvc_peer_send_msg(peer, &m, "release");
}

/* kvc_write_d_resend_releases: the releases of fencing D transfers that
 * went unanswered go again once their time came (the ranks that have
 * confirmed meanwhile are skipped); the count of transfers still waiting,
 * and the earliest time one waits for (the tick looks no sooner), are
 * taken again. */
static void kvc_write_d_resend_releases(struct kvx_engine *eng, uint64_t now)
{
    /* Counted again from 0: a release that cannot even be posted is
     * answered (unsent) inside kvc_peer_send_msg, and sets its transfer
     * waiting again, counted then (kvc_write_d_release_unanswered). */
    eng->fence_resends     = 0;
    eng->fence_resend_next = 0;
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            uint64_t open;

            if (x->fence_resend == 0) {
                continue;
            }
            open = x->fence_resend & ~(x->rel_fenced | x->rel_done);
            if (x->is_producer || !x->write || !x->aborting ||
                x->state != KVC_XFER_WAIT_WRITE || open == 0) {
                x->fence_resend = 0;
                continue;
            }
            if (now < x->fence_resend_at) {
                eng->fence_resends++;
                if (eng->fence_resend_next == 0 ||
                    x->fence_resend_at < eng->fence_resend_next) {
                    eng->fence_resend_next = x->fence_resend_at;
                }
                continue;
            }
            x->fence_resend = 0;
            for (uint32_t k = 0; k < x->nrel && k < 64; k++) {
                if (open >> k & 1) {
                    kvc_write_d_release_to(eng, x, x->rel[k]);
                    eng->stats.fence_resends++;
                }
            }
        }
    }
}

/* kvc_write_on_tick (kvc_mode_t.on_tick): completes the D transfers whose
 * counted notice overtook some of the puts it counts once those landed,
 * and asks for the next look soon while any still waits (100 µs after a
 * new one, then twice as long each time up to 10 ms: the bytes are
 * usually on their way; the notice after P's flush ends any wait). */
void kvc_write_on_tick(struct kvx_engine *eng, uint64_t now)
{
    uint32_t left = 0;

    if (eng->fence_resends > 0 && now >= eng->fence_resend_next) {
        kvc_write_d_resend_releases(eng, now);
    }
    if (eng->landing_waits == 0) {
        return;
    }
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            if (x->landing == 0) {
                continue;
            }
            if (!x->write || x->is_producer ||
                x->state != KVC_XFER_WAIT_WRITE || x->nrel != 1 ||
                (x->rel_done & 1)) {
                x->landing = 0;
            } else if (kvc_expo_put_bytes(eng, x) >= x->landing) {
                eng->stats.notices_done++;
                eng->stats.counted_done++;
                kvc_write_d_done(eng, x, 0);
            } else {
                left++;
            }
        }
    }
    eng->landing_waits = left;
    if (left > 0 && KVD(eng)->tick_at != NULL &&
        eng->landing_delay_us < KVC_LANDING_MAX_US) {
        eng->landing_delay_us *= 2;
        KVD(eng)->tick_at(eng->ucx, now + eng->landing_delay_us);
    }
}

void kvc_write_on_notice(struct kvx_engine *eng, const kvc_notice_t *nt)
{
    kvc_xfer_t        *x;
    const char        *hosts[KVC_RANKMAP_MAX];
    uint64_t           insts[KVC_RANKMAP_MAX];
    uint32_t           n = 0;
    int                k;
    const char        *id = nt->id;
    uint64_t           tag = nt->tag, instance = nt->instance;

    x = kvc_xfer_find(eng, id);
    if (x == NULL || !x->write || x->is_producer ||
        x->state != KVC_XFER_WAIT_WRITE || nt->xnonce != x->xnonce) {
        /* Ended, unknown here, or of another use of the id (a late notice
         * of an earlier transfer under a reused id): as write_done,
         * ignored (SPEC §9). */
        return;
    }
    /* Authenticated by the session this D handed the host of the P rank of
     * that instance: the notice comes from the P rank the transfer is bound
     * to, not from whoever knows its id and instance. */
    for (; n < x->nrel && n < KVC_RANKMAP_MAX; n++) {
        hosts[n] = x->rel[n]->host;
        insts[n] = x->rel_inst[n] != 0 ? x->rel_inst[n] : x->rel[n]->inst;
    }
    k = kvc_xfer_tag(id) != tag
            ? -2
            : kvc_notice_match_n(eng->expo.key, hosts, insts, n, tag,
                                 nt->nonce, instance, nt->xnonce, nt->count,
                                 nt->mac);
    if (k == -2) {
        eng->stats.notices_refused++;
        kvc_log_debug("KVX-WRITE-NOTICE", "notice for '%s' (instance %llu) "
                      "refused: not authenticated by a P rank of the "
                      "transfer", x->transfer_id,
                      (unsigned long long)instance);
    } else if (k >= 0 && !(x->rel_done >> k & 1)) {
        int counted = nt->count != KVC_COUNT_NONE;

        if (counted && (x->nrel != 1 || !x->exposed)) {
            /* Counted notices are asked for with one rank only (the bytes
             * landed are the transfer's, not a rank's). */
            eng->stats.notices_refused++;
        } else if (counted && kvc_expo_put_bytes(eng, x) < nt->count) {
            /* Sent right behind the puts, it overtook some of them: done
             * once they landed (kvc_write_on_tick), or on the notice P
             * sends after its flush, or at the deadline. */
            x->landing = nt->count;
            eng->landing_waits++;
            eng->landing_delay_us = 100;
            eng->stats.notices_landing++;
            if (KVD(eng)->tick_at != NULL) {
                KVD(eng)->tick_at(eng->ucx, kvc_now_us(eng) + 100);
            }
        } else {
            eng->stats.notices_done++;
            eng->stats.counted_done += counted;
            kvc_write_d_done(eng, x, k);
        }
    } else if (k == -1 && nt->count != KVC_COUNT_NONE) {
        /* (not held as early: its count could not be checked then) */
    } else if (k == -1) {
        int e = kvc_write_d_notice_early(eng, x, nt, hosts, n);

        if (e > 0) {
            eng->stats.notices_early++;
        } else if (e < 0) {
            eng->stats.notices_refused++;
        }
        /* e == 0: a host name (write_done decides) or the store full. */
    }
}

#define KVC_FENCE_RESEND_US 200000 /* an unanswered release, again after */

/* kvc_write_d_release_unanswered: x's release to P rank peer, while x
 * fences its puts, got no answer (not sent, the connection lost, a
 * timeout): that rank has not confirmed, so the release goes again
 * (kvc_write_on_tick) until it confirms or the fence's deadline passes.
 * A refusal is an answer and is not sent again: the rank would refuse the
 * same way (its host, its ranks, its instance, which on_reply settles). */
static void kvc_write_d_release_unanswered(struct kvx_engine *eng,
                                           kvc_xfer_t *x, kvc_peer_t *peer,
                                           const kvc_reply_info_t *info)
{
    if (x->is_producer || !x->write || x->state != KVC_XFER_WAIT_WRITE ||
        (info->sent_xnonce != 0 && x->xnonce != 0 &&
         info->sent_xnonce != x->xnonce)) {
        return;
    }
    for (uint32_t k = 0; k < x->nrel && k < 64; k++) {
        uint64_t bit = 1ull << k;

        if (x->rel[k] == peer && !((x->rel_fenced | x->rel_done) & bit)) {
            if (x->fence_resend == 0) {
                eng->fence_resends++;
            }
            x->fence_resend |= bit;
            x->fence_resend_at = kvc_now_us(eng) + KVC_FENCE_RESEND_US;
            if (eng->fence_resend_next == 0 ||
                x->fence_resend_at < eng->fence_resend_next) {
                eng->fence_resend_next = x->fence_resend_at;
            }
        }
    }
}

/* kvc_write_d_on_reply: P rank peer answered remote_blocks (its instance
 * binds the transfer) or, while aborting, a release (fenced: none of its
 * puts can land any more). */
void kvc_write_d_on_reply(struct kvx_engine *eng, kvc_peer_t *peer,
                          kvc_msg_type_t type, const char *tid,
                          const kvc_reply_info_t *info)
{
    kvc_xfer_t *x = kvc_xfer_find(eng, tid);

    if (x != NULL && type == KVC_MSG_RELEASE && x->aborting &&
        !info->delivered) {
        kvc_write_d_release_unanswered(eng, x, peer, info);
    }
    if (x == NULL || x->is_producer || !x->write || !info->delivered ||
        !info->ok || x->state != KVC_XFER_WAIT_WRITE ||
        (info->sent_xnonce != 0 && x->xnonce != 0 &&
         info->sent_xnonce != x->xnonce)) {
        return; /* (or the reply to a message of an earlier use of the id) */
    }
    for (uint32_t k = 0; k < x->nrel; k++) {
        if (x->rel[k] != peer) {
            continue;
        }
        if (type == KVC_MSG_REMOTE_BLOCKS && x->rel_inst[k] == 0) {
            x->rel_inst[k] = info->instance;
            if (k < 64) {
                uint64_t bit = 1ull << k;

                x->rel_replied |= bit;
                if ((x->plain_done & bit) && info->instance == 0) {
                    /* a legacy P: its plain write_done came first */
                    x->plain_done &= ~bit;
                    kvc_write_d_done(eng, x, (int)k);
                    if (x->state != KVC_XFER_WAIT_WRITE) {
                        return;
                    }
                    continue;
                }
                if (x->plain_done & bit) {
                    /* a kvxfer P: the plain write_done named no use */
                    x->plain_done &= ~bit;
                    kvc_log_warn("KVX-CTL-REJECT", "write_done for '%s' "
                                 "without an xfer_nonce dropped: its P rank "
                                 "%s answered as instance %llu, whose "
                                 "write_done carries the use's nonce",
                                 x->transfer_id, peer->name,
                                 (unsigned long long)info->instance);
                }
            }
            if (kvc_early_done_take(&x->early, info->instance, k)) {
                eng->stats.early_completed++;
                kvc_write_d_done(eng, x, (int)k);
                if (x->state != KVC_XFER_WAIT_WRITE) {
                    return;
                }
            }
        } else if (type == KVC_MSG_RELEASE && info->fenced) {
            x->rel_fenced |= 1ull << k;
        }
    }
    kvc_write_d_abort_check(eng, x, NULL);
}

static void kvc_write_d_fence_arm(struct kvx_engine *eng, kvc_xfer_t *x);

/* kvc_write_d_peer_failed: P rank peer died or restarted: the D transfers
 * waiting for its writes fail (an aborted one counts it as fenced: nothing
 * of that instance can land any more). */
void kvc_write_d_peer_failed(struct kvx_engine *eng, kvc_peer_t *peer)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
        for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
            uint32_t k;
            int      restarted;

            if (x->is_producer || !x->write ||
                x->state != KVC_XFER_WAIT_WRITE) {
                continue;
            }
            for (k = 0; k < x->nrel && x->rel[k] != peer; k++) {
            }
            if (k == x->nrel || (x->rel_done >> k & 1) ||
                !kvc_peer_bound_lost(peer, x->rel_inst[k])) {
                continue;
            }
            restarted = x->rel_inst[k] == 0 && peer->lost_inst != 0 &&
                        peer->inst != 0 && peer->inst != peer->lost_inst;
            if (x->aborting && restarted) {
                /* No reply told which instance took remote_blocks: the
                 * new one may be putting, and the release sent before
                 * went to the old one. */
                kvc_write_d_release_to(eng, x, peer);
                kvc_write_d_fence_arm(eng, x); /* its answer's full window */
                continue;
            }
            if (x->aborting && peer->lost_by_ctl) {
                /* Only its control connection is gone: the process may
                 * live and put on over the data plane, so it must confirm
                 * (or its kept endpoint fail: kvc_peer_ep_error); the
                 * release sent before may be lost, it goes again. */
                kvc_write_d_release_to(eng, x, peer);
                continue;
            }
            if (x->aborting) {
                x->rel_fenced |= 1ull << k;
                kvc_write_d_abort_check(eng, x, NULL);
                continue;
            }
            {
                char why[KVX_REASON_MAX];

                snprintf(why, sizeof(why), "P rank %.200s: %.280s",
                         peer->name, peer->fail_reason);
                if (restarted || peer->lost_by_ctl) {
                    /* A restart, and no reply told which instance took
                     * remote_blocks: the new one may be putting into the
                     * blocks, so it is asked to fence too. Or only its
                     * control connection is gone (a cut network): the
                     * rank may live and put on over the data plane, so it
                     * confirms too, unless its kept endpoint fails
                     * (kvc_peer_ep_error: gone). */
                    kvc_write_d_fence(eng, x, peer->fail_status, why, NULL);
                } else {
                    /* That instance is gone: none of its puts can land
                     * any more; the other P ranks' still can. */
                    kvc_write_d_fence(eng, x, peer->fail_status, why, peer);
                }
            }
        }
    }
}

/* kvc_write_d_fence_arm: x starts fencing: its deadline becomes at least
 * transfer_timeout + handshake_timeout from now (a P rank's puts in
 * flight end by its own transfer deadline, which may lie up to
 * transfer_timeout after ours: it started pushing when its prefill ended;
 * then a control round trip), never earlier than it was. */
static void kvc_write_d_fence_arm(struct kvx_engine *eng, kvc_xfer_t *x)
{
    uint64_t limit = kvc_deadline_us(eng, eng->cfg.transfer_timeout +
                                              eng->cfg.handshake_timeout);

    if (x->timed_out || x->deadline_us < limit) {
        x->timed_out = 0; /* the fence's own deadline (kvc_write_on_timer) */
        kvc_xfer_arm(eng, x, limit);
    }
}

/* kvc_write_d_fence: x (waiting for its writes, not aborting yet) fails
 * with status and why, but its blocks are reported (FAILED) only once
 * every P rank confirmed that none of its puts can land any more: release
 * to each (it stops, flushes what it posted and answers write_done or a
 * fenced reply), gone is a P rank that is known dead (its instance's puts
 * cannot land). The wait is bounded (kvc_write_d_fence_arm); a P rank
 * that has not confirmed by then is named in the reason and counted
 * (fences_unconfirmed). */
void kvc_write_d_fence(struct kvx_engine *eng, kvc_xfer_t *x,
                       kvx_status_t status, const char *why,
                       const kvc_peer_t *gone)
{
    kvc_msg_t m;

    if (x->is_producer || !x->write || x->state != KVC_XFER_WAIT_WRITE ||
        x->aborting) {
        return;
    }
    x->aborting = 1;
    x->status   = status != KVX_OK ? status : KVX_ERR_TRANSFER_TIMEOUT;
    snprintf(x->reason, sizeof(x->reason), "%s", why);
    kvc_release_msg(eng, x->transfer_id, &m);
    m.xfer_nonce = x->xnonce;
    for (uint32_t k = 0; k < x->nrel; k++) {
        if (x->rel[k] == gone) {
            x->rel_fenced |= 1ull << k;
        } else if (!(x->rel_done >> k & 1)) {
            kvc_peer_send_msg(x->rel[k], &m, "release");
        }
    }
    kvc_write_d_fence_arm(eng, x);
    kvc_write_d_abort_check(eng, x, NULL);
}

/* kvc_write_d_deadline: an aborted transfer's deadline passed before every
 * P rank confirmed. */
void kvc_write_d_deadline(struct kvx_engine *eng, kvc_xfer_t *x)
{
    char     why[KVX_REASON_MAX];
    uint64_t open = kvc_write_d_all(x) & ~(x->rel_fenced | x->rel_done);
    size_t   n;

    n = (size_t)snprintf(why, sizeof(why), "%.300s; not every P rank "
                         "confirmed its puts fenced before the deadline "
                         "(unconfirmed:", x->reason);
    for (uint32_t k = 0; k < x->nrel && n < sizeof(why); k++) {
        if (open >> k & 1) {
            n += (size_t)snprintf(why + n, sizeof(why) - n, " %s",
                                  x->rel[k]->name);
        }
    }
    if (n < sizeof(why)) {
        snprintf(why + n, sizeof(why) - n, ")");
    }
    if (open != 0) {
        eng->stats.fences_unconfirmed++;
    }
    kvc_write_d_dp_timeout(eng, x); /* (an abort's wait ran out too) */
    kvc_write_d_abort_check(eng, x, why);
}

/* kvc_write_abort_xfer: D aborts a transfer still waiting for its writes:
 * the release to every P rank (kvc_consumer_abort) asks them to stop; the
 * blocks are reported free (CANCELED) only once each confirmed. */
static void kvc_write_abort_xfer(struct kvx_engine *eng, kvc_xfer_t *x)
{
    if (!x->is_producer && x->write && x->state == KVC_XFER_WAIT_WRITE &&
        !x->aborting) {
        x->aborting = 1;
        x->status   = KVX_ERR_CANCELED;
        snprintf(x->reason, sizeof(x->reason), "aborted by the framework");
        kvc_write_d_fence_arm(eng, x);
        kvc_write_d_abort_check(eng, x, NULL);
    }
}

/* kvc_write_d_destroy: engine_destroy aborts a transfer still waiting for
 * its writes: release to every P rank, which stops and fences its puts;
 * destroy waits (bounded) for the confirmations before it deregisters the
 * blocks those puts target. */
int kvc_write_d_destroy(struct kvx_engine *eng, kvc_xfer_t *x)
{
    kvc_msg_t m;

    if (x->is_producer || !x->write || x->state != KVC_XFER_WAIT_WRITE) {
        return 0;
    }
    if (!x->aborting) {
        kvc_release_msg(eng, x->transfer_id, &m);
        kvc_write_abort_xfer(eng, x);
        kvc_write_d_send(x, &m, "release");
    }
    return x->aborting && x->state == KVC_XFER_WAIT_WRITE;
}

kvx_status_t kvc_write_abort(struct kvx_engine *eng, const char *req_id,
                             const char *params_json)
{
    return kvc_consumer_abort(eng, req_id, params_json, kvc_write_abort_xfer);
}
