/*
 * api.c - the public function table (kvx_api_t): argument checks, layer
 * registration, registration payload, events and reports. The transfer
 * logic lives in engine.c / engine_read.c.
 */
#define _GNU_SOURCE
#include "api.h"
#include "engine.h"
#include "nng/kvn.h"
#include "proxy.h"
#include "ucx/kvu.h"

#include <json-c/json.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvx_status_t kvx_engine_create(const kvt_env_t *env, const char *json,
                               struct kvx_engine **eng_p);
void         kvx_engine_destroy(struct kvx_engine *eng);
kvx_status_t kvx_engine_start(struct kvx_engine *eng);

/* api_apply_log_level: a top-level "log_level" in the config of an engine
 * just created (validated by its config parse, 0..3) becomes the
 * process-wide log threshold, as set_logger's max_level does (the sink is
 * kept); without the key the threshold is left as it is. The logger is
 * process-wide, so the last engine created with the key decides. */
static kvx_status_t api_apply_log_level(kvx_status_t st, const char *json)
{
    json_object *o = st == KVX_OK ? json_tokener_parse(json) : NULL;
    json_object *v = NULL;

    if (o != NULL && json_object_is_type(o, json_type_object) &&
        json_object_object_get_ex(o, "log_level", &v) &&
        json_object_is_type(v, json_type_int)) {
        __atomic_store_n(&kvc_log_level, json_object_get_int(v),
                         __ATOMIC_RELAXED);
    }
    json_object_put(o);
    return st;
}

kvx_status_t kvc_engine_create_env(const kvt_env_t *env, const char *json,
                                   kvx_engine_t **eng_p)
{
    kvc_error_clear();
    if (env == NULL || json == NULL || eng_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "engine_create: env, config_json and engine_p "
                         "required");
    }
    return api_apply_log_level(kvx_engine_create(env, json, eng_p), json);
}

static const char *api_last_error(void)
{
    return kvc_last_error();
}

static void api_free(void *ptr)
{
    kvc_error_clear();
    free(ptr);
}

static void api_set_logger(kvx_log_fn_t fn, void *arg, int max_level)
{
    kvc_error_clear();
    kvc_log_set(fn, arg, max_level);
}

static kvx_status_t api_engine_create(const char *json, kvx_engine_t **eng_p)
{
    kvc_error_clear();
    if (json == NULL || eng_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "engine_create: config_json and engine_p required");
    }
    /* A real process: UCX data plane, nng control plane, the host clock. */
    kvt_env_t env = {kvt_ucx_ops(), kvt_nng_ops(), *kvt_real_clock()};

    return api_apply_log_level(kvx_engine_create(&env, json, eng_p), json);
}

static kvx_status_t api_config_dump_in(kvx_engine_t *eng, char **json_p)
{
    kvc_error_clear();
    if (eng == NULL || json_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "config_dump: NULL argument");
    }
    *json_p = kvc_config_dump(&eng->cfg);
    return *json_p ? KVX_OK : kvc_error(KVX_ERR_NO_MEMORY, "out of memory");
}

static kvx_status_t api_alloc_region_in(kvx_engine_t *eng, size_t len,
                                     void **ptr_p)
{
    kvc_region_t *r;
    kvx_status_t  st;

    kvc_error_clear();
    if (eng == NULL || ptr_p == NULL || len == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "alloc_region: length %zu: must be > 0", len);
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "alloc_region: out of memory");
    }
    st = KVD(eng)->mem_alloc(eng->ucx, len, &r->mem, &r->ptr);
    if (st != KVX_OK) {
        free(r);
        return st;
    }
    pthread_mutex_lock(&eng->lock);
    r->next      = eng->regions;
    eng->regions = r;
    pthread_mutex_unlock(&eng->lock);
    *ptr_p = r->ptr;
    return KVX_OK;
}

static kvx_status_t api_free_region_in(kvx_engine_t *eng, void *ptr)
{
    kvc_region_t **pp, *r = NULL;

    kvc_error_clear();
    if (eng == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "free_region: NULL engine");
    }
    pthread_mutex_lock(&eng->lock);
    for (size_t i = 0; i < eng->nlayers; i++) {
        if (!eng->layers[i].mem_owned &&
            KVD(eng)->mem_base(eng->layers[i].mem) == ptr) {
            pthread_mutex_unlock(&eng->lock);
            return kvc_error(KVX_ERR_BAD_STATE, "free_region %p: layer '%s' "
                             "is registered in it", ptr, eng->layers[i].name);
        }
    }
    for (pp = &eng->regions; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr) {
            r   = *pp;
            *pp = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&eng->lock);
    if (r == NULL) {
        return kvc_error(KVX_ERR_NOT_FOUND, "free_region %p: not a region "
                         "from alloc_region", ptr);
    }
    KVD(eng)->mem_release(r->mem);
    free(r);
    return KVX_OK;
}

static kvx_status_t api_check_desc(kvx_engine_t *eng,
                                   const kvx_layer_desc_t *d)
{
    if (d->struct_size < sizeof(kvx_layer_desc_t)) {
        return kvc_error(KVX_ERR_ABI, "layer desc struct_size %zu: must be "
                         ">= %zu", d->struct_size, sizeof(kvx_layer_desc_t));
    }
    if (d->name == NULL || d->name[0] == '\0' ||
        strlen(d->name) >= KVC_LAYER_NAME_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer name: must be 1..%d "
                         "characters", KVC_LAYER_NAME_MAX - 1);
    }
    if (d->base == NULL || d->length == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer '%s': base and length "
                         "must be set", d->name);
    }
    if (d->mem_type != KVX_MEM_HOST && d->mem_type != KVX_MEM_ROCM) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer '%s': mem_type %d: "
                         "must be KVX_MEM_HOST or KVX_MEM_ROCM", d->name,
                         (int)d->mem_type);
    }
    for (size_t i = 0; i < eng->nlayers; i++) {
        if (strcmp(eng->layers[i].name, d->name) == 0) {
            return kvc_error(KVX_ERR_EXISTS, "layer '%s': already registered",
                             d->name);
        }
    }
    if (d->mem_type == KVX_MEM_ROCM && KVD(eng)->mem_type_of(d->base) != 1) {
        return kvc_error(KVX_ERR_DEVICE, "layer '%s': mem_type rocm but %s",
                         d->name, kvc_last_error()[0] ? kvc_last_error()
                                  : "HIP does not report device memory");
    }
    return KVX_OK;
}

static kvc_region_t *api_region_of(kvx_engine_t *eng, const void *base,
                                   size_t len)
{
    for (kvc_region_t *r = eng->regions; r != NULL; r = r->next) {
        uintptr_t b = (uintptr_t)KVD(eng)->mem_base(r->mem);

        if ((uintptr_t)base >= b &&
            (uintptr_t)base + len <= b + KVD(eng)->mem_length(r->mem)) {
            return r;
        }
    }
    return NULL;
}

static kvx_status_t api_register_layer_in(kvx_engine_t *eng,
                                       const kvx_layer_desc_t *d)
{
    kvc_layer_t   l;
    kvc_region_t *r;
    kvx_status_t  st;

    kvc_error_clear();
    if (eng == NULL || d == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "register_layer: NULL");
    }
    pthread_mutex_lock(&eng->lock);
    st = eng->started || eng->starting
             ? kvc_error(KVX_ERR_BAD_STATE, "register_layer: engine %s",
                         eng->started ? "already started"
                                      : "starting (start() in progress)")
             : api_check_desc(eng, d);
    memset(&l, 0, sizeof(l));
    if (st == KVX_OK) {
        st = kvc_geom_from_desc(d, &l.geom);
    }
    if (st == KVX_OK) {
        snprintf(l.name, sizeof(l.name), "%s", d->name);
        l.base     = d->base;
        l.length   = d->length;
        l.mem_type = (int)d->mem_type;
        r          = api_region_of(eng, d->base, d->length);
        if (r != NULL) {
            l.mem = r->mem; /* one rkey for the region: direct shm copies */
        } else {
            st          = KVD(eng)->mem_register(eng->ucx, d->base, d->length,
                                           (int)d->mem_type, &l.mem);
            l.mem_owned = 1;
        }
    }
    if (st == KVX_OK && eng->nlayers == eng->layers_cap) {
        size_t       cap = eng->layers_cap ? eng->layers_cap * 2 : 16;
        kvc_layer_t *nl  = realloc(eng->layers, cap * sizeof(*nl));

        if (nl == NULL) {
            if (l.mem_owned) {
                KVD(eng)->mem_release(l.mem);
            }
            st = kvc_error(KVX_ERR_NO_MEMORY, "register_layer: no memory");
        } else {
            eng->layers     = nl;
            eng->layers_cap = cap;
        }
    }
    if (st == KVX_OK) {
        eng->layers[eng->nlayers++] = l;
    }
    pthread_mutex_unlock(&eng->lock);
    return st;
}

static kvx_status_t api_start_in(kvx_engine_t *eng)
{
    kvc_error_clear();
    if (eng == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "start: NULL engine");
    }
    return kvx_engine_start(eng); /* under its lock: layers, replicated */
}

static kvx_status_t api_registration_payload_in(kvx_engine_t *eng, char **out)
{
    kvc_error_clear();
    if (eng == NULL || out == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "registration_payload: NULL");
    }
    return kvc_registration_build(&eng->cfg, out);
}

static kvx_status_t api_check_request(kvx_engine_t *eng, int producer,
                                      const uint64_t *ids, size_t n)
{
    kvc_error_clear();
    if (eng == NULL || (ids == NULL && n > 0)) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "%s_request: engine and "
                         "block_ids required", producer ? "producer"
                                                        : "consumer");
    }
    if (!eng->started) {
        return kvc_error(KVX_ERR_BAD_STATE, "engine %s: start() first",
                         eng->engine_id);
    }
    if (eng->cfg.is_producer != producer) {
        return kvc_error(KVX_ERR_BAD_STATE, "%s_request on a %s engine",
                         producer ? "producer" : "consumer",
                         eng->cfg.is_producer ? "kv_producer" : "kv_consumer");
    }
    return KVX_OK;
}

/* api_check_rid: a request id must fit the events' request_id field
 * whole; a longer one is refused, never truncated. */
static kvx_status_t api_check_rid(kvx_status_t st, const char *rid)
{
    if (st == KVX_OK && rid != NULL && strlen(rid) >= KVX_ID_MAX) {
        st = kvc_error(KVX_ERR_INVALID_PARAM, "request_id: %zu characters: "
                       "must be at most %d (KVX_ID_MAX - 1)", strlen(rid),
                       KVX_ID_MAX - 1);
    }
    return st;
}

static kvx_status_t api_producer_request_in(kvx_engine_t *eng, const char *rid,
                                         const char *params,
                                         const uint64_t *ids, size_t n,
                                         char **resp_p)
{
    kvx_status_t st = api_check_rid(api_check_request(eng, 1, ids, n), rid);

    if (st == KVX_OK && resp_p == NULL) {
        st = kvc_error(KVX_ERR_INVALID_PARAM, "response_params_p: NULL");
    }
    if (st != KVX_OK) {
        return st;
    }
    return eng->mode->producer_request(eng, rid, params, ids, n, resp_p);
}

static kvx_status_t api_consumer_request_in(kvx_engine_t *eng, const char *rid,
                                         const char *params,
                                         const uint64_t *ids, size_t n)
{
    kvx_status_t st = api_check_rid(api_check_request(eng, 0, ids, n), rid);

    if (st != KVX_OK) {
        return st;
    }
    return eng->mode->consumer_request(eng, rid, params, ids, n);
}

static kvx_status_t api_wait_layer_in(kvx_engine_t *eng, const char *tid,
                                   uint32_t layer, int64_t timeout_ms)
{
    kvc_error_clear();
    if (eng == NULL || tid == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "wait_layer: NULL argument");
    }
    return kvc_xfer_wait(eng, tid, layer, timeout_ms);
}

static kvx_status_t api_wait_transfer_in(kvx_engine_t *eng, const char *tid,
                                      int64_t timeout_ms)
{
    kvc_error_clear();
    if (eng == NULL || tid == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "wait_transfer: NULL");
    }
    return kvc_xfer_wait(eng, tid, -1, timeout_ms);
}

static int api_poll_events_in(kvx_engine_t *eng, kvx_event_t *evs, int max)
{
    int n = 0;

    kvc_error_clear();
    if (eng == NULL || (evs == NULL && max > 0)) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "poll_events: NULL");
    }
    pthread_mutex_lock(&eng->lock);
    while (n < max && eng->ev_head != NULL) {
        kvc_event_node_t *node = eng->ev_head;
        kvc_xfer_t       *x;

        eng->ev_head = node->next;
        if (eng->ev_head == NULL) {
            eng->ev_tail = NULL;
        }
        eng->nevents--;
        evs[n++] = node->ev;
        free(node);
        /* A finished consumer transfer is forgotten once reported. */
        x = kvc_xfer_find(eng, evs[n - 1].transfer_id);
        if (x != NULL && !x->is_producer &&
            (x->state == KVC_XFER_DONE || x->state == KVC_XFER_FAILED)) {
            kvc_xfer_remove(eng, x);
            kvc_xfer_free(x);
        }
    }
    kvc_evfd_drain(eng); /* no-op unless the queue is now empty */
    pthread_mutex_unlock(&eng->lock);
    return n;
}

static kvx_status_t api_event_fd_in(kvx_engine_t *eng, int *fd_p)
{
    kvx_status_t st;

    kvc_error_clear();
    if (eng == NULL || fd_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "event_fd: NULL argument");
    }
    pthread_mutex_lock(&eng->lock);
    st = kvc_evfd_get(eng, fd_p);
    pthread_mutex_unlock(&eng->lock);
    return st;
}

static kvx_status_t api_transports_in(kvx_engine_t *eng, char **json_p)
{
    kvc_error_clear();
    return kvc_report_transports(eng, json_p);
}

static kvx_status_t api_stats_in(kvx_engine_t *eng, char **json_p)
{
    kvc_error_clear();
    return kvc_report_stats(eng, json_p);
}

static void api_engine_destroy(kvx_engine_t *eng)
{
    kvc_error_clear();
    kvx_engine_destroy(eng);
}


static kvx_status_t api_build_decode_params(const char *resp, const char *tid,
                                            char **out_p)
{
    kvc_error_clear();
    if (out_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "decode_params_p: NULL");
    }
    if (resp == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "prefill_response_json: "
                         "NULL: give the prefill rank's producer_request "
                         "response");
    }
    return kvc_params_build_decode(resp, tid, out_p);
}

static kvx_status_t api_write_check(kvx_engine_t *eng, const char *tid,
                                    const char *what)
{
    kvc_error_clear();
    if (eng == NULL || tid == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "%s: NULL argument", what);
    }
    if (!eng->started || !eng->cfg.is_producer) {
        return kvc_error(KVX_ERR_BAD_STATE, "%s: needs a started kv_producer "
                         "engine", what);
    }
    return KVX_OK;
}

static kvx_status_t api_layer_ready_in(kvx_engine_t *eng, const char *tid,
                                    uint32_t layer)
{
    kvx_status_t st = api_write_check(eng, tid, "layer_ready");

    if (st != KVX_OK || eng->mode->layer_ready == NULL) {
        return st; /* READ: nothing to schedule */
    }
    return eng->mode->layer_ready(eng, tid, layer);
}

static kvx_status_t api_seal_transfer_in(kvx_engine_t *eng, const char *tid)
{
    kvx_status_t st = api_write_check(eng, tid, "seal_transfer");

    if (st != KVX_OK || eng->mode->seal == NULL) {
        return st;
    }
    return eng->mode->seal(eng, tid);
}

static kvx_status_t api_consumer_abort_in(kvx_engine_t *eng, const char *rid,
                                       const char *params)
{
    kvx_status_t st = api_check_rid(api_check_request(eng, 0, NULL, 0), rid);

    return st != KVX_OK ? st : eng->mode->abort(eng, rid, params);
}


static kvx_status_t api_build_prefill_params(const char *reg, const char *tid,
                                             char **out_p)
{
    kvc_error_clear();
    if (out_p == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "prefill_params_p: NULL");
    }
    *out_p = NULL;
    return kvc_params_build_prefill(reg, tid, out_p);
}

static kvx_status_t api_connect_peer_in(kvx_engine_t *eng, const char *params,
                                     int64_t timeout_ms)
{
    kvc_error_clear();
    if (eng == NULL || params == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "connect_peer: NULL argument");
    }
    if (timeout_ms < 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "connect_peer: timeout_ms %lld:"
                         " must be >= 0", (long long)timeout_ms);
    }
    return kvc_engine_connect(eng, params, timeout_ms);
}

static kvx_status_t api_wait_events_in(kvx_engine_t *eng, int64_t timeout_ms)
{
    kvc_error_clear();
    if (eng == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "wait_events: NULL engine");
    }
    if (timeout_ms < 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "wait_events: timeout_ms "
                         "%lld: must be >= 0 (every wait has a deadline)",
                         (long long)timeout_ms);
    }
    return kvc_events_wait(eng, timeout_ms);
}

/* --- calls on an engine ------------------------------------------------ */

/* api_enter: a call on eng begins; refused once engine_destroy began,
 * which waits for the calls in progress (engine.c kvc_engine_drain_users)
 * and ends the waits among them. No call may begin after engine_destroy
 * returned: eng is gone. */
static int api_enter(kvx_engine_t *eng)
{
    if (eng == NULL) {
        return 0; /* the call refuses its NULL engine itself */
    }
    atomic_fetch_add(&eng->api_users, 1);
    if (atomic_load(&eng->destroying)) {
        kvc_error_clear();
        (void)kvc_error(KVX_ERR_BAD_STATE, "engine %s: engine_destroy "
                        "began", eng->engine_id);
        atomic_fetch_sub(&eng->api_users, 1); /* eng may go from here */
        return -1;
    }
    return 0;
}

static void api_leave(kvx_engine_t *eng)
{
    if (eng != NULL) {
        atomic_fetch_sub(&eng->api_users, 1);
    }
}

/* KVC_API_CALL defines api_<name>, the table's entry: api_<name>_in
 * between api_enter and api_leave. */
#define KVC_API_CALL(ret, name, params, args)                               \
    static ret api_##name params                                            \
    {                                                                       \
        ret r;                                                              \
                                                                            \
        if (api_enter(eng) != 0) {                                          \
            return KVX_ERR_BAD_STATE;                                       \
        }                                                                   \
        r = api_##name##_in args;                                           \
        api_leave(eng);                                                     \
        return r;                                                           \
    }

KVC_API_CALL(kvx_status_t, config_dump,
             (kvx_engine_t *eng, char **json_p),
             (eng, json_p))
KVC_API_CALL(kvx_status_t, alloc_region,
             (kvx_engine_t *eng, size_t len, void **ptr_p),
             (eng, len, ptr_p))
KVC_API_CALL(kvx_status_t, free_region,
             (kvx_engine_t *eng, void *ptr),
             (eng, ptr))
KVC_API_CALL(kvx_status_t, register_layer,
             (kvx_engine_t *eng, const kvx_layer_desc_t *d),
             (eng, d))
KVC_API_CALL(kvx_status_t, start,
             (kvx_engine_t *eng),
             (eng))
KVC_API_CALL(kvx_status_t, registration_payload,
             (kvx_engine_t *eng, char **out),
             (eng, out))
KVC_API_CALL(kvx_status_t, producer_request,
             (kvx_engine_t *eng, const char *rid, const char *params,
              const uint64_t *ids, size_t n, char **resp_p),
             (eng, rid, params, ids, n, resp_p))
KVC_API_CALL(kvx_status_t, consumer_request,
             (kvx_engine_t *eng, const char *rid, const char *params,
              const uint64_t *ids, size_t n),
             (eng, rid, params, ids, n))
KVC_API_CALL(kvx_status_t, wait_layer,
             (kvx_engine_t *eng, const char *tid, uint32_t layer,
              int64_t timeout_ms),
             (eng, tid, layer, timeout_ms))
KVC_API_CALL(kvx_status_t, wait_transfer,
             (kvx_engine_t *eng, const char *tid, int64_t timeout_ms),
             (eng, tid, timeout_ms))
KVC_API_CALL(int, poll_events,
             (kvx_engine_t *eng, kvx_event_t *evs, int max),
             (eng, evs, max))
KVC_API_CALL(kvx_status_t, event_fd,
             (kvx_engine_t *eng, int *fd_p),
             (eng, fd_p))
KVC_API_CALL(kvx_status_t, transports,
             (kvx_engine_t *eng, char **json_p),
             (eng, json_p))
KVC_API_CALL(kvx_status_t, stats,
             (kvx_engine_t *eng, char **json_p),
             (eng, json_p))
KVC_API_CALL(kvx_status_t, layer_ready,
             (kvx_engine_t *eng, const char *tid, uint32_t layer),
             (eng, tid, layer))
KVC_API_CALL(kvx_status_t, seal_transfer,
             (kvx_engine_t *eng, const char *tid),
             (eng, tid))
KVC_API_CALL(kvx_status_t, consumer_abort,
             (kvx_engine_t *eng, const char *rid, const char *params),
             (eng, rid, params))
KVC_API_CALL(kvx_status_t, connect_peer,
             (kvx_engine_t *eng, const char *params, int64_t timeout_ms),
             (eng, params, timeout_ms))
KVC_API_CALL(kvx_status_t, wait_events,
             (kvx_engine_t *eng, int64_t timeout_ms),
             (eng, timeout_ms))

static const kvx_api_t kvc_api = {
    .abi_major            = KVX_ABI_MAJOR,
    .abi_minor            = KVX_ABI_MINOR,
    .struct_size          = sizeof(kvx_api_t),
    .status_name          = kvc_status_name,
    .status_string        = kvc_status_string,
    .last_error           = api_last_error,
    .free                 = api_free,
    .set_logger           = api_set_logger,
    .engine_create        = api_engine_create,
    .engine_destroy       = api_engine_destroy,
    .config_dump          = api_config_dump,
    .alloc_region         = api_alloc_region,
    .free_region          = api_free_region,
    .register_layer       = api_register_layer,
    .start                = api_start,
    .registration_payload = api_registration_payload,
    .producer_request     = api_producer_request,
    .consumer_request     = api_consumer_request,
    .wait_layer           = api_wait_layer,
    .wait_transfer        = api_wait_transfer,
    .poll_events          = api_poll_events,
    .transports           = api_transports,
    .build_decode_params  = api_build_decode_params,
    .layer_ready          = api_layer_ready,
    .seal_transfer        = api_seal_transfer,
    .consumer_abort       = api_consumer_abort,
    .stats                = api_stats,
    .build_prefill_params = api_build_prefill_params,
    .connect_peer         = api_connect_peer,
    .wait_events          = api_wait_events,
    .event_fd             = api_event_fd,
};

const kvx_api_t *kvc_api_table(void)
{
    return &kvc_api;
}
