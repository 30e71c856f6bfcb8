/*
 * engine.c - engine lifetime: create (config, placement, data plane),
 * start (metadata, listeners, registration), the periodic tick, destroy.
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

uint64_t kvc_now_us(const struct kvx_engine *eng)
{
    return eng->env.clock.now_us(eng->env.clock.arg);
}

uint64_t kvc_deadline_us(const struct kvx_engine *eng, double seconds)
{
    return kvc_now_us(eng) + (uint64_t)(seconds * 1e6);
}

uint64_t kvc_wait_deadline(const struct kvx_engine *eng, int64_t timeout_ms)
{
    /* at most 2^50 us (about 35 years) ahead: no clock arithmetic wraps */
    const uint64_t cap = (uint64_t)1 << 50;
    uint64_t       ms  = timeout_ms > 0 ? (uint64_t)timeout_ms : 0;

    return kvc_now_us(eng) + (ms > cap / 1000u ? cap : ms * 1000u);
}

void kvc_wait_until(struct kvx_engine *eng, uint64_t deadline_us)
{
    eng->env.clock.wait(eng->env.clock.arg, &eng->cond, &eng->lock,
                        deadline_us);
}

void kvc_wake(struct kvx_engine *eng)
{
    if (eng->defer_wake && pthread_equal(eng->defer_owner, pthread_self())) {
        eng->wake_pending = 1;
    } else {
        pthread_cond_broadcast(&eng->cond);
    }
}

void kvc_lock_deferring(struct kvx_engine *eng)
{
    pthread_mutex_lock(&eng->lock);
    eng->defer_wake  = 1;
    eng->defer_owner = pthread_self();
}

void kvc_unlock_waking(struct kvx_engine *eng)
{
    int wake = eng->wake_pending;

    eng->defer_wake   = 0;
    eng->wake_pending = 0;
    pthread_mutex_unlock(&eng->lock);
    if (wake) { /* eng outlives its progress owner's callbacks */
        pthread_cond_broadcast(&eng->cond);
    }
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
    if (eng->started || eng->starting) {
        pthread_mutex_unlock(&eng->lock);
        return kvc_error(KVX_ERR_BAD_STATE, "engine %s: %s", eng->engine_id,
                         eng->started ? "already started"
                                      : "start() already in progress in "
                                        "another thread");
    }
    if (eng->nlayers == 0) {
        pthread_mutex_unlock(&eng->lock);
        return kvc_error(KVX_ERR_BAD_STATE, "start: no layer registered");
    }
    /* From here until it ends, register_layer and another start() are
     * refused: the metadata built now is what peers get. */
    eng->starting   = 1;
    eng->replicated = 1;
    for (size_t i = 0; i < eng->nlayers; i++) {
        eng->replicated &= eng->layers[i].geom.key_only ? 1 : 0;
    }
    st = kvc_meta_build(eng);
    if (st != KVX_OK) {
        eng->starting = 0;
    }
    pthread_mutex_unlock(&eng->lock);
    if (st != KVX_OK) {
        return st;
    }
    st = KVN(eng)->server_create(eng->cfg.host_ip, eng->cfg.handshake_port + off,
                                 KVC_SERVER_CTX, KVC_MSG_MAX_BYTES * 2,
                                 kvc_config_ctl_sec(&eng->cfg), kvc_hs_handler,
                                 eng, &eng->hs_srv);
    if (st == KVX_OK) {
        st = KVN(eng)->server_create(eng->cfg.host_ip, eng->cfg.notify_port + off,
                                     KVC_SERVER_CTX, KVC_MSG_MAX_BYTES * 2,
                                     kvc_config_ctl_sec(&eng->cfg),
                                     kvc_notify_handler, eng,
                                     &eng->notify_srv);
    }
    if (st != KVX_OK) {
        kvc_server_close(eng, &eng->hs_srv);
        st = kvc_error(st, "engine %s: %s (ports: handshake_port %u + rank "
                       "%u, notify_port %u + rank %u)", eng->engine_id,
                       kvc_last_error(), eng->cfg.handshake_port, off,
                       eng->cfg.notify_port, off);
        pthread_mutex_lock(&eng->lock);
        eng->starting = 0;
        pthread_mutex_unlock(&eng->lock);
        return st;
    }
    if (st == KVX_OK) {
        st = kvc_reg_setup(eng);
    }
    if (st != KVX_OK) {
        kvc_server_close(eng, &eng->hs_srv);
        kvc_server_close(eng, &eng->notify_srv);
        pthread_mutex_lock(&eng->lock);
        eng->starting = 0;
        pthread_mutex_unlock(&eng->lock);
        return st;
    }
    pthread_mutex_lock(&eng->lock);
    eng->started  = 1;
    eng->starting = 0;
    pthread_mutex_unlock(&eng->lock);
    kvc_log_info("KVX-STARTED", "engine %s rank dp%u tp%u listening on %s:%u "
                 "(handshake) and :%u (notify), UCX %s", eng->engine_id,
                 eng->cfg.dp_rank, eng->cfg.tp_rank, eng->cfg.host_ip,
                 eng->cfg.handshake_port + off, eng->cfg.notify_port + off,
                 KVD(eng)->version());
    return KVX_OK;
}

static void kvc_engine_tick(void *arg)
{
    struct kvx_engine *eng  = arg;
    int                full = 0;

    pthread_mutex_lock(&eng->lock);
    if (!eng->stopping) {
        uint64_t     now = kvc_now_us(eng);
        kvc_timer_t *t;

        /* Only due deadlines cost anything: idle transfers sit in the
         * queue untouched. */
        while ((t = kvc_timerq_pop_due(&eng->timers, now)) != NULL) {
            eng->mode->on_timer(eng, kvc_xfer_of_timer(t));
        }
        if (eng->mode->on_tick != NULL) {
            eng->mode->on_tick(eng, now);
        }
        /* The rest keeps its period when ticks come sooner (a READ
         * retry's tick_at): a prefault chunk per retry would hold up the
         * very gets that wait. */
        full = now - eng->full_tick_us >= KVC_TICK_FULL_US;
        if (full) {
            eng->full_tick_us = now;
            kvc_early_expire(eng, now);
            kvc_reg_tick(eng);
            kvc_peers_prefault(eng);
            kvc_peers_check_conn(eng);
        }
    }
    pthread_mutex_unlock(&eng->lock);
    if (full) {
        kvc_peers_collect(eng);
    }
}

/* kvc_engine_on_notice (kvt_data_params_t.notice): to the mode, under the
 * engine lock (on the progress owner, without the transport's locks). */
static void kvc_engine_on_notice(void *arg, uint64_t tag, uint64_t mac,
                                 uint64_t nonce, uint64_t instance,
                                 uint64_t xnonce, const char *id,
                                 size_t idlen, const char *from,
                                 uint64_t count)
{
    struct kvx_engine *eng = arg;
    kvc_notice_t       nt  = {tag, mac, nonce, instance, xnonce, id,
                              from != NULL ? from : "", count};

    (void)idlen; /* id is NUL-terminated by the transport */
    kvc_lock_deferring(eng);
    /* Not once destroy freed the peers (stopping): the progress thread
     * still delivers until the transport is destroyed. */
    if (!eng->stopping && eng->mode->on_notice != NULL) {
        eng->mode->on_notice(eng, &nt);
    }
    kvc_unlock_waking(eng);
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
    kvt_net_t         *nets = NULL;
    char               nic[256], cpus[256];
    kvx_status_t       st;

    if (eng == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "engine: out of memory");
    }
    eng->env   = *env;
    eng->ev_fd = -1;
    pthread_mutex_init(&eng->lock, NULL);
    pthread_cond_init(&eng->cond, NULL);
    kvc_expo_init(&eng->expo);
    /* The data-plane session key (expose.c): secret, random per engine. */
    if (getrandom(eng->expo.key, sizeof(eng->expo.key), 0) !=
        (ssize_t)sizeof(eng->expo.key)) {
        st = kvc_error(KVX_ERR_INTERNAL, "engine: getrandom(2) gave no "
                       "key for the data-plane sessions: %s",
                       strerror(errno));
        goto err_free;
    }
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
    st = kvc_idset_init(&eng->failed, KVC_TERMINAL_MAX);
    if (st != KVX_OK) {
        kvc_idset_fini(&eng->terminal);
        goto err_trust;
    }
    st = kvc_idset_init(&eng->released, KVC_TERMINAL_MAX);
    if (st != KVX_OK) {
        kvc_idset_fini(&eng->terminal);
        kvc_idset_fini(&eng->failed);
        goto err_trust;
    }
    st = kvc_xfers_init(eng);
    if (st != KVX_OK) {
        goto err_idset;
    }
    eng->epoch = eng->env.clock.random64(eng->env.clock.arg);
    /* Uses of transfer ids: a keyed hash of this count (mode_write_d.c),
     * so another instance (another key) does not repeat them either. */
    eng->xnonce_seq = 0;
    eng->mode  = eng->cfg.read_mode ? &kvc_mode_read : &kvc_mode_write;
    eng->drive_waits = kvc_progress_caller_on(&eng->cfg, getenv("UCX_TLS"));
    kvc_timerq_init(&eng->timers);
    snprintf(eng->engine_id, sizeof(eng->engine_id), "%s:%u", eng->cfg.host_ip,
             eng->cfg.handshake_port);
    memset(&up, 0, sizeof(up));
    st = kvc_engine_place(eng, nic, sizeof(nic), cpus, sizeof(cpus));
    if (st != KVX_OK) {
        goto err_idset;
    }
    up.tls                = eng->cfg.ucx_tls;
    up.lane_settings      = eng->cfg.ucx_lane_settings;
    up.net_devices        = nic;
    up.tcp_port_range     = eng->cfg.ucx_tcp_port_range;
    up.cpus               = cpus;
    up.err_mode_peer      = eng->cfg.ucx_error_mode == KVC_ERR_MODE_PEER;
    up.spin_us            = eng->cfg.progress_spin_us;
    up.lease_us           = eng->cfg.progress_drive_us;
    up.max_inflight_bytes = eng->cfg.max_inflight_bytes;
    up.tick               = kvc_engine_tick;
    up.tick_arg           = eng;
    up.authorize          = kvc_expo_authorize;
    up.authorize_arg      = eng;
    up.worker_reset       = kvc_meta_worker_reset;
    up.worker_reset_arg   = eng;
    up.notice             = kvc_engine_on_notice;
    up.notice_arg         = eng;
    up.ctl = eng->cfg.is_producer && !eng->cfg.read_mode
                 ? kvc_dp_ctl_handler /* only a WRITE P takes them */
                 : NULL;
    up.ctl_arg            = eng;
    up.name               = eng->engine_id;
    if (eng->trust.set) {
        /* The data plane's listening sockets (UCX's tcp interfaces)
         * admit the same senders as the control plane (ctx_create checks
         * how many networks it takes). */
        size_t nn = kvc_trust_nets(&eng->trust, NULL, 0);

        nets = calloc(nn ? nn : 1, sizeof(*nets));
        if (nets == NULL) {
            st = kvc_error(KVX_ERR_NO_MEMORY, "trusted_remote_hosts: out "
                           "of memory");
            goto err_idset;
        }
        up.inbound_set = 1;
        up.n_inbound   = kvc_trust_nets(&eng->trust, nets, nn);
        up.inbound     = nets;
    }
    up.remote_access = eng->cfg.read_mode ? (eng->cfg.is_producer
                                                 ? KVT_ACCESS_READ
                                                 : KVT_ACCESS_LOCAL)
                                          : (eng->cfg.is_producer
                                                 ? KVT_ACCESS_LOCAL
                                                 : KVT_ACCESS_WRITE);
    st = KVD(eng)->ctx_create(&up, &eng->ucx);
    free(nets); /* ctx_create copied them */
    if (st != KVX_OK) {
        goto err_idset;
    }
    *eng_p = eng;
    return KVX_OK;

err_idset:
    free(eng->xfers);
    kvc_idset_fini(&eng->terminal);
    kvc_idset_fini(&eng->failed);
    kvc_idset_fini(&eng->released);
err_trust:
    kvc_trust_fini(&eng->trust);
err_cfg:
    kvc_config_fini(&eng->cfg);
err_free:
    kvc_expo_fini(&eng->expo);
    pthread_cond_destroy(&eng->cond);
    pthread_mutex_destroy(&eng->lock);
    free(eng);
    return st;
}

static void kvc_engine_free_state(struct kvx_engine *eng)
{
    for (size_t b = 0; b < eng->nbuckets; b++) {
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
    kvc_early_free_all(eng);
}

/* Waits (bounded) until no D transfer has operations in flight, so that
 * no completion callback can touch a freed transfer. */
static void kvc_engine_quiesce(struct kvx_engine *eng)
{
    uint64_t deadline = kvc_now_us(eng) + 5000000u;

    pthread_mutex_lock(&eng->lock);
    for (;;) {
        int busy = 0;

        for (size_t b = 0; b < eng->nbuckets && !busy; b++) {
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

/* kvc_engine_abandon (destroy, before the notify listener closes): every
 * live transfer is given up as an abort would (mode->destroy_xfer tells
 * its peers: WRITE D releases, so P stops and fences its puts into our
 * blocks), then destroy waits, at most KVC_DESTROY_ABANDON_S, until no peer
 * may still operate on our blocks (WRITE D: P's write_done or fenced
 * release reply; READ P: D's release once its gets completed); those
 * arrive through the listener still open. */
#define KVC_DESTROY_ABANDON_S 1.0
static void kvc_engine_abandon(struct kvx_engine *eng)
{
    uint64_t deadline;

    if (eng->mode->destroy_xfer == NULL) {
        return;
    }
    deadline = kvc_deadline_us(eng, KVC_DESTROY_ABANDON_S);
    pthread_mutex_lock(&eng->lock);
    for (;;) {
        int      busy = 0;
        uint64_t now;

        for (size_t b = 0; b < eng->nbuckets; b++) {
            for (kvc_xfer_t *x = eng->xfers[b]; x != NULL; x = x->hnext) {
                busy |= eng->mode->destroy_xfer(eng, x);
            }
        }
        now = kvc_now_us(eng);
        if (!busy || now >= deadline) {
            break;
        }
        kvc_wait_until(eng, now + 10000u < deadline ? now + 10000u
                                                    : deadline);
    }
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_engine_drain_users (destroy): calls of the table in other threads
 * end before anything is freed: waits see destroying and return (the
 * broadcast wakes them), the rest are short. Bounded: after
 * KVC_DESTROY_USERS_MS a call still inside is logged and destroy goes on
 * (such a call is blocked in a framework callback). */
#define KVC_DESTROY_USERS_MS 5000u

static void kvc_engine_drain_users(struct kvx_engine *eng)
{
    uint64_t deadline = kvc_now_us(eng) + KVC_DESTROY_USERS_MS * 1000u;

    atomic_store(&eng->destroying, 1);
    pthread_mutex_lock(&eng->lock);
    while (atomic_load(&eng->api_users) > 0) {
        uint64_t now = kvc_now_us(eng);

        if (now >= deadline) {
            kvc_log_warn("KVX-DESTROY", "engine %s: %u calls of the API "
                         "still in progress %u ms after engine_destroy "
                         "began; destroying anyway", eng->engine_id,
                         (unsigned)atomic_load(&eng->api_users),
                         KVC_DESTROY_USERS_MS);
            break;
        }
        pthread_cond_broadcast(&eng->cond);
        kvc_wait_until(eng, now + 10000u < deadline ? now + 10000u
                                                    : deadline);
    }
    pthread_mutex_unlock(&eng->lock);
}

void kvx_engine_destroy(struct kvx_engine *eng)
{
    if (eng == NULL) {
        return;
    }
    kvt_client_t *proxy;

    kvc_engine_drain_users(eng);

    pthread_mutex_lock(&eng->lock);
    proxy          = eng->proxy_cli; /* no registration after this */
    eng->proxy_cli = NULL;
    pthread_mutex_unlock(&eng->lock);
    if (proxy != NULL) {
        KVN(eng)->client_close(proxy);
    }
    free(eng->reg_payload);
    kvc_server_close(eng, &eng->hs_srv);
    kvc_engine_abandon(eng);
    kvc_server_close(eng, &eng->notify_srv);
    /* No new connection or handshake from here. Peers close their
     * endpoints: queued runs are canceled, operations UCX already has are
     * flushed (at most 1 s, then force-closed) so that no peer is left
     * owing replies to a vanished endpoint, and complete before transfers
     * and peers are freed; the releases those
     * completions produce, and everything queued before, go out (each
     * within its deadline) before the control channels close. */
    pthread_mutex_lock(&eng->lock);
    eng->closing = 1;
    pthread_mutex_unlock(&eng->lock);
    kvc_peers_disconnect(eng);
    kvc_engine_quiesce(eng);
    if (eng->mode->stopped != NULL) {
        pthread_mutex_lock(&eng->lock);
        eng->mode->stopped(eng);
        pthread_mutex_unlock(&eng->lock);
    }
    kvc_peers_flush(eng);
    pthread_mutex_lock(&eng->lock);
    eng->stopping = 1; /* no tick work, no new peer jobs */
    pthread_mutex_unlock(&eng->lock);
    kvc_peers_free(eng);
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
    kvc_peers_release(eng); /* no operation can complete any more */
    kvc_engine_free_state(eng);
    kvc_evfd_close(eng);
    free(eng->layers);
    free(eng->xfers);
    free(eng->meta_json);
    kvc_idset_fini(&eng->terminal);
    kvc_idset_fini(&eng->failed);
    kvc_idset_fini(&eng->released);
    kvc_timerq_fini(&eng->timers);
    kvc_trust_fini(&eng->trust);
    kvc_config_fini(&eng->cfg);
    kvc_expo_fini(&eng->expo); /* after ctx_destroy: no authorize calls */
    free(eng->dp_replay);      /* (and no ctl deliveries) */
    pthread_cond_destroy(&eng->cond);
    pthread_mutex_destroy(&eng->lock);
    free(eng);
}
