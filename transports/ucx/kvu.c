/*
 * kvu.c - UCX data plane: context, worker, progress thread, memory,
 * endpoints, rkeys and run posting (see kvu.h for the contract).
 */
#define _GNU_SOURCE
#include "kvu.h"
#include "kvu_lanes.h"
#include "kvu_guard.h"
#include "clock.h"
#include "siphash.h"
#include "tlsname.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define KVU_TICK_MS       20
/* While a waiter drives or holds its lease, the progress thread aside looks
 * at least this often (µs) whether the lease ended: 1 ms keeps its timer
 * cheap (arm + disarm 11-19 µs 50-200 µs ahead on a paravirtualised
 * guest, 5.5 µs at 1 ms, 2.7 µs from the 4 ms tick on: kvxfer_timer_bench,
 * perf/README.md) and its wake-ups to 1,000 per second. */
#define KVU_LOOK_US       1000u
#define KVU_CLOSE_WAIT_MS 3000
/* Emulated gets in flight per endpoint whose active-message lane is a
 * shared-memory FIFO (kvu_lanes_am_fifo). Each such get is one request
 * message in the peer's receive FIFO (UCX default UCX_MM_FIFO_SIZE 64,
 * released to senders every 32 elements the peer consumed). A sender that
 * fills that FIFO cannot discard its lane once the peer stops draining it
 * (killed, engine destroyed): uct_mm_ep_flush answers NO_RESOURCE whatever
 * the CANCEL flag (UCX 1.13 .. master), so ucp_ep_close_nbx(FORCE) and
 * UCX's own error path never purge the endpoint's requests and their
 * callbacks never run. At most 16 requests + 31 consumed-but-unreleased
 * elements stay below 64: the force close completes every get as
 * canceled. */
#define KVU_FIFO_MAX_GETS 16
/* A healthy endpoint being closed first flushes (its in-flight operations
 * complete at both ends) for at most this long, then is force-closed. */
#define KVU_DRAIN_MS      1000

/* --- RMA over kvxfer's own active messages ------------------------------
 * On an endpoint without an RMA lane (tcp), UCX emulates ucp_get/ucp_put
 * with internal active messages whose target-side replies are internal
 * requests without an error path: when the origin dies or force-closes
 * while replies are queued, the TARGET aborts (ucp_request_try_send
 * "unexpected error", UCX 1.13 .. 1.22; tcp pending purge assertion). On
 * such endpoints kvxfer moves the data itself with user active messages
 * (ucp_am_send_nbx requests complete with an error status instead):
 *   GETREQ {id, addr, len}         origin -> target
 *   GETREP {id, status} + data     target -> origin (reply endpoint)
 *   PUT    {id, addr, len} + data  origin -> target
 *   PUTV   {id, n, len} + n entries {addr, len, nonce, mac} + their data
 *                                  origin -> target: n short runs of one
 *                                  job in one message (KVU_AM_PUTV_MAX)
 *   PUTACK {id, status}            target -> origin (one for a PUTV)
 * Every message is eager (UCP_AM_SEND_FLAG_EAGER: no rendezvous, whose
 * internal requests would have the same defect). The target checks every
 * request against the memory it registered and the remote access it
 * granted (kvt.h KVT_ACCESS_*), then asks the engine (params.authorize)
 * whether the transfer the request's tag names holds the range: anything
 * else is answered KVX_ERR_OUT_OF_BOUNDS (or KVX_ERR_NOT_EXPOSED: that
 * transfer is not held here yet) and never touches memory. The variable
 * KVX_UCX_AM_RMA=0 turns it off (UCX's own emulation). */
#define KVU_AM_GETREQ     0x4b1
#define KVU_AM_GETREP     0x4b2
#define KVU_AM_PUT        0x4b3
#define KVU_AM_PUTACK     0x4b4
#define KVU_AM_PROBE      0x4b5 /* the receive-FIFO watchdog's token */
#define KVU_AM_NOTICE     0x4b6 /* a completion notice (kvu_notify) */
#define KVU_NOTICE_COUNTED 1    /* a notice's status: kvu_notify_queued's */
#define KVU_AM_CTL        0x4b7 /* a control message (kvu_ctl_send) */
#define KVU_AM_PUTV       0x4b8 /* several short puts (kvu_am_issue_v) */
#define KVU_AM_MAGIC      0x4d41564bu /* "KVAM" */
#define KVU_AM_VERSION    11 /* 2: token and nonce; 3: transfer tag;
                               4: published rkeys end with kvu_pub_trailer;
                               5: published worker addresses are
                                  kvu_addr_hdr_t lists (the tcp plane);
                               6: requests carry a mac under the
                               origin's session (kvc_req_mac);
                               7: completion notices (KVU_AM_NOTICE);
                               8: control messages (KVU_AM_CTL);
                               9: a READ release notice carries its
                                  sender's stamp (nonce) and instance
                                  (token), which P checks for replays;
                                  transfer tags are SipHash, not FNV
                                  (kvc_xfer_tag);
                               10: published addresses carry the UCX
                                   version and FIFO geometry;
                               11: PUTV, several puts in one message */
#define KVU_AM_MAX_LEN    (256u << 10) /* bytes per message (tcp) */
#define KVU_AM_SMALL_LEN  (60u << 10)  /* to or from a worker whose tcp
                                          receive segments are UCX's
                                          default 64k (one segment each
                                          when the sender's are large) */
#define KVU_AM_FIFO_LEN   (64u << 10)  /* what a shared-memory FIFO's
                                          segments (KVU_MM_SEG) and its gets
                                          budget are sized for; a message
                                          over it carries at most
                                          KVU_AM_SMALL_LEN (kvu_ep_drain) */
/* PUTV: up to KVU_AM_PUTV_MAX (kvu.h) whole runs of one job, each of at
 * most KVU_AM_PUTV_RUN bytes, go in one message on a lane that is not a
 * shared-memory FIFO (tcp): a put message of its own each cost a send, a
 * receive and an answer (tcp WRITE 32 KiB x 32 1.59-1.89x resident,
 * 1.43-1.74x cold with PUTV; transports/ucx/README.md, "Several puts in one
 * message"). Each run keeps its own nonce and mac and is checked alone. */
#define KVU_AM_PUTV_RUN   (64u << 10) /* (KVU_AM_PUTV_MAX: kvu.h) */
/* Bytes of AM gets unanswered at once over a shared-memory FIFO. Each
 * answer lands in this side's receive FIFO (UCX's default 64 elements of
 * 8 KiB): a 64 KiB answer takes 9 elements, so 16 gets in flight need
 * 144. Once the FIFO is full the target's answers wait in UCX's pending
 * queue, and UCX's sender learns of freed elements only when it runs a
 * progress pass again, which a target gone to sleep does at its next
 * event: READ of 1 MiB runs fell to 1.6-2.1 GB/s in 6 of 9 runs on UCX
 * 1.13 (3.6-7.3 GB/s with this budget: 5 answers, 45 elements;
 * transports/ucx/README.md, "The answers' budget"). With "auto"'s
 * segments (KVU_MM_SEG) an answer takes one element; the budget stays
 * for segments a user sets (lifting it there measured no better). */
#define KVU_FIFO_GET_BYTES (5u * KVU_AM_FIFO_LEN)
/* Shared-memory receive segments ("auto": MM_SEG_SIZE) that hold a whole
 * FIFO message (KVU_AM_FIFO_LEN and kvxfer's and UCX's headers), so UCX
 * neither cuts a 60 KiB get answer or put into 8 segments of its default
 * 8256 bytes nor reassembles them into a buffer of its own before kvxfer's
 * handler copies them (sm READ and WRITE 1 MiB x 1 cold 1.3-1.5x,
 * resident 1.3-1.6x; transports/ucx/README.md, "Segments that hold a
 * message"). The cost: each shared-memory transport's receive buffers
 * are 8x larger, about 26 MiB more System V shared memory per process. */
#define KVU_MM_SEG        (KVU_AM_FIFO_LEN + 2048u)
/* ... and FIFOs of 64 elements (MM_FIFO_SIZE), UCX 1.13's default: UCX
 * 1.22's 256 elements of such segments cycle 17 MB of receive buffers, and
 * READ of one 32 KiB block fell to 0.29-0.35 GB/s from 0.51-0.68 with
 * 8256-byte segments (0.43-0.77 with 64 elements; 1 MiB x 1 resident 7.1-8.5
 * -> 10.3-12.1). Set on every version, with the element size (128, the
 * default of both), so that 1.13 and 1.22 agree (kvu_mm_geo_match). */
#define KVU_MM_FIFO       "64"
#define KVU_MM_ELEM       "128"  /* UCX's FIFO_ELEM_SIZE (1.13, 1.22) */
#define KVU_MM_SEG_UCX    8256u  /* UCX's SEG_SIZE (1.13, 1.22) */
#define KVU_TCP_SEG       "272k" /* a whole message, headers included */
/* tcp socket buffers of the tcp plane (TCP_SNDBUF, TCP_RCVBUF), set from
 * the start instead of grown by the kernel's autotuning: WRITE 1 MiB x 1
 * over tcp 0.95-1.71x, median 1.37 (transports/ucx/README.md, "Socket
 * buffers"). Each only where the kernel allows that much
 * (net.core.wmem_max / rmem_max, kvu_sock_max): a size set by hand is
 * capped there and stops the autotuning, which may grow a buffer past it
 * (Linux's default maximum is 208 KiB, its autotuning's 4 and 6 MiB), and
 * only where the environment sets none (UCX_TCP_SNDBUF, UCX_TCP_RCVBUF).
 * The kernel doubles the value: 8 MiB a socket, a bandwidth-delay product
 * of 100 Gb/s over 670 us, ample inside a data centre; a path that needs
 * more (autotuning may reach tcp_rmem's third value) sets its own. */
#define KVU_TCP_BUF       "4m"
#define KVU_TCP_BUF_BYTES (4ull << 20)
#define KVU_AMP_BUCKETS   1024
#define KVU_NOTICE_ID_MAX 512  /* bytes of a notice's transfer id */
#define KVU_NOTICE_QMAX   4096 /* notices waiting for delivery (more are
                                  dropped: a peer cannot grow memory) */
#define KVU_CTL_QBYTES    (4u << 20) /* control-message bytes waiting for
                                        delivery (more are dropped) */
/* Answers (GETREP, PUTACK) a target has in flight: a peer that asks and
 * stops reading would otherwise make it queue answers without bound. Per
 * reply endpoint at most KVU_AMR_EP_MAX answers (params answers_max) and
 * the larger of KVU_AMR_EP_BYTES and twice max_inflight_bytes; all
 * endpoints together 4 times that many answers and the larger of
 * KVU_AMR_BYTES and 4 times an endpoint's bytes (a backstop against many
 * connections). A kvxfer origin has at most max_inflight_bytes in flight
 * per endpoint, in runs of any length (2 KiB runs: 8,192 gets at the
 * default), hence the count. Past a byte bound a get is refused
 * (KVX_ERR_NO_MEMORY, no data: the origin's op fails at once, naming the
 * status); past a count bound a request goes unanswered (its origin's op
 * ends at its deadline or its endpoint's failure): a peer that stops
 * reading stalls only itself, until the backstop. */
#define KVU_AMR_EP_MAX     65536
#define KVU_AMR_EP_BYTES   (256ull << 20)
#define KVU_AMR_BYTES      (1ull << 30)
#define KVU_AMR_EP_BUCKETS 64
#define KVU_NOTICE_PENDING_MAX 256 /* notice sends outstanding on one
                                      endpoint (a peer that stopped reading
                                      cannot grow this side's memory) */

typedef struct kvu_am_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t pad;
    int32_t  status;   /* answers: kvx_status_t; notices: 0, or
                          KVU_NOTICE_COUNTED with len the count */
    uint32_t pad2;
    uint64_t id;       /* origin's request id */
    uint64_t addr;     /* requests: target address */
    uint64_t len;      /* requests: bytes */
    uint64_t token;    /* requests: the target region's token (its rkey) */
    uint64_t nonce;    /* random per request, echoed by the answer */
    uint64_t tag;      /* requests: the origin op's transfer tag;
                          notices: their transfer's */
    uint64_t mac;      /* requests: kvc_req_mac under the origin
                          endpoint's session (kvu_ep_set_session) of tag,
                          nonce, addr, len, direction; to authorize */
} kvu_am_hdr_t;

/* kvu_pub_trailer_t: the last 8 bytes of every rkey kvxfer publishes
 * (after UCX's packed rkey and the region's token): the data-plane
 * protocol this build speaks, so that peers of different protocols refuse
 * each other at the handshake, naming both versions, instead of timing out
 * on active messages the other side drops as malformed. */
#define KVU_PUB_MAGIC     0x5044564bu /* "KVDP" */
typedef struct kvu_pub_trailer {
    uint32_t magic;
    uint16_t version; /* KVU_AM_VERSION */
    uint16_t pad;
} kvu_pub_trailer_t;

/* kvu_addr_hdr_t: what kvu_worker_address publishes: this header, then
 * n entries, each a 4-byte length (its top bits flags: kvu.h
 * KVU_ADDR_NO_RMA, KVU_ADDR_BIG_RX) and a UCP
 * worker address: entry 0 the
 * current worker's, entry 1 (split contexts only) the tcp plane's. Peers
 * of another data-plane protocol are refused by kvu_addr_entries (the
 * first 8 bytes have been the same since protocol 5). Since protocol 10
 * the header also carries the UCX version and the shared-memory FIFO
 * geometry the publisher runs with (kvu_mm_geo_t): an endpoint over a
 * FIFO whose two ends disagree is refused (kvu_mm_geo_match). */
#define KVU_ADDR_MAGIC    0x4157564bu /* "KVWA" */
#define KVU_ADDR_LEN_MASK 0x3fffffffu
typedef struct kvu_addr_hdr {
    uint32_t magic;
    uint16_t version; /* KVU_AM_VERSION */
    uint16_t n;
    uint16_t ucx;     /* UCX major << 8 | minor */
    uint16_t pad;     /* 0 */
    uint32_t mm_seg, mm_fifo, mm_elem; /* kvu_mm_geo_t */
} kvu_addr_hdr_t;
#define KVU_ADDR_HDR_V5 8 /* bytes of magic, version and n */

/* kvu_amp_t: one AM get/put at the origin, until it was answered (reply,
 * error, cancel: the op's reference dropped) and its send completed. */
/* The pack state of the byte datatype (kvu_dt_ops): lives in the send's
 * own kvu_amp_t / kvu_amr_t, so nothing is allocated per send (UCX 1.13
 * does not call finish() for a send purged by an endpoint failure). */
typedef struct kvu_dt_seg {
    const uint8_t *buf;
    size_t         len;
} kvu_dt_seg_t;

typedef struct kvu_dt_state {
    const uint8_t      *buf;
    size_t              len;   /* bytes packed in all */
    size_t              last;  /* offset of the latest pack call */
    const kvu_dt_seg_t *segs;  /* nsegs > 0: the bytes are these, in order
                                  (buf unused) */
    unsigned            nsegs;
} kvu_dt_state_t;

typedef struct kvu_amp {
    kvu_am_hdr_t    hdr;       /* sent; valid until the send completes */
    kvu_dt_state_t  dts;       /* PUT data */
    kvu_ep_t       *ep;
    kvt_op_t       *op;
    void           *lbuf;
    uint64_t        len;
    int             is_put;
    int             answered;
    int             send_done;
    int             op_held;   /* answered (or canceled) before its send
                                  completed: the op is given back then */
    struct kvu_amp *hnext;     /* ctx->amp[] bucket */
} kvu_amp_t;

/* kvu_notice_t: a received completion notice on its way to
 * params.notice (ctx->notice_head, under the ctx lock), or one being sent
 * (hdr and id valid until the send completes). */
typedef struct kvu_notice {
    kvu_am_hdr_t       hdr;
    struct kvu_ep     *ep;      /* sent on (notices_pending), NULL received */
    int                ctl;     /* a control message (KVU_AM_CTL): id holds
                                   its idlen bytes, for params.ctl */
    size_t             idlen;
    char               from[KVT_NOTICE_FROM_MAX]; /* received: "" none */
    struct kvu_notice *next;
    char               id[];
} kvu_notice_t;

/* kvu_amr_ep_t: the answers in flight on one reply endpoint. */
typedef struct kvu_amr_ep {
    ucp_ep_h           ep;
    uint64_t           n, bytes;
    struct kvu_amr_ep *next;
} kvu_amr_ep_t;

/* kvu_amr_t: a target's answer in flight, with its own copy of the data. */
typedef struct kvu_amr {
    kvu_am_hdr_t     hdr;
    kvu_ctx_t       *ctx;
    kvu_amr_ep_t    *epc;      /* its endpoint's count */
    size_t           len;      /* counted in ctx->amr_bytes, epc->bytes */
    kvu_dt_state_t   dts;      /* GETREP data: data[] below */
    unsigned char    data[];   /* what UCX had not packed when the send
                                  returned, copied then (while the range
                                  was authorized): UCX packs the rest
                                  later, when the block may be reused */
} kvu_amr_t;

typedef struct kvu_job kvu_job_t;

struct kvu_job {
    kvu_ep_t        *ep;
    kvu_op_t        *op;
    int              is_put;
    int              is_flush;  /* ep flush after every earlier job */
    uint64_t         local_base;
    ucp_mem_h        memh;
    ucp_rkey_h       rkey;
    kvu_rkey_t      *krkey; /* the same rkey, with its mapping's bounds */
    uint64_t         token;     /* the remote region's AM token */
    int              local_host; /* local memory is host memory */
    uint64_t         remote_base;
    const kvc_run_t *runs;
    size_t           n;
    size_t           idx;  /* current run */
    uint64_t         off;  /* bytes of runs[idx] already issued */
    int              route; /* 0 undecided, else KVU_ROUTE_* */
    struct kvu_notice *nt;  /* a queued notice (kvu_notify_queued), sent
                               once the jobs before it were issued; op
                               NULL */
    kvu_job_t       *next;
};

/* How a job's runs move (kvu_job_route, decided once per job). */
#define KVU_ROUTE_UCX  1 /* ucp_get_nbx / ucp_put_nbx */
#define KVU_ROUTE_AM   2 /* kvxfer's own active messages (kvu_am_issue) */
#define KVU_ROUTE_SIZE 3 /* per run: UCX (cma) from KVU_CMA_MIN_RUN bytes,
                            else active messages */
#define KVU_ROUTE_PTR  4 /* the peer's memory is mapped here (UCX-allocated,
                            ucp_rkey_ptr): kvxfer copies it with memcpy */
/* Runs shorter than this take kvxfer's active messages even where a cma
 * lane could copy them (the user's CMA_MEMORY_INVALIDATE=y): measured on
 * this VM (UCX 1.22, sm, application memory, transports/ucx/README.md
 * "cma"), cma moved 32 KiB blocks at 0.52-0.77x the active messages and
 * 1 MiB blocks at 0.76-1.59x. */
#define KVU_CMA_MIN_RUN (256u << 10)

/* kvu_req_t lives inside every UCP request (UCP_PARAM_FIELD_REQUEST_SIZE). */
typedef struct kvu_req {
    kvu_ep_t *ep;
    kvu_op_t *op;
    uint64_t  len;
} kvu_req_t;

struct kvu_mem {
    kvu_ctx_t *ctx;
    ucp_mem_h  memh;
    void      *base;
    size_t     len;
    void      *rkey_buf;       /* UCX's packed rkey */
    size_t     rkey_len;
    uint64_t   token;          /* random: AM requests must name it */
    uint8_t   *pub;            /* rkey_buf + token + kvu_pub_trailer_t:
                                  what peers get */
    size_t     pub_len;
    int        host;           /* host memory (AM requests may copy) */
    kvu_mem_t *next;           /* ctx->mems */
};

struct kvu_rkey {
    kvu_ep_t  *ep;
    ucp_rkey_h rkey;
    uint64_t   token; /* the peer region's AM token */
    /* KVU_ROUTE_PTR: the shared mapping of the peer's segment here, found
     * when the first job through it is routed (kvu_rkey_map; the thread
     * running the pass, ctx lock held). 0 not looked up yet, 1 [map_lo,
     * map_hi), -1 refused. */
    int        map_state;
    uintptr_t  map_lo, map_hi;
    /* Destroyed by its owner while UCX requests of its endpoint were in
     * flight (kvu_rkey_destroy): kept, on ep->dead_rkeys, until none is. */
    kvu_rkey_t *dead_next;
};

struct kvu_ep {
    kvu_ctx_t    *ctx;
    ucp_ep_h      ep;
    char          peer[160];
    char          transports[512];
    int           emulated;      /* no RMA lane at all */
    int           rma_shm_only;  /* RMA lanes are shared memory only */
    int           rma_cma;       /* RMA lanes are shared memory and cma
                                    (zero-copy, protocol v2; no GPU or
                                    RDMA lane): on application memory
                                    runs of KVU_CMA_MIN_RUN and more go
                                    cma, shorter ones kvxfer's AMs */
    int           am_putv;       /* short puts share a message (PUTV):
                                    not over a FIFO (sm keeps one message
                                    a put, measured ahead already) */
    int           am_fifo;       /* AM lane is a shared-memory FIFO: gets
                                    capped at KVU_FIFO_MAX_GETS and
                                    KVU_FIFO_GET_BYTES */
    int           fifo_lane;     /* some lane is such a FIFO (both ends
                                    must agree on its geometry) */
    int           am_rma;        /* gets/puts over kvxfer AMs (emulated) */
    int           am_only;       /* this or the peer's end is a tcp plane
                                    (no UCX RMA at all): kvxfer AMs only */
    uint64_t      am_get_max;    /* bytes per AM get: this side's receive
                                    segments (KVU_ADDR_BIG_RX) */
    uint64_t      am_put_max;    /* bytes per AM put: the peer's */
    uint64_t      am_npending;   /* AM gets/puts not answered yet */
    uint64_t      am_get_bytes;  /* bytes of those that are gets (over a
                                    FIFO capped at KVU_FIFO_GET_BYTES) */
    uint64_t      session;       /* carried by every AM request */
    kvu_ep_err_fn err_cb;
    void         *err_arg;
    int           failed;
    int           err_pending;   /* error callback not yet delivered */
    int           closed;        /* kvu_ep_close called */
    _Atomic int   dead;          /* failed or closed: posts are refused;
                                    set after fail_reason (release) */
    kvx_status_t  fail_status;
    char          fail_reason[256];
    uint64_t      inflight;      /* bytes */
    uint64_t      inflight_reqs;
    uint64_t      notices_pending; /* notice sends not completed: at
                                      KVU_NOTICE_PENDING_MAX kvu_notify
                                      refuses (the caller falls back to
                                      its control plane) */
    void         *close_req;
    void         *close_flush;   /* the flush before a graceful close */
    uint64_t      close_by_us;   /* its deadline */
    int           wired;         /* wire-up flush completed */
    int           wire_pending;  /* its request is outstanding */
    ucs_status_t  wire_status;
    kvu_job_t    *qhead, *qtail;
    kvu_rkey_t   *dead_rkeys;    /* destroyed by the owner, still held
                                    for UCX (kvu_rkeys_reap) */
    kvu_ep_t     *next;          /* ctx->eps or ctx->closing */
};

/* kvu_wk_t: one UCP worker of the context. wk[nwk - 1] is the current
 * one (new endpoints, the published address); earlier ones were retired by
 * the receive-FIFO watchdog (kvu_fifo_*) and are still progressed until the
 * context is destroyed, for the endpoints created on them. */
typedef struct kvu_wk {
    kvu_ctx_t     *ctx;
    ucp_worker_h   worker;
    int            efd;
    ucp_address_t *addr;
    size_t         addr_len;
    uint8_t       *pub;      /* what peers get (kvu_addr_build) */
    size_t         pub_len;
} kvu_wk_t;

/* At most this many workers per context: the watchdog retires a worker at
 * most KVU_WORKERS_MAX - 1 times, then only logs. */
#define KVU_WORKERS_MAX 4

struct kvu_ctx {
    ucp_context_h   ucp;
    ucp_worker_h    worker;      /* wk[nwk - 1].worker */
    kvu_wk_t        wk[KVU_WORKERS_MAX];
    unsigned        nwk;
    /* The tcp plane (kvu_tls_split): when tcp is allowed beside transports
     * that copy for real, tcp lives in a context of its own without
     * UCP_FEATURE_RMA (so without UCX's software RMA handlers), and ucp /
     * wk[] keep every other transport. */
    int             split;
    ucp_context_h   ucp_tcp;
    char            tls[512];    /* the transport list in force */
    int             big_rx_main; /* tcp receive segments hold KVU_AM_MAX_LEN */
    int             big_rx_tcp;  /* the same for the tcp plane */
    int             big_rx_last; /* set by kvu_settings_apply */
    kvu_mm_geo_t    mm;          /* FIFO geometry (kvu_settings_apply) */
    unsigned        ucx_ver;     /* UCX major << 8 | minor */
    kvu_wk_t        wkt;
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    pthread_t       thread;
    int             thread_started;
    _Atomic int     stop;
    int             efd;
    int             wakefd;
    kvu_params_t    params;
    kvt_net_t       inbound[KVT_INBOUND_MAX]; /* params.inbound's copy */
    char            name[64];
    char            cpus[256];
    char            settings[768]; /* UCX settings in force, KEY=VALUE ... */
    uint64_t        chunk;
    kvu_op_t       *done_head;   /* completed ops, under lock */
    /* Posted jobs on their way to their endpoint's queue. Posting takes
     * only in_lock, never the lock ucp_worker_progress runs under, so an
     * API call never waits behind data movement. */
    pthread_mutex_t in_lock;
    kvu_job_t      *in_head, *in_tail;
    kvt_job_t      *def_head, *def_tail; /* kvu_defer, under in_lock */
    kvu_ep_t       *eps;         /* live endpoints */
    kvu_ep_t       *closing;     /* closed, waiting for UCX */
    uint64_t        mem_types;
    int             delivering;  /* error callbacks running unlocked */
    _Atomic uint64_t kicks;      /* kvu_ctx_kick calls */
    _Atomic uint64_t tick_at;    /* kvu_tick_at: the tick is due then (0: no
                                    such time, the period alone) */
    _Atomic int     sleeping;    /* progress thread in (or entering) poll */
    /* A pass (kvu_pass), the tick and the FIFO check run under pass_lock,
     * on the progress thread or on a framework thread waiting in the
     * engine (kvu_drive): never two at once, so what the progress thread
     * alone touched before is touched by one pass owner at a time. */
    pthread_mutex_t pass_lock;
    _Atomic int     drivers;     /* threads between drive_begin and _end */
    /* A waiter that just left is expected back (its next wait) until
     * lease_us (kvc_mono_us): meanwhile the progress thread stays aside and
     * kicks skip its wake-up. No timer marks the lease's end: arming one
     * 50 µs ahead and disarming it costs 16-19 µs on a paravirtualised
     * guest, more than the hand-off the lease saves. The thread aside
     * looks again every KVU_LOOK_US instead, so a waiter that does not
     * come back costs the rest of its lease and at most that much more. */
    _Atomic uint64_t lease_us;
    _Atomic int     aside;       /* the progress thread sleeps aside */
    _Atomic uint64_t driven;     /* waiters' passes that found work */
    _Atomic int     pass_wanted; /* the progress thread waits for the pass */
    uint64_t        last_tick;   /* of params.tick (pass_lock) */
    int             am_rma;      /* KVX_UCX_AM_RMA (default 1) */
    int             putv;        /* KVX_UCX_PUTV (default 1): short puts
                                    share a message (KVU_AM_PUTV) */
    uint64_t        am_putv;     /* PUTV messages sent */
    int             rma;         /* UCP_FEATURE_RMA requested (kvu_rma_wanted) */
    kvu_mem_t      *mems;        /* registered memory, ctx lock */
    uint64_t        amp_next_id;
    uint64_t        am_refused;  /* AM requests refused (log throttle) */
    uint64_t        am_served;   /* AM requests answered (debug log) */
    uint64_t        am_dropped;  /* AM answers matching no request */
    uint64_t        amr_n;       /* answers in flight, all endpoints */
    uint64_t        amr_bytes;   /* their data */
    uint64_t        amr_unsent;  /* requests left unanswered: over a limit */
    uint64_t        amr_sent;    /* answers handed to UCX */
    uint64_t        amr_ep_max, amr_ep_bytes; /* per endpoint (KVU_AMR_*) */
    uint64_t        amr_max, amr_max_bytes;   /* all together */
    kvu_amr_ep_t   *amr_ep[KVU_AMR_EP_BUCKETS]; /* by reply endpoint */
    uint64_t        am_late_copied; /* GETREP bytes copied for a later pack */
    uint64_t        rkeys_held;     /* rkeys destroyed by their owner and
                                       held for requests in flight */
    uint64_t        ptr_copied;     /* bytes copied through a mapped peer
                                       segment (KVU_ROUTE_PTR) */
    kvu_notice_t   *notice_head, *notice_tail; /* received, under lock */
    uint64_t        notice_queued;  /* entries in that list */
    uint64_t        ctl_queued;     /* bytes of its control messages */
    uint64_t        notice_dropped; /* malformed or over KVU_NOTICE_QMAX */
    uint64_t        am_key[2];   /* secret key of request nonces */
    uint64_t        am_seq;      /* count of request nonces drawn */
    ucp_datatype_t  am_dt;       /* bytes, packed by copy (kvu_dt_*) */
    kvu_amp_t      *amp[KVU_AMP_BUCKETS]; /* unanswered AM ops, by id */
    /* The receive-FIFO watchdog (progress thread only; kvu_fifo_*). */
    ucp_context_h   probe_ucp;
    ucp_worker_h    probe_worker;
    ucp_ep_h        probe_ep[KVU_WORKERS_MAX]; /* to wk[i] */
    int             probe_on;
    uint64_t        probe_hdr;   /* the token of the probe in flight */
    uint64_t        probe_seen;  /* the last token the current worker got */
    uint64_t        probe_sent_us;
    uint64_t        probe_sent_pass;
    _Atomic uint64_t passes;     /* progress passes */
    int             reset_pending; /* params.worker_reset to call */
    _Atomic uint64_t worker_resets;
};

kvx_status_t kvu_status_from_ucs(int ucs_status)
{
    switch ((ucs_status_t)ucs_status) {
    case UCS_OK:
        return KVX_OK;
    case UCS_INPROGRESS:
        return KVX_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return KVX_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
        return KVX_ERR_INVALID_PARAM;
    case UCS_ERR_UNSUPPORTED:
        return KVX_ERR_NOT_SUPPORTED;
    case UCS_ERR_CANCELED:
        return KVX_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return KVX_ERR_TRANSFER_TIMEOUT;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
        return KVX_ERR_ENDPOINT;
    default:
        return ucs_status < 0 ? KVX_ERR_ENDPOINT : KVX_ERR_INTERNAL;
    }
}

const char *kvu_version(void)
{
    return ucp_get_version_string();
}

/* kvu_driven: is a waiter driving, or expected back (its lease)? */
static int kvu_driven(kvu_ctx_t *ctx)
{
    uint64_t lease = atomic_load(&ctx->lease_us);

    return atomic_load(&ctx->drivers) > 0 ||
           (lease != 0 && kvc_mono_us() < lease);
}

/* kvu_wake: the eventfd written if the progress thread sleeps. */
static void kvu_wake(kvu_ctx_t *ctx)
{
    uint64_t one = 1;

    if (atomic_load(&ctx->sleeping)) {
        ssize_t rc = write(ctx->wakefd, &one, sizeof(one));

        (void)rc;
    }
}

/* kvu_ctx_kick: something for the progress thread. Every kick is counted;
 * the eventfd is written only while the thread sleeps (or is about to): a
 * post to a spinning thread costs no system call, and so no scheduling
 * point, on the caller's side. The thread re-checks the count after
 * announcing its sleep (kvu_wait), so no kick is lost. While it sleeps
 * aside for a waiter that drives or holds its lease (kvu_drive_*), no
 * eventfd is written either: the waiter's next pass takes the work, or the
 * thread's own look when the lease ends (KVU_LOOK_US). A thread in its
 * ordinary sleep is always woken: it does not look that often. */
void kvu_ctx_kick(kvu_ctx_t *ctx)
{
    atomic_fetch_add(&ctx->kicks, 1);
    if (atomic_load(&ctx->sleeping) &&
        !(atomic_load(&ctx->aside) && kvu_driven(ctx))) {
        kvu_wake(ctx);
    }
}

/* kvu_tick_at: see kvu.h. The earliest time asked for is kept. */
void kvu_tick_at(kvu_ctx_t *ctx, uint64_t us)
{
    uint64_t cur = atomic_load(&ctx->tick_at);

    us = us != 0 ? us : 1;
    while (cur == 0 || us < cur) {
        if (atomic_compare_exchange_weak(&ctx->tick_at, &cur, us)) {
            /* A progress thread about to sleep sees the kick and passes
             * again; one asleep is woken to take the earlier time. */
            atomic_fetch_add(&ctx->kicks, 1);
            if (atomic_load(&ctx->sleeping)) {
                kvu_wake(ctx);
            }
            return;
        }
    }
}

/* kvu_tick_due: the tick's period ended, or the time kvu_tick_at asked
 * for came; take: the caller runs the tick now (the time asked for is
 * cleared: the tick may ask again), else it only looks. */
static int kvu_tick_due(kvu_ctx_t *ctx, uint64_t now, int take)
{
    uint64_t at = atomic_load(&ctx->tick_at);

    if (at != 0 && now >= at &&
        (!take || atomic_compare_exchange_strong(&ctx->tick_at, &at, 0))) {
        return 1;
    }
    return now - ctx->last_tick >= KVU_TICK_MS * 1000u / 2;
}

/* kvu_poll_until: poll(2) for at most max_us, and not past the time
 * kvu_tick_at asked for (to the microsecond). */
static int kvu_poll_until(kvu_ctx_t *ctx, struct pollfd *pfd, nfds_t n,
                          uint64_t max_us)
{
    uint64_t        at = atomic_load(&ctx->tick_at), now = kvc_mono_us();
    uint64_t        us = max_us;
    struct timespec ts;

    if (at != 0) {
        us = at <= now ? 0 : at - now < us ? at - now : us;
    }
    ts.tv_sec  = (time_t)(us / 1000000u);
    ts.tv_nsec = (long)(us % 1000000u) * 1000;
    return ppoll(pfd, n, &ts, NULL);
}

/* --- completion bookkeeping (ctx lock held) ----------------------------- */

static void kvu_op_set_error(kvu_op_t *op, kvx_status_t status)
{
    int expected = 0;

    atomic_compare_exchange_strong(&op->status, &expected, (int)status);
}

static void kvu_op_put(kvu_ctx_t *ctx, kvu_op_t *op)
{
    if (atomic_fetch_sub(&op->remaining, 1) == 1) {
        op->next       = ctx->done_head;
        ctx->done_head = op;
    }
}

static void kvu_req_cb(void *request, ucs_status_t status, void *user_data)
{
    kvu_req_t *req = request;
    kvu_ep_t  *ep  = req->ep;
    kvu_op_t  *op  = user_data;

    (void)user_data;
    ep->inflight -= req->len;
    ep->inflight_reqs--;
    if (status != UCS_OK) {
        kvu_op_set_error(op, ep->failed ? ep->fail_status
                                        : kvu_status_from_ucs(status));
    }
    kvu_op_put(ep->ctx, op);
    ucp_request_free(request);
}

/* kvu_job_cancel: job will not run: its op completes with status, or its
 * notice is dropped (best effort: the peer's deadline covers it). */
static void kvu_job_cancel(kvu_ctx_t *ctx, kvu_job_t *job,
                           kvx_status_t status)
{
    if (job->nt != NULL) {
        free(job->nt);
    } else {
        kvu_op_set_error(job->op, status);
        kvu_op_put(ctx, job->op);
    }
    free(job);
}

static void kvu_job_cancel_all(kvu_ep_t *ep, kvx_status_t status)
{
    kvu_job_t *job;

    while ((job = ep->qhead) != NULL) {
        ep->qhead = job->next;
        kvu_job_cancel(ep->ctx, job, status);
    }
    ep->qtail = NULL;
}

/* --- RMA over active messages (ctx lock held throughout) ---------------- */

static kvu_amp_t **kvu_amp_slot(kvu_ctx_t *ctx, uint64_t id)
{
    kvu_amp_t **pp = &ctx->amp[id & (KVU_AMP_BUCKETS - 1)];

    while (*pp != NULL && (*pp)->hdr.id != id) {
        pp = &(*pp)->hnext;
    }
    return pp;
}

/* kvu_amp_answer drops the op's reference of an unanswered AM op (reply,
 * error or cancel); frees it once its send completed too. A put whose send
 * has not completed keeps its op until it has (kvu_am_send_cb): UCX packs
 * its data from the op's blocks when it sends it (kvu_dt_pack), and with
 * error mode none a canceled endpoint's close is not forced, so UCX may
 * still send it; the blocks are the framework's again once the op is done.
 * (The bytes already went with a PUTACK'd put: its send completed first.) */
static void kvu_amp_answer(kvu_amp_t *amp, kvx_status_t status)
{
    kvu_ep_t   *ep  = amp->ep;
    kvu_ctx_t  *ctx = ep->ctx;
    kvu_amp_t **pp  = kvu_amp_slot(ctx, amp->hdr.id);

    if (*pp == amp) {
        *pp = amp->hnext;
    }
    amp->answered = 1;
    ep->am_npending--;
    ep->inflight -= amp->len;
    if (!amp->is_put) {
        ep->am_get_bytes -= amp->len;
    }
    if (status != KVX_OK) {
        kvu_op_set_error(amp->op, status);
    }
    if (amp->is_put && !amp->send_done) {
        amp->op_held = 1;
        return;
    }
    kvu_op_put(ctx, amp->op);
    if (amp->send_done) {
        free(amp);
    }
}

/* kvu_am_cancel_ep completes every unanswered AM op of ep with status
 * (endpoint failed or closing: their answers, if any, are dropped). */
static void kvu_am_cancel_ep(kvu_ep_t *ep, kvx_status_t status)
{
    kvu_ctx_t *ctx = ep->ctx;

    for (size_t b = 0; b < KVU_AMP_BUCKETS && ep->am_npending > 0; b++) {
        kvu_amp_t *amp = ctx->amp[b], *next;

        for (; amp != NULL; amp = next) {
            next = amp->hnext;
            if (amp->ep == ep) {
                kvu_amp_answer(amp, status);
            }
        }
    }
}

static void kvu_am_send_cb(void *request, ucs_status_t status,
                           void *user_data)
{
    kvu_amp_t *amp = user_data;
    kvu_ep_t  *ep  = amp->ep;

    ep->inflight_reqs--;
    amp->send_done = 1;
    if (!amp->answered && status != UCS_OK) {
        kvu_amp_answer(amp, ep->failed ? ep->fail_status
                                       : kvu_status_from_ucs(status));
    } else if (amp->answered) {
        if (amp->op_held) {
            if (status != UCS_OK) {
                kvu_op_set_error(amp->op, ep->failed
                                              ? ep->fail_status
                                              : kvu_status_from_ucs(status));
            }
            kvu_op_put(ep->ctx, amp->op);
        }
        free(amp);
    }
    ucp_request_free(request);
}

/* kvu_nonce: the next request nonce: SipHash-2-4 of a counter under the
 * context's random secret key. A peer sees the nonces of the requests sent
 * to it; from them it cannot tell those of requests sent to others (whose
 * answers it could otherwise forge: an answer is matched by id and nonce).
 * (A splitmix64 stream, as before, gives its state away with one output.)
 * Never 0. ctx lock held. */
static uint64_t kvu_nonce(kvu_ctx_t *ctx)
{
    uint64_t seq = ++ctx->am_seq;
    uint64_t v   = kvc_siphash24(ctx->am_key, &seq, sizeof(seq));

    return v != 0 ? v : 1;
}

/* kvu_random64: 64 random bits (getrandom; the clock if it fails). */
static uint64_t kvu_random64(void)
{
    uint64_t v = 0;

    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        v = kvc_mono_us() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    }
    return v;
}

/* kvu_am_send registers amp (its header filled but id, its len and
 * is_put set) as unanswered, then sends it as am_id with the pack state
 * amp->dts (puts) or no data (gets). 0, or -1 when the send failed (the op
 * then has its error). */
static int kvu_am_send(kvu_ep_t *ep, kvu_job_t *job, kvu_amp_t *amp,
                       unsigned am_id)
{
    kvu_ctx_t          *ctx = ep->ctx;
    kvu_amp_t         **pp;
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    amp->hdr.magic   = KVU_AM_MAGIC;
    amp->hdr.version = KVU_AM_VERSION;
    amp->hdr.id      = ++ctx->amp_next_id;
    amp->hdr.token   = job->token;
    amp->hdr.tag     = job->op->tag;
    amp->ep          = ep;
    amp->op          = job->op;
    pp               = kvu_amp_slot(ctx, amp->hdr.id);
    amp->hnext       = *pp; /* NULL: ids are unique */
    *pp              = amp;
    ep->am_npending++;
    ep->inflight += amp->len;
    job->op->am_bytes += amp->len;
    if (!amp->is_put) {
        ep->am_get_bytes += amp->len;
    }
    atomic_fetch_add(&job->op->remaining, 1);

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send      = kvu_am_send_cb;
    prm.user_data    = amp;
    prm.flags        = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    if (amp->is_put) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype      = ctx->am_dt;
        sp = ucp_am_send_nbx(ep->ep, am_id, &amp->hdr, sizeof(amp->hdr),
                             &amp->dts, amp->dts.len, &prm);
    } else {
        sp = ucp_am_send_nbx(ep->ep, am_id, &amp->hdr, sizeof(amp->hdr),
                             NULL, 0, &prm);
    }
    if (sp == NULL) {
        amp->send_done = 1;
        return 0;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        kvc_log_error("KVX-UCX-POST", "%s of %llu bytes to %s (active "
                      "message) failed: %s", amp->is_put ? "put" : "get",
                      (unsigned long long)amp->len, ep->peer,
                      ucs_status_string(UCS_PTR_STATUS(sp)));
        amp->send_done = 1;
        kvu_amp_answer(amp, kvu_status_from_ucs(UCS_PTR_STATUS(sp)));
        return -1;
    }
    ep->inflight_reqs++;
    return 0;
}

/* kvu_am_issue sends one GETREQ or PUT of len bytes (<= KVU_AM_MAX_LEN). */
static int kvu_am_issue(kvu_ep_t *ep, kvu_job_t *job, void *lbuf,
                        uint64_t raddr, uint64_t len)
{
    kvu_ctx_t *ctx = ep->ctx;
    kvu_amp_t *amp = calloc(1, sizeof(*amp));

    if (amp == NULL) {
        kvu_op_set_error(job->op, KVX_ERR_NO_MEMORY);
        return -1;
    }
    amp->hdr.addr  = raddr;
    amp->hdr.len   = len;
    amp->hdr.nonce = kvu_nonce(ctx);
    amp->hdr.mac   = kvc_req_mac(ep->session, job->op->tag, amp->hdr.nonce,
                                 raddr, len, job->is_put);
    amp->lbuf      = lbuf;
    amp->len       = len;
    amp->is_put    = job->is_put;
    amp->dts.buf   = lbuf;
    amp->dts.len   = job->is_put ? len : 0;
    return kvu_am_send(ep, job, amp,
                       job->is_put ? KVU_AM_PUT : KVU_AM_GETREQ);
}

/* kvu_am_putv_count: how many runs of job, from the current one (none of
 * it issued yet), go in one PUTV: each short (KVU_AM_PUTV_RUN), at most
 * KVU_AM_PUTV_MAX, their bytes within max (a put's payload; the entries,
 * at most 512 bytes, ride in the receive segment's room for headers:
 * KVU_TCP_SEG, or UCX's 64k beside KVU_AM_SMALL_LEN); *bytes_p their
 * bytes. Fewer than 2 means a PUT of its own. */
static size_t kvu_am_putv_count(const kvu_job_t *job, uint64_t max,
                                uint64_t *bytes_p)
{
    size_t   k     = 0;
    uint64_t bytes = 0;

    while (job->off == 0 && k < KVU_AM_PUTV_MAX && job->idx + k < job->n) {
        uint64_t len = job->runs[job->idx + k].len;

        if (len == 0 || len > KVU_AM_PUTV_RUN || bytes + len > max) {
            break;
        }
        bytes += len;
        k++;
    }
    *bytes_p = bytes;
    return k;
}

/* kvu_am_issue_v sends runs idx .. idx+k-1 of job (whole, bytes in all) as
 * one PUTV: one entry each, with its own nonce and mac, then their bytes,
 * packed by UCX straight from the blocks (kvu_dt_pack over the segments).
 * One PUTACK answers it. */
static int kvu_am_issue_v(kvu_ep_t *ep, kvu_job_t *job, size_t k,
                          uint64_t bytes)
{
    kvu_ctx_t    *ctx = ep->ctx;
    kvu_amp_t    *amp;
    kvu_am_ent_t *ent;
    kvu_dt_seg_t *seg;

    amp = calloc(1, sizeof(*amp) + k * sizeof(*ent) + (k + 1) * sizeof(*seg));
    if (amp == NULL) {
        kvu_op_set_error(job->op, KVX_ERR_NO_MEMORY);
        return -1;
    }
    ent = (kvu_am_ent_t *)(amp + 1);
    seg = (kvu_dt_seg_t *)(ent + k);
    seg[0].buf = (const uint8_t *)ent;
    seg[0].len = k * sizeof(*ent);
    for (size_t i = 0; i < k; i++) {
        const kvc_run_t *run = &job->runs[job->idx + i];

        ent[i].addr  = job->remote_base + run->remote_off;
        ent[i].len   = run->len;
        ent[i].nonce = kvu_nonce(ctx);
        ent[i].mac   = kvc_req_mac(ep->session, job->op->tag, ent[i].nonce,
                                   ent[i].addr, ent[i].len, 1);
        seg[i + 1].buf = (const uint8_t *)(uintptr_t)(job->local_base +
                                                      run->local_off);
        seg[i + 1].len = run->len;
    }
    amp->hdr.addr  = k; /* a PUTV's count of entries */
    amp->hdr.len   = bytes;
    amp->hdr.nonce = kvu_nonce(ctx);
    amp->len       = bytes;
    amp->is_put    = 1;
    amp->dts.segs  = seg;
    amp->dts.nsegs = (unsigned)(k + 1);
    amp->dts.len   = seg[0].len + bytes;
    ctx->am_putv++;
    return kvu_am_send(ep, job, amp, KVU_AM_PUTV);
}

/* kvu_am_find_mem: the registered host memory holding [addr, addr+len)
 * that peers may access as asked (is_put: write, else read); NULL when
 * there is none. Every field comes from the wire: checked for overflow. */
static kvu_mem_t *kvu_am_find_mem(kvu_ctx_t *ctx, uint64_t addr,
                                  uint64_t len, uint64_t token, int is_put)
{
    int access = ctx->params.remote_access;

    if (len == 0 || len > KVU_AM_MAX_LEN || access == KVT_ACCESS_LOCAL ||
        (is_put && access == KVT_ACCESS_READ) ||
        (!is_put && access == KVT_ACCESS_WRITE)) {
        return NULL;
    }
    for (kvu_mem_t *m = ctx->mems; m != NULL; m = m->next) {
        uint64_t base = (uint64_t)(uintptr_t)m->base;

        if (m->host && addr >= base && addr - base <= m->len &&
            len <= m->len - (addr - base)) {
            return m->token == token ? m : NULL;
        }
    }
    return NULL;
}

static kvu_amr_ep_t **kvu_amr_ep_slot(kvu_ctx_t *ctx, ucp_ep_h ep)
{
    return &ctx->amr_ep[((uintptr_t)ep >> 4) % KVU_AMR_EP_BUCKETS];
}

/* kvu_amr_ep_find: the count of ep's answers in flight; NULL when it has
 * none (no node), or, with create, a new one at 0 (NULL without memory).
 * ctx lock held. A node exists only while an answer is pending, so an
 * answer UCX sends at once allocates nothing. */
static kvu_amr_ep_t *kvu_amr_ep_find(kvu_ctx_t *ctx, ucp_ep_h ep, int create)
{
    kvu_amr_ep_t **pp = kvu_amr_ep_slot(ctx, ep), *e;

    for (e = *pp; e != NULL; e = e->next) {
        if (e->ep == ep) {
            return e;
        }
    }
    e = create ? calloc(1, sizeof(*e)) : NULL;
    if (e != NULL) {
        e->ep   = ep;
        e->next = *pp;
        *pp     = e;
    }
    return e;
}

/* kvu_amr_ep_drop: e if it holds no answer: unlinked, freed. */
static void kvu_amr_ep_drop(kvu_ctx_t *ctx, kvu_amr_ep_t *e)
{
    kvu_amr_ep_t **pp = kvu_amr_ep_slot(ctx, e->ep);

    if (e->n != 0) {
        return;
    }
    while (*pp != e) {
        pp = &(*pp)->next;
    }
    *pp = e->next;
    free(e);
}

/* kvu_amr_uncount: an answer of len bytes is no longer in flight (e: its
 * endpoint's count, or NULL when it has none). */
static void kvu_amr_uncount(kvu_ctx_t *ctx, kvu_amr_ep_t *e, size_t len)
{
    ctx->amr_n--;
    ctx->amr_bytes -= len;
    if (e != NULL) {
        e->n--;
        e->bytes -= len;
        kvu_amr_ep_drop(ctx, e);
    }
}

static void kvu_am_reply_cb(void *request, ucs_status_t status,
                            void *user_data)
{
    kvu_amr_t *amr = user_data;

    (void)status; /* the origin went away: nothing to do */
    kvu_amr_uncount(amr->ctx, amr->epc, amr->len);
    free(amr);
    ucp_request_free(request);
}

static int kvu_am_log_refusal(kvu_ctx_t *ctx);

/* kvu_am_answer_send: GETREP (data from mem, or none) or PUTACK on the
 * requester's reply endpoint; a failure is dropped (origin gone). */
static void kvu_am_answer_send(kvu_ctx_t *ctx, ucp_ep_h reply_ep,
                               unsigned am_id, const kvu_am_hdr_t *req,
                               kvx_status_t status, const void *data,
                               size_t len)
{
    kvu_amr_t          *amr;
    kvu_amr_ep_t       *e  = kvu_amr_ep_find(ctx, reply_ep, 0);
    uint64_t            en = e != NULL ? e->n : 0;
    uint64_t            eb = e != NULL ? e->bytes : 0;
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    if (len > 0 && (eb + len > ctx->amr_ep_bytes ||
                    ctx->amr_bytes + len > ctx->amr_max_bytes)) {
        /* over a byte bound: the get is refused, without data */
        status = KVX_ERR_NO_MEMORY;
        data   = NULL;
        len    = 0;
        if (kvu_am_log_refusal(ctx)) {
            kvc_log_warn("KVX-UCX-AM", "%s: %llu bytes of answers in flight "
                         "to this peer, %llu to all, at most %llu and %llu: "
                         "a get refused", ctx->name,
                         (unsigned long long)eb,
                         (unsigned long long)ctx->amr_bytes,
                         (unsigned long long)ctx->amr_ep_bytes,
                         (unsigned long long)ctx->amr_max_bytes);
        }
    }
    if (en >= ctx->amr_ep_max || ctx->amr_n >= ctx->amr_max) {
        uint64_t n = ++ctx->amr_unsent;

        if ((n & (n - 1)) == 0) { /* the 1st, 2nd, 4th ...: no flood */
            kvc_log_warn("KVX-UCX-AM", "%s: %llu answers in flight to this "
                         "peer, %llu to all, at most %llu and %llu: a request "
                         "left unanswered (%llu so far); a peer asks and does "
                         "not read?", ctx->name, (unsigned long long)en,
                         (unsigned long long)ctx->amr_n,
                         (unsigned long long)ctx->amr_ep_max,
                         (unsigned long long)ctx->amr_max,
                         (unsigned long long)n);
        }
        return; /* the origin's op ends at its deadline or ep failure */
    }
    amr = malloc(sizeof(*amr) + len);
    if (amr == NULL) {
        return; /* the origin's op completes at its ep's failure or close */
    }
    memset(&amr->hdr, 0, sizeof(amr->hdr)); /* nothing else goes out */
    amr->ctx         = ctx;
    amr->len         = len;
    amr->hdr.magic   = KVU_AM_MAGIC;
    amr->hdr.version = KVU_AM_VERSION;
    amr->hdr.status  = (int32_t)status;
    amr->hdr.id      = req->id;
    amr->hdr.nonce   = req->nonce;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send      = kvu_am_reply_cb;
    prm.user_data    = amr;
    prm.flags        = UCP_AM_SEND_FLAG_EAGER;
    if (len > 0) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype      = ctx->am_dt;
    }
    /* UCX packs what it can send now from the block itself, inside this
     * call (kvu_dt_pack, while the range is authorized); whatever it will
     * pack later is copied before this handler returns. A fragment whose
     * send UCX rewinds is packed again from its start (dts.last), so the
     * copy starts there. */
    amr->dts.buf   = data;
    amr->dts.len   = len;
    amr->dts.last  = 0;
    amr->dts.segs  = NULL;
    amr->dts.nsegs = 0;
    /* Counted before the send: an endpoint failing inside it completes
     * its other answers (kvu_am_reply_cb), which must not free e. */
    ctx->amr_n++; /* until kvu_amr_uncount */
    ctx->amr_bytes += len;
    if (e != NULL) {
        e->n++;
        e->bytes += len;
    }
    ctx->amr_sent++;
    sp = ucp_am_send_nbx(reply_ep, am_id, &amr->hdr, sizeof(amr->hdr),
                         len > 0 ? (const void *)&amr->dts : NULL, len, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        kvu_amr_uncount(ctx, e, len); /* sent at once, or failed */
        free(amr);
        return;
    }
    if (e == NULL) { /* pending: the endpoint's count from now on */
        e = kvu_amr_ep_find(ctx, reply_ep, 1);
        if (e != NULL) {
            e->n++;
            e->bytes += len;
        }
    }
    amr->epc = e; /* (NULL without memory: counted in all only) */
    if (len > 0) {
        memcpy(amr->data + amr->dts.last,
               (const uint8_t *)data + amr->dts.last, len - amr->dts.last);
        amr->dts.buf = amr->data;
        ctx->am_late_copied += len - amr->dts.last;
    }
}

/* kvu_am_log_refusal counts a refused request; logs the 1st, 2nd, 4th ...
 * (a hostile or broken peer cannot flood the log). */
static int kvu_am_log_refusal(kvu_ctx_t *ctx)
{
    uint64_t n = ++ctx->am_refused;

    return (n & (n - 1)) == 0;
}

static int kvu_am_hdr_ok(const void *header, size_t header_length,
                         kvu_am_hdr_t *h)
{
    if (header == NULL || header_length != sizeof(*h)) {
        return 0;
    }
    memcpy(h, header, sizeof(*h));
    return h->magic == KVU_AM_MAGIC && h->version == KVU_AM_VERSION;
}

/* kvu_am_admit: may a request (every field from the wire) touch
 * [addr, addr+len) as asked? NULL, or why not with *refusal_p the
 * answer's status (logged; a hostile peer cannot flood the log). The
 * range must lie in memory registered for that access with the request's
 * token, and the engine must find it inside the blocks of the live
 * transfer of the request's tag, under a mac of one of its bound hosts.
 * malformed: the message around it is. */
static const char *kvu_am_admit(kvu_ctx_t *ctx, int is_put,
                                const kvu_am_hdr_t *h, uint64_t addr,
                                uint64_t len, uint64_t nonce, uint64_t mac,
                                int malformed, kvx_status_t *refusal_p)
{
    kvu_mem_t   *mem = kvu_am_find_mem(ctx, addr, len, h->token, is_put);
    const char  *why;
    kvx_status_t refusal = KVX_ERR_OUT_OF_BOUNDS;

    why = mem == NULL ? "not inside memory registered for this remote access"
          : malformed ? "malformed message"
                      : NULL;
    if (why == NULL && ctx->params.authorize != NULL) {
        refusal = ctx->params.authorize(ctx->params.authorize_arg, h->tag,
                                        mac, nonce, addr, len, is_put);
        why     = refusal == KVX_OK ? NULL
                  : refusal == KVX_ERR_NOT_EXPOSED
                      ? "its transfer is not (yet) held here"
                  : refusal == KVX_ERR_UNTRUSTED_PEER
                      ? "its transfer is bound to another host"
                      : "not inside the blocks of its live transfer";
        refusal = refusal == KVX_ERR_NOT_EXPOSED ||
                          refusal == KVX_ERR_UNTRUSTED_PEER
                      ? refusal
                      : KVX_ERR_OUT_OF_BOUNDS;
    }
    if (why != NULL && refusal == KVX_ERR_NOT_EXPOSED) {
        /* An early get (READ: before P's producer_request): normal. */
        kvc_log_debug("KVX-UCX-AM", "%s: %s of %llu bytes at 0x%llx: %s",
                      ctx->name, is_put ? "put" : "get",
                      (unsigned long long)len, (unsigned long long)addr,
                      why);
    } else if (why != NULL && kvu_am_log_refusal(ctx)) {
        kvc_log_warn("KVX-UCX-AM", "%s: %s of %llu bytes at 0x%llx "
                         "refused: %s (%llu refused so far)", ctx->name,
                         is_put ? "put" : "get", (unsigned long long)len,
                         (unsigned long long)addr, why,
                         (unsigned long long)ctx->am_refused);
    }
    *refusal_p = refusal;
    return why;
}

/* kvu_am_served counts an answered request (logged at 1, 2, 4, ...). */
static void kvu_am_served(kvu_ctx_t *ctx)
{
    ctx->am_served++;
    if ((ctx->am_served & (ctx->am_served - 1)) == 0) {
        kvc_log_debug("KVX-UCX-AM", "%s: %llu active-message requests "
                      "answered", ctx->name,
                      (unsigned long long)ctx->am_served);
    }
}

/* kvu_am_malformed: a request without a valid header or reply endpoint,
 * dropped (counted, logged at 1, 2, 4, ... of them). */
static int kvu_am_malformed(kvu_ctx_t *ctx, const void *header, size_t hlen,
                            const ucp_am_recv_param_t *param,
                            const char *what, kvu_am_hdr_t *h)
{
    if (kvu_am_hdr_ok(header, hlen, h) &&
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
        param->reply_ep != NULL) {
        return 0;
    }
    if (kvu_am_log_refusal(ctx)) {
        kvc_log_warn("KVX-UCX-AM", "%s: malformed %s request dropped (%llu "
                     "refused so far)", ctx->name, what,
                     (unsigned long long)ctx->am_refused);
    }
    return 1;
}

/* kvu_am_on_request: the target side of GETREQ and PUT (inside
 * ucp_worker_progress, ctx lock held). */
static ucs_status_t kvu_am_on_request(kvu_ctx_t *ctx, ucp_worker_h worker,
                                      int is_put,
                                      const void *header, size_t hlen,
                                      void *data, size_t len,
                                      const ucp_am_recv_param_t *param)
{
    kvu_am_hdr_t h;
    kvx_status_t refusal;
    int          rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    (void)worker;
    /* A rendezvous message is never sent by kvxfer (eager only) and is not
     * received: returning UCS_OK lets UCX drop it and answer the sender
     * (ATS). Releasing it here as well made UCX answer and free it twice,
     * a crash any peer could cause (test KvuAmForge.RendezvousMessages-
     * AreDroppedWithoutHarm). */
    if (kvu_am_malformed(ctx, header, hlen, param, is_put ? "put" : "get",
                         &h)) {
        return UCS_OK;
    }
    if (kvu_am_admit(ctx, is_put, &h, h.addr, h.len, h.nonce, h.mac,
                     rndv || (is_put ? len != h.len : len != 0),
                     &refusal) != NULL) {
        kvu_am_answer_send(ctx, param->reply_ep,
                           is_put ? KVU_AM_PUTACK : KVU_AM_GETREP, &h,
                           refusal, NULL, 0);
        return UCS_OK;
    }
    kvu_am_served(ctx);
    if (is_put) {
        memcpy((void *)(uintptr_t)h.addr, data, h.len);
        kvu_am_answer_send(ctx, param->reply_ep, KVU_AM_PUTACK, &h, KVX_OK,
                           NULL, 0);
    } else {
        kvu_am_answer_send(ctx, param->reply_ep, KVU_AM_GETREP, &h, KVX_OK,
                           (const void *)(uintptr_t)h.addr, h.len);
    }
    return UCS_OK;
}

/* kvu_am_on_putv: the target side of PUTV (as kvu_am_on_request). The
 * message must hold exactly its header's count of entries (1 ..
 * KVU_AM_PUTV_MAX) and then exactly the bytes they name; each entry is
 * then admitted on its own, as a PUT of its own would be, and written
 * only if admitted. One PUTACK answers: OK when every entry was written,
 * else the first refusal (the origin's op fails, as with a refused PUT). */
static ucs_status_t kvu_am_on_putv(kvu_ctx_t *ctx, ucp_worker_h worker,
                                   const void *header, size_t hlen,
                                   void *data, size_t len,
                                   const ucp_am_recv_param_t *param)
{
    kvu_am_hdr_t  h;
    kvu_am_ent_t  ent[KVU_AM_PUTV_MAX];
    kvx_status_t  answer = KVX_OK, refusal;
    uint64_t      n, off;
    int           rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    int           well;

    (void)worker;
    /* rndv: never sent by kvxfer; UCS_OK drops it (see kvu_am_on_request) */
    if (kvu_am_malformed(ctx, header, hlen, param, "put", &h)) {
        return UCS_OK;
    }
    n    = h.addr;
    well = !rndv && kvu_putv_split(data, len, n, h.len, ent) == 0;
    if (!well) {
        /* (answered, so that the origin's op ends now, not at its
         * deadline; nothing of it is written) */
        if (kvu_am_log_refusal(ctx)) {
            kvc_log_warn("KVX-UCX-AM", "%s: malformed put of several runs "
                         "refused: %llu entries (1 to %u), %zu bytes "
                         "carried for %llu named (%llu refused so far)",
                         ctx->name, (unsigned long long)n,
                         (unsigned)KVU_AM_PUTV_MAX, len,
                         (unsigned long long)h.len,
                         (unsigned long long)ctx->am_refused);
        }
        kvu_am_answer_send(ctx, param->reply_ep, KVU_AM_PUTACK, &h,
                           KVX_ERR_OUT_OF_BOUNDS, NULL, 0);
        return UCS_OK;
    }
    off = n * sizeof(ent[0]);
    for (uint64_t i = 0; i < n; i++) {
        if (kvu_am_admit(ctx, 1, &h, ent[i].addr, ent[i].len, ent[i].nonce,
                         ent[i].mac, 0, &refusal) != NULL) {
            answer = answer == KVX_OK ? refusal : answer;
        } else {
            memcpy((void *)(uintptr_t)ent[i].addr, (uint8_t *)data + off,
                   ent[i].len);
        }
        off += ent[i].len;
    }
    if (answer == KVX_OK) {
        kvu_am_served(ctx);
    }
    kvu_am_answer_send(ctx, param->reply_ep, KVU_AM_PUTACK, &h, answer, NULL,
                       0);
    return UCS_OK;
}

/* kvu_am_on_answer: the origin side of GETREP and PUTACK. */
static ucs_status_t kvu_am_on_answer(kvu_ctx_t *ctx, ucp_worker_h worker,
                                     int is_put,
                                     const void *header, size_t hlen,
                                     void *data, size_t len,
                                     const ucp_am_recv_param_t *param)
{
    kvu_am_hdr_t h;
    kvu_amp_t   *amp;
    kvx_status_t st;
    int          rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    (void)worker;
    /* rndv: never sent by kvxfer; UCS_OK drops it (see kvu_am_on_request) */
    if (!kvu_am_hdr_ok(header, hlen, &h)) {
        uint64_t n = ++ctx->am_dropped;

        if ((n & (n - 1)) == 0) { /* the 1st, 2nd, 4th ...: no flood */
            kvc_log_warn("KVX-UCX-AM", "%s: malformed %s answer dropped "
                         "(%llu answers dropped so far)", ctx->name,
                         is_put ? "put" : "get", (unsigned long long)n);
        }
        return UCS_OK;
    }
    amp = *kvu_amp_slot(ctx, h.id);
    if (amp == NULL || amp->hdr.nonce != h.nonce) {
        /* Canceled meanwhile (ep failed or closed), or not an answer to
         * our request: only the target saw the request's nonce. */
        ctx->am_dropped++;
        return UCS_OK;
    }
    if (amp->is_put != is_put || rndv ||
        (h.status == KVX_OK && len != (is_put ? 0 : amp->len))) {
        kvc_log_warn("KVX-UCX-AM", "%s: malformed %s answer from %s",
                     ctx->name, is_put ? "put" : "get", amp->ep->peer);
        st = KVX_ERR_ENDPOINT;
    } else if (h.status == KVX_ERR_NOT_EXPOSED) {
        /* Not held by a live transfer (yet): the engine decides whether
         * to retry; not an error of the endpoint, logged at debug. */
        st = KVX_ERR_NOT_EXPOSED;
        kvc_log_debug("KVX-UCX-AM", "%s: %s of %llu bytes: %s has not "
                      "exposed the range", ctx->name, is_put ? "put" : "get",
                      (unsigned long long)amp->len, amp->ep->peer);
    } else if (h.status != KVX_OK) {
        st = h.status == KVX_ERR_OUT_OF_BOUNDS ||
                     h.status == KVX_ERR_UNTRUSTED_PEER
                 ? (kvx_status_t)h.status
                 : KVX_ERR_ENDPOINT;
        kvc_log_error("KVX-UCX-AM", "%s: %s of %llu bytes refused by %s "
                      "(status %d%s)", ctx->name, is_put ? "put" : "get",
                      (unsigned long long)amp->len, amp->ep->peer,
                      (int)h.status,
                      st == KVX_ERR_UNTRUSTED_PEER
                          ? ": the transfer is bound to another host there"
                          : "");
    } else {
        if (!is_put) {
            memcpy(amp->lbuf, data, amp->len);
        }
        st = KVX_OK;
    }
    kvu_amp_answer(amp, st);
    return UCS_OK;
}

int kvu_notice_split(const void *data, size_t len, size_t *idlen_p,
                     size_t *flen_p)
{
    const char *nul = len > 0 ? memchr(data, '\0', len) : NULL;
    size_t      idlen = nul != NULL ? (size_t)(nul - (const char *)data) : len;
    size_t      flen  = nul != NULL ? len - idlen - 1 : 0;

    if (idlen == 0 || idlen > KVU_NOTICE_ID_MAX ||
        (nul != NULL && (flen == 0 || flen >= KVT_NOTICE_FROM_MAX ||
                         memchr(nul + 1, '\0', flen) != NULL))) {
        return -1;
    }
    *idlen_p = idlen;
    *flen_p  = flen;
    return 0;
}

int kvu_putv_split(const void *data, size_t len, uint64_t n, uint64_t bytes,
                   kvu_am_ent_t *ent)
{
    uint64_t sum = 0;

    if (n < 1 || n > KVU_AM_PUTV_MAX || bytes == 0 ||
        len < n * sizeof(*ent) || len - n * sizeof(*ent) != bytes) {
        return -1;
    }
    memcpy(ent, data, n * sizeof(*ent));
    for (uint64_t i = 0; i < n; i++) {
        if (ent[i].len == 0 || ent[i].len > KVU_AM_MAX_LEN) {
            return -1;
        }
        sum += ent[i].len; /* at most 16 x 256 KiB: cannot wrap */
    }
    return sum == bytes ? 0 : -1;
}

int kvu_ctl_split(const void *data, size_t len, size_t *flen_p)
{
    const char *nul  = len > 0 ? memchr(data, '\0', len) : NULL;
    size_t      flen = nul != NULL ? (size_t)(nul - (const char *)data) : 0;

    if (nul == NULL || flen == 0 || flen >= KVT_NOTICE_FROM_MAX ||
        len - flen - 1 == 0 || len - flen - 1 > KVT_CTL_MAX ||
        memchr(nul + 1, '\0', len - flen - 1) != NULL) {
        return -1;
    }
    *flen_p = flen;
    return 0;
}

/* kvu_am_queue: a peer's completion notice (ctl 0: the transfer id,
 * optionally a NUL and the sender's address claim, kvu_notify's from) or
 * control message (ctl 1: the claim, a NUL, then the message of hdr.len
 * bytes, kvu_ctl_send), inside ucp_worker_progress with the ctx lock held:
 * queued, bounded in count (and messages in bytes), for kvu_deliver,
 * which hands it to params.notice / params.ctl without the lock. Nothing
 * in it is trusted here: the engine checks the mac. */
static ucs_status_t kvu_am_queue(void *arg, const void *header, size_t hlen,
                                 void *data, size_t len,
                                 const ucp_am_recv_param_t *param, int ctl)
{
    kvu_wk_t     *wk  = arg;
    kvu_ctx_t    *ctx = wk->ctx;
    kvu_am_hdr_t  h   = {0};
    kvu_notice_t *nt  = NULL;
    int           rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    int           ok   = !rndv && kvu_am_hdr_ok(header, hlen, &h);
    size_t        idlen = 0, flen = 0;
    const char   *idp = data, *fp = data;

    if (ok && ctl) {
        ok = kvu_ctl_split(data, len, &flen) == 0 &&
             (idlen = len - flen - 1) == h.len && ctx->params.ctl != NULL &&
             ctx->ctl_queued + idlen <= KVU_CTL_QBYTES;
        idp = (const char *)data + flen + 1;
    } else if (ok) {
        /* a plain notice (count 0) or a counted one (kvu_notify_queued) */
        ok = (h.status == KVU_NOTICE_COUNTED ||
              (h.status == 0 && h.len == 0)) &&
             kvu_notice_split(data, len, &idlen, &flen) == 0 &&
             ctx->params.notice != NULL;
        fp = (const char *)data + idlen + 1;
    }
    if (ok && ctx->notice_queued < KVU_NOTICE_QMAX) {
        nt = malloc(sizeof(*nt) + idlen + 1);
    }
    /* rndv: never sent by kvxfer; UCS_OK drops it (see kvu_am_on_request) */
    if (nt == NULL) {
        uint64_t n = ++ctx->notice_dropped;

        if ((n & (n - 1)) == 0) {
            kvc_log_warn("KVX-UCX-AM", "%s: %s dropped (malformed, unwanted "
                         "or too many queued; %llu notices and messages so "
                         "far)", ctx->name,
                         ctl ? "control message" : "completion notice",
                         (unsigned long long)ctx->notice_dropped);
        }
        return UCS_OK;
    }
    nt->hdr   = h;
    nt->ep    = NULL;
    nt->ctl   = ctl;
    nt->idlen = idlen;
    nt->next  = NULL;
    memcpy(nt->id, idp, idlen);
    nt->id[idlen] = '\0';
    if (flen > 0) {
        memcpy(nt->from, fp, flen);
    }
    nt->from[flen] = '\0';
    if (ctx->notice_tail != NULL) {
        ctx->notice_tail->next = nt;
    } else {
        ctx->notice_head = nt;
    }
    ctx->notice_tail = nt;
    ctx->notice_queued++;
    ctx->ctl_queued += ctl ? idlen : 0;
    return UCS_OK;
}

static ucs_status_t kvu_am_notice_cb(void *arg, const void *header,
                                     size_t hlen, void *data, size_t len,
                                     const ucp_am_recv_param_t *param)
{
    return kvu_am_queue(arg, header, hlen, data, len, param, 0);
}

static ucs_status_t kvu_am_ctl_cb(void *arg, const void *header, size_t hlen,
                                  void *data, size_t len,
                                  const ucp_am_recv_param_t *param)
{
    return kvu_am_queue(arg, header, hlen, data, len, param, 1);
}

static void kvu_notice_send_cb(void *request, ucs_status_t status,
                               void *user_data)
{
    kvu_notice_t *nt = user_data;

    (void)status; /* best effort: the peer's deadline covers a loss */
    nt->ep->notices_pending--;
    free(nt);
    ucp_request_free(request);
}

static kvx_status_t kvu_enqueue(kvu_ep_t *ep, kvu_job_t *job);

/* kvu_notice_send_locked: nt (payload nt->id, nt->idlen bytes; a notice's
 * tag, address, token and (counted) status and length, a message's length
 * set in nt->hdr) to ep's peer as one eager active message, authenticated
 * under ep's session; nt is consumed. ctx lock held. */
static kvx_status_t kvu_notice_send_locked(kvu_ep_t *ep, kvu_notice_t *nt)
{
    kvu_ctx_t          *ctx  = ep->ctx;
    int                 ctl  = nt->ctl;
    const char         *what = ctl ? "control message" : "notice";
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;
    kvx_status_t        rc = KVX_OK;

    if (atomic_load(&ep->dead) || ep->failed ||
        (ctl && ep->session == 0)) {
        free(nt);
        return kvc_error(KVX_ERR_ENDPOINT, "%s to %s: %s", what, ep->peer,
                         ep->failed                ? "endpoint failed"
                         : atomic_load(&ep->dead) ? "endpoint closed"
                                                   : "no session");
    }
    if (ep->notices_pending >= KVU_NOTICE_PENDING_MAX) {
        free(nt);
        return kvc_error(KVX_ERR_ENDPOINT, "%s to %s: %u notices and "
                         "messages not sent yet (the peer does not read)",
                         what, ep->peer, KVU_NOTICE_PENDING_MAX);
    }
    nt->ep          = ep;
    nt->hdr.magic   = KVU_AM_MAGIC;
    nt->hdr.version = KVU_AM_VERSION;
    if (!ctl && nt->hdr.nonce == 0) {
        /* (a control message carries its sender's, a READ release too) */
        nt->hdr.nonce = kvu_nonce(ctx);
    }
    nt->hdr.mac     = ctl
                          ? kvc_msg_mac(ep->session, nt->hdr.nonce,
                                        nt->id + nt->idlen - nt->hdr.len,
                                        nt->hdr.len)
                      : nt->hdr.status == KVU_NOTICE_COUNTED
                          ? kvc_count_mac(ep->session, nt->hdr.tag,
                                          nt->hdr.nonce, nt->hdr.addr,
                                          nt->hdr.token, nt->hdr.len)
                          : kvc_req_mac(ep->session, nt->hdr.tag,
                                        nt->hdr.nonce, nt->hdr.addr,
                                        nt->hdr.token, KVC_MAC_NOTICE);
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send      = kvu_notice_send_cb;
    prm.user_data    = nt;
    prm.flags        = UCP_AM_SEND_FLAG_EAGER;
    sp = ucp_am_send_nbx(ep->ep, ctl ? KVU_AM_CTL : KVU_AM_NOTICE,
                         &nt->hdr, sizeof(nt->hdr), nt->id, nt->idlen, &prm);
    if (sp == NULL) {
        free(nt);
    } else if (UCS_PTR_IS_ERR(sp)) {
        rc = kvc_error(KVX_ERR_ENDPOINT, "%s to %s: %s", what, ep->peer,
                       ucs_status_string(UCS_PTR_STATUS(sp)));
        free(nt);
    } else {
        ep->notices_pending++;
    }
    return rc;
}

static kvx_status_t kvu_notice_send(kvu_ep_t *ep, kvu_notice_t *nt)
{
    kvx_status_t rc;

    pthread_mutex_lock(&ep->ctx->lock);
    rc = kvu_notice_send_locked(ep, nt);
    pthread_mutex_unlock(&ep->ctx->lock);
    kvu_ctx_kick(ep->ctx);
    return rc;
}

kvx_status_t kvu_notify(kvu_ep_t *ep, uint64_t tag, uint64_t instance,
                        uint64_t xnonce, uint64_t nonce, const char *id,
                        const char *from)
{
    size_t        idlen = strlen(id);
    size_t        flen  = from != NULL ? strlen(from) : 0;
    kvu_notice_t *nt;

    if (idlen == 0 || idlen > KVU_NOTICE_ID_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "notice: transfer id of %zu "
                         "bytes (1..%u)", idlen, KVU_NOTICE_ID_MAX);
    }
    if (flen >= KVT_NOTICE_FROM_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "notice: from of %zu bytes "
                         "(at most %u)", flen, KVT_NOTICE_FROM_MAX - 1);
    }
    nt = calloc(1, sizeof(*nt) + idlen + 1 + flen + 1);
    if (nt == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "notice: out of memory");
    }
    memcpy(nt->id, id, idlen);
    if (flen > 0) { /* id, NUL, from */
        memcpy(nt->id + idlen + 1, from, flen);
    }
    nt->idlen     = flen > 0 ? idlen + 1 + flen : idlen;
    nt->hdr.tag   = tag;
    nt->hdr.addr  = instance;
    nt->hdr.token = xnonce;
    nt->hdr.nonce = nonce; /* 0: kvu_notice_send draws one */
    return kvu_notice_send(ep, nt);
}

kvx_status_t kvu_notify_queued(kvu_ep_t *ep, uint64_t tag, uint64_t instance,
                               uint64_t xnonce, uint64_t count,
                               const char *id)
{
    size_t        idlen = strlen(id);
    kvu_notice_t *nt;
    kvu_job_t    *job;

    if (idlen == 0 || idlen > KVU_NOTICE_ID_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "notice: transfer id of %zu "
                         "bytes (1..%u)", idlen, KVU_NOTICE_ID_MAX);
    }
    nt  = calloc(1, sizeof(*nt) + idlen + 1);
    job = calloc(1, sizeof(*job));
    if (nt == NULL || job == NULL) {
        free(nt);
        free(job);
        return kvc_error(KVX_ERR_NO_MEMORY, "notice: out of memory");
    }
    memcpy(nt->id, id, idlen);
    nt->idlen      = idlen;
    nt->hdr.status = KVU_NOTICE_COUNTED;
    nt->hdr.len    = count;
    nt->hdr.tag    = tag;
    nt->hdr.addr   = instance;
    nt->hdr.token  = xnonce;
    job->nt        = nt;
    return kvu_enqueue(ep, job);
}

kvx_status_t kvu_ctl_send(kvu_ep_t *ep, const char *msg, size_t len,
                          const char *from, uint64_t nonce)
{
    size_t        flen = from != NULL ? strlen(from) : 0;
    kvu_notice_t *nt;

    if (len == 0 || len > KVT_CTL_MAX || memchr(msg, '\0', len) != NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "control message of %zu "
                         "bytes (1..%u, no NUL)", len, KVT_CTL_MAX);
    }
    if (flen == 0 || flen >= KVT_NOTICE_FROM_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "control message: from of "
                         "%zu bytes (1..%u)", flen, KVT_NOTICE_FROM_MAX - 1);
    }
    nt = calloc(1, sizeof(*nt) + flen + 1 + len);
    if (nt == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "control message: out of "
                         "memory");
    }
    memcpy(nt->id, from, flen); /* from, NUL, the message */
    memcpy(nt->id + flen + 1, msg, len);
    nt->idlen     = flen + 1 + len;
    nt->ctl       = 1;
    nt->hdr.len   = len;
    nt->hdr.nonce = nonce != 0 ? nonce : 1;
    return kvu_notice_send(ep, nt);
}

static ucs_status_t kvu_am_getreq_cb(void *arg, const void *header,
                                     size_t hlen, void *data, size_t len,
                                     const ucp_am_recv_param_t *param)
{
    kvu_wk_t *wk = arg;

    return kvu_am_on_request(wk->ctx, wk->worker, 0, header, hlen, data, len,
                        param);
}

static ucs_status_t kvu_am_put_cb(void *arg, const void *header, size_t hlen,
                                  void *data, size_t len,
                                  const ucp_am_recv_param_t *param)
{
    kvu_wk_t *wk = arg;

    return kvu_am_on_request(wk->ctx, wk->worker, 1, header, hlen, data, len,
                        param);
}

static ucs_status_t kvu_am_putv_cb(void *arg, const void *header,
                                   size_t hlen, void *data, size_t len,
                                   const ucp_am_recv_param_t *param)
{
    kvu_wk_t *wk = arg;

    return kvu_am_on_putv(wk->ctx, wk->worker, header, hlen, data, len,
                          param);
}

static ucs_status_t kvu_am_getrep_cb(void *arg, const void *header,
                                     size_t hlen, void *data, size_t len,
                                     const ucp_am_recv_param_t *param)
{
    kvu_wk_t *wk = arg;

    return kvu_am_on_answer(wk->ctx, wk->worker, 0, header, hlen, data, len,
                        param);
}

static ucs_status_t kvu_am_putack_cb(void *arg, const void *header,
                                     size_t hlen, void *data, size_t len,
                                     const ucp_am_recv_param_t *param)
{
    kvu_wk_t *wk = arg;

    return kvu_am_on_answer(wk->ctx, wk->worker, 1, header, hlen, data, len,
                        param);
}

/* A generic datatype of bytes: UCX can only copy it (bcopy), never send it
 * zero-copy. UCX 1.13's tcp zero-copy path aborts the sender when the
 * peer dies with the send outstanding (uct_iface.h "Assertion
 * `comp->count > 0' failed", status ENDPOINT_TIMEOUT: seen in the kill_d
 * READ campaign on GETREP); copy sends complete with the error. */

/* buffer is the send's kvu_dt_state_t (count: its len). */
static void *kvu_dt_start_pack(void *context, const void *buffer,
                               size_t count)
{
    (void)context;
    (void)count;
    return (void *)(uintptr_t)buffer;
}

static void *kvu_dt_start_unpack(void *context, void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return buffer;
}

static size_t kvu_dt_packed_size(void *state)
{
    return ((kvu_dt_state_t *)state)->len;
}

static size_t kvu_dt_pack(void *state, size_t offset, void *dest,
                          size_t max_length)
{
    kvu_dt_state_t *st = state;
    size_t          n;

    if (offset >= st->len) {
        return 0;
    }
    st->last = offset;
    n = st->len - offset < max_length ? st->len - offset : max_length;
    if (st->nsegs == 0) {
        memcpy(dest, st->buf + offset, n);
        return n;
    }
    max_length = n;
    n          = 0;
    for (unsigned i = 0; i < st->nsegs && n < max_length; i++) {
        const kvu_dt_seg_t *sg = &st->segs[i];
        size_t              c;

        if (offset >= sg->len) {
            offset -= sg->len;
            continue;
        }
        c = sg->len - offset < max_length - n ? sg->len - offset
                                              : max_length - n;
        memcpy((uint8_t *)dest + n, sg->buf + offset, c);
        n     += c;
        offset = 0;
    }
    return n;
}

static ucs_status_t kvu_dt_unpack(void *state, size_t offset, const void *src,
                                  size_t length)
{
    (void)state;
    (void)offset;
    (void)src;
    (void)length;
    return UCS_ERR_UNSUPPORTED; /* kvxfer never receives with it */
}

static void kvu_dt_finish(void *state)
{
    (void)state; /* owned by the send's kvu_amp_t / kvu_amr_t */
}

static const ucp_generic_dt_ops_t kvu_dt_ops = {
    .start_pack   = kvu_dt_start_pack,
    .start_unpack = kvu_dt_start_unpack,
    .packed_size  = kvu_dt_packed_size,
    .pack         = kvu_dt_pack,
    .unpack       = kvu_dt_unpack,
    .finish       = kvu_dt_finish,
};

static ucs_status_t kvu_am_probe_cb(void *arg, const void *header,
                                    size_t hlen, void *data, size_t len,
                                    const ucp_am_recv_param_t *param);

/* kvu_am_handlers installs kvxfer's active-message handlers on one worker
 * (argument: the worker's kvu_wk_t). */
static kvx_status_t kvu_am_handlers(kvu_wk_t *wk)
{
    static const struct {
        unsigned        id;
        ucp_am_recv_callback_t cb;
    } h[] = {
        {KVU_AM_GETREQ, kvu_am_getreq_cb}, {KVU_AM_GETREP, kvu_am_getrep_cb},
        {KVU_AM_PUT, kvu_am_put_cb},       {KVU_AM_PUTACK, kvu_am_putack_cb},
        {KVU_AM_PUTV, kvu_am_putv_cb},
        {KVU_AM_PROBE, kvu_am_probe_cb},
        {KVU_AM_NOTICE, kvu_am_notice_cb}, {KVU_AM_CTL, kvu_am_ctl_cb},
    };

    for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
        ucp_am_handler_param_t hp;
        ucs_status_t           st;

        memset(&hp, 0, sizeof(hp));
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                        UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                        UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id         = h[i].id;
        hp.flags      = UCP_AM_FLAG_WHOLE_MSG;
        hp.cb         = h[i].cb;
        hp.arg        = wk;
        st = ucp_worker_set_am_recv_handler(wk->worker, &hp);
        if (st != UCS_OK) {
            return kvc_error(KVX_ERR_TRANSPORT,
                             "ucp_worker_set_am_recv_handler: %s",
                             ucs_status_string(st));
        }
    }
    return KVX_OK;
}

/* One mapping of this process, as /proc/self/maps shows it. */
typedef struct {
    uintptr_t     lo, hi;
    unsigned long ino;
    char          dev[16];
    int           shared_rw; /* "rw-s" */
    int           found;
} kvu_vma_t;

/* kvu_vmas_of: one pass over /proc/self/maps: out[i] is the mapping that
 * holds at[i] (out[i].found 0: none). 0, or -1 when it cannot be read. */
static int kvu_vmas_of(const uintptr_t *at, kvu_vma_t *out, size_t n)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char  line[512];

    if (f == NULL) {
        return -1;
    }
    memset(out, 0, n * sizeof(*out));
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi, ino;
        char          perms[5], dev[16];

        if (strchr(line, '\n') == NULL) { /* a long path: skip the rest */
            int c;

            while ((c = fgetc(f)) != EOF && c != '\n') {
            }
        }
        if (sscanf(line, "%lx-%lx %4s %*s %15s %lu", &lo, &hi, perms, dev,
                   &ino) != 5) {
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            if (!out[i].found && at[i] >= lo && at[i] < hi) {
                out[i].found     = 1;
                out[i].lo        = lo;
                out[i].hi        = hi;
                out[i].ino       = ino;
                out[i].shared_rw = perms[0] == 'r' && perms[1] == 'w' &&
                                   perms[3] == 's';
                snprintf(out[i].dev, sizeof(out[i].dev), "%s", dev);
            }
        }
    }
    fclose(f);
    return 0;
}

/* kvu_rkey_map: finds, once per rkey, the mapping its copies may touch:
 * the shared read-write mapping that holds p (where the rkey maps the
 * peer's memory), unless it is backed by the same object as memory this
 * context registered itself (a peer naming this process's own segment in
 * its rkey). Sets kr->map_state to 1 ([map_lo, map_hi)) or -1 (refused);
 * leaves it 0 when /proc/self/maps cannot be read. ctx lock held. */
static void kvu_rkey_map(kvu_ctx_t *ctx, kvu_rkey_t *kr, uintptr_t p)
{
    size_t     n = 1, i = 1;
    uintptr_t *at;
    kvu_vma_t *v;

    for (kvu_mem_t *m = ctx->mems; m != NULL; m = m->next) {
        n++;
    }
    at = calloc(n, sizeof(*at));
    v  = calloc(n, sizeof(*v));
    if (at == NULL || v == NULL) {
        free(at);
        free(v);
        return;
    }
    at[0] = p;
    for (kvu_mem_t *m = ctx->mems; m != NULL && i < n; m = m->next) {
        at[i++] = (uintptr_t)m->base;
    }
    if (kvu_vmas_of(at, v, n) == 0) {
        kr->map_state = v[0].found && v[0].shared_rw ? 1 : -1;
        for (i = 1; i < n && kr->map_state == 1; i++) {
            if (v[i].found && v[i].ino == v[0].ino &&
                strcmp(v[i].dev, v[0].dev) == 0) {
                kr->map_state = -1; /* this context's own memory */
            }
        }
        kr->map_lo = v[0].lo;
        kr->map_hi = v[0].hi;
    }
    free(at);
    free(v);
}

/* kvu_ptr_range: where [raddr, raddr + len) of the peer's memory lies
 * here, or NULL. The rkey maps addresses without bounds (UCX adds the
 * attachment's offset to any address), and the peer's own metadata says
 * how long its layers are: so a copy goes only where the whole range lies
 * inside the mapping kvu_rkey_map found. ctx lock held. */
static void *kvu_ptr_range(kvu_job_t *job, uint64_t raddr, uint64_t len)
{
    kvu_rkey_t *kr  = job->krkey;
    void       *ptr = NULL;
    uintptr_t   p;

    if (kr == NULL || ucp_rkey_ptr(job->rkey, raddr, &ptr) != UCS_OK) {
        return NULL;
    }
    p = (uintptr_t)ptr;
    if (kr->map_state != 1 || p < kr->map_lo || p >= kr->map_hi ||
        len > kr->map_hi - p) {
        return NULL;
    }
    return ptr;
}

static int kvu_issue(kvu_ep_t *ep, kvu_job_t *job, int route, uint64_t len)
{
    const kvc_run_t   *run = &job->runs[job->idx];
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;
    void               *lbuf = (void *)(uintptr_t)(job->local_base +
                                                 run->local_off + job->off);
    uint64_t            raddr = job->remote_base + run->remote_off + job->off;

    if (route == KVU_ROUTE_AM) {
        return kvu_am_issue(ep, job, lbuf, raddr, len);
    }
    if (route == KVU_ROUTE_PTR) {
        /* The rkey stays mapped while the ctx lock is held (rkeys are
         * destroyed under it, and their queued jobs canceled first), so the
         * copy is done before anyone could unmap the segment. The whole
         * run is checked before any of it is copied. */
        char *rptr = kvu_ptr_range(job, job->remote_base + run->remote_off,
                                   run->len);

        if (rptr != NULL) {
            rptr += job->off;
        }
        if (rptr == NULL) {
            kvu_op_set_error(job->op, KVX_ERR_OUT_OF_BOUNDS);
            kvc_log_error("KVX-UCX-POST", "%s of %llu bytes at 0x%llx of "
                          "%s's memory: %s; nothing copied",
                          job->is_put ? "put" : "get",
                          (unsigned long long)run->len,
                          (unsigned long long)(job->remote_base +
                                               run->remote_off),
                          ep->peer,
                          job->krkey->map_state == 1
                              ? "not inside the shared mapping of the "
                                "peer's segment here"
                              : "its rkey maps into memory this engine "
                                "registered, or into no shared read-write "
                                "mapping");
            return -1;
        }
        if (job->is_put) {
            memcpy(rptr, lbuf, len);
        } else {
            memcpy(lbuf, rptr, len);
        }
        ep->ctx->ptr_copied += len;
        return 0;
    }
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send      = kvu_req_cb;
    prm.user_data    = job->op;
#if UCP_API_VERSION >= UCP_VERSION(1, 13)
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_MULTI_SEND;
    prm.memh          = job->memh;
#endif
    if (job->is_put) {
        sp = ucp_put_nbx(ep->ep, lbuf, len, raddr, job->rkey, &prm);
    } else {
        sp = ucp_get_nbx(ep->ep, lbuf, len, raddr, job->rkey, &prm);
    }
    if (sp == NULL) {
        return 0;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        kvu_op_set_error(job->op, kvu_status_from_ucs(UCS_PTR_STATUS(sp)));
        kvc_log_error("KVX-UCX-POST", "%s of %llu bytes to %s failed: %s",
                      job->is_put ? "put" : "get", (unsigned long long)len,
                      ep->peer, ucs_status_string(UCS_PTR_STATUS(sp)));
        return -1;
    }
    kvu_req_t *req = sp;
    req->ep  = ep;
    req->op  = job->op;
    req->len = len;
    ep->inflight += len;
    ep->inflight_reqs++;
    atomic_fetch_add(&job->op->remaining, 1);
    return 0;
}

static void kvu_issue_flush(kvu_ep_t *ep, kvu_job_t *job)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send      = kvu_req_cb;
    prm.user_data    = job->op;
    sp = ucp_ep_flush_nbx(ep->ep, &prm);
    if (sp == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        kvu_op_set_error(job->op, kvu_status_from_ucs(UCS_PTR_STATUS(sp)));
        return;
    }
    kvu_req_t *req = sp;
    req->ep  = ep;
    req->op  = job->op;
    req->len = 0;
    ep->inflight_reqs++;
    atomic_fetch_add(&job->op->remaining, 1);
}

/* kvu_job_route decides how job moves (progress thread, ctx lock held).
 * UCX emulates a get/put in software (rma_sw.c) on an endpoint without an
 * RMA lane (tcp) and on shared-memory RMA lanes when the peer's memory is
 * not UCX-allocated (its rkey does not map here: ucp_rkey_ptr fails, UCX
 * 1.13). The target's answers are then internal requests without an error
 * path (a dead origin aborts the target; purged at ucp_worker_destroy they
 * crash it: ucp_request_send_state_ff reads a datatype and memh those
 * requests never set, seen after kill_p WRITE sm in ucp_mem_rereg_mds).
 * Such jobs go over kvxfer's own active messages, whose target checks
 * every range; UCX-allocated peer memory that maps here kvxfer copies
 * itself (KVU_ROUTE_PTR); everything else stays with UCX (zero-copy). */
static int kvu_job_route(const kvu_ep_t *ep, const kvu_job_t *job)
{
    void *ptr = NULL;

    if (ep->am_only) {
        return KVU_ROUTE_AM; /* host memory: kvu_post */
    }
    if (!ep->ctx->am_rma || !job->local_host) {
        /* kvxfer's active messages copy with memcpy: host memory only
         * (device memory stays with UCX, which knows memory types). */
        return KVU_ROUTE_UCX;
    }
    if (ep->emulated || !ep->ctx->rma) {
        return KVU_ROUTE_AM;
    }
    if ((ep->rma_shm_only || ep->rma_cma) && job->n > 0) {
        if (ucp_rkey_ptr(job->rkey,
                         job->remote_base + job->runs[0].remote_off,
                         &ptr) != UCS_OK) {
            /* application memory: emulated on shared-memory lanes alone;
             * beside a cma lane short runs are faster as kvxfer's active
             * messages (KVU_CMA_MIN_RUN) */
            return ep->rma_cma ? KVU_ROUTE_SIZE : KVU_ROUTE_AM;
        }
        /* UCX-allocated peer memory, mapped here: kvxfer copies it, once
         * the mapping it may touch is known (UCX 1.13 copies the same way
         * behind ucp_get_nbx; UCX 1.22 emulates gets from such memory in
         * software instead, whose answer of 64 KiB or more overflows the
         * FIFO element's 16-bit length with "auto"'s segments and never
         * completes: transports/ucx/README.md, "Mapped peer memory").
         * /proc/self/maps unreadable: UCX's route, as before. */
        if (job->krkey->map_state == 0) {
            kvu_rkey_map(ep->ctx, job->krkey, (uintptr_t)ptr);
        }
        return job->krkey->map_state != 0 ? KVU_ROUTE_PTR : KVU_ROUTE_UCX;
    }
    return KVU_ROUTE_UCX;
}

/* kvu_ep_drain issues queued runs while under the in-flight cap. */
static void kvu_ep_drain(kvu_ep_t *ep)
{
    kvu_ctx_t *ctx = ep->ctx;
    kvu_job_t *job;

    while (!ep->failed && (job = ep->qhead) != NULL) {
        if (job->nt != NULL) {
            /* Every job before it issued: the notice goes after them on
             * the wire (best effort, as notify). */
            kvu_job_t *next = job->next;

            if (kvu_notice_send_locked(ep, job->nt) != KVX_OK) {
                kvc_log_debug("KVX-UCX-NOTICE", "%s", kvc_last_error());
                kvc_error_clear();
            }
            ep->qhead = next;
            if (next == NULL) {
                ep->qtail = NULL;
            }
            free(job);
            continue;
        }
        if (job->is_flush) {
            if (ep->am_npending > 0) {
                return; /* AM gets/puts complete only when answered */
            }
            kvu_issue_flush(ep, job);
        }
        if (job->route == 0 && !job->is_flush) {
            job->route = kvu_job_route(ep, job);
        }
        while (job->idx < job->n) {
            const kvc_run_t *run = &job->runs[job->idx];
            uint64_t         len, bytes = 0;
            size_t           k;
            int              route = job->route, rc;

            if (route == KVU_ROUTE_SIZE) {
                /* what one cma call would copy: the run, cut to chunks */
                route = run->len >= KVU_CMA_MIN_RUN &&
                                ctx->chunk >= KVU_CMA_MIN_RUN
                            ? KVU_ROUTE_UCX
                            : KVU_ROUTE_AM;
            }
            if (ep->inflight > 0 &&
                ep->inflight >= ctx->params.max_inflight_bytes) {
                return;
            }
            if (ep->am_fifo && !job->is_put &&
                ep->inflight_reqs + ep->am_npending >= KVU_FIFO_MAX_GETS) {
                return;
            }
            len = run->len - job->off;
            if (len > ctx->chunk) {
                len = ctx->chunk;
            }
            if (route == KVU_ROUTE_AM) {
                uint64_t max = job->is_put ? ep->am_put_max : ep->am_get_max;

                /* Over a FIFO a message must stay under 64 KiB with its
                 * headers: UCX sends it as one bcopy fragment (segments of
                 * KVU_MM_SEG), and the FIFO element's length is 16 bits
                 * (transports/ucx/README.md, "Mapped peer memory"). Only a
                 * context that also holds tcp with large segments has a
                 * larger max. */
                if (ep->am_fifo && max > KVU_AM_SMALL_LEN) {
                    max = KVU_AM_SMALL_LEN;
                }
                if (len > max) {
                    len = max;
                }
                if (ep->am_fifo && !job->is_put && ep->am_get_bytes > 0 &&
                    ep->am_get_bytes + len > KVU_FIFO_GET_BYTES) {
                    return;
                }
            }
            k = 0;
            if (route == KVU_ROUTE_AM && job->is_put && ep->am_putv) {
                k = kvu_am_putv_count(job,
                                      ep->am_put_max < ctx->chunk
                                          ? ep->am_put_max
                                          : ctx->chunk,
                                      &bytes);
            }
            rc = k >= 2    ? kvu_am_issue_v(ep, job, k, bytes)
                 : len > 0 ? kvu_issue(ep, job, route, len)
                           : 0;
            if (rc != 0) {
                job->idx = job->n;
                break;
            }
            if (ep->failed) {
                kvu_job_cancel_all(ep, ep->fail_status);
                return;
            }
            if (k >= 2) { /* whole runs: the next one starts at 0 */
                job->idx += k;
                continue;
            }
            job->off += len;
            if (job->off >= run->len) {
                job->idx++;
                job->off = 0;
            }
        }
        ep->qhead = job->next;
        if (ep->qhead == NULL) {
            ep->qtail = NULL;
        }
        kvu_op_put(ctx, job->op);
        free(job);
    }
}

/* --- progress thread ---------------------------------------------------- */

static void kvu_ep_close_locked(kvu_ep_t *ep);

/* kvu_rkeys_reap (ctx lock held): destroys the rkeys kvu_rkey_destroy held
 * for ep once no UCX request of ep is in flight (ucp.h: an rkey is
 * destroyed after every operation using it is flushed; a request UCX still
 * holds, pending or in progress, reads it). force: destroy them whatever
 * is in flight (the context goes: its workers are destroyed next). */
static void kvu_rkeys_reap(kvu_ep_t *ep, int force)
{
    while (ep->dead_rkeys != NULL && (ep->inflight_reqs == 0 || force)) {
        kvu_rkey_t *rk = ep->dead_rkeys;

        ep->dead_rkeys = rk->dead_next;
        ucp_rkey_destroy(rk->rkey);
        ep->ctx->rkeys_held--;
        free(rk);
    }
}

static void kvu_reap_closing(kvu_ctx_t *ctx)
{
    kvu_ep_t **pp  = &ctx->closing;
    uint64_t   now = ctx->closing != NULL ? kvc_mono_us() : 0;

    while (*pp != NULL) {
        kvu_ep_t *ep = *pp;

        kvu_rkeys_reap(ep, 0); /* before the close, once nothing is out */
        /* Graceful close (kvu_ep_close_start): once the flush completed,
         * nothing of this endpoint is outstanding at either end and the
         * close cannot leave the peer with replies to a vanished endpoint;
         * a failure or the deadline closes it at once. */
        if (ep->ep != NULL &&
            ((ep->close_flush == NULL && ep->am_npending == 0) ||
             ep->failed || now >= ep->close_by_us)) {
            if ((ep->close_flush != NULL || ep->am_npending > 0) &&
                !ep->failed) {
                kvc_log_warn("KVX-UCX-CLOSE", "endpoint to %s: operations "
                             "still in flight %d ms after close began (%llu "
                             "sends not completed, %llu active-message "
                             "gets/puts not answered); force-closing",
                             ep->peer, KVU_DRAIN_MS,
                             (unsigned long long)ep->inflight_reqs,
                             (unsigned long long)ep->am_npending);
            }
            kvu_ep_close_locked(ep);
            kvu_rkeys_reap(ep, 0); /* a forced close completed them */
        }
        if (ep->close_req != NULL &&
            ucp_request_check_status(ep->close_req) != UCS_INPROGRESS) {
            ucp_request_free(ep->close_req);
            ep->close_req = NULL;
        }
        if (ep->ep == NULL && ep->close_req == NULL &&
            ep->close_flush == NULL && ep->inflight_reqs == 0 &&
            ep->notices_pending == 0 && ep->am_npending == 0 &&
            !ep->err_pending && !ep->wire_pending) {
            kvu_rkeys_reap(ep, 1); /* none: nothing is in flight */
            *pp = ep->next;
            free(ep);
            continue;
        }
        pp = &ep->next;
    }
}

/* kvu_take_incoming moves posted jobs to their endpoints' queues (ctx lock
 * held). Runs before the reaper in each pass, so a job posted before its
 * endpoint was closed is canceled here, never left pointing at a freed
 * endpoint. Returns the number of jobs moved. */
static int kvu_take_incoming(kvu_ctx_t *ctx)
{
    kvu_job_t *job, *next;
    int        n = 0;

    pthread_mutex_lock(&ctx->in_lock);
    job          = ctx->in_head;
    ctx->in_head = ctx->in_tail = NULL;
    pthread_mutex_unlock(&ctx->in_lock);
    for (; job != NULL; job = next, n++) {
        kvu_ep_t *ep = job->ep;

        next      = job->next;
        job->next = NULL;
        if (ep->failed || ep->closed || ep->ep == NULL) {
            kvu_job_cancel(ctx, job, ep->failed ? ep->fail_status
                                                : KVX_ERR_CANCELED);
            continue;
        }
        if (ep->qtail != NULL) {
            ep->qtail->next = job;
        } else {
            ep->qhead = job;
        }
        ep->qtail = job;
    }
    return n;
}

/* Collects completions and endpoint errors under the lock, delivers them
 * without it. Returns the number of things delivered. */
static int kvu_deliver(kvu_ctx_t *ctx)
{
    kvu_op_t     *ops;
    kvu_notice_t *nts;
    kvu_ep_t     *errs[64];
    int           nerr = 0, n = 0;

    pthread_mutex_lock(&ctx->lock);
    n += kvu_take_incoming(ctx);
    for (kvu_ep_t *ep = ctx->eps; ep != NULL; ep = ep->next) {
        if (ep->failed && ep->am_npending > 0) {
            kvu_am_cancel_ep(ep, ep->fail_status);
        }
        if (ep->qhead != NULL && ep->failed) {
            kvu_job_cancel_all(ep, ep->fail_status);
        } else if (ep->qhead != NULL) {
            kvu_ep_drain(ep);
            n++; /* issuing is activity: keep spinning, don't sleep yet */
        }
    }
    for (kvu_ep_t *ep = ctx->eps; ep != NULL && nerr < 64; ep = ep->next) {
        if (ep->err_pending) {
            ep->err_pending = 0;
            errs[nerr++]    = ep;
        }
    }
    for (kvu_ep_t *ep = ctx->closing; ep != NULL; ep = ep->next) {
        ep->err_pending = 0; /* closed endpoints report nothing */
    }
    kvu_reap_closing(ctx);
    ops                = ctx->done_head;
    ctx->done_head     = NULL;
    nts                = ctx->notice_head;
    ctx->notice_head   = ctx->notice_tail = NULL;
    ctx->notice_queued = 0;
    ctx->ctl_queued    = 0;
    ctx->delivering    = nerr > 0;
    pthread_mutex_unlock(&ctx->lock);

    /* Endpoints in errs stay allocated: only kvu_ep_close (by the owner of
     * err_cb, after this returns) can move them to the closing list. */
    for (int i = 0; i < nerr; i++) {
        kvu_ep_t *ep = errs[i];

        if (ep->err_cb != NULL) {
            ep->err_cb(ep->err_arg, (kvt_ep_t *)ep, ep->fail_status,
                       ep->fail_reason);
        }
        n++;
    }
    if (nerr > 0) {
        pthread_mutex_lock(&ctx->lock);
        ctx->delivering = 0;
        pthread_cond_broadcast(&ctx->cond);
        pthread_mutex_unlock(&ctx->lock);
    }
    while (ops != NULL) {
        kvu_op_t *next = ops->next;

        ops->done(ops);
        ops = next;
        n++;
    }
    while (nts != NULL) { /* params.notice / ctl set: checked at receipt */
        kvu_notice_t *next = nts->next;

        if (nts->ctl) {
            ctx->params.ctl(ctx->params.ctl_arg, nts->id, nts->idlen,
                            nts->hdr.nonce, nts->hdr.mac, nts->from);
        } else {
            ctx->params.notice(ctx->params.notice_arg, nts->hdr.tag,
                               nts->hdr.mac, nts->hdr.nonce, nts->hdr.addr,
                               nts->hdr.token, nts->id, nts->idlen,
                               nts->from,
                               nts->hdr.status == KVU_NOTICE_COUNTED
                                   ? nts->hdr.len
                                   : KVT_NOTICE_UNCOUNTED);
        }
        free(nts);
        nts = next;
        n++;
    }
    return n;
}

/* kvu_wake_clear reads the wake-up eventfd if poll found it readable. */
static void kvu_wake_clear(kvu_ctx_t *ctx, short wake)
{
    uint64_t val;
    ssize_t  rc = 0;

    if (wake & POLLIN) {
        rc = read(ctx->wakefd, &val, sizeof(val));
    }
    (void)rc;
}

/* kvu_wait sleeps until UCX or a kick has something; seen is the kick
 * count when the current pass began. */
static void kvu_wait(kvu_ctx_t *ctx, uint64_t seen)
{
    struct pollfd pfd[3];
    ucs_status_t  st;
    unsigned      n  = 0;

    /* Only the current worker is armed: a retired one whose FIFO is
     * blocked answers BUSY for good (the thread would never sleep); it is
     * progressed on every pass, at least every KVU_TICK_MS. */
    pthread_mutex_lock(&ctx->lock);
    st              = ucp_worker_arm(ctx->worker);
    pfd[n].fd       = ctx->wk[ctx->nwk - 1].efd;
    pfd[n++].events = POLLIN;
    if (st != UCS_ERR_BUSY && ctx->split) {
        st              = ucp_worker_arm(ctx->wkt.worker);
        pfd[n].fd       = ctx->wkt.efd;
        pfd[n++].events = POLLIN;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (st == UCS_ERR_BUSY) {
        return;
    }
    atomic_store(&ctx->sleeping, 1);
    if (atomic_load(&ctx->kicks) != seen) { /* kicked since: no sleep */
        atomic_store(&ctx->sleeping, 0);
        return;
    }
    pfd[n].fd     = ctx->wakefd;
    pfd[n].events = POLLIN;
    if (kvu_poll_until(ctx, pfd, n + 1, KVU_TICK_MS * 1000u) > 0) {
        kvu_wake_clear(ctx, pfd[n].revents);
    }
    atomic_store(&ctx->sleeping, 0);
}

/* kvu_bind_cpus binds the calling thread to a CPU list "0-3,8-11". */
static void kvu_bind_cpus(const char *list)
{
    cpu_set_t   set;
    const char *p = list;

    CPU_ZERO(&set);
    while (*p != '\0') {
        char         *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;

        if (end == p) {
            return;
        }
        if (*end == '-') {
            p  = end + 1;
            hi = strtoul(p, &end, 10);
        }
        for (unsigned long c = lo; c <= hi && c < CPU_SETSIZE; c++) {
            CPU_SET(c, &set);
        }
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != '\0') {
            return;
        }
    }
    if (CPU_COUNT(&set) > 0 &&
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
        kvc_log_warn("KVX-TOPO", "cannot bind the progress thread to CPUs %s",
                     list);
    }
}

/* kvu_run_deferred runs the jobs handed over by kvu_defer, unlocked. */
static int kvu_run_deferred(kvu_ctx_t *ctx)
{
    kvt_job_t *job;
    int        n = 0;

    pthread_mutex_lock(&ctx->in_lock);
    job           = ctx->def_head;
    ctx->def_head = ctx->def_tail = NULL;
    pthread_mutex_unlock(&ctx->in_lock);
    while (job != NULL) {
        kvt_job_t *next = job->next;

        job->next = NULL;
        job->fn(job);
        job = next;
        n++;
    }
    return n;
}

void kvu_defer(kvu_ctx_t *ctx, kvt_job_t *job)
{
    job->next = NULL;
    pthread_mutex_lock(&ctx->in_lock);
    if (ctx->def_tail != NULL) {
        ctx->def_tail->next = job;
    } else {
        ctx->def_head = job;
    }
    ctx->def_tail = job;
    pthread_mutex_unlock(&ctx->in_lock);
    /* Jobs run on the progress thread only: wake it even while a waiter
     * drives. */
    atomic_fetch_add(&ctx->kicks, 1);
    kvu_wake(ctx);
}

static void kvu_fifo_check(kvu_ctx_t *ctx, uint64_t now);

/* The pass owner of the calling thread (kvu_in_progress_thread). */
static __thread const kvu_ctx_t *kvu_passing;

/* kvu_pass: progress the workers, issue posted runs, deliver completions,
 * notices and errors (pass_lock held). Returns the amount of activity (0:
 * nothing happened). */
static unsigned int kvu_pass(kvu_ctx_t *ctx)
{
    unsigned int n = 0;

    pthread_mutex_lock(&ctx->lock);
    while (ucp_worker_progress(ctx->worker) != 0 && n < 1024) {
        n++;
    }
    for (unsigned i = 0; i + 1 < ctx->nwk; i++) { /* retired workers */
        n += ucp_worker_progress(ctx->wk[i].worker);
    }
    if (ctx->split) {
        unsigned t = 0;

        while (ucp_worker_progress(ctx->wkt.worker) != 0 && t < 1024) {
            t++;
        }
        n += t;
    }
    pthread_mutex_unlock(&ctx->lock);
    pthread_cond_broadcast(&ctx->cond);
    n += (unsigned int)kvu_deliver(ctx);
    ctx->passes++;
    return n;
}

/* kvu_chores: the progress thread's own work (pass_lock held): deferred
 * jobs (handshake completion, connection service: they may block, so never
 * on a waiter's thread), the FIFO watchdog and, every half tick, the
 * owner's tick. Returns the number of deferred jobs run. */
static int kvu_chores(kvu_ctx_t *ctx)
{
    int      n   = kvu_run_deferred(ctx);
    uint64_t now = kvc_mono_us();

    kvu_fifo_check(ctx, now);
    if (ctx->params.tick != NULL && kvu_tick_due(ctx, now, 1)) {
        ctx->last_tick = now;
        ctx->params.tick(ctx->params.tick_arg);
    }
    return n;
}

/* kvu_take_pass: the progress thread takes pass_lock; pass_wanted makes
 * waiters step back meanwhile (they only trylock, and would otherwise win
 * every time). */
static void kvu_take_pass(kvu_ctx_t *ctx)
{
    atomic_store(&ctx->pass_wanted, 1);
    pthread_mutex_lock(&ctx->pass_lock);
    atomic_store(&ctx->pass_wanted, 0);
    kvu_passing = ctx;
}

static void kvu_drop_pass(kvu_ctx_t *ctx)
{
    kvu_passing = NULL;
    pthread_mutex_unlock(&ctx->pass_lock);
}

/* kvu_wait_aside: the progress thread while a waiter drives or holds its
 * lease: the workers are left to the waiter (not armed, so their events do
 * not wake this thread too); it sleeps until a kick (the last waiter
 * leaving for sleep, a deferred job, a post while it is not aside yet) or
 * KVU_LOOK_US, whichever comes first, and then looks whether a waiter is
 * still in or its lease still runs. aside is announced with sleeping and
 * both re-checked before the sleep, as in kvu_wait. */
static void kvu_wait_aside(kvu_ctx_t *ctx, uint64_t seen)
{
    struct pollfd pfd[1] = {{.fd = ctx->wakefd, .events = POLLIN}};

    atomic_store(&ctx->aside, 1);
    atomic_store(&ctx->sleeping, 1);
    if (atomic_load(&ctx->kicks) == seen && kvu_driven(ctx) &&
        kvu_poll_until(ctx, pfd, 1, KVU_LOOK_US) > 0) {
        kvu_wake_clear(ctx, pfd[0].revents);
    }
    atomic_store(&ctx->sleeping, 0);
    atomic_store(&ctx->aside, 0);
}

static void *kvu_progress_main(void *arg)
{
    kvu_ctx_t *ctx       = arg;
    uint64_t   last_busy = kvc_mono_us();

    /* Named, so top -H, perf and gdb tell it from the framework's. */
    (void)pthread_setname_np(pthread_self(), "kvx-progress");
    if (ctx->cpus[0] != '\0') {
        kvu_bind_cpus(ctx->cpus);
    }

    while (!atomic_load(&ctx->stop)) {
        unsigned int n    = 0;
        uint64_t     seen = atomic_load(&ctx->kicks);
        uint64_t     now;

        if (kvu_driven(ctx)) {
            int jobs;

            /* Jobs looked for after seen was read: one deferred later
             * moves kicks, and kvu_wait_aside does not sleep. */
            pthread_mutex_lock(&ctx->in_lock);
            jobs = ctx->def_head != NULL;
            pthread_mutex_unlock(&ctx->in_lock);
            if (jobs || kvu_tick_due(ctx, kvc_mono_us(), 0)) {
                kvu_take_pass(ctx);
                (void)kvu_chores(ctx);
                kvu_drop_pass(ctx);
            } else {
                kvu_wait_aside(ctx, seen);
            }
            last_busy = kvc_mono_us(); /* back in charge: spin first */
            continue;
        }
        kvu_take_pass(ctx);
        n = kvu_pass(ctx);
        n += (unsigned int)kvu_chores(ctx);
        kvu_drop_pass(ctx);
        now = kvc_mono_us();
        if (n > 0) {
            last_busy = now;
            continue;
        }
        if (now - last_busy < ctx->params.spin_us) {
            continue;
        }
        kvu_wait(ctx, seen);
    }
    return NULL;
}

void kvu_drive_begin(kvu_ctx_t *ctx)
{
    if (atomic_fetch_add(&ctx->drivers, 1) == 0 &&
        atomic_load(&ctx->lease_us) != 0) {
        /* Back within (or after) the lease: it is not needed any more.
         * Ended leases stay ended: kvu_driven compares with now. */
        atomic_store(&ctx->lease_us, 0);
    }
}

int kvu_drive(kvu_ctx_t *ctx)
{
    const kvu_ctx_t *outer = kvu_passing;
    unsigned int     n;

    if (outer == ctx || atomic_load(&ctx->stop)) {
        return -1; /* inside a pass already, or closing */
    }
    if (atomic_load(&ctx->pass_wanted) ||
        pthread_mutex_trylock(&ctx->pass_lock) != 0) {
        /* Another thread has the pass: the progress thread, which leaves
         * the workers to a driver at its next one. Where the two share a
         * CPU, a waiter spinning on the pass takes the time the holder
         * needs to finish it: sm READ 1 MiB x 1 measured 0.68-0.72x the
         * default with the spin, 1.23x with this yield (perf/README.md). */
        (void)sched_yield();
        return -1;
    }
    kvu_passing = ctx;
    n           = kvu_pass(ctx);
    kvu_passing = outer;
    pthread_mutex_unlock(&ctx->pass_lock);
    if (n > 0) {
        atomic_fetch_add(&ctx->driven, 1);
    }
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

void kvu_drive_end(kvu_ctx_t *ctx, int back)
{
    uint64_t until = kvc_mono_us() + ctx->params.lease_us;

    if (!back || ctx->params.lease_us == 0) {
        /* A lease another waiter left is over too: the kick below must
         * not be skipped for it (this caller is about to sleep). */
        atomic_store(&ctx->lease_us, 0);
        if (atomic_fetch_sub(&ctx->drivers, 1) == 1) {
            kvu_ctx_kick(ctx); /* the progress thread is in charge again */
        }
        return;
    }
    /* The waiter is expected back soon (a framework loops: start, wait,
     * start, ...): the progress thread stays aside until the lease ends,
     * and sees that at its next look (KVU_LOOK_US), not woken by this
     * call. Stored before the count drops, so no moment looks undriven
     * while a kick is being skipped. */
    atomic_store(&ctx->lease_us, until);
    atomic_fetch_sub(&ctx->drivers, 1);
}

uint64_t kvu_driven_passes(const kvu_ctx_t *ctx)
{
    return atomic_load(&ctx->driven);
}

/* --- context ------------------------------------------------------------ */

static int kvu_tls_lists(const char *list, const char *name);

/* kvu_tls_has_mm: does the UCX_TLS list enable sysv/posix shared memory? */
static int kvu_tls_has_mm(const char *tls)
{
    static const char *const mm[] = {"sm", "shm", "sysv", "posix", "mm", "all"};

    if (tls == NULL || tls[0] == '\0') {
        return 1;
    }
    if (tls[0] == '^') { /* everything but the names listed */
        const char *l = tls + 1;

        return !(kvu_tls_lists(l, "sm") || kvu_tls_lists(l, "shm") ||
                 kvu_tls_lists(l, "mm") ||
                 (kvu_tls_lists(l, "sysv") && kvu_tls_lists(l, "posix")));
    }
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
        if (kvu_tls_lists(tls, mm[i])) {
            return 1;
        }
    }
    return 0;
}

/* --- lane settings (config key ucx_lane_settings) ----------------------
 * Settings go through ucp_config_modify only, never the environment, and
 * every one in force is listed in ctx->settings (logged, and reported with
 * each peer by api->transports). "auto" is kvxfer's own choice, per UCX
 * version and transport set (transports/ucx/README.md, with the figures it
 * rests on); KEY=VALUE tokens after it override or add. */

/* kvu_setting: one ucp_config_modify; optional settings a UCX version does
 * not know are skipped (logged), explicit ones are a configuration error. */
static kvx_status_t kvu_setting(kvu_ctx_t *ctx, ucp_config_t *config,
                                const char *key, const char *val,
                                int optional)
{
    ucs_status_t st   = ucp_config_modify(config, key, val);
    size_t       used = strlen(ctx->settings);

    if (st != UCS_OK && optional) {
        kvc_log_info("KVX-UCX-SETTINGS", "%s: UCX %s rejects %s=%s (%s); "
                     "not applied", ctx->name, ucp_get_version_string(), key,
                     val, ucs_status_string(st));
        return KVX_OK;
    }
    if (st != UCS_OK) {
        return kvc_error(KVX_ERR_CONFIG,
                         "kv_connector_extra_config.ucx_lane_settings: "
                         "'%s=%s': rejected by UCX %s: %s", key, val,
                         ucp_get_version_string(), ucs_status_string(st));
    }
    snprintf(ctx->settings + used, sizeof(ctx->settings) - used, "%s%s=%s",
             used ? " " : "", key, val);
    return KVX_OK;
}

/* kvu_ucx_at_least: is the UCX this process runs on major.minor or newer? */
static int kvu_ucx_at_least(unsigned want_major, unsigned want_minor)
{
    unsigned major = 0, minor = 0, release = 0;

    ucp_get_version(&major, &minor, &release);
    return major > want_major ||
           (major == want_major && minor >= want_minor);
}

/* kvu_tl_key: the name a transport's (or memory domain's) table takes key
 * under (prefix "TCP_", "CMA_"). UCX before 1.17 applies a key ucp does
 * not know to every transport's table by its bare name (and ignores the
 * prefixed one, warning "invalid configurations"); from 1.17 it matches
 * the table prefix (1.17-1.20 accept the bare name and silently ignore it;
 * 1.21 and later reject it). */
static const char *kvu_tl_key(const char *prefix, const char *key, char *buf,
                              size_t len)
{
    if (kvu_ucx_at_least(1, 17)) {
        snprintf(buf, len, "%s%s", prefix, key);
        return buf;
    }
    return key;
}

static const char *kvu_tcp_key(const char *key, char *buf, size_t len)
{
    return kvu_tl_key("TCP_", key, buf, len);
}

/* kvu_setting_tcp: an optional setting of UCX's tcp transport, under the
 * name this UCX applies (kvu_tcp_key); returns 1 when applied. */
static int kvu_setting_tcp(kvu_ctx_t *ctx, ucp_config_t *config,
                           const char *key, const char *val)
{
    char   full[64];
    size_t before = strlen(ctx->settings);

    return kvu_setting(ctx, config, kvu_tcp_key(key, full, sizeof(full)),
                       val, 1) == KVX_OK &&
           strlen(ctx->settings) > before;
}

uint64_t kvu_sock_max(const char *name)
{
    char     path[64];
    FILE    *f;
    uint64_t v = 0;

    snprintf(path, sizeof(path), "/proc/sys/net/core/%s", name);
    if ((f = fopen(path, "r")) != NULL) {
        if (fscanf(f, "%" SCNu64, &v) != 1) {
            v = 0;
        }
        fclose(f);
    }
    return v;
}

/* kvu_settings_auto: kvxfer's choice, per context (tls: its transport
 * list; figures in transports/ucx/README.md "Lane settings"):
 * - shared memory in peer error mode: MM_ERROR_HANDLING=y (peer error mode
 *   drops the sysv/posix lanes on 1.13 unless they advertise peer-failure
 *   support, research/ucx.md §0.5, exp. G);
 * - shared memory: receive segments that hold a whole FIFO message
 *   (MM_SEG_SIZE=KVU_MM_SEG) in FIFOs of KVU_MM_FIFO elements (both ends
 *   must agree, kvu_mm_geo_match);
 * - a tcp-only context (the tcp plane, or a tcp-only list), whose data are
 *   kvxfer's active messages of up to KVU_AM_MAX_LEN: tcp segments that
 *   hold a whole message (TX_SEG_SIZE, RX_SEG_SIZE), so UCX neither
 *   fragments it nor reassembles it into a buffer of its own before the
 *   handler copies it (tcp READ 2.8x, WRITE 2.3x at 1 MiB), and socket
 *   buffers of KVU_TCP_BUF from the start (SNDBUF, RCVBUF) where the
 *   kernel allows them.
 * Not in it, measured (transports/ucx/README.md "cma"): CMA_MEMORY_
 * INVALIDATE=y (UCX 1.16: MEMORY_INVALIDATE=y), which keeps cma's
 * zero-copy lane in peer error mode on protocol v2; runs of
 * KVU_CMA_MIN_RUN and more then go cma (kvu_job_route). Faster on resident
 * 1 MiB blocks, slower on cold ones and on 32 KiB blocks on this VM, so it
 * is the user's choice ("auto CMA_MEMORY_INVALIDATE=y"). */
#define KVU_KEEPALIVE "500ms" /* UCX_KEEPALIVE_INTERVAL of auto */

static kvx_status_t kvu_settings_auto(kvu_ctx_t *ctx, ucp_config_t *config,
                                      const char *tls)
{
    kvx_status_t status = KVX_OK;

    if (ctx->params.err_mode_peer && kvu_tls_has_mm(tls)) {
        status = kvu_setting(ctx, config, "MM_ERROR_HANDLING", "y", 1);
    }
    if (status == KVX_OK && ctx->params.err_mode_peer &&
        getenv("UCX_KEEPALIVE_INTERVAL") == NULL) {
        /* A dead peer's endpoint fails within about a second, not UCX's
         * default 20 s: a WRITE D tells a dead P from one cut off on the
         * control network by it (plugin/engine/README.md). */
        status = kvu_setting(ctx, config, "KEEPALIVE_INTERVAL",
                             KVU_KEEPALIVE, 1);
    }
    if (status == KVX_OK && kvu_tls_has_mm(tls)) {
        char seg[16];

        snprintf(seg, sizeof(seg), "%u", KVU_MM_SEG);
        status = kvu_setting(ctx, config, "MM_SEG_SIZE", seg, 1);
        if (status == KVX_OK) {
            status = kvu_setting(ctx, config, "MM_FIFO_SIZE", KVU_MM_FIFO, 1);
        }
        if (status == KVX_OK) { /* UCX's default, explicit: see above */
            status = kvu_setting(ctx, config, "MM_FIFO_ELEM_SIZE", KVU_MM_ELEM,
                                 1);
        }
    }
    if (status == KVX_OK && ctx->am_rma && tls != NULL && tls[0] != '\0' &&
        !kvu_rma_wanted(tls, 1)) {
        (void)kvu_setting_tcp(ctx, config, "TX_SEG_SIZE", KVU_TCP_SEG);
        /* applied (a UCX that knows neither name skips it, unlisted) */
        ctx->big_rx_last = kvu_setting_tcp(ctx, config, "RX_SEG_SIZE",
                                           KVU_TCP_SEG);
        /* (a size the user set in the environment is left alone) */
        if (kvu_sock_max("wmem_max") >= KVU_TCP_BUF_BYTES &&
            getenv("UCX_TCP_SNDBUF") == NULL) {
            (void)kvu_setting_tcp(ctx, config, "SNDBUF", KVU_TCP_BUF);
        }
        if (kvu_sock_max("rmem_max") >= KVU_TCP_BUF_BYTES &&
            getenv("UCX_TCP_RCVBUF") == NULL) {
            (void)kvu_setting_tcp(ctx, config, "RCVBUF", KVU_TCP_BUF);
        }
    }
    return status;
}

/* kvu_size_parse: the size val ("32k", "65536", "1m", "8kb") as UCX
 * reads memory units, into *out; 0 when this cannot read it ("inf",
 * "auto", garbage: left to UCX). */
static int kvu_size_parse(const char *val, size_t n, unsigned long long *out)
{
    char               buf[32], *end;
    unsigned long long v;

    if (n == 0 || n >= sizeof(buf) || !isdigit((unsigned char)val[0])) {
        return 0;
    }
    memcpy(buf, val, n);
    buf[n] = '\0';
    v      = strtoull(buf, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'b' || *end == 'B') {
        end++;
    }
    if (*end != '\0') {
        return 0;
    }
    *out = v;
    return 1;
}

/* kvu_rx_seg_too_small: is the size val below the 64k receive segment a
 * peer may fill with one message (KVU_AM_SMALL_LEN and headers)? Sizes
 * this cannot read are left to UCX. */
static int kvu_rx_seg_too_small(const char *val)
{
    unsigned long long v;

    return kvu_size_parse(val, strlen(val), &v) && v < (64u << 10);
}

/* The FIFO geometry's keys, per field of kvu_mm_geo_t, and the table
 * prefixes UCX reads them under (most specific first). */
static const char *const kvu_mm_fields[3] = {"SEG_SIZE", "FIFO_SIZE",
                                             "FIFO_ELEM_SIZE"};
static const char *const kvu_mm_prefixes[3] = {"SYSV_", "POSIX_", "MM_"};

/* kvu_mm_value: val as geometry field f, read as UCX reads it (SEG_SIZE
 * memory units; the FIFO's sizes "%u": the leading digits). A value this
 * cannot read is UINT32_MAX (set, unknown: it matches only itself). */
static uint32_t kvu_mm_value(int f, const char *val, size_t n)
{
    unsigned long long v = 0;
    size_t             d = 0;

    if (f == 0) {
        return kvu_size_parse(val, n, &v) && v > 0 && v < UINT32_MAX
                   ? (uint32_t)v : UINT32_MAX;
    }
    while (d < n && isdigit((unsigned char)val[d]) && v < UINT32_MAX) {
        v = v * 10 + (unsigned)(val[d++] - '0');
    }
    return d > 0 && v > 0 && v < UINT32_MAX ? (uint32_t)v : UINT32_MAX;
}

/* kvu_mm_key: which geometry field key ("MM_FIFO_SIZE") names, prefix k
 * (kvu_mm_prefixes) and field f; 0 when none. */
static int kvu_mm_key(const char *key, size_t klen, int *k_p, int *f_p)
{
    for (int f = 0; f < 3; f++) {
        for (int k = 0; k < 3; k++) {
            size_t pl = strlen(kvu_mm_prefixes[k]);
            size_t fl = strlen(kvu_mm_fields[f]);

            if (klen == pl + fl && strncmp(key, kvu_mm_prefixes[k], pl) == 0 &&
                strncmp(key + pl, kvu_mm_fields[f], fl) == 0) {
                *k_p = k;
                *f_p = f;
                return 1;
            }
        }
    }
    return 0;
}

int kvu_mm_geo_parse(const char *settings,
                     const char *(*env)(const char *name), kvu_mm_geo_t *out,
                     char *why, size_t len)
{
    uint32_t    v[3]   = {0, 0, 0};
    int         set[3] = {0, 0, 0};
    const char *p      = settings != NULL ? settings : "";

    for (;;) { /* kvu_settings lists KEY=VALUE separated by spaces */
        size_t      n;
        const char *eq;
        int         k, f;

        p += strspn(p, " \t");
        n = strcspn(p, " \t");
        if (n == 0) {
            break;
        }
        eq = memchr(p, '=', n);
        if (eq != NULL && kvu_mm_key(p, (size_t)(eq - p), &k, &f) && k == 2) {
            v[f]   = kvu_mm_value(f, eq + 1, n - (size_t)(eq - p) - 1);
            set[f] = 1;
        }
        p += n;
    }
    for (int f = 0; env != NULL && f < 3; f++) {
        uint32_t    t[2] = {0, 0}; /* sysv, posix */
        char        names[2][48];
        const char *name_of[2] = {NULL, NULL};

        if (set[f]) {
            continue; /* ucp_config_modify overrides the environment */
        }
        for (int k = 0; k < 2; k++) {
            const int order[2] = {k, 2}; /* its own name, else UCX_MM_* */

            for (int q = 0; q < 2 && name_of[k] == NULL; q++) {
                const char *s;

                snprintf(names[k], sizeof(names[k]), "UCX_%s%s",
                         kvu_mm_prefixes[order[q]], kvu_mm_fields[f]);
                s = env(names[k]);
                if (s != NULL && s[0] != '\0') {
                    t[k]       = kvu_mm_value(f, s, strlen(s));
                    name_of[k] = names[k];
                }
            }
        }
        if (t[0] != t[1]) {
            snprintf(why, len, "%s=%s and %s=%s (environment): kvxfer keeps "
                     "one shared-memory FIFO geometry for sysv and posix (its "
                     "peers check it); set MM_%s in ucx_lane_settings, or "
                     "UCX_MM_%s",
                     name_of[0] ? name_of[0] : "(sysv: UCX's default)",
                     name_of[0] ? env(name_of[0]) : "",
                     name_of[1] ? name_of[1] : "(posix: UCX's default)",
                     name_of[1] ? env(name_of[1]) : "", kvu_mm_fields[f],
                     kvu_mm_fields[f]);
            return -1;
        }
        v[f] = t[0];
    }
    out->seg  = v[0];
    out->fifo = v[1];
    out->elem = v[2];
    return 0;
}

/* kvu_mm_show: a geometry field for a message. */
static const char *kvu_mm_show(uint32_t v, unsigned ucx, char *buf,
                               size_t len)
{
    if (v == 0) {
        snprintf(buf, len, "UCX %u.%u's default", ucx >> 8, ucx & 0xffu);
    } else if (v == UINT32_MAX) {
        snprintf(buf, len, "a value kvxfer cannot read");
    } else {
        snprintf(buf, len, "%u", (unsigned)v);
    }
    return buf;
}

int kvu_mm_geo_match(const kvu_mm_geo_t *mine, unsigned mine_ucx,
                     const kvu_mm_geo_t *peer, unsigned peer_ucx, char *why,
                     size_t len)
{
    const uint32_t a[3] = {mine->seg, mine->fifo, mine->elem};
    const uint32_t b[3] = {peer->seg, peer->fifo, peer->elem};

    for (int f = 0; f < 3; f++) {
        char x[48], y[48];

        if (a[f] == b[f] && (a[f] != 0 || mine_ucx == peer_ucx)) {
            continue;
        }
        snprintf(why, len, "shared-memory FIFO %s%s: this side %s, the peer "
                 "%s; the two ends of a FIFO must agree (a sender writes "
                 "with its own sizes into the receiver's buffers): set the "
                 "same ucx_lane_settings MM_%s on both",
                 kvu_mm_prefixes[2], kvu_mm_fields[f],
                 kvu_mm_show(a[f], mine_ucx, x, sizeof(x)),
                 kvu_mm_show(b[f], peer_ucx, y, sizeof(y)), kvu_mm_fields[f]);
        return 0;
    }
    return 1;
}

/* kvu_getenv: getenv for kvu_mm_geo_parse. */
static const char *kvu_getenv(const char *name)
{
    return getenv(name);
}

/* kvu_proto_v2_refused: UCX before 1.16 ships its protocol v2 as an
 * experiment (PROTO_ENABLE, default n), and UCX 1.13.1 with it aborts a
 * kvxfer READ ("stack smashing detected" inside libucp on the reading
 * side, tcp and sm, seen 2026-12-05); so it is refused there, naming where
 * it came from. 1 when val turns it on under such a UCX. */
static int kvu_proto_v2_refused(const char *val)
{
    static const char *const on[] = {"y", "yes", "on", "1", "true"};

    if (kvu_ucx_at_least(1, 16)) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        if (strcasecmp(val, on[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* kvu_settings_token applies one KEY=VALUE token of ucx_lane_settings. */
static kvx_status_t kvu_settings_token(kvu_ctx_t *ctx, ucp_config_t *config,
                                       const char *tok, size_t n)
{
    char        key[64], val[256];
    const char *eq = memchr(tok, '=', n);
    size_t      klen = eq ? (size_t)(eq - tok) : 0;
    int         mm_k = -1, mm_f = -1; /* a FIFO geometry key (kvu_mm_key) */

    if (eq == NULL || klen == 0 || klen >= sizeof(key) ||
        n - klen - 1 == 0 || n - klen - 1 >= sizeof(val) ||
        strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != klen) {
        return kvc_error(KVX_ERR_CONFIG,
                         "kv_connector_extra_config.ucx_lane_settings: token "
                         "'%.*s': must be \"auto\", \"none\" or KEY=VALUE "
                         "(KEY in capitals, UCX's name without UCX_)",
                         (int)n, tok);
    }
    memcpy(key, tok, klen);
    key[klen] = '\0';
    memcpy(val, eq + 1, n - klen - 1);
    val[n - klen - 1] = '\0';
    if (strncmp(key, "UCX_", 4) == 0 || strcmp(key, "TLS") == 0 ||
        strcmp(key, "NET_DEVICES") == 0) {
        return kvc_error(KVX_ERR_CONFIG,
                         "kv_connector_extra_config.ucx_lane_settings: key "
                         "'%s': %s", key,
                         strncmp(key, "UCX_", 4) == 0
                             ? "give UCX's name without the UCX_ prefix"
                             : "set it with ucx_tls / ucx_net_devices");
    }
    if (strcmp(key, "PROTO_ENABLE") == 0 && kvu_proto_v2_refused(val)) {
        return kvc_error(KVX_ERR_CONFIG,
                         "kv_connector_extra_config.ucx_lane_settings: "
                         "'%s=%s': UCX %s's protocol v2 is experimental and "
                         "aborts kvxfer's gets (stack smashing in libucp); "
                         "it needs UCX 1.16 or later", key, val,
                         ucp_get_version_string());
    }
    if (kvu_mm_key(key, klen, &mm_k, &mm_f) && mm_k != 2) {
        return kvc_error(KVX_ERR_CONFIG,
                         "kv_connector_extra_config.ucx_lane_settings: "
                         "'%s=%s': kvxfer keeps one shared-memory FIFO "
                         "geometry for sysv and posix (its peers check it): "
                         "set MM_%s", key, val, kvu_mm_fields[mm_f]);
    }
    /* a tcp segment key (not the FIFO's: MM_SEG_SIZE leaves tcp alone) */
    if (mm_k < 0 && klen >= 8 && strcmp(key + klen - 8, "SEG_SIZE") == 0) {
        ctx->big_rx_last = 0; /* the user's segments: small messages */
        if (klen >= 11 && strcmp(key + klen - 11, "RX_SEG_SIZE") == 0 &&
            kvu_rx_seg_too_small(val)) {
            return kvc_error(KVX_ERR_CONFIG,
                             "kv_connector_extra_config.ucx_lane_settings: "
                             "'%s=%s': must be at least 64k (peers send "
                             "kvxfer's active messages of up to 60 KiB as "
                             "one segment)", key, val);
        }
    }
    return kvu_setting(ctx, config, key, val, 0);
}

static kvx_status_t kvu_settings_apply(kvu_ctx_t *ctx, ucp_config_t *config,
                                       const char *tls)
{
    const char  *p = ctx->params.lane_settings ? ctx->params.lane_settings
                                               : "auto";
    kvx_status_t status = KVX_OK;

    ctx->settings[0] = '\0';
    ctx->big_rx_last = 0;
    while (status == KVX_OK) {
        size_t n;

        p += strspn(p, " \t");
        if (*p == '\0') {
            break;
        }
        n = strcspn(p, " \t");
        if (n == 4 && strncmp(p, "auto", 4) == 0) {
            status = kvu_settings_auto(ctx, config, tls);
        } else if (!(n == 4 && strncmp(p, "none", 4) == 0)) {
            status = kvu_settings_token(ctx, config, p, n);
        }
        p += n;
    }
    if (status == KVX_OK && kvu_tls_has_mm(tls)) {
        char why[384];

        if (kvu_mm_geo_parse(ctx->settings, kvu_getenv, &ctx->mm, why,
                             sizeof(why)) != 0) {
            status = kvc_error(KVX_ERR_CONFIG, "%s", why);
        }
    }
    if (status == KVX_OK) {
        kvc_log_info("KVX-UCX-SETTINGS", "%s: UCX %s settings: %s (config "
                     "ucx_lane_settings '%s')", ctx->name,
                     ucp_get_version_string(),
                     ctx->settings[0] ? ctx->settings : "UCX defaults",
                     ctx->params.lane_settings ? ctx->params.lane_settings
                                               : "auto");
    }
    return status;
}

const char *kvu_settings(const kvu_ctx_t *ctx)
{
    return ctx->settings;
}

/* kvu_rma_wanted: whether the context asks UCX for one-sided operations
 * (UCP_FEATURE_RMA). With that feature UCX installs its software RMA
 * handlers on every interface, and they read or write whatever address a
 * sender names (rma_sw.c: no check against registered memory): anyone able
 * to reach the worker over tcp could use them. When every allowed
 * transport is tcp (or self), no lane could carry a real one-sided
 * operation anyway (UCX 1.13; on 1.22 tcp's zero-copy put is no safer, and
 * its receiving side writes wherever a PUT_REQ says whatever the features:
 * transports/ucx/README.md, "Not closed"), so
 * the feature is not requested, those handlers do not exist, and all data
 * moves over kvxfer's own checked active messages. Any other transport
 * list keeps the feature (shared memory, RDMA and GPU lanes copy for real).
 * KVX_UCX_AM_RMA=0 (UCX's own emulation) needs it too. */
int kvu_rma_wanted(const char *tls, int am_rma)
{
    const char *p = tls;

    if (!am_rma || tls == NULL || tls[0] == '\0' || tls[0] == '^') {
        return 1;
    }
    while (*p != '\0') {
        size_t n = strcspn(p, ",");

        if (n > 0 && !kvc_tl_is(p, n, "tcp") && !kvc_tl_is(p, n, "self")) {
            return 1;
        }
        p += n;
        p += *p == ',';
    }
    return 0;
}

/* kvu_tls_lists: is name one of the comma-separated names of list? */
static int kvu_tls_lists(const char *list, const char *name)
{
    while (*list != '\0') {
        size_t n = strcspn(list, ",");

        if (kvc_tl_is(list, n, name)) {
            return 1;
        }
        list += n;
        list += *list == ',';
    }
    return 0;
}

/* Transports that copy but carry no messages (UCX needs a message-capable
 * one beside them for wire-up). */
static const char *const kvu_tl_rma_only[] = {
    "cma", "knem", "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm",
    "rocm_copy", "rocm_ipc", "rocm_gdr"};

int kvu_tls_split(const char *tls, char **main_p)
{
    size_t len = tls ? strlen(tls) : 0;
    char  *main;
    size_t used = 0;
    int    msg  = 0;

    *main_p = NULL;
    if (tls == NULL || tls[0] == '\0' || kvu_tls_lists(tls, "all")) {
        main = strdup("^tcp");
    } else if (tls[0] == '^') {
        if (kvu_tls_lists(tls + 1, "tcp")) {
            return 0;
        }
        main = malloc(len + 5);
        if (main != NULL) {
            snprintf(main, len + 5, "%s,tcp", tls);
        }
    } else {
        if (!kvu_tls_lists(tls, "tcp")) {
            return 0;
        }
        main = malloc(len + 1);
        if (main == NULL) {
            return -2;
        }
        main[0] = '\0';
        for (const char *p = tls; *p != '\0';) {
            size_t n = strcspn(p, ",");

            if (n > 0 && !kvc_tl_is(p, n, "tcp")) {
                int rma_only = 0;

                for (size_t i = 0; i < sizeof(kvu_tl_rma_only) /
                                       sizeof(kvu_tl_rma_only[0]); i++) {
                    rma_only |= kvc_tl_is(p, n, kvu_tl_rma_only[i]);
                }
                msg |= !rma_only && !kvc_tl_is(p, n, "self");
                used += (size_t)snprintf(main + used, len + 1 - used,
                                         "%s%.*s", used ? "," : "", (int)n,
                                         p);
            }
            p += n;
            p += *p == ',';
        }
        if (!msg) { /* tcp carries the others' wire-up: cannot split */
            free(main);
            return -1;
        }
    }
    if (main == NULL) {
        return -2;
    }
    *main_p = main;
    return 1;
}

/* kvu_ucp_has_tcp: does the UCP context hold a tcp interface? */
static int kvu_ucp_has_tcp(ucp_context_h ucp)
{
    char  *text = NULL;
    size_t len  = 0;
    FILE  *f    = open_memstream(&text, &len);
    int    has;

    if (f == NULL) {
        return 1; /* cannot tell: assume the worst */
    }
    ucp_context_print_info(ucp, f);
    fclose(f);
    has = text == NULL || strstr(text, "-- tcp/") != NULL;
    free(text);
    return has;
}

/* kvu_config_make: UCX's configuration for a context of ctx allowing the
 * transports tls (NULL or "": UCX's default), with kvxfer's settings. */
static kvx_status_t kvu_config_make(kvu_ctx_t *ctx, const char *tls,
                                    ucp_config_t **config_p)
{
    ucp_config_t *config;
    ucs_status_t  st;
    kvx_status_t  status;
    char          key[32];

    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_config_read: %s",
                         ucs_status_string(st));
    }
    if (tls != NULL && tls[0] != '\0') {
        const char *configured = ctx->params.tls ? ctx->params.tls : "";
        int         as         = strcmp(tls, configured) != 0;

        st = ucp_config_modify(config, "TLS", tls);
        if (st != UCS_OK) {
            ucp_config_release(config);
            return kvc_error(KVX_ERR_CONFIG,
                             "kv_connector_extra_config.ucx_tls: value '%s': "
                             "rejected by UCX%s%s%s: %s", configured,
                             as ? " (as '" : "", as ? tls : "",
                             as ? "', kvu_tls_split)" : "",
                             ucs_status_string(st));
        }
    }
    if (ctx->params.net_devices != NULL && ctx->params.net_devices[0]) {
        st = ucp_config_modify(config, "NET_DEVICES", ctx->params.net_devices);
        if (st != UCS_OK) {
            ucp_config_release(config);
            return kvc_error(KVX_ERR_CONFIG,
                             "kv_connector_extra_config.ucx_net_devices: "
                             "value '%s': rejected by UCX: %s",
                             ctx->params.net_devices, ucs_status_string(st));
        }
    }
    /* UCX_TCP_PORT_RANGE, under the name this UCX applies (kvu_tcp_key;
     * tests/python test_ucx.py checks the listening ports). */
    if (ctx->params.tcp_port_range != NULL && ctx->params.tcp_port_range[0] &&
        (st = ucp_config_modify(config,
                                kvu_tcp_key("PORT_RANGE", key, sizeof(key)),
                                ctx->params.tcp_port_range)) != UCS_OK) {
        ucp_config_release(config);
        return kvc_error(KVX_ERR_CONFIG, "kv_connector_extra_config."
                         "ucx_tcp_port_range: value '%s': rejected by UCX: %s",
                         ctx->params.tcp_port_range, ucs_status_string(st));
    }
    status = kvu_settings_apply(ctx, config, tls);
    if (status != KVX_OK) {
        ucp_config_release(config);
        return status;
    }
    *config_p = config;
    return KVX_OK;
}

/* kvu_ucp_open: one UCP context of ctx (features: with or without RMA). */
static kvx_status_t kvu_ucp_open(kvu_ctx_t *ctx, const char *tls, int rma,
                                 const char *name, ucp_context_h *ucp_p)
{
    ucp_config_t *config = NULL;
    ucp_params_t  params;
    ucs_status_t  st;
    kvx_status_t  status = kvu_config_make(ctx, tls, &config);
    int           as;

    if (status != KVX_OK) {
        return status;
    }
    as = strcmp(tls ? tls : "", ctx->params.tls ? ctx->params.tls : "") != 0;
    memset(&params, 0, sizeof(params));
    params.field_mask   = UCP_PARAM_FIELD_FEATURES |
                          UCP_PARAM_FIELD_REQUEST_SIZE |
                          UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                          UCP_PARAM_FIELD_NAME;
    params.features     = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP |
                          (rma ? UCP_FEATURE_RMA : 0);
    params.request_size = sizeof(kvu_req_t);
    params.mt_workers_shared = 0;
    params.name         = name;
    st = ucp_init(&params, config, ucp_p);
    ucp_config_release(config);
    if (st != UCS_OK) {
        *ucp_p = NULL;
        return kvc_error(KVX_ERR_TRANSPORT,
                         "ucp_init (ucx_tls '%s'%s%s%s, net devices '%s'): "
                         "%s; the requested transports/devices are not "
                         "usable here",
                         ctx->params.tls ? ctx->params.tls : "",
                         as ? " as '" : "", as ? (tls ? tls : "") : "",
                         as ? "'" : "",
                         ctx->params.net_devices ? ctx->params.net_devices
                                                 : "",
                         ucs_status_string(st));
    }
    return KVX_OK;
}

/* kvu_ucp_init opens ctx's UCP contexts. UCP_FEATURE_RMA makes UCX
 * install its software RMA handlers on every interface of the context, and
 * they read or write whatever address a sender names (kvu_rma_wanted): so
 * tcp, which anyone on the network can reach, never shares a context with
 * RMA. When the transport list allows tcp beside transports that copy for
 * real (UCX's default does), the RMA context gets every transport but tcp
 * and a second context, the tcp plane, gets tcp without RMA; kvu_ep_create
 * picks the plane that reaches the peer. */
static kvx_status_t kvu_ucp_init(kvu_ctx_t *ctx)
{
    char         name[80], *main = NULL, tcp_settings[sizeof(ctx->settings)];
    const char  *tls;
    kvx_status_t status;
    int          split;

    {
        const char *env = getenv("KVX_UCX_AM_RMA");

        ctx->am_rma = env == NULL || strcmp(env, "0") != 0;
        env         = getenv("KVX_UCX_PUTV");
        ctx->putv   = env == NULL || strcmp(env, "0") != 0;
    }
    /* The list in force: ucx_tls, else the UCX_TLS the process was started
     * with (ucp_config_read reads it), else UCX's default. */
    tls = ctx->params.tls != NULL && ctx->params.tls[0] != '\0'
              ? ctx->params.tls
              : getenv("UCX_TLS") != NULL ? getenv("UCX_TLS") : "";
    snprintf(ctx->tls, sizeof(ctx->tls), "%s", tls);
    if (strlen(tls) >= sizeof(ctx->tls)) {
        return kvc_error(KVX_ERR_CONFIG, "UCX_TLS: %zu characters, at most "
                         "%zu", strlen(tls), sizeof(ctx->tls) - 1);
    }
    if (getenv("UCX_PROTO_ENABLE") != NULL &&
        kvu_proto_v2_refused(getenv("UCX_PROTO_ENABLE"))) {
        return kvc_error(KVX_ERR_CONFIG, "UCX_PROTO_ENABLE=%s (environment): "
                         "UCX %s's protocol v2 is experimental and aborts "
                         "kvxfer's gets (stack smashing in libucp); it needs "
                         "UCX 1.16 or later", getenv("UCX_PROTO_ENABLE"),
                         ucp_get_version_string());
    }
    if (getenv("UCX_TCP_RX_SEG_SIZE") != NULL &&
        kvu_rx_seg_too_small(getenv("UCX_TCP_RX_SEG_SIZE"))) {
        return kvc_error(KVX_ERR_CONFIG, "UCX_TCP_RX_SEG_SIZE=%s (environment):"
                         " must be at least 64k (peers send kvxfer's active "
                         "messages of up to 60 KiB as one segment)",
                         getenv("UCX_TCP_RX_SEG_SIZE"));
    }
    ctx->rma = kvu_rma_wanted(ctx->tls, ctx->am_rma);
    split    = ctx->rma && ctx->am_rma ? kvu_tls_split(ctx->tls, &main) : 0;
    if (split == -2) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu context: out of memory");
    }
    if (split == -1) {
        kvc_log_warn("KVX-UCX-PLANES", "%s: ucx_tls '%s': besides tcp only "
                     "transports that carry no messages (tcp carries their "
                     "wire-up), so tcp stays in the context that asks for "
                     "RMA and UCX's software RMA handlers, which serve any "
                     "address, are reachable over tcp; add sm (same host) "
                     "or an RDMA transport to keep tcp apart", ctx->name,
                     ctx->tls);
    }
    ctx->split = split == 1;
    if (!ctx->split) {
        status = kvu_ucp_open(ctx, ctx->tls, ctx->rma, ctx->name, &ctx->ucp);
        ctx->big_rx_main = ctx->big_rx_last;
        return status;
    }
    snprintf(name, sizeof(name), "%s-tcp", ctx->name);
    status = kvu_ucp_open(ctx, "tcp", 0, name, &ctx->ucp_tcp);
    snprintf(tcp_settings, sizeof(tcp_settings), "%s", ctx->settings);
    ctx->big_rx_tcp = status == KVX_OK && ctx->big_rx_last;
    if (status != KVX_OK) {
        /* No tcp here (e.g. no interface): the rest as one context. */
        kvc_log_info("KVX-UCX-PLANES", "%s: no tcp plane (%s); transports "
                     "'%s' only", ctx->name, kvc_last_error(), main);
        ctx->split      = 0;
        ctx->big_rx_tcp = 0;
        status          = kvu_ucp_open(ctx, main, 1, ctx->name, &ctx->ucp);
        ctx->big_rx_main = ctx->big_rx_last;
    } else if ((status = kvu_ucp_open(ctx, main, 1, ctx->name,
                                      &ctx->ucp)) != KVX_OK) {
        /* Nothing but tcp usable here: tcp alone, without RMA. */
        kvc_log_info("KVX-UCX-PLANES", "%s: transports '%s' unusable (%s); "
                     "tcp only, over kvxfer's active messages", ctx->name,
                     main, kvc_last_error());
        ctx->ucp     = ctx->ucp_tcp;
        ctx->ucp_tcp = NULL;
        ctx->split   = 0;
        ctx->rma     = 0;
        status       = KVX_OK;
        ctx->big_rx_main = ctx->big_rx_tcp;
        ctx->big_rx_tcp  = 0;
        memcpy(ctx->settings, tcp_settings, sizeof(ctx->settings));
    } else {
        size_t used = strlen(ctx->settings);

        ctx->big_rx_main = ctx->big_rx_last;
        snprintf(ctx->settings + used, sizeof(ctx->settings) - used,
                 "%stcp plane: %s", used ? "; " : "",
                 tcp_settings[0] ? tcp_settings : "UCX defaults");
        kvc_log_debug("KVX-UCX-PLANES", "%s: RMA context over '%s', tcp "
                      "plane without RMA", ctx->name, main);
    }
    /* Whatever the list said: the context that asks for RMA must not hold
     * a tcp interface (the split's whole point). */
    if (status == KVX_OK && ctx->rma && ctx->split &&
        kvu_ucp_has_tcp(ctx->ucp)) {
        status = kvc_error(KVX_ERR_CONFIG, "kv_connector_extra_config."
                           "ucx_tls '%s': the context asking for RMA (as "
                           "'%s') still holds a tcp interface; refusing to "
                           "serve UCX's software RMA over tcp", ctx->tls,
                           main);
    }
    free(main);
    return status;
}

/* kvu_addr_build: what peers get as wk's address (kvu_addr_hdr_t): wk's
 * UCP address, then the tcp plane's when ctx is split. */
static kvx_status_t kvu_addr_build(kvu_ctx_t *ctx, kvu_wk_t *wk)
{
    const kvu_wk_t *e[KVU_ADDR_MAX] = {wk, ctx->split ? &ctx->wkt : NULL};
    kvu_addr_hdr_t  h = {KVU_ADDR_MAGIC, KVU_AM_VERSION,
                         (uint16_t)(ctx->split ? 2 : 1), (uint16_t)ctx->ucx_ver,
                         0, ctx->mm.seg, ctx->mm.fifo, ctx->mm.elem};
    size_t          len = sizeof(h), off = sizeof(h);

    for (unsigned i = 0; i < h.n; i++) {
        len += sizeof(uint32_t) + e[i]->addr_len;
    }
    wk->pub = malloc(len);
    if (wk->pub == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu address: out of memory");
    }
    memcpy(wk->pub, &h, sizeof(h));
    for (unsigned i = 0; i < h.n; i++) {
        uint32_t n = (uint32_t)e[i]->addr_len;
        int      big = i == 1 ? ctx->big_rx_tcp : ctx->big_rx_main;
        uint32_t w   = n | (i == 1 || !ctx->rma ? KVU_ADDR_NO_RMA : 0) |
                     (big ? KVU_ADDR_BIG_RX : 0);

        memcpy(wk->pub + off, &w, sizeof(w));
        memcpy(wk->pub + off + sizeof(n), e[i]->addr, n);
        off += sizeof(n) + n;
    }
    wk->pub_len = len;
    return KVX_OK;
}

kvx_status_t kvu_addr_entries(const void *buf, size_t len,
                              const void *ent[KVU_ADDR_MAX],
                              size_t ent_len[KVU_ADDR_MAX],
                              uint32_t flags[KVU_ADDR_MAX], unsigned *n_p)
{
    const uint8_t *p = buf;
    kvu_addr_hdr_t h;
    size_t         off = sizeof(h);

    if (buf == NULL || len < KVU_ADDR_HDR_V5) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: %zu bytes, "
                         "shorter than kvxfer's %zu-byte header", len,
                         sizeof(h));
    }
    memset(&h, 0, sizeof(h));
    memcpy(&h, buf, KVU_ADDR_HDR_V5); /* the same since protocol 5 */
    if (h.magic != KVU_ADDR_MAGIC) {
        return kvc_error(KVX_ERR_PEER_VERSION, "peer worker address: no "
                         "kvxfer data-plane protocol header (a build older "
                         "than protocol 5); this build speaks kvxfer "
                         "data-plane protocol %d", KVU_AM_VERSION);
    }
    if (h.version != KVU_AM_VERSION) {
        return kvc_error(KVX_ERR_PEER_VERSION, "the peer speaks kvxfer "
                         "data-plane protocol %u, this build speaks %d",
                         (unsigned)h.version, KVU_AM_VERSION);
    }
    if (len < sizeof(h)) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: %zu bytes, "
                         "shorter than kvxfer's %zu-byte header", len,
                         sizeof(h));
    }
    memcpy(&h, buf, sizeof(h));
    if (h.n < 1 || h.n > KVU_ADDR_MAX) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: %u "
                         "entries, must be 1..%d", (unsigned)h.n,
                         KVU_ADDR_MAX);
    }
    for (unsigned i = 0; i < h.n; i++) {
        uint32_t n;

        if (len - off < sizeof(n)) {
            return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: entry "
                             "%u of %u cut short at byte %zu of %zu", i,
                             (unsigned)h.n, off, len);
        }
        memcpy(&n, p + off, sizeof(n));
        off += sizeof(n);
        if (flags != NULL) {
            flags[i] = n & ~KVU_ADDR_LEN_MASK;
        }
        n &= KVU_ADDR_LEN_MASK;
        if (n == 0 || n > len - off) {
            return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: entry "
                             "%u: length %u, must be 1..%zu (the bytes "
                             "left)", i, (unsigned)n, len - off);
        }
        ent[i]     = p + off;
        ent_len[i] = n;
        off += n;
    }
    if (off != len) {
        return kvc_error(KVX_ERR_HANDSHAKE, "peer worker address: %zu bytes "
                         "after its %u entries", len - off, (unsigned)h.n);
    }
    *n_p = h.n;
    return KVX_OK;
}

void kvu_addr_geo(const void *buf, unsigned *ucx_p, kvu_mm_geo_t *geo)
{
    kvu_addr_hdr_t h;

    memcpy(&h, buf, sizeof(h));
    *ucx_p    = h.ucx;
    geo->seg  = h.mm_seg;
    geo->fifo = h.mm_fifo;
    geo->elem = h.mm_elem;
}

/* kvu_worker_may_listen: may wk's UCX context open tcp listening sockets?
 * The tcp plane's does; beside it (split) the other context has no tcp;
 * an unsplit one has tcp unless its list names transports without it. */
static int kvu_worker_may_listen(const kvu_ctx_t *ctx, const kvu_wk_t *wk)
{
    if (wk == &ctx->wkt) {
        return 1;
    }
    if (ctx->split) {
        return 0;
    }
    return ctx->tls[0] == '\0' || ctx->tls[0] == '^' ||
           kvu_tls_lists(ctx->tls, "tcp") || kvu_tls_lists(ctx->tls, "all");
}

/* kvu_guard_worker: trusted_remote_hosts' filter on the listening sockets
 * the new worker wk opened (kvu_guard.h), under kvt_listen_lock with the
 * list before its creation. */
static kvx_status_t kvu_guard_worker(kvu_ctx_t *ctx, kvu_wk_t *wk,
                                     const kvu_guard_list_t *before)
{
    ucp_worker_attr_t  wa;
    ucs_status_t       st;
    kvx_status_t       status;
    kvu_guard_report_t rep;
    char               list[64] = "";

    memset(&wa, 0, sizeof(wa));
    memset(&rep, 0, sizeof(rep));
    wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    st = ucp_worker_query(wk->worker, &wa);
    if (st != UCS_OK) {
        return kvc_error(KVX_ERR_TRANSPORT, "%s: ucp_worker_query: %s",
                         ctx->name, ucs_status_string(st));
    }
    status = kvu_guard_attach_new(before, wa.address, wa.address_length,
                                  ctx->params.inbound, ctx->params.n_inbound,
                                  kvu_worker_may_listen(ctx, wk), &rep,
                                  ctx->name);
    ucp_worker_release_address(wk->worker, wa.address);
    if (status != KVX_OK) {
        return status;
    }
    for (size_t i = 0; i < rep.found && i < 8; i++) {
        size_t len = strlen(list);

        snprintf(list + len, sizeof(list) - len, "%s%u", i ? "," : "",
                 (unsigned)rep.ports[i]);
    }
    if (rep.others > 0) {
        /* Not this worker's as far as its address tells: another thread
         * of the process opened them meanwhile (not kvxfer's: every
         * kvxfer listener is created under kvt_listen_lock). */
        kvc_log_warn("KVX-UCX-GUARD", "%s: %zu listening socket(s) opened "
                     "beside this worker's whose port is not in its "
                     "address: not filtered", ctx->name, rep.others);
    }
    if (rep.closed > 0) {
        kvc_log_warn("KVX-UCX-GUARD", "%s: closed %zu connection(s) made to "
                     "UCX's tcp listener before its filter was on", ctx->name,
                     rep.closed);
    }
    if (rep.found > 0) {
        kvc_log_info("KVX-UCX-GUARD", "%s: %zu tcp listening socket(s) "
                     "(port %s) admit only trusted_remote_hosts (%zu "
                     "network(s))", ctx->name, rep.found, list,
                     ctx->params.n_inbound);
    }
    return KVX_OK;
}

/* kvu_worker_open creates a worker of the UCP context ucp into wk (its
 * event fd, address and active-message handlers; wk->pub unless wk is the
 * tcp plane's); on error wk may hold a partial worker, released by
 * kvu_worker_close. */
static kvx_status_t kvu_worker_open(kvu_ctx_t *ctx, ucp_context_h ucp,
                                    kvu_wk_t *wk)
{
    kvx_status_t     status;
    kvu_guard_list_t before;

    ucp_worker_params_t wp;
    ucs_status_t        st;

    memset(wk, 0, sizeof(*wk));
    wk->ctx = ctx;
    wk->efd = -1;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE |
                     UCP_WORKER_PARAM_FIELD_EVENTS;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    wp.events      = UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TAG_SEND |
                     UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
    /* The listening sockets this worker opens are the new ones
     * (kvu_guard.h): no other kvxfer listener is created meanwhile. */
    kvt_listen_lock();
    if (ctx->params.inbound_set) {
        if (kvu_guard_listeners(&before) != 0) {
            kvt_listen_unlock();
            return kvc_error(KVX_ERR_INTERNAL, "%s: trusted_remote_hosts: "
                             "/proc/self/fd: %s: cannot find UCX's "
                             "listening sockets to filter", ctx->name,
                             strerror(errno));
        }
    }
    st = ucp_worker_create(ucp, &wp, &wk->worker);
    if (st != UCS_OK) {
        kvt_listen_unlock();
        if (ctx->params.inbound_set) {
            kvu_guard_list_free(&before);
        }
        wk->worker = NULL;
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_worker_create: %s",
                         ucs_status_string(st));
    }
    if (ctx->params.inbound_set) {
        status = kvu_guard_worker(ctx, wk, &before);
        kvt_listen_unlock();
        kvu_guard_list_free(&before);
        if (status != KVX_OK) {
            return status;
        }
    } else {
        kvt_listen_unlock();
    }
    st = ucp_worker_get_efd(wk->worker, &wk->efd);
    if (st != UCS_OK) {
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_worker_get_efd: %s",
                         ucs_status_string(st));
    }
    st = ucp_worker_get_address(wk->worker, &wk->addr, &wk->addr_len);
    if (st != UCS_OK) {
        wk->addr = NULL;
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_worker_get_address: %s",
                         ucs_status_string(st));
    }
    status = kvu_am_handlers(wk);
    if (status == KVX_OK && wk != &ctx->wkt) {
        status = kvu_addr_build(ctx, wk);
    }
    return status;
}

static void kvu_worker_close(kvu_wk_t *wk)
{
    free(wk->pub);
    wk->pub = NULL;
    if (wk->addr != NULL) {
        ucp_worker_release_address(wk->worker, wk->addr);
        wk->addr = NULL;
    }
    if (wk->worker != NULL) {
        ucp_worker_destroy(wk->worker);
        wk->worker = NULL;
    }
}

static kvx_status_t kvu_worker_init(kvu_ctx_t *ctx)
{
    ucp_context_attr_t ca;
    ucs_status_t       st;
    kvx_status_t       status;

    memset(&ca, 0, sizeof(ca));
    ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(ctx->ucp, &ca) == UCS_OK) {
        ctx->mem_types = ca.memory_types;
    }
    st = ucp_dt_create_generic(&kvu_dt_ops, NULL, &ctx->am_dt);
    if (st != UCS_OK) {
        ctx->am_dt = 0;
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_dt_create_generic: %s",
                         ucs_status_string(st));
    }
    if (ctx->split) { /* first: every other worker's address names it */
        status = kvu_worker_open(ctx, ctx->ucp_tcp, &ctx->wkt);
        if (status != KVX_OK) {
            return status;
        }
    }
    ctx->nwk = 1;
    status   = kvu_worker_open(ctx, ctx->ucp, &ctx->wk[0]);
    ctx->worker = ctx->wk[0].worker;
    return status;
}

static void kvu_fifo_fini(kvu_ctx_t *ctx);

static void kvu_ctx_free(kvu_ctx_t *ctx)
{
    /* Held rkeys of endpoints UCX had not released by the deadline: before
     * the workers, whose pools hold them. */
    for (kvu_ep_t *ep = ctx->closing; ep != NULL; ep = ep->next) {
        kvu_rkeys_reap(ep, 1);
    }
    for (kvu_ep_t *ep = ctx->eps; ep != NULL; ep = ep->next) {
        kvu_rkeys_reap(ep, 1);
    }
    kvu_fifo_fini(ctx); /* its endpoints reach ctx's workers */
    for (unsigned i = ctx->nwk; i-- > 0;) {
        kvu_worker_close(&ctx->wk[i]);
    }
    kvu_worker_close(&ctx->wkt);
    if (ctx->am_dt != 0) {
        ucp_dt_destroy(ctx->am_dt);
    }
    while (ctx->notice_head != NULL) {
        kvu_notice_t *nt = ctx->notice_head;

        ctx->notice_head = nt->next;
        free(nt);
    }
    /* Endpoints UCX had not released by the deadline: freed only after
     * the worker, whose destruction may still complete their requests. */
    while (ctx->closing != NULL) {
        kvu_ep_t *ep = ctx->closing;

        ctx->closing = ep->next;
        free(ep);
    }
    if (ctx->ucp != NULL) {
        ucp_cleanup(ctx->ucp);
    }
    if (ctx->ucp_tcp != NULL) {
        ucp_cleanup(ctx->ucp_tcp);
    }
    if (ctx->wakefd >= 0) {
        close(ctx->wakefd);
    }
    pthread_cond_destroy(&ctx->cond);
    pthread_mutex_destroy(&ctx->in_lock);
    pthread_mutex_destroy(&ctx->pass_lock);
    pthread_mutex_destroy(&ctx->lock);
    for (unsigned b = 0; b < KVU_AMR_EP_BUCKETS; b++) {
        while (ctx->amr_ep[b] != NULL) { /* (answers never completed) */
            kvu_amr_ep_t *e = ctx->amr_ep[b];

            ctx->amr_ep[b] = e->next;
            free(e);
        }
    }
    free(ctx);
    kvu_log_release(); /* the hold of kvu_ctx_create */
}

/* --- the receive-FIFO watchdog ------------------------------------------
 * UCX's sysv/posix transports deliver every message through the receiver's
 * FIFO in shared memory, strictly in order; a sender killed between
 * reserving an element and marking it ready (inside the pack callback)
 * blocks that FIFO for good, and with it every shared-memory message from
 * every peer into this worker (UCX 1.13 .. master; transports/ucx/README.md
 * "A peer killed while writing into this process's shared-memory FIFO").
 *
 * The watchdog sends a token to the current worker over shared memory from
 * a small probe context of its own (sysv,posix only): when a shared-memory
 * endpoint is created (kvu_fifo_verify: 20 passes and 50 ms), and every
 * KVU_PROBE_EVERY_MS (lost after KVU_PROBE_LOST_MS and KVU_PROBE_PASSES
 * progress passes). A token not received means the FIFO is blocked: the
 * worker is retired (still progressed, for its endpoints over other lanes)
 * and a new one takes its place. Endpoints whose active-message lane is
 * shared memory fail with the reason (their peers' answers would arrive in
 * the blocked FIFO), so their transfers fail now instead of at their
 * deadline; the endpoint being created, and every later one, is made on
 * the new worker, whose address the engine publishes from then on
 * (params.worker_reset: it rebuilds its handshake metadata). Peers holding
 * the old address reach the new one after their own deadline and a new
 * handshake (transports/ucx/README.md).
 * KVX_UCX_FIFO_WATCHDOG=0 turns it off. */
#define KVU_PROBE_EVERY_MS 100
#define KVU_PROBE_LOST_MS  1000
#define KVU_PROBE_PASSES   20

static ucs_status_t kvu_am_probe_cb(void *arg, const void *header,
                                    size_t hlen, void *data, size_t len,
                                    const ucp_am_recv_param_t *param)
{
    kvu_wk_t  *wk  = arg;
    kvu_ctx_t *ctx = wk->ctx;
    uint64_t   tok;

    (void)data;
    (void)len;
    (void)param; /* a rendezvous probe: UCS_OK drops it (kvu_am_on_request) */
    /* Progress thread, ctx lock held. Only the current worker's tokens
     * count; anything else (a forged or late probe) changes nothing. */
    if (header != NULL && hlen == sizeof(tok) &&
        wk == &ctx->wk[ctx->nwk - 1]) {
        memcpy(&tok, header, sizeof(tok));
        if (tok == ctx->probe_hdr) {
            ctx->probe_seen = tok;
        }
    }
    return UCS_OK;
}

/* kvu_fifo_connect: the probe's endpoint to wk[idx] (ctx lock held); 0
 * when shared memory cannot reach it (no sysv/posix lane: nothing to
 * watch). No endpoint of wk[idx] to the probe: UCX 1.13 aborts ("endpoint
 * reconfiguration not supported yet") with endpoints both ways between
 * the two; a worker's interfaces without endpoints are woken by their
 * event (UCX activates them on a message). */
static int kvu_fifo_connect(kvu_ctx_t *ctx, unsigned idx)
{
    ucp_ep_params_t ep;
    ucs_status_t    st;

    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address    = ctx->wk[idx].addr;
    ep.err_mode   = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(ctx->probe_worker, &ep, &ctx->probe_ep[idx]);
    if (st != UCS_OK) {
        ctx->probe_ep[idx] = NULL;
        kvc_log_debug("KVX-UCX-FIFO", "%s: no shared-memory probe (%s): "
                      "the receive-FIFO watchdog is off", ctx->name,
                      ucs_status_string(st));
        return 0;
    }
    return 1;
}

static void kvu_fifo_fini(kvu_ctx_t *ctx)
{
    ctx->probe_on = 0;
    if (ctx->probe_worker != NULL) {
        ucp_worker_destroy(ctx->probe_worker); /* and its endpoints */
        ctx->probe_worker = NULL;
    }
    if (ctx->probe_ucp != NULL) {
        ucp_cleanup(ctx->probe_ucp);
        ctx->probe_ucp = NULL;
    }
}

/* kvu_fifo_init starts the watchdog when ctx may use shared memory (best
 * effort: without it the context works as before). */
static void kvu_fifo_init(kvu_ctx_t *ctx)
{
    const char         *env = getenv("KVX_UCX_FIFO_WATCHDOG");
    ucp_config_t       *config;
    ucp_params_t        params;
    ucp_worker_params_t wp;

    if ((env != NULL && strcmp(env, "0") == 0) ||
        !kvu_tls_has_mm(ctx->tls) ||
        ucp_config_read(NULL, NULL, &config) != UCS_OK) {
        return;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features   = UCP_FEATURE_AM;
    params.name       = "kvxfer-fifo-probe";
    /* The probe only sends: a small receive pool (UCX's default grows
     * by 512 segments of 8 KiB, 4 MiB per transport), best effort (the
     * key needs its table's prefix: UCX 1.13 and 1.22 warned "invalid
     * configuration" at the bare RX_BUFS_GROW and ignored it). Its
     * FIFO's size and element size are the context's: it writes into the
     * worker's FIFO (only messages that fit an element: its receive
     * segments can stay UCX's). */
    (void)ucp_config_modify(config, "MM_RX_BUFS_GROW", "16");
    {
        const uint32_t v[3] = {ctx->mm.seg, ctx->mm.fifo, ctx->mm.elem};

        for (int f = 0; f < 3; f++) {
            char key[32], val[16];

            if (v[f] == UINT32_MAX) { /* a value kvxfer cannot read */
                ucp_config_release(config);
                kvc_log_debug("KVX-UCX-FIFO", "%s: FIFO geometry unknown: "
                              "the receive-FIFO watchdog is off", ctx->name);
                return;
            }
            /* its segments stay UCX's unless the worker's are smaller */
            if (v[f] == 0 || (f == 0 && v[f] >= KVU_MM_SEG_UCX)) {
                continue;
            }
            snprintf(key, sizeof(key), "MM_%s", kvu_mm_fields[f]);
            snprintf(val, sizeof(val), "%u", (unsigned)v[f]);
            if (ucp_config_modify(config, key, val) != UCS_OK) {
                ucp_config_release(config);
                kvc_log_debug("KVX-UCX-FIFO", "%s: %s=%s refused: the "
                              "receive-FIFO watchdog is off", ctx->name, key,
                              val);
                return;
            }
        }
    }
    if (ucp_config_modify(config, "TLS", "sysv,posix") != UCS_OK ||
        ucp_init(&params, config, &ctx->probe_ucp) != UCS_OK) {
        ctx->probe_ucp = NULL;
        ucp_config_release(config);
        kvc_log_debug("KVX-UCX-FIFO", "%s: no shared-memory probe context: "
                      "the receive-FIFO watchdog is off", ctx->name);
        return;
    }
    ucp_config_release(config);
    memset(&wp, 0, sizeof(wp));
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED; /* under ctx->lock */
    if (ucp_worker_create(ctx->probe_ucp, &wp, &ctx->probe_worker) !=
            UCS_OK) {
        ctx->probe_worker = NULL;
        kvu_fifo_fini(ctx);
        return;
    }
    if (!kvu_fifo_connect(ctx, 0)) {
        kvu_fifo_fini(ctx);
        return;
    }
    ctx->probe_on = 1;
}

/* kvu_fifo_retire: the current worker's FIFO is blocked; a new worker takes
 * its place (ctx lock held). Returns 1 when it did; the engine is told by
 * the progress thread (reset_pending), never from here: a caller of
 * kvu_ep_create may hold the engine's lock. */
static int kvu_fifo_retire(kvu_ctx_t *ctx, uint64_t now, const char *how)
{
    char         why[256];
    unsigned     idx = ctx->nwk;
    kvx_status_t status;
    unsigned     nfailed = 0;

    snprintf(why, sizeof(why), "this process's shared-memory receive FIFO "
             "is blocked (a peer killed while writing into it): endpoint "
             "retired with its worker");
    if (idx >= KVU_WORKERS_MAX) {
        ctx->probe_on = 0;
        kvc_log_error("KVX-UCX-FIFO", "%s: the shared-memory receive FIFO "
                      "is blocked again and %u workers were already "
                      "retired: no further recovery, shared-memory "
                      "transfers of this process time out until it "
                      "restarts", ctx->name, idx - 1);
        return 0;
    }
    status = kvu_worker_open(ctx, ctx->ucp, &ctx->wk[idx]);
    if (status != KVX_OK) {
        kvu_worker_close(&ctx->wk[idx]);
        ctx->probe_sent_us   = now; /* try again after another period */
        ctx->probe_sent_pass = ctx->passes;
        kvc_log_error("KVX-UCX-FIFO", "%s: the shared-memory receive FIFO "
                      "is blocked and no new worker could be created: %s",
                      ctx->name, kvc_last_error());
        return 0;
    }
    ctx->nwk       = idx + 1;
    ctx->worker    = ctx->wk[idx].worker;
    ctx->probe_hdr = 0; /* the next check probes the new worker */
    if (!kvu_fifo_connect(ctx, idx)) {
        ctx->probe_on = 0;
    }
    for (kvu_ep_t *ep = ctx->eps; ep != NULL; ep = ep->next) {
        if (ep->am_fifo && !ep->failed && !ep->closed) {
            ep->failed      = 1;
            ep->fail_status = KVX_ERR_ENDPOINT;
            snprintf(ep->fail_reason, sizeof(ep->fail_reason),
                     "UCX endpoint to %.50s failed: %.160s", ep->peer, why);
            ep->err_pending = 1;
            atomic_store(&ep->dead, 1);
            kvu_job_cancel_all(ep, KVX_ERR_ENDPOINT);
            nfailed++;
        }
    }
    atomic_fetch_add(&ctx->worker_resets, 1);
    ctx->reset_pending = 1;
    kvc_log_error("KVX-UCX-FIFO", "%s: %s (%s): worker %u retired, %u "
                  "shared-memory endpoints failed, new endpoints and "
                  "handshakes use worker %u", ctx->name, why, how, idx - 1,
                  nfailed, idx);
    return 1;
}

/* kvu_fifo_send sends a new token to the current worker (ctx lock held). */
static void kvu_fifo_send(kvu_ctx_t *ctx, uint64_t now)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    do {
        ctx->probe_hdr = kvu_random64();
    } while (ctx->probe_hdr == 0);
    ctx->probe_sent_us   = now;
    ctx->probe_sent_pass = ctx->passes;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = UCP_AM_SEND_FLAG_EAGER;
    sp = ucp_am_send_nbx(ctx->probe_ep[ctx->nwk - 1], KVU_AM_PROBE,
                         &ctx->probe_hdr, sizeof(ctx->probe_hdr), NULL, 0,
                         &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        ctx->probe_on = 0;
        kvc_log_warn("KVX-UCX-FIFO", "%s: probe send failed (%s): the "
                     "receive-FIFO watchdog is off", ctx->name,
                     ucs_status_string(UCS_PTR_STATUS(sp)));
    } else if (sp != NULL) {
        ucp_request_free(sp); /* released by UCX when it completes */
    }
}

/* kvu_fifo_verify: is the current worker's FIFO delivering? Sends a token
 * and progresses the worker until it arrives, or KVU_VERIFY_PASSES passes
 * and KVU_VERIFY_MS went by (ctx lock held). Only meaningful while an
 * endpoint keeps the worker's shared-memory interfaces progressed (UCX polls
 * an interface only then; otherwise it waits for the interface's event).
 * A healthy FIFO answers within a few passes; the window is as long as the
 * periodic verdict's, so a live peer descheduled inside a message (a
 * loaded machine) is not taken for a dead one: the wait costs up to 1 s of
 * the caller (the progress thread) only when the FIFO is blocked. */
#define KVU_VERIFY_PASSES 20
#define KVU_VERIFY_MS     KVU_PROBE_LOST_MS

static int kvu_fifo_verify(kvu_ctx_t *ctx)
{
    uint64_t t0 = kvc_mono_us();

    kvu_fifo_send(ctx, t0);
    for (unsigned pass = 1; ctx->probe_on; pass++) {
        ucp_worker_progress(ctx->probe_worker);
        ucp_worker_progress(ctx->worker);
        if (ctx->probe_seen == ctx->probe_hdr) {
            return 1;
        }
        if (pass >= KVU_VERIFY_PASSES &&
            kvc_mono_us() - t0 >= KVU_VERIFY_MS * 1000u) {
            return 0;
        }
    }
    return 1; /* no probe: nothing known */
}

/* kvu_fifo_check: the periodic probe (progress thread). */
static void kvu_fifo_check(kvu_ctx_t *ctx, uint64_t now)
{
    int reset = 0;

    pthread_mutex_lock(&ctx->lock);
    if (ctx->probe_on) {
        while (ucp_worker_progress(ctx->probe_worker) != 0) {
        }
        if (ctx->probe_hdr != 0 && ctx->probe_seen != ctx->probe_hdr) {
            if (now - ctx->probe_sent_us >= KVU_PROBE_LOST_MS * 1000u &&
                ctx->passes - ctx->probe_sent_pass >= KVU_PROBE_PASSES) {
                char how[64];

                snprintf(how, sizeof(how), "no probe delivered for %llu ms",
                         (unsigned long long)(now - ctx->probe_sent_us) /
                             1000);
                kvu_fifo_retire(ctx, now, how);
            }
        } else if (ctx->probe_hdr == 0 ||
                   now - ctx->probe_sent_us >= KVU_PROBE_EVERY_MS * 1000u) {
            kvu_fifo_send(ctx, now);
        }
    }
    reset              = ctx->reset_pending;
    ctx->reset_pending = 0;
    pthread_mutex_unlock(&ctx->lock);
    if (reset) {
        if (ctx->params.worker_reset != NULL) {
            ctx->params.worker_reset(ctx->params.worker_reset_arg);
        }
        kvu_ctx_kick(ctx);
    }
}

kvx_status_t kvu_ctx_create(const kvu_params_t *params, kvu_ctx_t **ctx_p)
{
    kvu_ctx_t   *ctx = calloc(1, sizeof(*ctx));
    kvx_status_t status;

    if (ctx == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu context: out of memory");
    }
    kvu_log_hold(); /* released by kvu_ctx_free */
    ctx->params = *params;
    snprintf(ctx->name, sizeof(ctx->name), "%s",
             params->name ? params->name : "kvxfer");
    ctx->params.name = ctx->name;
    snprintf(ctx->cpus, sizeof(ctx->cpus), "%s",
             params->cpus ? params->cpus : "");
    ctx->params.cpus = ctx->cpus;
    {
        unsigned major = 0, minor = 0, release = 0;

        ucp_get_version(&major, &minor, &release);
        ctx->ucx_ver = (major & 0xffu) << 8 | (minor & 0xffu);
    }
    if (params->inbound_set) {
        if (params->n_inbound > KVT_INBOUND_MAX ||
            (params->n_inbound > 0 && params->inbound == NULL)) {
            status = kvc_error(KVX_ERR_CONFIG, "trusted_remote_hosts: %zu "
                               "networks: at most %d", params->n_inbound,
                               KVT_INBOUND_MAX);
            kvu_log_release();
            free(ctx);
            return status;
        }
        if (params->n_inbound > 0) {
            memcpy(ctx->inbound, params->inbound,
                   params->n_inbound * sizeof(ctx->inbound[0]));
        }
    }
    ctx->params.inbound = ctx->inbound;
    if (ctx->params.max_inflight_bytes < 4096) {
        ctx->params.max_inflight_bytes = 16u << 20;
    }
    ctx->chunk = ctx->params.max_inflight_bytes / 8;
    if (ctx->chunk < 65536) {
        ctx->chunk = 65536;
    }
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->in_lock, NULL);
    pthread_mutex_init(&ctx->pass_lock, NULL);
    pthread_cond_init(&ctx->cond, NULL);
    ctx->amr_ep_max    = ctx->params.answers_max != 0
                             ? ctx->params.answers_max
                             : KVU_AMR_EP_MAX;
    ctx->amr_ep_bytes  = ctx->params.answers_bytes != 0
                             ? ctx->params.answers_bytes
                         : ctx->params.max_inflight_bytes < KVU_AMR_EP_BYTES / 2
                             ? KVU_AMR_EP_BYTES
                         : ctx->params.max_inflight_bytes < (1ull << 40)
                             ? 2 * ctx->params.max_inflight_bytes
                             : 2ull << 40;
    ctx->amr_max       = 4 * ctx->amr_ep_max;
    ctx->amr_max_bytes = ctx->amr_ep_bytes < KVU_AMR_BYTES / 4
                             ? KVU_AMR_BYTES
                             : 4 * ctx->amr_ep_bytes;
    ctx->am_key[0] = kvu_random64();
    ctx->am_key[1] = kvu_random64();
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->wakefd < 0) {
        status = kvc_error(KVX_ERR_INTERNAL, "eventfd: %s", strerror(errno));
        goto err;
    }
    status = kvu_ucp_init(ctx);
    if (status != KVX_OK) {
        goto err;
    }
    status = kvu_worker_init(ctx);
    if (status != KVX_OK) {
        goto err;
    }
    kvu_fifo_init(ctx);
    if (pthread_create(&ctx->thread, NULL, kvu_progress_main, ctx) != 0) {
        status = kvc_error(KVX_ERR_INTERNAL, "progress thread: %s",
                           strerror(errno));
        goto err;
    }
    ctx->thread_started = 1;
    *ctx_p = ctx;
    return KVX_OK;

err:
    kvu_ctx_free(ctx);
    return status;
}

void kvu_ctx_destroy(kvu_ctx_t *ctx)
{
    uint64_t deadline;

    if (ctx == NULL) {
        return;
    }
    deadline = kvc_mono_us() + KVU_CLOSE_WAIT_MS * 1000u;
    pthread_mutex_lock(&ctx->lock);
    while ((ctx->closing != NULL || ctx->eps != NULL) &&
           kvc_mono_us() < deadline) {
        struct timespec ts;

        kvc_abs_realtime(&ts, 10);
        pthread_mutex_unlock(&ctx->lock);
        kvu_ctx_kick(ctx);
        pthread_mutex_lock(&ctx->lock);
        pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts);
    }
    if (ctx->closing != NULL || ctx->eps != NULL) {
        kvc_log_warn("KVX-UCX-CLOSE", "%s: endpoints still closing after %d ms",
                     ctx->name, KVU_CLOSE_WAIT_MS);
    }
    pthread_mutex_unlock(&ctx->lock);
    atomic_store(&ctx->stop, 1);
    atomic_store(&ctx->lease_us, 0); /* no waiter comes back: wake it now */
    kvu_ctx_kick(ctx);
    if (ctx->thread_started) {
        pthread_join(ctx->thread, NULL);
    }
    while (ctx->in_head != NULL) { /* posted after the last pass */
        kvu_job_t *job = ctx->in_head;

        ctx->in_head = job->next;
        free(job->nt);
        free(job);
    }
    kvu_ctx_free(ctx);
}

int kvu_in_progress_thread(const kvu_ctx_t *ctx)
{
    return ctx != NULL && kvu_passing == ctx;
}

void kvu_worker_address(kvu_ctx_t *ctx, const void **addr_p, size_t *len_p)
{
    const kvu_wk_t *wk;

    pthread_mutex_lock(&ctx->lock);
    wk      = &ctx->wk[ctx->nwk - 1];
    *addr_p = wk->pub;
    *len_p  = wk->pub_len;
    pthread_mutex_unlock(&ctx->lock);
}

/* --- memory ------------------------------------------------------------- */

static kvx_status_t kvu_mem_finish(kvu_ctx_t *ctx, kvu_mem_t *mem)
{
    ucs_status_t st = ucp_rkey_pack(ctx->ucp, mem->memh, &mem->rkey_buf,
                                    &mem->rkey_len);

    if (st != UCS_OK) {
        ucp_mem_unmap(ctx->ucp, mem->memh);
        free(mem);
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_rkey_pack: %s",
                         ucs_status_string(st));
    }
    /* What peers get as the rkey: UCX's packed rkey, then the region's
     * random token, which kvxfer's active-message requests must carry
     * (kvu_am_find_mem): knowing an address is not enough; then the
     * protocol trailer (kvu_rkey_unpack checks it). */
    kvu_pub_trailer_t tr = {KVU_PUB_MAGIC, KVU_AM_VERSION, 0};

    mem->token   = kvu_random64();
    mem->pub_len = mem->rkey_len + sizeof(mem->token) + sizeof(tr);
    mem->pub     = malloc(mem->pub_len);
    if (mem->pub == NULL) {
        ucp_rkey_buffer_release(mem->rkey_buf);
        ucp_mem_unmap(ctx->ucp, mem->memh);
        free(mem);
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu rkey: out of memory");
    }
    memcpy(mem->pub, mem->rkey_buf, mem->rkey_len);
    memcpy(mem->pub + mem->rkey_len, &mem->token, sizeof(mem->token));
    memcpy(mem->pub + mem->rkey_len + sizeof(mem->token), &tr, sizeof(tr));
    return KVX_OK;
}

/* kvu_mem_list_add: peers' AM gets/puts may use mem from now on. */
static void kvu_mem_list_add(kvu_ctx_t *ctx, kvu_mem_t *mem)
{
    pthread_mutex_lock(&ctx->lock);
    mem->next = ctx->mems;
    ctx->mems = mem;
    pthread_mutex_unlock(&ctx->lock);
}

/* kvu_mem_prot: ucp_mem_map protection for the context's remote_access
 * (kvt.h); sets the field in mp unless it is the default. */
static void kvu_mem_prot(const kvu_ctx_t *ctx, ucp_mem_map_params_t *mp)
{
    unsigned prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE;

    switch (ctx->params.remote_access) {
    case KVT_ACCESS_READ:
        prot |= UCP_MEM_MAP_PROT_REMOTE_READ;
        break;
    case KVT_ACCESS_WRITE:
        prot |= UCP_MEM_MAP_PROT_REMOTE_WRITE;
        break;
    case KVT_ACCESS_LOCAL:
        break;
    default:
        return;
    }
    mp->field_mask |= UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp->prot        = prot;
}

kvx_status_t kvu_mem_register(kvu_ctx_t *ctx, void *base, size_t len,
                              int mem_type, kvu_mem_t **mem_p)
{
    ucp_mem_map_params_t mp;
    ucs_memory_type_t    mt = mem_type == KVX_MEM_ROCM ? UCS_MEMORY_TYPE_ROCM
                                                       : UCS_MEMORY_TYPE_HOST;
    kvu_mem_t           *mem;
    ucs_status_t         st;

    if (!(ctx->mem_types & UCS_BIT(mt))) {
        return kvc_error(KVX_ERR_DEVICE,
                         "mem_type %s: UCX %s in this process was built "
                         "without support for it (memory types mask 0x%llx); "
                         "refusing to register device memory as host memory",
                         mem_type == KVX_MEM_ROCM ? "rocm" : "host",
                         ucp_get_version_string(),
                         (unsigned long long)ctx->mem_types);
    }
    mem = calloc(1, sizeof(*mem));
    if (mem == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu mem: out of memory");
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask  = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                     UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                     UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address     = base;
    mp.length      = len;
    mp.memory_type = mt;
    kvu_mem_prot(ctx, &mp);
    pthread_mutex_lock(&ctx->lock);
    st = ucp_mem_map(ctx->ucp, &mp, &mem->memh);
    pthread_mutex_unlock(&ctx->lock);
    if (st != UCS_OK) {
        free(mem);
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_mem_map(%p, %zu): %s", base,
                         len, ucs_status_string(st));
    }
    mem->ctx  = ctx;
    mem->base = base;
    mem->len  = len;
    if (kvu_mem_finish(ctx, mem) != KVX_OK) {
        return KVX_ERR_TRANSPORT;
    }
    mem->host = mt == UCS_MEMORY_TYPE_HOST;
    kvu_mem_list_add(ctx, mem);
    *mem_p = mem;
    return KVX_OK;
}

kvx_status_t kvu_mem_alloc(kvu_ctx_t *ctx, size_t len, kvu_mem_t **mem_p,
                           void **ptr_p)
{
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t       ma;
    kvu_mem_t           *mem = calloc(1, sizeof(*mem));
    ucs_status_t         st;

    if (mem == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu mem: out of memory");
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address    = NULL;
    mp.length     = len;
    mp.flags      = UCP_MEM_MAP_ALLOCATE;
    kvu_mem_prot(ctx, &mp);
    st = ucp_mem_map(ctx->ucp, &mp, &mem->memh);
    if (st != UCS_OK) {
        free(mem);
        return kvc_error(KVX_ERR_NO_MEMORY, "ucp_mem_map(ALLOCATE %zu): %s",
                         len, ucs_status_string(st));
    }
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(mem->memh, &ma);
    if (st != UCS_OK) {
        ucp_mem_unmap(ctx->ucp, mem->memh);
        free(mem);
        return kvc_error(KVX_ERR_TRANSPORT, "ucp_mem_query: %s",
                         ucs_status_string(st));
    }
    mem->ctx  = ctx;
    mem->base = ma.address;
    mem->len  = len;
    if (kvu_mem_finish(ctx, mem) != KVX_OK) {
        return KVX_ERR_TRANSPORT;
    }
    mem->host = 1;
    kvu_mem_list_add(ctx, mem);
    *mem_p = mem;
    *ptr_p = mem->base;
    return KVX_OK;
}

void kvu_mem_release(kvu_mem_t *mem)
{
    if (mem == NULL) {
        return;
    }
    ucp_rkey_buffer_release(mem->rkey_buf);
    free(mem->pub);
    pthread_mutex_lock(&mem->ctx->lock);
    for (kvu_mem_t **pp = &mem->ctx->mems; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == mem) {
            *pp = mem->next;
            break;
        }
    }
    /* AM get replies carry their own copy of the data (kvu_amr_t). */
    ucp_mem_unmap(mem->ctx->ucp, mem->memh);
    pthread_mutex_unlock(&mem->ctx->lock);
    free(mem);
}

void *kvu_mem_base(const kvu_mem_t *mem)
{
    return mem->base;
}

size_t kvu_mem_length(const kvu_mem_t *mem)
{
    return mem->len;
}

void kvu_mem_rkey(const kvu_mem_t *mem, const void **buf_p, size_t *len_p)
{
    *buf_p = mem->pub;
    *len_p = mem->pub_len;
}

/* --- endpoints ---------------------------------------------------------- */

static void kvu_ep_err_handler(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    kvu_ep_t *ep = arg;

    (void)uep;
    /* Runs inside ucp_worker_progress with the ctx lock held. */
    if (!ep->failed) {
        ep->failed      = 1;
        ep->fail_status = KVX_ERR_ENDPOINT;
        snprintf(ep->fail_reason, sizeof(ep->fail_reason),
                 "UCX endpoint to %s failed: %s", ep->peer,
                 ucs_status_string(status));
        ep->err_pending = 1;
        atomic_store(&ep->dead, 1);
    }
    kvc_log_warn("KVX-UCX-EP-ERROR", "endpoint to %s: %s", ep->peer,
                 ucs_status_string(status));
    /* Queued jobs are canceled by kvu_ep_drain / kvu_deliver, never here:
     * UCX may call this handler from inside a post made by kvu_ep_drain,
     * which still holds the job it is issuing. */
}

static void kvu_wire_cb(void *request, ucs_status_t status, void *user_data)
{
    kvu_ep_t *ep = user_data;

    ep->wired        = 1;
    ep->wire_pending = 0;
    ep->wire_status  = status;
    ucp_request_free(request);
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
        kvc_log_warn("KVX-UCX-WIREUP", "wire-up with %s failed: %s",
                     ep->peer, ucs_status_string(status));
    } else {
        kvc_log_debug("KVX-UCX-WIREUP", "wire-up with %s: %s", ep->peer,
                      ucs_status_string(status));
    }
}

/* kvu_ep_query_names overwrites the parsed transport and device names with
 * those of UCX's query API, where the headers have it (meson checks
 * UCP_EP_ATTR_FIELD_TRANSPORTS). */
static void kvu_ep_query_names(kvu_ep_t *ep, kvu_lanes_t *lanes)
{
#ifdef KVU_HAVE_EP_QUERY_TRANSPORTS
    ucp_transport_entry_t ent[KVU_LANES_MAX];
    ucp_ep_attr_t         attr;
    const char           *tl[KVU_LANES_MAX], *dev[KVU_LANES_MAX];

    memset(&attr, 0, sizeof(attr));
    attr.field_mask             = UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports.entries     = ent;
    attr.transports.num_entries = KVU_LANES_MAX;
    attr.transports.entry_size  = sizeof(ent[0]);
    if (ucp_ep_query(ep->ep, &attr) != UCS_OK) {
        return;
    }
    for (unsigned i = 0; i < attr.transports.num_entries &&
                         i < KVU_LANES_MAX; i++) {
        tl[i]  = ent[i].transport_name ? ent[i].transport_name : "?";
        dev[i] = ent[i].device_name ? ent[i].device_name : "?";
    }
    if (kvu_lanes_set_names(lanes, tl, dev,
                            (int)attr.transports.num_entries) != 0) {
        kvc_log_warn("KVX-UCX-LANES", "endpoint to %s: ucp_ep_query reports "
                     "%u transports, ucp_ep_print_info %d lanes; the lane "
                     "names are those printed", ep->peer,
                     attr.transports.num_entries, lanes->n);
    }
#else
    (void)ep;
    (void)lanes;
#endif
}

/* kvu_ep_describe records the endpoint's lanes and which of them carry
 * one-sided operations (kvu_lanes.h: both print formats). */
static void kvu_ep_describe(kvu_ep_t *ep)
{
    char       *text = NULL;
    size_t      len  = 0;
    FILE       *f    = open_memstream(&text, &len);
    kvu_lanes_t lanes;

    memset(&lanes, 0, sizeof(lanes));
    if (f != NULL) {
        ucp_ep_print_info(ep->ep, f);
        fclose(f);
        kvc_log_debug("KVX-UCX-LANES", "endpoint to %s, ucp_ep_print_info "
                      "(UCX %s):\n%s", ep->peer, ucp_get_version_string(),
                      text != NULL ? text : "");
        kvu_lanes_parse(text != NULL ? text : "", &lanes);
        free(text);
    }
    kvu_ep_query_names(ep, &lanes);
    ep->emulated     = kvu_lanes_rma_emulated(&lanes);
    ep->rma_shm_only = kvu_lanes_rma_shm_only(&lanes);
    ep->rma_cma      = kvu_lanes_rma_shm_or(&lanes, "cma");
    ep->am_fifo      = kvu_lanes_am_fifo(&lanes);
    ep->am_putv      = ep->ctx->putv && !ep->am_fifo;
    ep->fifo_lane    = kvu_lanes_any_fifo(&lanes);
    ep->am_rma       = (ep->emulated && ep->ctx->am_rma) || ep->am_only;
    (void)kvu_lanes_format(&lanes, ep->transports, sizeof(ep->transports));
}

/* kvu_ep_wire_start starts the wire-up (a flush that completes once every
 * lane is connected) without waiting for it: the endpoint is usable at
 * once, operations posted meanwhile are queued by UCX and go out when the
 * lanes connect, so the first transfer overlaps the wire-up instead of
 * following it. The lanes are already selected (ucp_ep_create with a
 * worker address selects them from that address). A failed wire-up is an
 * endpoint error (err_cb), like any later failure. */
static kvx_status_t kvu_ep_wire_start(kvu_ep_t *ep)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send      = kvu_wire_cb;
    prm.user_data    = ep;
    sp = ucp_ep_flush_nbx(ep->ep, &prm);
    if (sp == NULL) {
        ep->wired = 1;
    } else if (UCS_PTR_IS_ERR(sp)) {
        ep->wired       = 1;
        ep->wire_status = UCS_PTR_STATUS(sp);
        return kvc_error(KVX_ERR_ENDPOINT, "UCX wire-up with %s failed: %s",
                         ep->peer, ucs_status_string(ep->wire_status));
    } else {
        ep->wire_pending = 1;
    }
    kvu_ctx_kick(ep->ctx);
    return KVX_OK;
}

/* kvu_ep_discard closes a UCP endpoint on which nothing was posted
 * (forced in peer error mode); its request, if any, is freed and
 * completes on its worker. ctx lock held. */
static void kvu_ep_discard(kvu_ctx_t *ctx, ucp_ep_h uep)
{
    ucs_status_ptr_t    cl;
    ucp_request_param_t cp;

    memset(&cp, 0, sizeof(cp));
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags        = ctx->params.err_mode_peer ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    cl              = ucp_ep_close_nbx(uep, &cp);
    if (UCS_PTR_IS_PTR(cl)) {
        ucp_request_free(cl);
    }
}

/* kvu_ep_connect creates ep->ep on the first pair of a local worker and
 * a peer address entry (kvu_addr_entries) that reach each other: this
 * context's RMA worker (the only one unless split) to the peer's first
 * entry, then to its tcp plane; then this context's tcp plane to the
 * peer's tcp plane, then to its first entry. Whatever ends on a worker
 * that serves no UCX RMA at either end (a tcp plane, a tcp-only context:
 * KVU_ADDR_NO_RMA) moves data over kvxfer's active messages (am_only).
 * Pairs without a common transport fail in ucp_ep_create (lane selection
 * is synchronous); UCX's complaints about them are logged at debug level.
 * ctx lock held. */
static ucs_status_t kvu_ep_connect(kvu_ctx_t *ctx, kvu_ep_t *ep,
                                   ucp_ep_params_t *prm,
                                   const void *const *ent,
                                   const uint32_t *flags, unsigned nent)
{
    static const struct {
        int      tcp;
        unsigned e;
    } order[] = {{0, 0}, {0, 1}, {1, 1}, {1, 0}};
    ucs_status_t st = UCS_ERR_UNREACHABLE;

    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        if (order[i].e >= nent || (order[i].tcp && !ctx->split)) {
            continue;
        }
        prm->address = ent[order[i].e];
        kvu_log_quiet(1);
        st = ucp_ep_create(order[i].tcp ? ctx->wkt.worker : ctx->worker, prm,
                           &ep->ep);
        kvu_log_quiet(0);
        if (st == UCS_OK) {
            int local_big = order[i].tcp ? ctx->big_rx_tcp : ctx->big_rx_main;

            ep->am_only = order[i].tcp ||
                          (flags[order[i].e] & KVU_ADDR_NO_RMA) || !ctx->rma;
            /* A message travels as one tcp segment when the sender's are
             * large (kvu_settings_auto): it must fit the receiver's. */
            ep->am_get_max = local_big ? KVU_AM_MAX_LEN : KVU_AM_SMALL_LEN;
            ep->am_put_max = (flags[order[i].e] & KVU_ADDR_BIG_RX)
                                 ? KVU_AM_MAX_LEN : KVU_AM_SMALL_LEN;
            return UCS_OK;
        }
        kvc_log_debug("KVX-UCX-EP", "%s: %s worker to %s's entry %u: %s",
                      ctx->name, order[i].tcp ? "tcp-plane" : "RMA",
                      ep->peer, order[i].e, ucs_status_string(st));
    }
    ep->ep = NULL;
    return st;
}

kvx_status_t kvu_ep_create(kvu_ctx_t *ctx, const void *addr, size_t len,
                           const char *peer_name, kvu_ep_err_fn err_cb,
                           void *err_arg, kvu_ep_t **ep_p)
{
    ucp_ep_params_t ep_params;
    kvu_ep_t       *ep;
    kvx_status_t    status;
    ucs_status_t    st;
    const void     *ent[KVU_ADDR_MAX];
    size_t          ent_len[KVU_ADDR_MAX];
    uint32_t        flags[KVU_ADDR_MAX];
    unsigned        nent;

    status = kvu_addr_entries(addr, len, ent, ent_len, flags, &nent);
    if (status != KVX_OK) {
        char why[384];

        snprintf(why, sizeof(why), "%s", kvc_last_error());
        return kvc_error(status, "endpoint to %s: %s", peer_name, why);
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu ep: out of memory");
    }
    ep->ctx     = ctx;
    ep->err_cb  = err_cb;
    ep->err_arg = err_arg;
    snprintf(ep->peer, sizeof(ep->peer), "%s", peer_name);
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.err_mode        = ctx->params.err_mode_peer
                                    ? UCP_ERR_HANDLING_MODE_PEER
                                    : UCP_ERR_HANDLING_MODE_NONE;
    ep_params.err_handler.cb  = kvu_ep_err_handler;
    ep_params.err_handler.arg = ep;
    pthread_mutex_lock(&ctx->lock);
    st = kvu_ep_connect(ctx, ep, &ep_params, ent, flags, nent);
    if (st != UCS_OK) {
        pthread_mutex_unlock(&ctx->lock);
        free(ep);
        return kvc_error(KVX_ERR_ENDPOINT,
                         "ucp_ep_create to %s: %s (no transport of ucx_tls "
                         "'%s' reaches the peer's %u published worker%s; "
                         "error mode %s: a transport set without "
                         "peer-failure support cannot be used in peer mode)",
                         peer_name, ucs_status_string(st),
                         ctx->params.tls ? ctx->params.tls : "", nent,
                         nent == 1 ? "" : "s",
                         ctx->params.err_mode_peer ? "peer" : "none");
    }
    kvu_ep_describe(ep);
    if (ep->fifo_lane) {
        kvu_mm_geo_t pgeo;
        unsigned     pucx;
        char         why[384];

        kvu_addr_geo(addr, &pucx, &pgeo);
        if (!kvu_mm_geo_match(&ctx->mm, ctx->ucx_ver, &pgeo, pucx, why,
                              sizeof(why))) {
            /* Closed before anything of kvxfer's was sent on it. */
            status = kvc_error(KVX_ERR_PEER_INCOMPATIBLE, "endpoint to %s "
                               "over %s: %s", peer_name, ep->transports, why);
            kvu_ep_discard(ctx, ep->ep);
            pthread_mutex_unlock(&ctx->lock);
            kvu_ctx_kick(ctx);
            free(ep);
            return status;
        }
    }
    /* A new shared-memory endpoint first checks that this worker's FIFO
     * delivers (the endpoint keeps its interface polled, so the probe's
     * verdict is reliable): after a peer was killed mid-message, the
     * endpoint to its successor is then made on a new worker instead of
     * failing with the old one (kvu_fifo_*). */
    if (ep->am_fifo && ctx->probe_on && !kvu_fifo_verify(ctx) &&
        kvu_fifo_retire(ctx, kvc_mono_us(), "a probe sent when an "
                        "endpoint was created was not delivered")) {
        kvu_ep_discard(ctx, ep->ep); /* completes on the retired worker */
        /* Whatever the first endpoint's error handler recorded during the
         * probe is not this endpoint's. */
        ep->failed       = 0;
        ep->err_pending  = 0;
        ep->fail_status  = KVX_OK;
        ep->fail_reason[0] = '\0';
        atomic_store(&ep->dead, 0);
        st = ucp_ep_create(ctx->worker, &ep_params, &ep->ep);
        if (st != UCS_OK) {
            pthread_mutex_unlock(&ctx->lock);
            kvu_ctx_kick(ctx);
            free(ep);
            return kvc_error(KVX_ERR_ENDPOINT, "ucp_ep_create to %s on a new "
                             "worker: %s", peer_name, ucs_status_string(st));
        }
        kvu_ep_describe(ep);
        kvu_ctx_kick(ctx); /* the progress thread tells the engine */
    }
    ep->next = ctx->eps;
    ctx->eps = ep;
    status   = kvu_ep_wire_start(ep);
    pthread_mutex_unlock(&ctx->lock);
    if (status != KVX_OK) {
        ep->err_cb = NULL;
        kvu_ep_close(ep);
        return status;
    }
    kvc_log_info("KVX-UCX-EP", "%s: endpoint to %s uses %s%s", ctx->name,
                 ep->peer, ep->transports,
                 !ep->emulated ? ""
                 : ep->am_rma ? " (no RMA lane: gets/puts over kvxfer active "
                                "messages)"
                              : " (RMA emulated over active messages)");
    *ep_p = ep;
    return KVX_OK;
}

/* kvu_ep_close_locked closes the UCP endpoint (ctx lock held). In peer
 * mode it force-closes: called once a graceful close's flush completed
 * (nothing outstanding: the peer sees a plain disconnect), or for an
 * endpoint that failed or outlived the drain deadline (requests complete as
 * canceled). Error mode none allows only the flushing close. */
static void kvu_ep_close_locked(kvu_ep_t *ep)
{
    kvu_ctx_t          *ctx = ep->ctx;
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    if (ep->ep == NULL) {
        return;
    }
    /* Unanswered AM gets/puts: any answer is dropped from now on. */
    kvu_am_cancel_ep(ep, ep->failed ? ep->fail_status : KVX_ERR_CANCELED);
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = ctx->params.err_mode_peer ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    sp     = ucp_ep_close_nbx(ep->ep, &prm);
    ep->ep = NULL;
    if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
        ep->close_req = sp;
    }
}

static void kvu_close_flush_cb(void *request, ucs_status_t status,
                               void *user_data)
{
    kvu_ep_t *ep = user_data;

    (void)status;
    ep->close_flush = NULL;
    ucp_request_free(request);
}

/* kvu_ep_close_start (ctx lock held) begins closing a detached endpoint.
 * A healthy one is flushed first: every operation already handed to UCX
 * completes at the origin and at the target (emulated RMA: the peer has
 * sent its last get reply or put acknowledgement). Closing under a peer
 * that still owes replies makes UCX 1.13 abort the PEER process (its
 * internal reply requests have no error path: ucp_request_try_send
 * "Fatal: unexpected error", tcp pending purge assertion). The reaper
 * closes once the flush is done, at the latest after KVU_DRAIN_MS. A
 * failed endpoint is closed at once. */
static void kvu_ep_close_start(kvu_ep_t *ep)
{
    ucp_request_param_t prm;
    ucs_status_ptr_t    sp;

    if (ep->ep == NULL) {
        return;
    }
    if (!ep->failed) {
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                           UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.send      = kvu_close_flush_cb;
        prm.user_data    = ep;
        sp = ucp_ep_flush_nbx(ep->ep, &prm);
        if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
            ep->close_flush = sp;
            ep->close_by_us = kvc_mono_us() + KVU_DRAIN_MS * 1000u;
            return;
        }
    }
    kvu_ep_close_locked(ep);
}

void kvu_ep_close(kvu_ep_t *ep)
{
    kvu_ctx_t *ctx;

    if (ep == NULL) {
        return;
    }
    ctx = ep->ctx;
    pthread_mutex_lock(&ctx->lock);
    /* An error callback being delivered may still use ep: wait for it,
     * unless we are that callback (the pass owner). */
    while (ctx->delivering && kvu_passing != ctx) {
        pthread_cond_wait(&ctx->cond, &ctx->lock);
    }
    ep->closed = 1;
    atomic_store(&ep->dead, 1);
    kvu_job_cancel_all(ep, KVX_ERR_CANCELED);
    kvu_ep_close_start(ep);
    for (kvu_ep_t **pp = &ctx->eps; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == ep) {
            *pp = ep->next;
            break;
        }
    }
    ep->err_pending = 0;
    ep->next        = ctx->closing;
    ctx->closing    = ep;
    pthread_mutex_unlock(&ctx->lock);
    kvu_ctx_kick(ctx);
}

void kvu_ep_fail(kvu_ep_t *ep, kvx_status_t status, const char *reason)
{
    kvu_ctx_t *ctx = ep->ctx;

    pthread_mutex_lock(&ctx->lock);
    if (!ep->failed && !ep->closed) {
        ep->failed      = 1;
        ep->fail_status = status;
        snprintf(ep->fail_reason, sizeof(ep->fail_reason), "%s", reason);
        ep->err_pending = 1;
        atomic_store(&ep->dead, 1);
        kvu_job_cancel_all(ep, status);
    }
    pthread_mutex_unlock(&ctx->lock);
    kvu_ctx_kick(ctx);
}

int kvu_ep_failed(kvu_ep_t *ep)
{
    int failed;

    pthread_mutex_lock(&ep->ctx->lock);
    failed = ep->failed;
    pthread_mutex_unlock(&ep->ctx->lock);
    return failed;
}

const char *kvu_ep_transports(const kvu_ep_t *ep)
{
    return ep->transports;
}

/* kvu_ctx_counter reads a counter the progress thread keeps under lock. */
static uint64_t kvu_ctx_counter(kvu_ctx_t *ctx, const uint64_t *counter)
{
    uint64_t n;

    pthread_mutex_lock(&ctx->lock);
    n = *counter;
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

uint64_t kvu_am_dropped_answers(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->am_dropped);
}

uint64_t kvu_am_unanswered(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->amr_unsent);
}

uint64_t kvu_am_answered(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->amr_sent);
}

uint64_t kvu_am_answers_in_flight(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->amr_n);
}

uint64_t kvu_am_late_copied(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->am_late_copied);
}

uint64_t kvu_ptr_copied(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->ptr_copied);
}

uint64_t kvu_am_putv_sent(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->am_putv);
}

int kvu_ep_rma_emulated(const kvu_ep_t *ep)
{
    return ep->emulated;
}

int kvu_rkey_direct(const kvu_rkey_t *rkey, uint64_t addr)
{
    void        *ptr = NULL;
    ucs_status_t st;

    /* A shared-memory RMA lane copies directly only when the peer's memory
     * was allocated by UCX (its rkey then maps locally); otherwise UCX 1.13
     * emulates the operation (research/ucx.md §0.2). */
    if (rkey->rkey == NULL) { /* an active-message-only endpoint */
        return 0;
    }
    pthread_mutex_lock(&rkey->ep->ctx->lock);
    st = ucp_rkey_ptr(rkey->rkey, addr, &ptr);
    pthread_mutex_unlock(&rkey->ep->ctx->lock);
    return st == UCS_OK;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

void *kvu_rkey_local(const kvu_rkey_t *rkey, uint64_t addr)
{
    void        *ptr = NULL;
    ucs_status_t st;

    if (rkey->rkey == NULL) {
        return NULL;
    }
    pthread_mutex_lock(&rkey->ep->ctx->lock);
    st = ucp_rkey_ptr(rkey->rkey, addr, &ptr);
    pthread_mutex_unlock(&rkey->ep->ctx->lock);
    return st == UCS_OK ? ptr : NULL;
}

void kvu_prefault(void *ptr, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start, end;

    if (ptr == NULL || len == 0) {
        return;
    }
    /* Best effort: kernels before 5.14 lack MADV_POPULATE_READ, and a
     * segment detached meanwhile (peer failed) just makes this fail. */
    start = (uintptr_t)ptr & ~(page - 1);
    end   = ((uintptr_t)ptr + len + page - 1) & ~(page - 1);
    (void)madvise((void *)start, end - start, MADV_POPULATE_READ);
}

size_t kvu_rkey_prefault(kvu_rkey_t *rkey, uint64_t addr, size_t len)
{
    kvu_ctx_t *ctx;
    void      *ptr = NULL;
    uintptr_t  lo = 0, hi = 0;

    if (rkey == NULL || rkey->rkey == NULL || len == 0) {
        return 0;
    }
    ctx = rkey->ep->ctx;
    pthread_mutex_lock(&ctx->lock);
    if (ucp_rkey_ptr(rkey->rkey, addr, &ptr) == UCS_OK) {
        if (rkey->map_state == 0) {
            kvu_rkey_map(ctx, rkey, (uintptr_t)ptr);
        }
        if (rkey->map_state == 1) {
            lo = rkey->map_lo;
            hi = rkey->map_hi;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    /* The mapping stays while the rkey does (the caller holds it). */
    if ((uintptr_t)ptr < lo || (uintptr_t)ptr >= hi) {
        return 0;
    }
    if (len > hi - (uintptr_t)ptr) {
        len = hi - (uintptr_t)ptr;
    }
    kvu_prefault(ptr, len);
    return len;
}

int kvu_ep_rma_shm_only(const kvu_ep_t *ep)
{
    return ep->rma_shm_only;
}

void kvu_ep_set_session(kvu_ep_t *ep, uint64_t session)
{
    ep->session = session;
}

const char *kvu_ep_peer(const kvu_ep_t *ep)
{
    return ep->peer;
}

/* --- rkeys and posting -------------------------------------------------- */


kvx_status_t kvu_rkey_unpack(kvu_ep_t *ep, const void *buf, size_t len,
                             kvu_rkey_t **rkey_p)
{
    kvu_rkey_t       *rk;
    kvu_pub_trailer_t tr;
    ucs_status_t      st;
    const size_t      tail = sizeof(rk->token) + sizeof(tr);

    /* kvu_mem_finish's layout: UCX's packed rkey, the 8-byte token, the
     * protocol trailer. */
    if (len <= tail) {
        return kvc_error(KVX_ERR_HANDSHAKE, "rkey from %s: %zu bytes, want "
                         "more than %zu (UCX's rkey, kvxfer's token and "
                         "protocol trailer)", ep->peer, len, tail);
    }
    memcpy(&tr, (const uint8_t *)buf + len - sizeof(tr), sizeof(tr));
    if (tr.magic != KVU_PUB_MAGIC) {
        return kvc_error(KVX_ERR_PEER_VERSION, "rkey from %s: no kvxfer "
                         "data-plane protocol trailer (not a kvxfer rkey, "
                         "or a kvxfer build older than data-plane protocol "
                         "4); this build speaks protocol %d: run the same "
                         "kvxfer on both sides", ep->peer, KVU_AM_VERSION);
    }
    if (tr.version != KVU_AM_VERSION) {
        return kvc_error(KVX_ERR_PEER_VERSION, "rkey from %s: the peer "
                         "speaks kvxfer data-plane protocol %u, this build "
                         "speaks %d: run the same kvxfer on both sides",
                         ep->peer, (unsigned)tr.version, KVU_AM_VERSION);
    }
    rk = calloc(1, sizeof(*rk));
    if (rk == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu rkey: out of memory");
    }
    memcpy(&rk->token, (const uint8_t *)buf + len - tail,
           sizeof(rk->token));
    /* An active-message-only endpoint (a tcp plane at either end) never
     * hands the rkey to UCX: only its token is used. */
    pthread_mutex_lock(&ep->ctx->lock);
    st = ep->ep == NULL ? UCS_ERR_NOT_CONNECTED
         : ep->am_only  ? UCS_OK
                        : ucp_ep_rkey_unpack(ep->ep, buf, &rk->rkey);
    pthread_mutex_unlock(&ep->ctx->lock);
    if (st != UCS_OK) {
        free(rk);
        return kvc_error(KVX_ERR_HANDSHAKE, "rkey from %s: unpack failed: %s",
                         ep->peer, ucs_status_string(st));
    }
    rk->ep  = ep;
    *rkey_p = rk;
    return KVX_OK;
}

/* kvu_rkey_cancel_jobs: the jobs posted through rkey that are not done
 * issuing end as canceled (ctx lock held), so that none copies through
 * it, or hands it to UCX, once it is destroyed: the engine destroys a
 * peer's rkeys before it closes the endpoint, and a pass can run between
 * the two. Returns how many. */
static unsigned kvu_rkey_cancel_jobs(kvu_rkey_t *rkey)
{
    kvu_ep_t  *ep  = rkey->ep;
    kvu_ctx_t *ctx = ep->ctx;
    kvu_job_t *job, *next, *head = NULL, *tail = NULL;
    unsigned   n = 0;

    (void)kvu_take_incoming(ctx); /* posted ones join their queues */
    for (job = ep->qhead; job != NULL; job = next) {
        next      = job->next;
        job->next = NULL;
        if (job->nt == NULL && job->krkey == rkey) {
            kvu_job_cancel(ctx, job, KVX_ERR_CANCELED);
            n++;
            continue;
        }
        if (tail != NULL) {
            tail->next = job;
        } else {
            head = job;
        }
        tail = job;
    }
    ep->qhead = head;
    ep->qtail = tail;
    return n;
}

void kvu_rkey_destroy(kvu_rkey_t *rkey)
{
    if (rkey == NULL) {
        return;
    }
    if (rkey->rkey != NULL) {
        kvu_ctx_t *ctx = rkey->ep->ctx;
        unsigned   n;

        pthread_mutex_lock(&ctx->lock);
        n = kvu_rkey_cancel_jobs(rkey);
        if (rkey->ep->inflight_reqs > 0) {
            /* Requests of this endpoint are with UCX, and one of them may
             * read this rkey (a put or get pending for send resources, on
             * an RDMA lane for example): it is destroyed once none is out
             * (kvu_rkeys_reap), at the latest when the endpoint's close
             * completed them. No new job can reach it: the owner lets go
             * of the handle now, and its queued jobs were canceled. */
            rkey->dead_next       = rkey->ep->dead_rkeys;
            rkey->ep->dead_rkeys = rkey;
            ctx->rkeys_held++;
            pthread_mutex_unlock(&ctx->lock);
            kvu_ctx_kick(ctx);
            return;
        }
        ucp_rkey_destroy(rkey->rkey);
        pthread_mutex_unlock(&ctx->lock);
        if (n > 0) {
            kvu_ctx_kick(ctx); /* their ops complete at the next pass */
        }
    }
    free(rkey);
}

uint64_t kvu_rkeys_held(kvu_ctx_t *ctx)
{
    return kvu_ctx_counter(ctx, &ctx->rkeys_held);
}

uint64_t kvu_ep_reqs_in_flight(kvu_ep_t *ep)
{
    return kvu_ctx_counter(ep->ctx, &ep->inflight_reqs);
}

kvx_status_t kvu_post(kvu_ep_t *ep, int is_put, kvu_mem_t *local_mem,
                      uint64_t local_base, kvu_rkey_t *rkey,
                      uint64_t remote_base, const kvc_run_t *runs, size_t n,
                      kvu_op_t *op)
{
    kvu_job_t *job;

    if (ep->am_only && !local_mem->host) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED, "%s to %s: device memory "
                         "over %s: kvxfer carries such data as its own "
                         "checked active messages, which copy host memory "
                         "only (UCX's RMA there would serve any address to "
                         "anyone who reaches the port); give ucx_tls an "
                         "RDMA transport that reaches the peer (or set "
                         "KVX_UCX_AM_RMA=0 on both sides to let UCX "
                         "emulate RMA, with that exposure)",
                         is_put ? "put" : "get", ep->peer, ep->transports);
    }
    job = calloc(1, sizeof(*job));
    if (job == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu post: out of memory");
    }
    job->op          = op;
    job->is_put      = is_put;
    job->local_base  = local_base;
    job->memh        = local_mem->memh;
    job->rkey        = rkey->rkey;
    job->krkey       = rkey;
    job->token       = rkey->token;
    job->local_host  = local_mem->host;
    job->remote_base = remote_base;
    job->runs        = runs;
    job->n           = n;
    atomic_store(&op->remaining, 1);
    atomic_store(&op->status, 0);
    op->bytes = 0;
    op->am_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        op->bytes += runs[i].len;
    }
    return kvu_enqueue(ep, job);
}

kvx_status_t kvu_flush(kvu_ep_t *ep, kvu_op_t *op)
{
    kvu_job_t *job = calloc(1, sizeof(*job));

    if (job == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "kvu flush: out of memory");
    }
    job->op       = op;
    job->is_flush = 1;
    atomic_store(&op->remaining, 1);
    atomic_store(&op->status, 0);
    op->bytes    = 0;
    op->am_bytes = 0;
    return kvu_enqueue(ep, job);
}

static kvx_status_t kvu_enqueue(kvu_ep_t *ep, kvu_job_t *job)
{
    kvu_ctx_t *ctx = ep->ctx;

    if (atomic_load(&ep->dead)) {
        free(job->nt);
        free(job);
        return kvc_error(KVX_ERR_ENDPOINT, "post to %s: endpoint %s",
                         ep->peer, ep->failed ? ep->fail_reason : "closed");
    }
    job->ep = ep;
    /* The progress thread issues the runs: posting returns at once even
     * where UCX completes an operation inside the call (shared-memory
     * copies), and the caller never pays for the copy nor waits for the
     * progress lock. */
    pthread_mutex_lock(&ctx->in_lock);
    if (ctx->in_tail != NULL) {
        ctx->in_tail->next = job;
    } else {
        ctx->in_head = job;
    }
    ctx->in_tail = job;
    pthread_mutex_unlock(&ctx->in_lock);
    kvu_ctx_kick(ctx);
    return KVX_OK;
}
