/*
 * kvu_ops.c - the UCX data plane as the engine's operation table (kvt.h).
 * Handles are the kvu objects themselves, cast.
 */
#include "kvu.h"

#define KVU_C(type, x) ((type *)(x))

static kvx_status_t ops_ctx_create(const kvt_data_params_t *p, kvt_ctx_t **c)
{
    return kvu_ctx_create(p, KVU_C(kvu_ctx_t *, c));
}

static void ops_ctx_destroy(kvt_ctx_t *c)
{
    kvu_ctx_destroy(KVU_C(kvu_ctx_t, c));
}

static void ops_kick(kvt_ctx_t *c)
{
    kvu_ctx_kick(KVU_C(kvu_ctx_t, c));
}

static void ops_defer(kvt_ctx_t *c, kvt_job_t *job)
{
    kvu_defer(KVU_C(kvu_ctx_t, c), job);
}

static int ops_in_progress_thread(const kvt_ctx_t *c)
{
    return kvu_in_progress_thread(KVU_C(const kvu_ctx_t, c));
}

static void ops_tick_at(kvt_ctx_t *c, uint64_t us)
{
    kvu_tick_at(KVU_C(kvu_ctx_t, c), us);
}

static void ops_drive_begin(kvt_ctx_t *c)
{
    kvu_drive_begin(KVU_C(kvu_ctx_t, c));
}

static int ops_drive(kvt_ctx_t *c)
{
    return kvu_drive(KVU_C(kvu_ctx_t, c));
}

static void ops_drive_end(kvt_ctx_t *c, int back)
{
    kvu_drive_end(KVU_C(kvu_ctx_t, c), back);
}

static uint64_t ops_driven(const kvt_ctx_t *c)
{
    return kvu_driven_passes(KVU_C(const kvu_ctx_t, c));
}

static const char *ops_settings(const kvt_ctx_t *c)
{
    return kvu_settings(KVU_C(const kvu_ctx_t, c));
}

static void ops_worker_address(kvt_ctx_t *c, const void **addr_p,
                               size_t *len_p)
{
    kvu_worker_address(KVU_C(kvu_ctx_t, c), addr_p, len_p);
}

static kvx_status_t ops_mem_register(kvt_ctx_t *c, void *base, size_t len,
                                     int mem_type, kvt_mem_t **mem_p)
{
    return kvu_mem_register(KVU_C(kvu_ctx_t, c), base, len, mem_type,
                            KVU_C(kvu_mem_t *, mem_p));
}

static kvx_status_t ops_mem_alloc(kvt_ctx_t *c, size_t len, kvt_mem_t **mem_p,
                                  void **ptr_p)
{
    return kvu_mem_alloc(KVU_C(kvu_ctx_t, c), len, KVU_C(kvu_mem_t *, mem_p),
                         ptr_p);
}

static void ops_mem_release(kvt_mem_t *m)
{
    kvu_mem_release(KVU_C(kvu_mem_t, m));
}

static void *ops_mem_base(const kvt_mem_t *m)
{
    return kvu_mem_base(KVU_C(const kvu_mem_t, m));
}

static size_t ops_mem_length(const kvt_mem_t *m)
{
    return kvu_mem_length(KVU_C(const kvu_mem_t, m));
}

static void ops_mem_rkey(const kvt_mem_t *m, const void **buf_p,
                         size_t *len_p)
{
    kvu_mem_rkey(KVU_C(const kvu_mem_t, m), buf_p, len_p);
}

static kvx_status_t ops_ep_create(kvt_ctx_t *c, const void *addr, size_t len,
                                  const char *peer_name, kvt_ep_err_fn err_cb,
                                  void *err_arg, kvt_ep_t **ep_p)
{
    return kvu_ep_create(KVU_C(kvu_ctx_t, c), addr, len, peer_name, err_cb,
                         err_arg, KVU_C(kvu_ep_t *, ep_p));
}

static void ops_ep_close(kvt_ep_t *ep)
{
    kvu_ep_close(KVU_C(kvu_ep_t, ep));
}

static void ops_ep_fail(kvt_ep_t *ep, kvx_status_t st, const char *reason)
{
    kvu_ep_fail(KVU_C(kvu_ep_t, ep), st, reason);
}

static const char *ops_ep_transports(const kvt_ep_t *ep)
{
    return kvu_ep_transports(KVU_C(const kvu_ep_t, ep));
}

static int ops_ep_rma_emulated(const kvt_ep_t *ep)
{
    return kvu_ep_rma_emulated(KVU_C(const kvu_ep_t, ep));
}

static int ops_ep_rma_shm_only(const kvt_ep_t *ep)
{
    return kvu_ep_rma_shm_only(KVU_C(const kvu_ep_t, ep));
}

static void ops_ep_set_session(kvt_ep_t *ep, uint64_t session)
{
    kvu_ep_set_session(KVU_C(kvu_ep_t, ep), session);
}

static kvx_status_t ops_notify_queued(kvt_ep_t *ep, uint64_t tag,
                                      uint64_t instance, uint64_t xnonce,
                                      uint64_t count, const char *id)
{
    return kvu_notify_queued(KVU_C(kvu_ep_t, ep), tag, instance, xnonce,
                             count, id);
}

static kvx_status_t ops_notify(kvt_ep_t *ep, uint64_t tag, uint64_t instance,
                               uint64_t xnonce, uint64_t nonce,
                               const char *id, const char *from)
{
    return kvu_notify(KVU_C(kvu_ep_t, ep), tag, instance, xnonce, nonce, id,
                      from);
}

static kvx_status_t ops_ctl_send(kvt_ep_t *ep, const char *msg, size_t len,
                                 const char *from, uint64_t nonce)
{
    return kvu_ctl_send(KVU_C(kvu_ep_t, ep), msg, len, from, nonce);
}

static kvx_status_t ops_rkey_unpack(kvt_ep_t *ep, const void *buf, size_t len,
                                    kvt_rkey_t **rkey_p)
{
    return kvu_rkey_unpack(KVU_C(kvu_ep_t, ep), buf, len,
                           KVU_C(kvu_rkey_t *, rkey_p));
}

static void ops_rkey_destroy(kvt_rkey_t *r)
{
    kvu_rkey_destroy(KVU_C(kvu_rkey_t, r));
}

static void ops_prefault(kvt_rkey_t *r, uint64_t addr, size_t len)
{
    (void)kvu_rkey_prefault(KVU_C(kvu_rkey_t, r), addr, len);
}

static void *ops_rkey_local(const kvt_rkey_t *r, uint64_t addr)
{
    return kvu_rkey_local(KVU_C(const kvu_rkey_t, r), addr);
}

static kvx_status_t ops_post(kvt_ep_t *ep, int is_put, kvt_mem_t *local_mem,
                             uint64_t local_base, kvt_rkey_t *rkey,
                             uint64_t remote_base, const kvc_run_t *runs,
                             size_t n, kvt_op_t *op)
{
    return kvu_post(KVU_C(kvu_ep_t, ep), is_put,
                    KVU_C(kvu_mem_t, local_mem), local_base,
                    KVU_C(kvu_rkey_t, rkey), remote_base, runs, n, op);
}

static kvx_status_t ops_flush(kvt_ep_t *ep, kvt_op_t *op)
{
    return kvu_flush(KVU_C(kvu_ep_t, ep), op);
}

const kvt_data_ops_t *kvt_ucx_ops(void)
{
    static const kvt_data_ops_t ops = {
        .name               = "ucx",
        .ctx_create         = ops_ctx_create,
        .ctx_destroy        = ops_ctx_destroy,
        .kick               = ops_kick,
        .tick_at            = ops_tick_at,
        .defer              = ops_defer,
        .in_progress_thread = ops_in_progress_thread,
        .worker_address     = ops_worker_address,
        .version            = kvu_version,
        .mem_register       = ops_mem_register,
        .mem_alloc          = ops_mem_alloc,
        .mem_release        = ops_mem_release,
        .mem_base           = ops_mem_base,
        .mem_length         = ops_mem_length,
        .mem_rkey           = ops_mem_rkey,
        .mem_type_of        = kvu_hip_mem_type,
        .ep_create          = ops_ep_create,
        .ep_close           = ops_ep_close,
        .ep_fail            = ops_ep_fail,
        .ep_transports      = ops_ep_transports,
        .ep_rma_emulated    = ops_ep_rma_emulated,
        .ep_rma_shm_only    = ops_ep_rma_shm_only,
        .ep_set_session     = ops_ep_set_session,
        .notify             = ops_notify,
        .notify_queued      = ops_notify_queued,
        .ctl_send           = ops_ctl_send,
        .rkey_unpack        = ops_rkey_unpack,
        .rkey_destroy       = ops_rkey_destroy,
        .rkey_local         = ops_rkey_local,
        .prefault           = ops_prefault,
        .post               = ops_post,
        .flush              = ops_flush,
        .pick_nic           = kvu_topo_pick_nic,
        .cpuset             = kvu_topo_cpuset,
        .settings           = ops_settings,
        .drive_begin        = ops_drive_begin,
        .drive              = ops_drive,
        .drive_end          = ops_drive_end,
        .driven             = ops_driven,
    };

    return &ops;
}
