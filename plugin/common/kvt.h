/*
 * kvt.h - the transport seam: what the engine needs from a data plane, a
 * control plane and a clock, as operation tables.
 *
 * The engine (plugin/engine) calls transports only through these tables.
 * The real implementations are UCX (transports/ucx, kvt_ucx_ops) and nng
 * (transports/nng, kvt_nng_ops); the deterministic simulator (tests/sim)
 * has in-memory ones. Handles are opaque: each implementation casts its own
 * objects to and from them.
 *
 * Contract common to every callback below: it never runs inside the call
 * that submitted the work (a callback may take locks the submitter holds),
 * and it runs with no lock of the transport held, so it may call back into
 * the same table (except the few functions documented as "not from a
 * callback"). Errors are returned as kvx_status_t with the thread's last
 * error text set (kvc_error).
 */
#ifndef KVT_H
#define KVT_H

#include "error.h"
#include "run.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* C++ includers (tests) never touch the atomic fields; same layout. */
#define KVT_ATOMIC(t) t
#else
#define KVT_ATOMIC(t) _Atomic t
#endif

typedef struct kvt_ctx  kvt_ctx_t;   /* one data-plane context (worker) */
typedef struct kvt_mem  kvt_mem_t;   /* registered local memory */
typedef struct kvt_ep   kvt_ep_t;    /* endpoint to one peer context */
typedef struct kvt_rkey kvt_rkey_t;  /* a peer's memory, unpacked on an ep */
typedef struct kvt_op   kvt_op_t;
typedef struct kvt_job  kvt_job_t;

/* ---- clock and entropy -------------------------------------------------- */

typedef struct kvt_clock {
    /* now_us: monotonic microseconds. */
    uint64_t (*now_us)(void *arg);
    /* random64: a fresh engine instance id, non-zero and increasing with
     * the start time: a later instance on the same address compares
     * greater (real: CLOCK_REALTIME microseconds << 12 | 12 random bits),
     * so a late message of an older instance is never taken for a
     * restart. */
    uint64_t (*random64)(void *arg);
    /* stamp: now on the scale of random64: an instance started after this
     * call compares greater, one started before compares less (real:
     * CLOCK_REALTIME microseconds << 12 | 0xfff; clocks of different hosts
     * must agree better than a process takes to restart). */
    uint64_t (*stamp)(void *arg);
    /* stamp_shift: a stamp is microseconds << stamp_shift | low bits, so
     * (stamp(now) - stamp(then)) >> stamp_shift is the time between (real:
     * 12). */
    unsigned  stamp_shift;
    /* wait: called with lock held, returns with it held, after cond was
     * signalled or now_us() reached deadline_us (or spuriously: callers
     * re-check). Real: pthread_cond_timedwait. Simulated: the scheduler runs
     * other steps (deliveries, completions, timers) until then. */
    void     (*wait)(void *arg, pthread_cond_t *cond, pthread_mutex_t *lock,
                     uint64_t deadline_us);
    void     *arg;
} kvt_clock_t;

/* kvt_real_clock: CLOCK_MONOTONIC, getrandom(2), pthread_cond_timedwait. */
const kvt_clock_t *kvt_real_clock(void);

/* ---- data plane ---------------------------------------------------------- */

typedef void (*kvt_tick_fn)(void *arg);
typedef void (*kvt_ep_err_fn)(void *arg, kvt_ep_t *ep, kvx_status_t status,
                              const char *reason);
typedef void (*kvt_op_done_fn)(kvt_op_t *op);
typedef void (*kvt_job_fn)(kvt_job_t *job);

/* kvt_op_t tracks one batch of runs (or a flush); the caller embeds it. */
struct kvt_op {
    kvt_op_done_fn   done;      /* set by the caller */
    void            *arg;       /* the caller's */
    uint64_t         tag;       /* set by the caller: the transfer the
                                   runs belong to (kvc_xfer_tag), carried
                                   to a target that serves them in
                                   software and given to its authorize */
    KVT_ATOMIC(int64_t) remaining; /* internal: runs not yet completed */
    KVT_ATOMIC(int)  status;    /* first error (kvx_status_t), 0 = ok */
    uint64_t         bytes;     /* bytes posted */
    uint64_t         am_bytes;  /* bytes the transport moved as checked
                                   active messages, which the target
                                   counts (authorize); set as it issues
                                   them, final once done ran */
    kvt_op_t        *next;      /* internal */
};

/* kvt_job_t: work the caller hands to the progress owner (kvt_data_ops_t.
 * defer); the caller embeds it. */
struct kvt_job {
    kvt_job_fn  fn;
    void       *arg;
    kvt_job_t  *next;          /* internal */
};

typedef struct kvt_data_params {
    const char *tls;             /* "" or NULL: the transport's default */
    const char *net_devices;     /* "" or NULL: all */
    int         err_mode_peer;   /* 1: peer failures are reported */
    uint32_t    spin_us;         /* the progress thread's busy-poll
                                    before it sleeps */
    uint32_t    lease_us;        /* a satisfied driver's lease (drive_end
                                    back 1); 0: none */
    uint64_t    max_inflight_bytes; /* per endpoint */
    uint32_t    answers_max;     /* a transport that answers peers' gets
                                    and puts itself: answers in flight to
                                    one peer at most (0: its default;
                                    tests set it low) */
    uint64_t    answers_bytes;   /* and their bytes (0: its default) */
    kvt_tick_fn tick;            /* periodic, on the progress owner, at
                                    least every 20 ms (simulated: when the
                                    scheduler fires timers) */
    void       *tick_arg;
    const char *name;            /* for logs */
    const char *cpus;            /* "" / NULL, or a CPU list for the
                                    progress owner */
    const char *tcp_port_range;  /* "" / NULL, or "lo-hi": ports the tcp
                                    transport listens on */
    const char *lane_settings;   /* transport settings ("auto", "none",
                                    KEY=VALUE ...); NULL: "auto" */
    int         remote_access;   /* what peers may do to memory registered
                                    on this context: KVT_ACCESS_* */
    /* authorize: a transport that serves a peer's get or put itself (in
     * software, kvxfer's own active messages) asks it for every request
     * that passed its registration and access checks, with the tag the
     * origin's op carried, the request's nonce and its authenticator
     * kvc_req_mac(session of the origin's endpoint (ep_set_session), tag,
     * nonce, addr, len, is_put) (common/siphash.h; 0 when no session was
     * set): KVX_OK serves it;
     * KVX_ERR_NOT_EXPOSED (no live transfer of that tag here yet: the
     * origin may retry), KVX_ERR_UNTRUSTED_PEER (the transfer is bound to
     * another peer's session) and KVX_ERR_OUT_OF_BOUNDS (not that
     * transfer's blocks, or the transfer ended) refuse it, memory
     * untouched, the status going back to the origin's op. Called on the
     * progress owner with the transport's locks held: it must not call the
     * transport. NULL: registration checks only. Hardware RMA (rkeys on
     * zero-copy lanes) is not asked. */
    kvx_status_t (*authorize)(void *arg, uint64_t tag, uint64_t mac,
                              uint64_t nonce, uint64_t addr, uint64_t len,
                              int is_put);
    void       *authorize_arg;
    /* worker_reset: the context replaced its worker (a blocked
     * shared-memory receive FIFO, transports/ucx/README.md): worker_address
     * now answers the new one, which handshakes must publish. Called on
     * the progress owner without the transport's locks; NULL: ignored. */
    void      (*worker_reset)(void *arg);
    void       *worker_reset_arg;
    /* notice: a peer's completion notice (kvt_data_ops_t.notify) arrived:
     * id (idlen bytes; id[idlen] is NUL) is the transfer it names, tag,
     * nonce, instance and xnonce as the peer sent them, mac its
     * authenticator kvc_req_mac(session of the peer's endpoint, tag,
     * nonce, instance, xnonce, KVC_MAC_NOTICE), unchecked: the callee
     * checks it against the sessions of the hosts the transfer is bound
     * to. from is the sender's claim of its address (notify's from; ""
     * when none), unchecked too. count: KVT_NOTICE_UNCOUNTED for a notice
     * of notify; for one of notify_queued, the bytes of the sender's puts
     * it follows, and mac is kvc_count_mac(session, tag, nonce, instance,
     * xnonce, count) instead. Called on the progress owner without the
     * transport's locks, after every put that arrived before the notice
     * was written; NULL: notices are dropped. */
    void      (*notice)(void *arg, uint64_t tag, uint64_t mac, uint64_t nonce,
                        uint64_t instance, uint64_t xnonce, const char *id,
                        size_t idlen, const char *from, uint64_t count);
    void       *notice_arg;
    /* ctl: a control message a peer sent on the data plane
     * (kvt_data_ops_t.ctl_send): msg (len bytes, msg[len] is NUL; no NUL
     * inside), nonce and mac as the peer sent them, mac its authenticator
     * kvc_msg_mac(session of the peer's endpoint, nonce, msg, len),
     * unchecked; from the sender's claim of its address, unchecked too.
     * Called on the progress owner without the transport's locks; NULL:
     * such messages are dropped. */
    void      (*ctl)(void *arg, const char *msg, size_t len, uint64_t nonce,
                     uint64_t mac, const char *from);
    void       *ctl_arg;
    /* inbound_set: the listening sockets the transport opens (UCX's tcp
     * interfaces) take connections only from the networks in
     * inbound[0..n_inbound) (none: no connection at all), the address
     * entries of trusted_remote_hosts, enforced in the kernel (a socket
     * filter) so a refused sender's bytes never reach the transport.
     * inbound_set 0: open to all. Copied by ctx_create. */
    int              inbound_set;
    const struct kvt_net *inbound;
    size_t           n_inbound;
} kvt_data_params_t;

/* kvt_listen_lock / kvt_listen_unlock: one process-wide lock a transport
 * holds while it creates listening sockets (UCX workers, nng listeners), so
 * the UCX transport can tell the sockets its worker opened from anyone
 * else's (transports/ucx/kvu_guard.h). */
void kvt_listen_lock(void);
void kvt_listen_unlock(void);

/* An IPv4 or IPv6 network: family 4 or 6, addr (4 or 16 bytes, network
 * order), prefix bits (0..32 / 0..128). */
typedef struct kvt_net {
    int      family;
    uint8_t  addr[16];
    uint32_t prefix;
} kvt_net_t;
#define KVT_INBOUND_MAX 256 /* networks a listening socket's filter holds */

#define KVT_NOTICE_UNCOUNTED UINT64_MAX /* params.notice: a notice of
                                            notify (sent after a flush);
                                            siphash.h KVC_COUNT_NONE */
#define KVT_NOTICE_FROM_MAX 64 /* bytes of a notice's from, with its NUL */
#define KVT_CTL_MAX 16384      /* bytes of a data-plane control message */

/* kvt_data_params_t.remote_access: the least the engine's role needs (READ:
 * P's memory remote-readable; WRITE: D's remote-writable; else local). */
#define KVT_ACCESS_DEFAULT 0 /* the transport's default (read and write) */
#define KVT_ACCESS_READ    1 /* remote get only */
#define KVT_ACCESS_WRITE   2 /* remote put only */
#define KVT_ACCESS_LOCAL   4 /* no remote access */

typedef struct kvt_data_ops {
    const char *name;            /* "ucx", "sim" */

    kvx_status_t (*ctx_create)(const kvt_data_params_t *p, kvt_ctx_t **ctx_p);
    /* ctx_destroy: endpoints, rkeys and mems released first; not from a
     * callback. */
    void         (*ctx_destroy)(kvt_ctx_t *ctx);
    /* kick: wake the progress owner (new work). */
    void         (*kick)(kvt_ctx_t *ctx);
    /* defer: run job->fn(job) on the progress owner soon (never inside
     * this call). */
    void         (*defer)(kvt_ctx_t *ctx, kvt_job_t *job);
    /* in_progress_thread: is the caller the progress owner? */
    int          (*in_progress_thread)(const kvt_ctx_t *ctx);
    /* worker_address: borrowed until ctx_destroy. */
    void         (*worker_address)(kvt_ctx_t *ctx, const void **addr_p,
                                   size_t *len_p);
    const char  *(*version)(void);

    kvx_status_t (*mem_register)(kvt_ctx_t *ctx, void *base, size_t len,
                                 int mem_type, kvt_mem_t **mem_p);
    kvx_status_t (*mem_alloc)(kvt_ctx_t *ctx, size_t len, kvt_mem_t **mem_p,
                              void **ptr_p);
    void         (*mem_release)(kvt_mem_t *mem);
    void        *(*mem_base)(const kvt_mem_t *mem);
    size_t       (*mem_length)(const kvt_mem_t *mem);
    /* mem_rkey: packed rkey, borrowed until mem_release. */
    void         (*mem_rkey)(const kvt_mem_t *mem, const void **buf_p,
                             size_t *len_p);
    /* mem_type_of: 0 host, 1 device, -1 unknown (reason in last error). */
    int          (*mem_type_of)(const void *ptr);

    /* ep_create connects to a peer worker address; a failed wire-up (and,
     * with err_mode_peer, any later peer failure) reaches err_cb once. */
    kvx_status_t (*ep_create)(kvt_ctx_t *ctx, const void *addr, size_t len,
                              const char *peer_name, kvt_ep_err_fn err_cb,
                              void *err_arg, kvt_ep_t **ep_p);
    /* ep_close cancels queued runs (their ops fail KVX_ERR_CANCELED),
     * closes and frees the endpoint; rkeys of the ep destroyed before. */
    void         (*ep_close)(kvt_ep_t *ep);
    /* ep_fail marks the endpoint failed: queued runs canceled, in-flight
     * ones completed by a force close. */
    void         (*ep_fail)(kvt_ep_t *ep, kvx_status_t status,
                            const char *reason);
    const char  *(*ep_transports)(const kvt_ep_t *ep);
    int          (*ep_rma_emulated)(const kvt_ep_t *ep);
    int          (*ep_rma_shm_only)(const kvt_ep_t *ep);

    kvx_status_t (*rkey_unpack)(kvt_ep_t *ep, const void *buf, size_t len,
                                kvt_rkey_t **rkey_p);
    void         (*rkey_destroy)(kvt_rkey_t *rkey);
    /* rkey_local: the local address of the peer's addr when the rkey maps
     * it into this process, else NULL. */
    void        *(*rkey_local)(const kvt_rkey_t *rkey, uint64_t addr);
    /* prefault: populate the page tables of the peer's [addr, addr+len)
     * where the rkey maps it here, no further than the mapping it lies in
     * (best effort; len is the peer's word). */
    void         (*prefault)(kvt_rkey_t *rkey, uint64_t addr, size_t len);

    /* post queues runs (offsets relative to local_base / remote_base) as
     * gets (is_put 0) or puts; runs stay valid until op->done ran.
     * op->done runs exactly once on KVX_OK, after the last run completed
     * or failed (op->status: the first error); never with an error return.
     * Zero runs complete at once (done still runs later). */
    kvx_status_t (*post)(kvt_ep_t *ep, int is_put, kvt_mem_t *local_mem,
                         uint64_t local_base, kvt_rkey_t *rkey,
                         uint64_t remote_base, const kvc_run_t *runs,
                         size_t n, kvt_op_t *op);
    /* flush completes op once every run posted on ep before it completed
     * at the origin and the target. Same contract as post. */
    kvx_status_t (*flush)(kvt_ep_t *ep, kvt_op_t *op);

    /* Device placement from a topology (see kvu.h); NULL: none. */
    kvx_status_t (*pick_nic)(const char *xml_path, const char *gpu_busid,
                             char *buf, size_t len);
    kvx_status_t (*cpuset)(const char *xml_path, const char *gpu_busid,
                           char *buf, size_t len);
    /* settings: the transport settings in force ("KEY=VALUE ..."),
     * borrowed until ctx_destroy; NULL member: none to report. */
    const char  *(*settings)(const kvt_ctx_t *ctx);
    /* ep_set_session: the session (from the peer's handshake reply) that
     * authenticates every get and put the peer serves in software
     * (kvc_req_mac, checked by its authorize); before the first post.
     * NULL member: not carried. */
    void         (*ep_set_session)(kvt_ep_t *ep, uint64_t session);
    /* notify sends the peer a completion notice naming transfer id (tag
     * kvc_xfer_tag(id)), the use of that id (xnonce, the peer's) and this
     * side's instance, authenticated under the endpoint's session; it
     * reaches the peer's params.notice. Best
     * effort, no reply, no completion: the caller sends it after a flush
     * completed, so nothing posted before it can land after it arrives.
     * KVX_OK when it was handed to the transport. NULL member: no notices
     * (the control plane's message is the only one). from (NULL or "":
     * none; else at most KVT_NOTICE_FROM_MAX - 1 bytes) travels with it:
     * the address the peer saw this side at, from which the peer
     * recomputes the session (a READ release, mode_read.c). nonce: the
     * caller's (a READ release: D's stamp, strictly increasing, which P
     * checks for replays), or 0 for one the transport draws. */
    kvx_status_t (*notify)(kvt_ep_t *ep, uint64_t tag, uint64_t instance,
                           uint64_t xnonce, uint64_t nonce, const char *id,
                           const char *from);
    /* notify_queued: a notice as notify's (no from, a drawn nonce), queued
     * behind every post and flush made on ep before it and sent once their
     * runs were all handed to the wire, not once they completed: it can
     * overtake them. So it carries count, the bytes of the puts of the
     * transfer it follows, which the peer checks against the bytes it took
     * for that transfer before it believes the notice (params.notice's
     * count; mac kvc_count_mac). It is a hint the peer may act on early,
     * never the last word: the caller still notifies after its flush. The
     * runs' op->am_bytes tell whether the peer could count them (checked
     * active messages) or not (RMA UCX moves itself). Same contract as
     * notify otherwise. NULL member: none. */
    kvx_status_t (*notify_queued)(kvt_ep_t *ep, uint64_t tag,
                                  uint64_t instance, uint64_t xnonce,
                                  uint64_t count, const char *id);
    /* ctl_send sends the peer a control message (len bytes, 1..KVT_CTL_MAX,
     * no NUL inside) on the data plane, authenticated under the endpoint's
     * session (kvc_msg_mac), with from (1..KVT_NOTICE_FROM_MAX - 1 bytes):
     * the address the peer saw this side at, from which the peer
     * recomputes the session; it reaches the peer's params.ctl with nonce
     * (the caller's, never 0: the receiver refuses replays by it). Best
     * effort, no reply, any thread. KVX_OK when handed to the transport;
     * an error (endpoint failed or closed, no session, 256 unsent, bad
     * length) leaves the message to the control plane. NULL member: none
     * (the control plane carries every message). */
    kvx_status_t (*ctl_send)(kvt_ep_t *ep, const char *msg, size_t len,
                             const char *from, uint64_t nonce);
    /* Caller-driven progress: a thread about to wait for a completion
     * runs the progress owner's passes itself. drive_begin, then drive
     * (one pass when no other runs: its activity, 0 idle, -1 another
     * thread holds the pass or the caller is inside one), then drive_end
     * before it sleeps (back 0) or returns (back 1: it is likely to wait
     * again soon; the progress owner stays aside a little longer); never
     * with a lock a completion callback takes. driven: the waiters' passes
     * that found work. NULL
     * members: the progress owner alone progresses (the simulator's
     * scheduler). */
    void         (*drive_begin)(kvt_ctx_t *ctx);
    int          (*drive)(kvt_ctx_t *ctx);
    void         (*drive_end)(kvt_ctx_t *ctx, int back);
    uint64_t     (*driven)(const kvt_ctx_t *ctx);
    /* tick_at: run params.tick once us has come (the engine clock's µs:
     * CLOCK_MONOTONIC on the real clock, virtual on the simulator; soon
     * after it, never before), besides its period (a READ get's retry is
     * due then); any thread. NULL member: the period alone. */
    void         (*tick_at)(kvt_ctx_t *ctx, uint64_t us);
} kvt_data_ops_t;

/* ---- control plane ------------------------------------------------------- */

typedef struct kvt_server kvt_server_t;
typedef struct kvt_client kvt_client_t;
typedef void (*kvt_conn_fn)(void *arg, int up);

#define KVT_PATH_MAX 512
#define KVT_NAME_MAX 256

/* kvt_ctl_sec_t: mutual TLS for the control plane. NULL (or cert_file "")
 * means plain TCP. With it, a server only accepts connections whose client
 * certificate chains to ca_file and names peer_name (CN or a DNS SAN), and
 * a client only talks to a server that does the same; a plain connection
 * is refused both ways. */
typedef struct kvt_ctl_sec {
    char cert_file[KVT_PATH_MAX]; /* PEM certificate this side presents */
    char key_file[KVT_PATH_MAX];  /* PEM private key (not encrypted) */
    char ca_file[KVT_PATH_MAX];   /* PEM CA certificate(s) peers chain to */
    char peer_name[KVT_NAME_MAX]; /* the name every peer must present */
} kvt_ctl_sec_t;

/* kvt_handler_fn: one request (len bytes, not NUL-terminated) from `from`
 * ("ip:port" of the sender's connection, "" when unknown; with TLS, the
 * sender has also presented a certificate naming the server's peer_name:
 * libnng 1.5 cannot report the name per connection); set *reply_p to
 * a malloc'd reply of *reply_len_p bytes (the transport frees it). Runs on
 * a transport thread, possibly concurrently for different requests; must
 * not block for long. */
typedef void (*kvt_handler_fn)(void *arg, const char *from, const char *msg,
                               size_t len, char **reply_p,
                               size_t *reply_len_p);
/* kvt_reply_fn: the outcome of one posted request, exactly once (also when
 * the client is closed: KVX_ERR_CANCELED). On KVX_OK reply is len bytes
 * plus a NUL, valid during the call; else err says what failed. */
typedef void (*kvt_reply_fn)(void *arg, kvx_status_t st, const char *reply,
                             size_t len, const char *err);

typedef struct kvt_ctl_ops {
    const char *name;            /* "nng", "sim" */

    /* server_create listens on host:port (host "0.0.0.0" / "::" for any)
     * with nctx requests served at once; messages above max_msg bytes are
     * dropped by the transport; sec: NULL plain, else mutual TLS. */
    kvx_status_t (*server_create)(const char *host, uint32_t port, int nctx,
                                  size_t max_msg, const kvt_ctl_sec_t *sec,
                                  kvt_handler_fn fn, void *arg,
                                  kvt_server_t **srv_p);
    /* server_destroy returns once no handler runs; not from a callback. */
    void         (*server_destroy)(kvt_server_t *srv);
    /* client_open dials host:port in the background (reconnecting) with
     * nctx requests in flight at most; sec as for server_create. */
    kvx_status_t (*client_open)(const char *host, uint32_t port, int nctx,
                                const kvt_ctl_sec_t *sec,
                                kvt_client_t **cli_p);
    /* client_post copies msg and sends it: KVX_OK means fn will be called;
     * KVX_ERR_BAD_STATE: every context busy (nothing sent). */
    kvx_status_t (*client_post)(kvt_client_t *cli, const void *msg,
                                size_t len, int timeout_ms, kvt_reply_fn fn,
                                void *arg);
    /* client_close: pending requests complete (canceled) before it
     * returns; not from a callback. */
    void         (*client_close)(kvt_client_t *cli);
    /* client_watch (NULL if the transport cannot tell): fn(arg, up) runs
     * on a control-plane thread each time the client's connection comes up
     * (1) or is lost (0), never after client_close began; first, inside
     * client_watch, for what happened since the client was opened (up; a
     * reconnect as lost and up; lost when none is up now), with the
     * caller's locks held: fn must take none of them, must not block nor
     * call back into the transport. Once per client. */
    void         (*client_watch)(kvt_client_t *cli, kvt_conn_fn fn,
                                 void *arg);
} kvt_ctl_ops_t;

/* The environment an engine runs in: its transports and clock. */
typedef struct kvt_env {
    const kvt_data_ops_t *data;
    const kvt_ctl_ops_t  *ctl;
    kvt_clock_t           clock;
} kvt_env_t;

#endif
