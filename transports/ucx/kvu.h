/*
 * kvu.h - the UCX data plane: one UCP context and worker per engine, driven
 * by one progress thread (the progress owner, SPEC §11). (A worker whose
 * shared-memory receive FIFO is found blocked is replaced by a new one of
 * the same context: kvu.c, "the receive-FIFO watchdog".)
 *
 * All UCP calls on a worker are serialised by the context lock; the worker
 * is created UCS_THREAD_MODE_SERIALIZED. The progress thread keeps the worker
 * progressing even while the API is idle, because on UCX 1.13 one-sided
 * operations on app-owned memory are emulated over active messages and need
 * target-side progress (research/ucx.md §0.2, experiment D).
 *
 * On an endpoint without an RMA lane (tcp) gets and puts do not use
 * ucp_get_nbx/ucp_put_nbx (UCX's emulation aborts the target when the
 * origin dies): they travel as kvxfer's own active messages, which the
 * target checks against the memory it registered and the remote access it
 * grants (transports/ucx/README.md).
 *
 * Operations are posted as run lists against a kvu_op_t. kvu_post only
 * queues them; the progress thread issues the runs under a per-endpoint
 * bytes-in-flight cap. When every run of an op has completed, op->done(op) runs on the
 * progress thread WITHOUT the context lock held, so it may take other locks
 * and call kvu functions. Endpoint failures (peer error mode) are delivered
 * the same way through the endpoint's error callback.
 *
 * Threading: every function may be called from any thread except
 * kvu_ctx_destroy, which blocks and must not run on the progress thread.
 */
#ifndef KVU_H
#define KVU_H

#include "error.h"
#include "kvt.h"
#include "run.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvu_ctx  kvu_ctx_t;
typedef struct kvu_mem  kvu_mem_t;
typedef struct kvu_ep   kvu_ep_t;
typedef struct kvu_rkey kvu_rkey_t;
typedef struct kvt_op   kvu_op_t;   /* kvt.h */

typedef kvt_tick_fn       kvu_tick_fn;
typedef kvt_op_done_fn    kvu_op_done_fn;
/* The endpoint error callback gets the endpoint as (kvt_ep_t *)kvu_ep. */
typedef kvt_ep_err_fn     kvu_ep_err_fn;
typedef kvt_data_params_t kvu_params_t;

/* kvt_ucx_ops: this data plane as the engine's operation table (handles are
 * the kvu objects, cast). */
const kvt_data_ops_t *kvt_ucx_ops(void);

kvx_status_t kvu_ctx_create(const kvu_params_t *params, kvu_ctx_t **ctx_p);
/* kvu_ctx_destroy: endpoints, rkeys and mems must be released first. */
void         kvu_ctx_destroy(kvu_ctx_t *ctx);
/* kvu_log_hold / kvu_log_release (kvu_log.c, any thread): UCX's log
 * messages go to kvxfer's logger while at least one hold is active. */
void         kvu_log_hold(void);
void         kvu_log_release(void);
/* kvu_log_quiet: while on (this thread), UCX's messages are logged at
 * debug level (e.g. its errors for a worker pair that was only tried). */
void         kvu_log_quiet(int on);
/* kvu_ctx_kick wakes the progress thread (e.g. after new work). */
void         kvu_ctx_kick(kvu_ctx_t *ctx);
/* kvu_tick_at: the progress thread runs params.tick once us (kvc_mono_us)
 * has come, besides every half KVU_TICK_MS; any thread. */
void         kvu_tick_at(kvu_ctx_t *ctx, uint64_t us);
/* kvu_defer runs job->fn(job) on the progress thread, unlocked, soon. */
void         kvu_defer(kvu_ctx_t *ctx, kvt_job_t *job);

/* kvu_worker_address: the current worker's address; borrowed, valid until
 * kvu_ctx_destroy. It changes when the receive-FIFO watchdog replaces a
 * worker whose shared-memory FIFO a killed peer blocked (kvu.c
 * kvu_fifo_*; params.worker_reset is then called). */
void kvu_worker_address(kvu_ctx_t *ctx, const void **addr_p, size_t *len_p);
/* kvu_addr_entries: the UCP worker addresses inside a published address
 * (kvu_worker_address): entry 0 the worker that asks UCX for one-sided
 * operations (or the only one), entry 1 the tcp plane's, a worker without
 * them (kvu.c kvu_ucp_init). KVX_ERR_PEER_VERSION naming both versions
 * when the address is of another data-plane protocol, KVX_ERR_HANDSHAKE
 * when its lengths do not add up. Entries point into buf; flags (may be
 * NULL) get each entry's KVU_ADDR_* flags. */
#define KVU_ADDR_MAX    2
#define KVU_ADDR_NO_RMA 0x80000000u /* the worker serves no UCX RMA (tcp
                                       plane, tcp-only context) */
#define KVU_ADDR_BIG_RX 0x40000000u /* its tcp receive segments hold a
                                       whole active message of the largest
                                       size (kvu.c KVU_AM_MAX_LEN) */
kvx_status_t kvu_addr_entries(const void *buf, size_t len,
                              const void *ent[KVU_ADDR_MAX],
                              size_t ent_len[KVU_ADDR_MAX],
                              uint32_t flags[KVU_ADDR_MAX], unsigned *n_p);
/* kvu_mm_geo_t: the geometry of a context's shared-memory FIFOs (UCX's
 * sysv/posix/xpmem transports) as kvxfer set it (ucx_lane_settings,
 * "auto") or found it in the environment; 0 = UCX's default for its
 * version. A sender writes into the receiver's FIFO and buffers with its
 * own sizes, so the two ends must agree (kvu_mm_geo_match). */
typedef struct kvu_mm_geo {
    uint32_t seg;  /* SEG_SIZE: bytes of a receive buffer */
    uint32_t fifo; /* FIFO_SIZE: elements */
    uint32_t elem; /* FIFO_ELEM_SIZE: bytes of an element */
} kvu_mm_geo_t;
/* kvu_mm_geo_parse: the geometry that the settings "KEY=VALUE ..." (as
 * kvu_settings lists them, applied in order; MM_* keys: per-transport ones
 * are refused by the settings' parser) give, each field not set there
 * taken from the environment (env: getenv or a test's; for sysv
 * UCX_SYSV_* else UCX_MM_*, for posix UCX_POSIX_* else UCX_MM_*;
 * ucp_config_modify overrides all). -1 with why when sysv and posix would
 * differ (one geometry is published), else 0. */
int kvu_mm_geo_parse(const char *settings,
                     const char *(*env)(const char *name), kvu_mm_geo_t *out,
                     char *why, size_t len);
/* kvu_mm_geo_match: may two ends with these geometries (ucx: UCX major <<
 * 8 | minor) share a FIFO? A field matches when equal, and a default (0)
 * only under the same UCX version (1.13 has 64 elements, 1.22 256). 1 if
 * so; else 0 and why names both ends' values and the remedy. */
int kvu_mm_geo_match(const kvu_mm_geo_t *mine, unsigned mine_ucx,
                     const kvu_mm_geo_t *peer, unsigned peer_ucx, char *why,
                     size_t len);
/* kvu_addr_geo: the UCX version and FIFO geometry in a published address
 * that kvu_addr_entries accepted. */
void kvu_addr_geo(const void *buf, unsigned *ucx_p, kvu_mm_geo_t *geo);
/* kvu_version: "1.13.1" style runtime version string (constant). */
const char *kvu_version(void);
/* kvu_settings: the UCX settings kvxfer applied (ucx_lane_settings), as
 * "KEY=VALUE ..." ("" = UCX defaults); valid until kvu_ctx_destroy. */
const char *kvu_settings(const kvu_ctx_t *ctx);

/* kvu_mem_register maps existing memory (mem_type kvx_mem_type_t). ROCm
 * memory with a UCX that has no ROCm support is KVX_ERR_DEVICE. */
kvx_status_t kvu_mem_register(kvu_ctx_t *ctx, void *base, size_t len,
                              int mem_type, kvu_mem_t **mem_p);
/* kvu_mem_alloc lets UCX allocate host memory (shared-memory peers can then
 * attach and copy directly). */
kvx_status_t kvu_mem_alloc(kvu_ctx_t *ctx, size_t len, kvu_mem_t **mem_p,
                           void **ptr_p);
void         kvu_mem_release(kvu_mem_t *mem);
void        *kvu_mem_base(const kvu_mem_t *mem);
size_t       kvu_mem_length(const kvu_mem_t *mem);
/* kvu_mem_rkey: what peers get as the rkey, borrowed until
 * kvu_mem_release: UCX's packed rkey, the region's random token (8 bytes)
 * and the data-plane protocol trailer (8 bytes). */
void         kvu_mem_rkey(const kvu_mem_t *mem, const void **buf_p,
                          size_t *len_p);

/* kvu_in_progress_thread: is the caller running one of ctx's passes (where
 * completions are delivered): its progress thread, or a thread inside
 * kvu_drive? */
int kvu_in_progress_thread(const kvu_ctx_t *ctx);

/* Caller-driven progress. A thread that waits for a completion may run the
 * passes itself (no hand-off to the progress thread and back):
 * kvu_drive_begin, then kvu_drive repeatedly (one pass when no other is
 * running: its activity, 0 when idle; -1 when another thread holds the
 * pass, after yielding the CPU to it, or the caller is inside one), then
 * kvu_drive_end before sleeping or returning. While a driver is in, the
 * progress thread leaves the workers to it (only its tick runs); the last
 * driver out hands them back: at once (back 0: the caller goes to sleep;
 * any lease ends too), or, when the caller is expected to wait again soon
 * (back 1: its wait was satisfied), after a lease of params.lease_us
 * (progress_drive_us)
 * unless a driver comes in meanwhile. No timer marks the lease's end: the
 * progress thread aside looks every KVU_LOOK_US (1 ms), so a waiter that
 * does not come back leaves the workers unprogressed for the rest of its
 * lease and at most that much more. Never with a lock a completion
 * callback takes. */
void     kvu_drive_begin(kvu_ctx_t *ctx);
int      kvu_drive(kvu_ctx_t *ctx);
void     kvu_drive_end(kvu_ctx_t *ctx, int back);
uint64_t kvu_driven_passes(const kvu_ctx_t *ctx);

/* kvu_ep_create connects to a peer worker address, records the lanes it
 * selected and starts the wire-up without waiting for it (operations
 * posted meanwhile are queued by UCX until the lanes connect; a failed
 * wire-up reaches err_cb). */
kvx_status_t kvu_ep_create(kvu_ctx_t *ctx, const void *addr, size_t len,
                           const char *peer_name, kvu_ep_err_fn err_cb,
                           void *err_arg, kvu_ep_t **ep_p);
/* kvu_ep_close cancels queued runs (their ops fail with KVX_ERR_CANCELED),
 * closes the endpoint (force-close when it failed) and frees it once UCX is
 * done. All rkeys of the endpoint must be destroyed before. */
void         kvu_ep_close(kvu_ep_t *ep);
/* kvu_ep_fail marks the endpoint failed (e.g. transfer timeout): queued
 * runs are canceled and in-flight ones are completed by a force close. */
void         kvu_ep_fail(kvu_ep_t *ep, kvx_status_t status,
                         const char *reason);
int          kvu_ep_failed(kvu_ep_t *ep);
/* kvu_ep_transports: e.g. "rma_am(tcp/lo) am(tcp/lo)"; borrowed. */
const char  *kvu_ep_transports(const kvu_ep_t *ep);
/* kvu_am_dropped_answers: active-message answers that matched no pending
 * request of this context (canceled meanwhile, or forged: wrong nonce). */
uint64_t     kvu_am_dropped_answers(kvu_ctx_t *ctx);
/* kvu_am_unanswered: requests this context (as target) left unanswered
 * because its answers in flight were at their limit (KVU_AMR_EP_MAX, or
 * params answers_max); kvu_am_answers_in_flight: its answers in flight. */
uint64_t     kvu_am_unanswered(kvu_ctx_t *ctx);
uint64_t     kvu_am_answers_in_flight(kvu_ctx_t *ctx);
uint64_t     kvu_am_answered(kvu_ctx_t *ctx); /* answers sent (or tried) */
/* kvu_am_late_copied: bytes of get answers this context (as target) copied
 * because UCX would pack them after the handler returned (the rest was
 * packed from the block while its range was authorized). */
uint64_t     kvu_am_late_copied(kvu_ctx_t *ctx);
/* kvu_rkeys_held: rkeys their owner destroyed while UCX requests of their
 * endpoint were in flight, still held until none is (tests). */
uint64_t     kvu_rkeys_held(kvu_ctx_t *ctx);
/* kvu_ep_reqs_in_flight: ep's requests UCX holds (tests). */
uint64_t     kvu_ep_reqs_in_flight(kvu_ep_t *ep);
/* kvu_ptr_copied: bytes this context (as origin) copied itself through a
 * peer's memory mapped here (UCX-allocated, ucp_rkey_ptr). */
uint64_t     kvu_ptr_copied(kvu_ctx_t *ctx);
/* kvu_sock_max: /proc/sys/net/core/NAME ("wmem_max", "rmem_max"): the
 * largest socket buffer a process may set; 0 when unknown. */
uint64_t     kvu_sock_max(const char *name);
/* kvu_am_putv_sent: PUTV messages this context sent (several short puts
 * of one job in one message; not over a shared-memory FIFO). */
uint64_t     kvu_am_putv_sent(kvu_ctx_t *ctx);
/* kvu_rma_wanted: 1 when a context allowing transports tls (UCX_TLS syntax;
 * NULL or "": UCX's default) asks UCX for one-sided operations; 0 when every
 * transport is tcp or self and am_rma (kvxfer's own active messages) is on:
 * UCX's software RMA handlers, which serve any address, are then never
 * installed (kvu.c). */
int          kvu_rma_wanted(const char *tls, int am_rma);
/* kvu_tls_split: 1 when the transport list tls (UCX_TLS syntax, "" = UCX's
 * default) allows tcp beside transports that copy for real and carry
 * messages: *main_p (malloc'ed) is then the list without tcp, for the
 * context asking for RMA, and tcp gets a context of its own without it
 * (kvu.c kvu_ucp_init). 0 when tcp is not allowed; -1 when besides tcp
 * only transports that carry no messages are (cma, cuda_*, rocm_*: tcp
 * carries their wire-up, no split); -2 without memory. Names are matched
 * as UCX does ("\tcp", "tcp:aux"). */
int          kvu_tls_split(const char *tls, char **main_p);
/* kvu_ep_rma_emulated: 1 when the endpoint has no RMA lane (every put/get
 * goes over active messages). */
int          kvu_ep_rma_emulated(const kvu_ep_t *ep);
/* kvu_ep_rma_shm_only: 1 when all RMA lanes are shared memory (then only
 * UCX-allocated peer memory is copied directly; see kvu_rkey_direct). */
int          kvu_ep_rma_shm_only(const kvu_ep_t *ep);
/* kvu_ep_set_session: the session every active-message request of ep
 * carries to the target's authorize (kvt.h); set before the first post. */
void         kvu_ep_set_session(kvu_ep_t *ep, uint64_t session);
/* kvu_notify: kvt_data_ops_t.notify (kvt.h): one active message
 * (KVU_AM_NOTICE) of tag, instance, xnonce, nonce (0: a random one) and
 * their mac under the endpoint's session, the transfer id (and, when from
 * is not NULL or "", a NUL and from) as its data; any thread. */
kvx_status_t kvu_notify(kvu_ep_t *ep, uint64_t tag, uint64_t instance,
                        uint64_t xnonce, uint64_t nonce, const char *id,
                        const char *from);
/* kvu_notify_queued: kvt_data_ops_t.notify_queued (kvt.h): a job on ep's
 * queue behind every post and flush before it; when it reaches the head,
 * one active message (KVU_AM_NOTICE, status KVU_NOTICE_COUNTED, count in
 * the length field, mac kvc_count_mac) with the transfer id as its data;
 * any thread. */
kvx_status_t kvu_notify_queued(kvu_ep_t *ep, uint64_t tag, uint64_t instance,
                               uint64_t xnonce, uint64_t count,
                               const char *id);
/* kvu_ctl_send: kvt_data_ops_t.ctl_send (kvt.h): one active message
 * (KVU_AM_CTL) of nonce, the message's length and its mac under the
 * endpoint's session (kvc_msg_mac); from, a NUL and the message as its
 * data; any thread. */
kvx_status_t kvu_ctl_send(kvu_ep_t *ep, const char *msg, size_t len,
                          const char *from, uint64_t nonce);
/* kvu_am_ent_t: one run of a PUTV (several short puts of one job in one
 * active message, over tcp): the message's data is n of these, then their
 * bytes in the same order. */
#define KVU_AM_PUTV_MAX 16
typedef struct kvu_am_ent {
    uint64_t addr;
    uint64_t len;
    uint64_t nonce;
    uint64_t mac;   /* kvc_req_mac(session, tag, nonce, addr, len, put) */
} kvu_am_ent_t;
/* kvu_putv_split: a received PUTV's data (len bytes, untrusted) and its
 * header's count of entries n and of bytes: 0 with the n entries copied
 * to ent (room for KVU_AM_PUTV_MAX), when there are 1 .. KVU_AM_PUTV_MAX of
 * them, each of 1 .. 256 KiB, followed by exactly the bytes they name
 * (their sum, and the header's); -1 otherwise. The entries' ranges are
 * not checked here (each is admitted on its own). */
int          kvu_putv_split(const void *data, size_t len, uint64_t n,
                            uint64_t bytes, kvu_am_ent_t *ent);
/* kvu_ctl_split: a received control message's data (len bytes,
 * untrusted): from (1..63 bytes, no NUL) in its first *flen_p bytes, a
 * NUL, then the message (1..KVT_CTL_MAX bytes, no NUL). 0, or -1 for
 * anything else. */
int          kvu_ctl_split(const void *data, size_t len, size_t *flen_p);
/* kvu_notice_split: a received notice's data (len bytes, untrusted): the
 * transfer id (1..512 bytes, no NUL) in its first *idlen_p bytes, then,
 * when *flen_p > 0, a NUL and from (1..63 bytes, no NUL). 0, or -1 for
 * anything else. */
int          kvu_notice_split(const void *data, size_t len, size_t *idlen_p,
                              size_t *flen_p);
/* kvu_rkey_direct: 1 when the rkey maps the peer's memory at addr into
 * this process (UCX-allocated shared memory). */
int          kvu_rkey_direct(const kvu_rkey_t *rkey, uint64_t addr);
/* kvu_rkey_local: local address of the peer's addr when the rkey maps it
 * into this process (UCX-allocated shared memory), else NULL. */
void        *kvu_rkey_local(const kvu_rkey_t *rkey, uint64_t addr);
/* kvu_prefault populates the page tables of [ptr, ptr+len) (best effort;
 * any thread, no lock). */
void         kvu_prefault(void *ptr, size_t len);
/* kvu_rkey_prefault: kvu_prefault of the peer's [addr, addr+len) where
 * rkey maps it here, cut to the shared mapping the copies may touch
 * (kvu_rkey_map); nothing when it has none. Returns the bytes it asked
 * the kernel to populate. */
size_t       kvu_rkey_prefault(kvu_rkey_t *rkey, uint64_t addr, size_t len);
const char  *kvu_ep_peer(const kvu_ep_t *ep);

/* kvu_rkey_unpack: a peer's published rkey (kvu_mem_rkey) for ep;
 * KVX_ERR_PEER_VERSION naming both versions when the peer speaks
 * another data-plane protocol (or none: an older build), KVX_ERR_HANDSHAKE
 * when it is too short or UCX cannot unpack it. */
kvx_status_t kvu_rkey_unpack(kvu_ep_t *ep, const void *buf, size_t len,
                             kvu_rkey_t **rkey_p);
void         kvu_rkey_destroy(kvu_rkey_t *rkey);

/*
 * kvu_post queues runs (offsets relative to local_base / remote_base) as
 * gets (is_put = 0) or puts. runs must stay valid until op->done has run.
 * op->done is called exactly once on KVX_OK, after the last run completed
 * or failed (op->status holds the first error); with an error return it is
 * never called. Zero runs complete at once (done still runs on the
 * progress thread).
 */
kvx_status_t kvu_post(kvu_ep_t *ep, int is_put, kvu_mem_t *local_mem,
                      uint64_t local_base, kvu_rkey_t *rkey,
                      uint64_t remote_base, const kvc_run_t *runs, size_t n,
                      kvu_op_t *op);

/* kvu_flush completes op once every run posted on ep before it has
 * completed at the origin and the target (ucp_ep_flush_nbx): puts are then
 * remotely visible. Same callback contract as kvu_post. */
kvx_status_t kvu_flush(kvu_ep_t *ep, kvu_op_t *op);

/* kvu_status_from_ucs converts a ucs_status_t (passed as int). */
kvx_status_t kvu_status_from_ucs(int ucs_status);

/* kvu_hip_mem_type asks HIP what memory ptr is: 0 host, 1 device; -1 when
 * HIP is not compiled in or no device is present (reason in last error). */
int kvu_hip_mem_type(const void *ptr);

/* Device placement (SPEC §11), read from an hwloc topology. xml_path is an
 * hwloc XML file, NULL or "" for this machine (config key hwloc_topology);
 * gpu_busid is the PCI bus id of the rank's GPU, "dddd:bb:dd.f" or "bb:dd.f"
 * (config key gpu_bus_id), NULL or "" when unknown.
 *
 * kvu_topo_pick_nic writes to buf the UCX name (UCX_NET_DEVICES form) of the
 * network device nearest the GPU: "<name>:<port>" for an OpenFabrics (RDMA)
 * device, e.g. "mlx5_0:1" (its first active port, else port 1), else the
 * interface name, e.g. "eth0". Nearest means the deepest common ancestor in
 * the hwloc tree: same PCI switch < same host bridge < same NUMA node or
 * package < machine. At equal distance RDMA devices win, then the device
 * with fewer hops below that ancestor, then the first in hwloc's order.
 * Without a GPU, distances are taken from the first NUMA node.
 *
 * kvu_topo_cpuset writes to buf the CPUs local to the GPU (the cpuset of its
 * nearest non-I/O ancestor) in hwloc list form, e.g. "0-3,8-11"; without a
 * GPU, the CPUs of the whole machine.
 *
 * Errors (with the last error set): KVX_ERR_CONFIG when the topology cannot
 * be read (naming the path) or the bus id is malformed or not in it (naming
 * the bus id); KVX_ERR_NOT_FOUND when there is no network device;
 * KVX_ERR_INVALID_PARAM when buf is NULL or shorter than the answer. */
kvx_status_t kvu_topo_pick_nic(const char *xml_path, const char *gpu_busid,
                               char *buf, size_t len);
kvx_status_t kvu_topo_cpuset(const char *xml_path, const char *gpu_busid,
                             char *buf, size_t len);

#endif
