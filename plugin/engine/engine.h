/*
 * engine.h - the connector core: one engine per rank (SPEC §1-§11). The
 * objects, their owners and threads are described in README.md beside this
 * file.
 *
 * Locking: one engine lock (eng->lock) guards every field below that is not
 * marked otherwise. Lock order is engine lock -> a transport's own locks;
 * transports deliver completions, endpoint errors, replies, requests, ticks
 * and deferred jobs without their locks held and never inside the call that
 * submitted the work (kvt.h), so the callbacks here take the engine lock.
 * The engine has no thread of its own: a peer's work (dialling, handshakes,
 * queued control messages) runs as jobs on the data plane's progress owner.
 *
 * Ownership: the engine owns layers, peers, transfers and events; transfers
 * are named by transfer_id and looked up under the lock (a late call gets
 * KVX_ERR_NOT_FOUND, never a dangling pointer).
 */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include "addr.h"
#include "config.h"
#include "ctlmsg.h"
#include "latency.h"
#include "layout.h"
#include "mode.h"
#include "siphash.h" /* kvc_xfer_tag */
#include "timerq.h"
#include "kvt.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct kvc_layer {
    char       name[KVC_LAYER_NAME_MAX];
    void      *base;
    size_t     length;
    int        mem_type;
    kvc_geom_t geom;
    kvt_mem_t *mem;       /* owned if mem_owned, else the region's */
    int        mem_owned;
} kvc_layer_t;

typedef struct kvc_region {
    void              *ptr;
    kvt_mem_t         *mem;  /* owned */
    struct kvc_region *next;
} kvc_region_t;

typedef enum kvc_peer_state {
    KVC_PEER_NEW = 0,
    KVC_PEER_HANDSHAKING,
    KVC_PEER_READY,
    KVC_PEER_FAILED,
} kvc_peer_state_t;

typedef struct kvc_ctlout {
    struct kvc_peer   *peer;
    char              *buf;   /* owned */
    uint64_t           t_queued;
    size_t             len;
    char               what[64];
    kvc_msg_type_t     type;            /* of the message, 0 if unknown */
    char               tid[KVX_ID_MAX]; /* its transfer id */
    uint64_t           xnonce;          /* its xfer_nonce (0: none) */
    struct kvc_ctlout *next;
} kvc_ctlout_t;

struct kvc_xfer;

/* kvc_peer_t: one rank of a remote instance. */
/* Refusal counters (stats "refused"): where and why. */
typedef enum kvc_port {
    KVC_PORT_HANDSHAKE = 0, /* requests on this engine's handshake port */
    KVC_PORT_NOTIFY,        /* messages on this engine's notify port */
    KVC_PORT_HS_REPLY,      /* replies to this engine's handshakes */
    KVC_PORT_N
} kvc_port_t;

typedef enum kvc_refusal {
    KVC_REFUSE_UNTRUSTED_HOST = 0, /* sender not in trusted_remote_hosts */
    KVC_REFUSE_BAD_MESSAGE,        /* does not decode */
    KVC_REFUSE_NOT_ACCEPTED,       /* the mode takes no such message */
    KVC_REFUSE_WRONG_PEER,         /* not from the transfer's peer */
    KVC_REFUSE_BAD_METADATA,       /* lengths / limits in peer metadata */
    KVC_REFUSE_OTHER_ENGINE,       /* reply names another engine */
    KVC_REFUSE_N
} kvc_refusal_t;

typedef struct kvc_peer {
    struct kvx_engine *eng;
    char              host[KVC_HOST_MAX];
    uint32_t          hs_port;      /* the rank's own handshake port */
    uint32_t          notify_port;  /* the rank's own notify port */
    uint32_t          dp_rank, tp_rank, dp_size, tp_size; /* expected */
    char              name[KVC_HOST_MAX + 32]; /* "host:port(dpX,tpY)" */
    kvc_peer_state_t  state;
    char              rma_mode[16];  /* rma | direct-shm | emulated */
    int               want_handshake;
    uint32_t          hs_stale;     /* replies of another instance in a row
                                       (KVC_HS_STALE_RETRIES) */
    uint64_t          ctl_retry_us; /* control-only: no handshake before */
    uint64_t          dp_off_until; /* control-only: its endpoint not used
                                       before (kvc_write_d_dp_timeout) */
    uint32_t          dp_unconfirmed; /* control-only: remote_blocks sent
                                         on its endpoint whose rank has not
                                         completed (KVC_DP_UNCONFIRMED_MAX) */
    int               count_off;    /* P WRITE: puts to this D rank went
                                       by RMA UCX moves itself, which it
                                       cannot count: no more counted
                                       notices to it (mode_write_push.c) */
    kvx_status_t      fail_status;
    char              fail_reason[KVX_REASON_MAX];
    kvc_hs_meta_t     meta;         /* valid when READY */
    uint64_t          inst;         /* the peer's instance id as last seen
                                       (handshake, replies); 0 unknown */
    uint64_t          dead_inst[4]; /* instances replaced by another one
                                       (a restart), newest last */
    uint32_t          ndead;
    uint64_t          lost_inst;    /* during mode->peer_failed: the
                                       instance that is gone (transfers
                                       bound to another one live on) */
    uint64_t          new_inst;     /* a request or message claims this
                                       instance, not inst: checked with the
                                       peer on the progress owner
                                       (kvc_peers_check_conn) */
    uint64_t          claimed_inst; /* that claim, until the peer's next
                                       reply or handshake settles it
                                       (kvc_peer_claim_settle) */
    int               claim_settled; /* one was settled: the tick pumps
                                        the peer's transfers */
    uint64_t          claim_us;     /* when the tick took the claim: only
                                       replies to messages queued since
                                       settle it */
    /* Written by the control plane's watch callback (no engine lock). */
    _Atomic uint64_t  conn_down_us; /* control connection lost at (0: up
                                       or never connected) */
    _Atomic int       conn_up_evt;  /* it came back up: verify instance */
    _Atomic int       conn_ups;     /* connections seen (the first is no
                                     * reconnect) */
    int               conn_gone;    /* lost for longer than the grace:
                                       reported, until it comes back */
    int               lost_by_ctl;  /* set while kvc_peer_lost runs for
                                       that loss alone: the process may
                                       live and put on over the data plane
                                       (a cut control network) */
    int               dp_dead;      /* its data-plane endpoint failed
                                       (kvc_peer_ctl_lost) since its last
                                       handshake: with the control
                                       connection of that instance
                                       (dp_dead_inst) lost too, the process
                                       is taken as gone */
    uint64_t          dp_dead_inst;
    kvt_ep_t         *watch_ep;     /* D WRITE: the data-plane endpoint of
                                       a peer lost on the control plane
                                       alone, kept open so that its failure
                                       (UCX's keepalive) tells a dead
                                       process from a cut network; closed
                                       when the peer handshakes again or
                                       the engine stops; watch_inst: the
                                       instance it reaches */
    uint64_t          watch_inst;
    int               inst_unconfirmed; /* declared gone: every transfer
                                        bound to inst failed; the next
                                        instance that answers is adopted,
                                        not taken for a restart */
    kvt_ep_t         *ep;           /* owned, READY */
    char              seen_as[KVC_SEEN_AS_MAX]; /* this engine's address as
                                       the peer saw its handshake (its
                                       reply's seen_as; "" unknown): READ
                                       releases on the data plane */
    kvt_rkey_t      **rkeys;        /* per remote layer, READY */
    int              *layer_map;    /* local layer -> remote layer */
    kvc_ctlout_t     *out_head, *out_tail;
    /* The peer's work (dialling, starting a handshake, posting queued
     * control messages) runs as a job on the progress owner, so API calls
     * only queue; the handshake reply is processed there too. */
    kvt_job_t         job;          /* kvc_peer_service */
    int               job_queued;
    kvt_job_t         hs_job;       /* kvc_peer_hs_finish */
    int               hs_job_queued;
    char             *hs_reply;     /* handshake reply, owned until
                                       processed */
    size_t            hs_reply_len;
    kvx_status_t      hs_status;
    char              hs_err[KVX_REASON_MAX];
    uint64_t          hs_t0;
    int               drop_out;     /* stopping and the peer is unreachable */
    int               prefault;     /* direct-shm segments to map in */
    uint32_t          pf_layer;     /* prefault cursor */
    uint64_t          pf_off;
    int               notify_failed; /* the notify client cannot be opened */
    int               gc;           /* idle and gone: close its clients */
    kvt_client_t     *hs_cli;       /* handshake requests */
    kvt_client_t     *notify_cli;   /* control messages (engine lock) */
    uint32_t          ctl_inflight; /* control requests awaiting a reply */
    uint64_t          hs_us[4];     /* last handshake: control, endpoint,
                                       rkeys, total */
    struct kvc_peer  *next;
} kvc_peer_t;

typedef enum kvc_xfer_state {
    KVC_XFER_WAIT_PEER = 1, /* D: waiting for the handshake */
    KVC_XFER_INFLIGHT,      /* D: gets posted */
    KVC_XFER_HELD,          /* P READ: blocks held until released */
    KVC_XFER_DONE,
    KVC_XFER_FAILED,
    KVC_XFER_PUSHING,       /* P WRITE: scheduling / putting layers */
    KVC_XFER_WAIT_WRITE,    /* D WRITE: remote_blocks sent, awaiting
                               write_done */
} kvc_xfer_state_t;

typedef struct kvc_layer_op {
    kvt_op_t        op;
    struct kvc_xfer *xfer;
    struct kvc_peer *peer;  /* READ: the source this op reads from */
    uint32_t        index;  /* layer */
    int             done;
    kvx_status_t    status;
    kvc_run_t      *runs;   /* borrowed from xfer->plans */
    size_t          nruns;
    /* READ: the source had not exposed the blocks yet (its
     * producer_request may come after D's gets): re-posted at retry_us
     * from eng->retry (mode_read.c), until the transfer's deadline. */
    uint64_t        retry_us;
    uint32_t        retries;
    int             waiting;  /* in eng->retry, not posted */
    uint64_t        inst;     /* peer->inst when first posted: a retry
                                 goes only to that instance */
    struct kvc_layer_op *rnext;
} kvc_layer_op_t;

typedef struct kvc_xfer {
    char              transfer_id[KVX_ID_MAX];
    char              request_id[KVX_ID_MAX];
    int               is_producer;
    kvc_xfer_state_t  state;
    kvx_status_t      status;
    char              reason[KVX_REASON_MAX];
    char              refused[160]; /* WRITE P: why the last remote_blocks
                                       was refused (in its timeout reason) */
    uint64_t         *local_ids;   /* owned */
    size_t            nlocal;
    uint64_t         *remote_ids;  /* owned */
    size_t            nremote;
    uint64_t          deadline_us;
    kvc_timer_t       timer;       /* deadline_us, in eng->timers while the
                                      transfer is in the table */
    kvc_timerq_t     *tq;          /* the queue it is in, else NULL */
    /* D side */
    kvc_peer_t       *src;         /* P rank read from */
    uint32_t          nsrc;        /* > 1: D gathers its heads from the
                                      P ranks rel[0..nsrc-1] (sharded, D tp
                                      < P tp); ops are per (layer, source):
                                      ops[layer * nsrc + k] */
    kvc_peer_t       *rel[KVC_RANKMAP_MAX]; /* P ranks to release */
    uint32_t          nrel;
    /* D WRITE: rel[k]'s instance (from its reply to remote_blocks; 0 not
     * yet known), which of rel[] sent write_done, and, once aborting, which
     * confirmed that none of its puts can land any more (fenced). */
    uint64_t          rel_inst[KVC_RANKMAP_MAX];
    uint64_t          rel_done, rel_fenced;
    uint64_t          rel_replied;  /* WRITE D: ranks that answered
                                       remote_blocks (ok) */
    uint64_t          plain_done;   /* WRITE D: a write_done without nonce
                                       or instance came from a rank before
                                       its answer (kvc_write_on_write_done) */
    uint64_t          rel_dp;      /* D WRITE: ranks whose remote_blocks
                                      went on the data plane, not settled
                                      (peer->dp_unconfirmed) */
    /* write_done or notice that overtook the reply binding its sender: the
     * sender's instance, and the mask of the unbound rel[] ranks whose host
     * it came from; it counts once a reply binds one of those to it. */
    kvc_early_done_t  early;
    int               aborting;
    kvc_layer_op_t   *ops;         /* one per local layer, owned */
    kvc_run_t       **plans;       /* distinct plans, owned */
    size_t            nplans;
    uint32_t          layers_pending;
    int               timed_out;
    /* WRITE mode (both sides) */
    int               write;
    uint8_t          *scheduled;   /* P: per layer, owned */
    uint8_t          *posted;      /* P: per layer, owned */
    uint32_t          nscheduled, ncompleted, nposted;
    int               sealed;
    int               have_blocks; /* P: remote_blocks arrived */
    int               by_notice;   /* P: its D rank completes on the
                                      data-plane notice alone (no
                                      write_done after one) */
    int               by_count;    /* P: its D rank takes a counted notice
                                      right behind the puts
                                      (remote_blocks' notice_counted) */
    int               count_sent;  /* P: that notice was handed over */
    uint64_t          landing;     /* D WRITE: a counted notice of rank
                                      0 came before every byte it counts
                                      landed: the bytes it counts, until
                                      they did (0: none) */
    int               given_up_sent; /* P WRITE: given_up sent to its D
                                        rank (engine_destroy) */
    uint64_t          fence_resend; /* D WRITE fencing: ranks (bits)
                                       whose release went unanswered, sent
                                       again at fence_resend_at */
    uint64_t          fence_resend_at;
    int32_t           decode_rank; /* P: D DP rank to write to */
    uint64_t          src_inst;    /* D READ: instance of the P rank
                                      src_tp (of its dp rank) that accepted
                                      the request (0: not bound) */
    uint32_t          src_tp;
    uint64_t          accepted;    /* READ: P's kvt_clock_t.stamp at
                                      producer_request (D: from the params;
                                      0: not known). A P rank whose
                                      instance compares greater started
                                      after it: it cannot hold the blocks */
    uint64_t          hold_end_us; /* D READ: when P's hold of the blocks
                                      (remote_hold_ms from accepted) ends,
                                      less clock_skew, on our monotonic
                                      clock; 0: not known (legacy P) */
    /* D READ, P TP > 1: the sources other than the rank that answered
     * the request were asked how much longer they hold the blocks
     * (kvc_read_ask_holds): those not answered yet (bit k: source k), the
     * xfer_nonce the questions carried, and when every get completed
     * while answers were still out (0: not yet). */
    uint64_t          holdq_mask;
    uint64_t          holdq_nonce;
    uint64_t          gets_done_us;
    uint64_t          holdq_early; /* of holdq_mask: answered that they
                                      have not taken the request yet,
                                      asked again at holdq_at */
    uint64_t          holdq_at;
    uint32_t          holdq_tries;
    uint64_t          peer_inst;   /* P WRITE: instance of the D rank that
                                      sent remote_blocks (0: legacy) */
    uint64_t          xnonce;      /* WRITE: this use of the transfer id
                                      (D: drawn at consumer_request, sent
                                      with every message of it; P: the one
                                      its remote_blocks carried, echoed in
                                      write_done and the notice): a stale
                                      completion of an earlier use of the
                                      id changes nothing (0: none/legacy) */
    kvc_xfer_params_t dparams;     /* P: D's instance from the request */
    kvc_peer_addr_t   daddr;       /* P: D's base address */
    kvt_op_t          flush_op;    /* P: final ep flush */
    int               flushing;
    uint32_t          waiting_done; /* D: write_done still expected */
    /* P WRITE with D tp = q x P tp (sharded): one sub-transfer per D rank
     * (not in the hash; layer_ready/seal/release fan out to them), the
     * parent reports once every sub finished. */
    struct kvc_xfer **subs;        /* nsubs, owned */
    uint32_t          nsubs, subs_open;
    uint32_t          subs_released; /* subs ended by their D rank's release */
    uint32_t          sub_index;   /* a sub: which of the parent's D ranks */
    int               sub_finished; /* a sub: reported to its parent */
    int               fanout;      /* a parent: looping over its subs */
    int               finish_pending; /* a parent: last sub finished in a
                                          fan-out; finish after it */
    struct kvc_xfer  *parent;      /* a sub: its parent (borrowed) */
    /* P side */
    uint32_t          quorum;      /* 0 until the first release */
    uint32_t          released;
    uint64_t          released_mask; /* consumer ranks seen (< 64) */
    struct kvc_xfer  *hnext;       /* hash chain */
    int               exposed;     /* its blocks counted in eng->expo */
} kvc_xfer_t;

/* kvc_expo_t: blocks peers may get/put, per live transfer, through a
 * transport that serves them in software (expose.c). */
typedef struct kvc_expo_layer {
    uint64_t   base, len;
    kvc_geom_t geom;
} kvc_expo_layer_t;

#define KVC_EXPO_SESS KVC_RANKMAP_MAX /* distinct peer hosts of a transfer */

typedef struct kvc_expo_xfer {
    uint64_t              tag;  /* kvc_xfer_tag(transfer_id), siphash.h */
    const void           *owner; /* the kvc_xfer_t (identity only) */
    struct kvc_expo_xfer *next;
    /* The sessions (kvc_host_session) of the peer hosts the transfer is
     * bound to; nsess 0: any session (the hosts are not known as
     * addresses here). */
    uint32_t              nsess;
    uint64_t              sess[KVC_EXPO_SESS];
    uint64_t              put_bytes; /* bytes of peers' puts it admitted,
                                        each start address once (each
                                        copied at once, on the progress
                                        owner: expose.c) */
    uint64_t             *puts;      /* those start addresses: an open
                                        hash set of nputs in cap slots
                                        (0 empty), NULL before the first */
    uint32_t              nputs, cap;
    int                   puts_full; /* more than KVC_EXPO_PUTS_MAX: no
                                        longer counted */
    size_t                n;
    uint64_t              ids[]; /* its local block ids, sorted */
} kvc_expo_xfer_t;

#define KVC_EXPO_BUCKETS 4096
#define KVC_EXPO_PUTS_MAX 65536 /* distinct puts counted per transfer */
#define KVC_EXPO_ENDED   4096 /* ended tags remembered (ring) */

typedef struct kvc_expo {
    pthread_mutex_t   lock;    /* leaf: see expose.c */
    kvc_expo_xfer_t  *live[KVC_EXPO_BUCKETS];
    uint64_t          ended[KVC_EXPO_ENDED];
    uint64_t          nended;
    kvc_expo_layer_t *layers;  /* copy of eng->layers' placement */
    size_t            nlayers;
    uint64_t          refused[3]; /* [0] final, [1] not exposed yet,
                                     [2] the transfer's peer is another */
    uint64_t          unbound;    /* transfers exposed to any session:
                                     a peer host that is no IP literal */
    uint64_t          key[2];     /* kvc_host_session key (random) */
} kvc_expo_t;

struct kvx_engine;
void kvc_expo_init(kvc_expo_t *e);
void kvc_expo_fini(kvc_expo_t *e);
/* kvc_expose / kvc_unexpose (eng->lock held): x's local blocks start /
 * stop being open to peers naming x (only P READ and D WRITE transfers
 * open any; idempotent). */
void kvc_expose(struct kvx_engine *eng, kvc_xfer_t *x);
void kvc_unexpose(struct kvx_engine *eng, kvc_xfer_t *x);
/* kvc_expo_put_bytes: the bytes of peers' puts x's exposure admitted so
 * far, a put to a start address already counted (a replay) not again (0
 * when not exposed, or when more distinct puts came than it tracks). Only
 * on the progress owner: each admitted put was copied before its handler
 * returned, so every byte counted here has landed. */
uint64_t kvc_expo_put_bytes(struct kvx_engine *eng, const kvc_xfer_t *x);
/* kvc_expo_authorize (kvt_data_params_t.authorize, arg the engine). */
kvx_status_t kvc_expo_authorize(void *arg, uint64_t tag, uint64_t mac,
                                uint64_t nonce,
                                uint64_t addr, uint64_t len, int is_put);
/* kvc_expo_bound_host (READ, P): with read_bind_decode_host, the decode
 * host a P transfer is bound to, from its request id (SPEC §3 proxy
 * format) into host; 0, or -1 when unset or the request id names none. */
int kvc_expo_bound_host(const struct kvx_engine *eng, const kvc_xfer_t *x,
                        char *host, size_t len);

typedef struct kvc_event_node {
    kvx_event_t            ev;
    struct kvc_event_node *next;
} kvc_event_node_t;

/* kvc_early_t: a control message that overtook its transfer (early.c). */
typedef struct kvc_early {
    kvc_msg_t         msg;       /* owned */
    size_t            size;      /* counted in early_bytes when kept (a
                                    handler may move msg's lists out) */
    uint64_t          expires_us;
    char              from[64];  /* msg.from points here */
    struct kvc_early *next;
} kvc_early_t;

#define KVC_XFER_BUCKETS    1024 /* initial; doubles as it fills */
#define KVC_SERVER_CTX      16 /* requests served at once per listener */
#define KVC_HS_ADDR_MAX     65536u /* largest peer worker address taken */
#define KVC_HS_RKEY_MAX     16384u /* largest packed rkey taken */
#define KVC_EARLY_MAX       4096
#define KVC_EARLY_MAX_BYTES (16u << 20)
#define KVC_TERMINAL_MAX    4096

struct kvx_engine {
    kvt_env_t         env;           /* transports and clock */
    const kvc_mode_t *mode;          /* READ or WRITE, fixed at create */
    kvc_config_t      cfg;
    kvc_trust_t       trust;
    pthread_mutex_t   lock;
    pthread_cond_t    cond;          /* transfer progress */
    int               defer_wake;    /* kvc_lock_deferring: wake at unlock */
    int               wake_pending;  /* a kvc_wake while deferring */
    pthread_t         defer_owner;   /* the thread that defers */
    uint64_t          full_tick_us;  /* kvc_engine_tick's last periodic work */
    kvt_ctx_t        *ucx;
    int               drive_waits;   /* kvc_progress_caller_on(&cfg) */
    kvc_layer_t      *layers;
    size_t            nlayers, layers_cap;
    int               replicated;    /* every layer key-only */
    kvc_region_t     *regions;
    int               started;
    int               starting;      /* start() running: no second one, no
                                        register_layer */
    _Atomic int       destroying;    /* engine_destroy began: calls refused,
                                        waits end (api.c kvc_api_enter) */
    _Atomic uint32_t  api_users;     /* table calls in progress */
    int               stopping;
    int               closing;       /* destroy began: no new connections */
    int               stopping_sends; /* destroy: deliver what is queued,
                                        then drop */
    uint32_t          jobs_queued;   /* peer jobs handed to the progress
                                        owner and not yet run */
    kvt_server_t     *hs_srv, *notify_srv;
    char             *meta_json;     /* handshake reply, owned */
    size_t            meta_len;
    uint64_t          epoch;
    uint64_t          dp_nonce;      /* D: the last data-plane control
                                        message's or READ release
                                        notice's nonce (a stamp, strictly
                                        increasing: kvc_dp_next_nonce) */
    kvc_replay_t     *dp_replay;     /* P: data-plane control messages and
                                        READ release notices taken
                                        (kvc_dp_fresh), allocated at the
                                        first */
    uint32_t          holdq_waiting; /* D READ: transfers with a P rank
                                        to ask its hold again (holdq_early;
                                        kvc_read_reask_holds) */
    uint64_t          xnonce_seq;    /* D WRITE: uses of transfer ids so
                                        far (kvc_use_nonce hashes it) */
    char              engine_id[KVX_ID_MAX + 16];
    kvc_peer_t       *peers;
    kvc_xfer_t      **xfers;         /* hash table, nbuckets chains */
    size_t            nbuckets;
    size_t            nxfers;
    kvc_event_node_t *ev_head, *ev_tail;
    size_t            nevents;
    int               ev_fd;         /* event_fd() eventfd (ABI 1.3), -1 */
    kvc_idset_t       terminal;
    kvc_idset_t       failed;      /* P WRITE ids that ended FAILED: later
                                      layer_ready / seal_transfer say so */
    kvc_idset_t       released;    /* P WRITE: "id#xfer_nonce" of uses D
                                      released before P knew the id: a
                                      remote_blocks of that use arriving
                                      later (delayed, duplicated) is dropped
                                      even once the early release expired */
    kvc_timerq_t      timers;        /* transfer deadlines */
    kvc_expo_t        expo;          /* blocks open to peers (expose.c) */
    kvc_layer_op_t   *retry;         /* READ ops waiting to be re-posted */
    uint32_t          landing_waits; /* D WRITE transfers with landing set
                                        (at most; kvc_write_on_tick) */
    uint32_t          landing_delay_us; /* the next look for them: 100 µs
                                           after a new one, doubling to
                                           KVC_LANDING_MAX_US */
    uint32_t          fence_resends; /* D WRITE transfers with fence_resend
                                        set (at most; kvc_write_on_tick) */
    uint64_t          fence_resend_next; /* the earliest fence_resend_at
                                            among them (at most) */
    kvc_early_t      *early_head, *early_tail; /* arrival order */
    size_t            nearly, early_bytes;
    struct {
        uint64_t refused[KVC_PORT_N][KVC_REFUSE_N]; /* report.c names */
        uint64_t rx_msgs[KVC_MSG_NTYPES + 1]; /* by kvc_msg_type_t */
        uint64_t rx_refused;      /* well-formed, refused by the mode */
        uint64_t early_kept, early_dropped;
        uint64_t rx_bad;          /* rejected control messages */
        uint64_t tx_msgs, tx_fail;
        uint64_t handshakes_ok, handshakes_failed;
        uint64_t peers_collected; /* control clients closed: gone, idle */
        uint64_t bytes_read, bytes_written;
        uint64_t read_retries;    /* gets re-posted: blocks not exposed yet */
        uint64_t notices_done;    /* D WRITE: P ranks completed by their
                                     data-plane notice (its rank bound);
                                     P READ: releases taken from a notice */
        uint64_t notices_refused; /* notices whose mac, tag or instance
                                     matched no peer of their transfer */
        uint64_t notices_early;   /* D WRITE: notices that overtook the
                                     reply binding their P rank's instance,
                                     kept for it (kvc_write_d_keep_early) */
        uint64_t early_completed; /* D WRITE: P ranks completed by a
                                     completion kept early (write_done or
                                     notice) once the reply bound them */
        uint64_t hold_asked;      /* D READ: hold messages sent to the
                                     P ranks that did not answer the
                                     request (kvc_read_ask_holds) */
        uint64_t releases_on_dp;  /* D READ: releases sent as a data-plane
                                     notice (kvc_read_release_on_dp) */
        uint64_t blocks_on_dp;    /* D WRITE: remote_blocks sent on the
                                     data plane (kvc_write_d_blocks_on_dp) */
        uint64_t dp_msgs_refused; /* data-plane control messages refused
                                     (mac, trust, shape, type, replay) */
        uint64_t dp_stale;        /* P: authentic data-plane control
                                     messages and READ release notices
                                     refused by kvc_dp_fresh (replayed,
                                     or the hosts' clocks disagree) */
        uint64_t write_done_skipped; /* P WRITE: transfers whose notice
                                        the transport took and D asked for
                                        no write_done after one */
        uint64_t notices_counted; /* P WRITE: counted notices queued right
                                     behind a transfer's puts
                                     (remote_blocks' notice_counted) */
        uint64_t counted_done;    /* D WRITE: P ranks completed by a
                                     counted notice (kvc_write_on_notice) */
        uint64_t notices_landing; /* D WRITE: counted notices that came
                                     before every byte they count landed
                                     (waited for: kvc_write_on_tick) */
        uint64_t fences_unconfirmed; /* D WRITE transfers reported FAILED
                                        before every P rank confirmed its
                                        puts fenced (kvc_write_d_fence) */
        uint64_t given_up;      /* D WRITE: given_up taken from a P rank
                                   whose engine stopped */
        uint64_t fence_resends; /* D WRITE: releases of a fence sent again
                                   (the one before unanswered: a control
                                   connection down, a timeout) */
        uint64_t reg_sent, reg_failed; /* registrations to the proxy */
        kvc_lat_t ctl_rtt;        /* control message queued -> reply */
        uint64_t  hs_last_us[4];  /* last handshake: metadata, endpoint,
                                     rkeys, total */
    } stats;
    /* Registration heartbeat to the proxy (rank 0 with proxy_ip set). */
    kvt_client_t     *proxy_cli;
    char             *reg_payload;
    size_t            reg_len;
    uint64_t          reg_next_us;
    int               reg_inflight, reg_failing;
};

/* kvc_from_host copies the host part of a transport's "ip:port" /
 * "[v6]:port" sender address ("" when it has none). */
void kvc_from_host(const char *from, char *host, size_t len);

/* kvc_refused counts one refused inbound message or handshake reply by
 * where it came in and why (stats "refused"); lock held. */
void kvc_refused(struct kvx_engine *eng, kvc_port_t port, kvc_refusal_t why);

/* The engine's transports and clock (kvt.h). */
#define KVD(eng) ((eng)->env.data)
#define KVN(eng) ((eng)->env.ctl)

/* kvc_now_us: the engine's clock, monotonic microseconds. */
uint64_t kvc_now_us(const struct kvx_engine *eng);
/* kvc_deadline_us: monotonic time `seconds` from now, in microseconds. */
uint64_t kvc_deadline_us(const struct kvx_engine *eng, double seconds);
/* kvc_wait_until: waits on eng->cond (lock held) until signalled or the
 * clock reaches deadline_us; callers re-check their condition. */
void kvc_wait_until(struct kvx_engine *eng, uint64_t deadline_us);
/* kvc_wait_deadline: now + timeout_ms, saturated (a framework's "very
 * long" timeout must not wrap into one already past). */
uint64_t kvc_wait_deadline(const struct kvx_engine *eng, int64_t timeout_ms);
/* kvc_wake (lock held): eng->cond's waiters have something to look at.
 * Broadcast at once, or at kvc_unlock_waking inside kvc_lock_deferring. */
void kvc_wake(struct kvx_engine *eng);
/* kvc_lock_deferring / kvc_unlock_waking: the engine lock for a completion
 * callback of the progress owner; its wake-ups are broadcast after the
 * unlock, so a waiting framework thread does not wake into a lock that is
 * still held (glibc's condition variable wakes it, and it blocks on the
 * mutex at once: a futex wait, a wake and two more switches per
 * completion). Every exit of such a section goes through
 * kvc_unlock_waking. */
void kvc_lock_deferring(struct kvx_engine *eng);
void kvc_unlock_waking(struct kvx_engine *eng);

/* engine.c: lifetime (create, start, tick, destroy) */
uint64_t kvc_now_us(const struct kvx_engine *eng);
uint64_t kvc_deadline_us(const struct kvx_engine *eng, double seconds);
void     kvc_wait_until(struct kvx_engine *eng, uint64_t deadline_us);

/* xfer.c: the transfer table, lifecycle, events and waits */
kvx_status_t kvc_xfers_init(struct kvx_engine *eng);
kvc_xfer_t  *kvc_xfer_find(struct kvx_engine *eng, const char *tid);
kvx_status_t kvc_xfer_insert(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_xfer_remove(struct kvx_engine *eng, kvc_xfer_t *x);
kvc_xfer_t  *kvc_xfer_new(const char *tid, const char *req_id,
                          const uint64_t *ids, size_t n);
void         kvc_xfer_free(kvc_xfer_t *x);
/* kvc_xfer_arm sets x's deadline (and its timer once x is in the table). */
void         kvc_xfer_arm(struct kvx_engine *eng, kvc_xfer_t *x,
                          uint64_t deadline_us);
/* kvc_xfer_of_timer: the transfer whose timer t is. */
kvc_xfer_t  *kvc_xfer_of_timer(kvc_timer_t *t);
/* kvc_xfer_fail records the first failure of x (status and reason). */
void         kvc_xfer_fail(kvc_xfer_t *x, kvx_status_t st, const char *why);
kvx_status_t kvc_xfer_check_ids(struct kvx_engine *eng, const uint64_t *ids,
                                size_t n);
/* kvc_read_response: P's kv_transfer_params for the proxy (both modes). */
char        *kvc_xfer_response(struct kvx_engine *eng, const kvc_xfer_t *x);
/* kvc_xfer_publish (P, lock not held): inserts x and applies the control
 * messages that overtook it (remote_blocks, release); on KVX_OK *response_p
 * = resp, on error x and resp are freed. */
kvx_status_t kvc_xfer_publish(struct kvx_engine *eng, kvc_xfer_t *x,
                              char *resp, char **response_p);
/* kvc_event_push queues x's terminal event; x's blocks stop being exposed
 * to peers (expose.c) as the framework may reuse them from now on. */
void         kvc_event_push(struct kvx_engine *eng, kvx_event_type_t type,
                            kvx_status_t status, kvc_xfer_t *x,
                            const char *reason, int with_blocks);
kvx_status_t kvc_xfer_wait(struct kvx_engine *eng, const char *tid,
                           int64_t layer, int64_t timeout_ms);
/* kvc_events_wait (API wait_events): until an event is pending or
 * timeout_ms passed. */
kvx_status_t kvc_events_wait(struct kvx_engine *eng, int64_t timeout_ms);

/* evfd.c (lock held, except close): the ABI 1.3 event_fd. get creates it
 * once; signal when the queue becomes non-empty; drain when poll_events
 * emptied it; close at destroy. */
kvx_status_t kvc_evfd_get(struct kvx_engine *eng, int *fd_p);
void         kvc_evfd_signal(struct kvx_engine *eng);
void         kvc_evfd_drain(struct kvx_engine *eng);
void         kvc_evfd_close(struct kvx_engine *eng);

/* plan.c: copy plans of a transfer */
uint32_t     kvc_xfer_nsrc(const kvc_xfer_t *x);
kvc_peer_t  *kvc_xfer_source(const kvc_xfer_t *x, uint32_t k);
kvx_status_t kvc_xfer_plan(struct kvx_engine *eng, kvc_xfer_t *x,
                           const uint64_t *lids, size_t nl);

/* peer.c: peers, their control queue and connection */
/* kvc_peer_conn_t: what a READY peer holds in the data plane, detached
 * from the peer under the engine lock so that exactly one thread releases
 * it. */
typedef struct kvc_peer_conn {
    kvc_hs_meta_t meta;
    kvt_ep_t     *ep;
    kvt_rkey_t  **rkeys;
    int          *layer_map;
} kvc_peer_conn_t;

kvc_peer_t *kvc_peer_get(struct kvx_engine *eng, const char *host,
                         const kvc_peer_addr_t *base, uint32_t dp_rank,
                         uint32_t tp_rank, uint32_t dp_size,
                         uint32_t tp_size);
void        kvc_peer_send(kvc_peer_t *peer, char *buf, size_t len,
                          const char *what);
void        kvc_peer_want_handshake(kvc_peer_t *peer);
/* kvc_release_msg fills m as this D rank's release of tid. */
void        kvc_release_msg(const struct kvx_engine *eng, const char *tid,
                            kvc_msg_t *m);
/* kvc_peer_send_msg encodes m and queues it to peer. */
void        kvc_peer_send_msg(kvc_peer_t *peer, const kvc_msg_t *m,
                              const char *what);
void        kvc_rkeys_destroy(struct kvx_engine *eng, kvt_rkey_t **rkeys,
                              size_t n);
void        kvc_peer_conn_free(struct kvx_engine *eng, kvc_peer_conn_t *c);
void        kvc_peer_ep_error(void *arg, kvt_ep_t *ep, kvx_status_t status,
                              const char *reason);
/* kvc_peer_lost: peer died or restarted (its endpoint failed, its control
 * connection stayed lost past the grace, or it answered as another
 * instance): it becomes FAILED, the transfers bound to it fail
 * (mode->peer_failed) and the next request handshakes again. Its data-plane
 * connection is detached into *c (return 1: the caller frees it, outside
 * the lock unless on the progress owner). */
int         kvc_peer_lost(kvc_peer_t *peer, kvx_status_t status,
                          const char *reason, kvc_peer_conn_t *c);
/* kvc_peer_saw_instance: peer answered as instance inst (0: unknown);
 * a change of a known instance is a restart (kvc_peer_lost). Returns as
 * kvc_peer_lost. */
int         kvc_peer_saw_instance(kvc_peer_t *peer, uint64_t inst,
                                  kvc_peer_conn_t *c);
/* kvc_peer_why_sep, kvc_peer_why: ": " and why the peer failed while it is
 * FAILED, else "" and "": an op that failed with its endpoint names the
 * cause when the endpoint's error came first (e.g. "this process's
 * shared-memory receive FIFO is blocked ...", "peer context destroyed"). */
static inline const char *kvc_peer_why_sep(const kvc_peer_t *peer)
{
    return peer->state == KVC_PEER_FAILED && peer->fail_reason[0] != '\0'
               ? ": "
               : "";
}

static inline const char *kvc_peer_why(const kvc_peer_t *peer)
{
    return peer->state == KVC_PEER_FAILED ? peer->fail_reason : "";
}

/* kvc_peer_ctl_only: a WRITE D's endpoint to a P rank carries control
 * messages only (remote_blocks on the data plane, mode_write_d.c): no gets
 * or puts, so neither the layer geometry (P checks it in its own
 * handshake, from its side of the TP ratio) nor the rkeys are looked at,
 * and neither a failed handshake nor the endpoint's failure fails a
 * transfer by itself (kvc_peer_ep_error); the messages then go over the
 * control plane. With the control connection lost too, the rank is gone;
 * while the endpoint stands, a lost control connection only fences it
 * (kvc_peers_check_conn, watch_ep). */
static inline int kvc_peer_ctl_only(const struct kvx_engine *eng)
{
    return !eng->cfg.is_producer && !eng->cfg.read_mode;
}
#define KVC_DP_FRESH_US 60000000u /* a data-plane control message older
                                     (or newer) than this plus clock_skew
                                     is refused (kvc_replay_check): the
                                     hosts' clocks must agree that well */
#define KVC_DP_UNCONFIRMED_MAX 16 /* a control-only endpoint that drops
                                     messages silently loses at most this
                                     many transfers before their deadline
                                     closes it (kvc_write_d_dp_timeout) */
#define KVC_CTL_RETRY_US 5000000u /* a control-only endpoint lost: the
                                     next handshake not before this */
#define KVC_HS_STALE_RETRIES 3    /* handshake replies of another instance
                                     than the known one: asked again */

/* kvc_peer_ctl_lost: a control-only peer's endpoint is given up (it
 * failed, or messages sent on it got no answer by their deadline): closed,
 * the peer FAILED without failing a transfer, another handshake not before
 * KVC_CTL_RETRY_US. Lock held, progress owner. */
void kvc_peer_ctl_lost(kvc_peer_t *peer, kvx_status_t status,
                       const char *reason);

/* kvc_peer_bound_lost: during mode->peer_failed, whether a transfer bound
 * to instance inst (0: not bound) of peer is hit. */
static inline int kvc_peer_bound_lost(const kvc_peer_t *peer, uint64_t inst)
{
    return inst == 0 || peer->lost_inst == 0 || inst == peer->lost_inst;
}
/* kvc_peer_note_instance: a message of a transfer came from instance inst
 * of peer (lock held, any thread). Returns 0 when inst is the peer's known
 * instance (or either is unknown); 1 when it is a new one: on the next
 * periodic tick (kvc_engine_tick) the peer is asked (a heartbeat, or a
 * handshake), and its answer decides: a restart, or a claim it refutes
 * (kvc_peer_claim_settle); until then nothing may use the peer's
 * connection for that transfer; 2 when inst is
 * one that restarted since (gone: the transfer cannot be served). */
int         kvc_peer_note_instance(kvc_peer_t *peer, uint64_t inst);
/* kvc_peer_claim_settle: the peer answered, naming its instance (a reply
 * or a handshake): a claimed instance (claimed_inst) it did not answer as
 * is dead from now on (the transfers bound to it fail), and the tick pumps
 * the peer's transfers. Engine lock held (any thread). */
void        kvc_peer_claim_settle(kvc_peer_t *peer);
/* kvc_peer_set_inst: peer is now instance inst (a handshake answered); a
 * different known one before it is dead (kvc_peer_inst_dead). */
void        kvc_peer_set_inst(kvc_peer_t *peer, uint64_t inst);
int         kvc_peer_inst_dead(const kvc_peer_t *peer, uint64_t inst);
#define KVC_CONN_GRACE_S 1.0 /* control connection lost this long: gone */
#define KVC_PEER_IDLE_S 5.0 /* gone and idle this long: its control
                               clients are closed (no redialling) until
                               something is sent to it again */
/* kvc_peers_check_conn (tick): peers whose control connection stayed lost
 * past KVC_CONN_GRACE_S are lost. */
void        kvc_peers_check_conn(struct kvx_engine *eng);
/* kvc_peers_collect (tick, after the lock is released): closes the control
 * clients of peers gone and idle past KVC_PEER_IDLE_S. */
void        kvc_peers_collect(struct kvx_engine *eng);
void        kvc_peers_flush(struct kvx_engine *eng);
void        kvc_peers_disconnect(struct kvx_engine *eng);
void        kvc_peers_free(struct kvx_engine *eng);
void        kvc_peers_release(struct kvx_engine *eng);

/* handshake.c */
kvx_status_t kvc_meta_build(struct kvx_engine *eng);
/* kvc_meta_worker_reset (kvt_data_params_t.worker_reset, progress owner):
 * the transport replaced its worker; the metadata handshakes send is
 * rebuilt with the new worker address. */
void         kvc_meta_worker_reset(void *arg);
void         kvc_peer_hs_start(kvc_peer_t *peer);
#define KVC_PREFAULT_CHUNK (32u << 20) /* bytes per periodic tick */
#define KVC_TICK_FULL_US 9000u /* periodic tick work at most this often
                                  (a tick_at in between: timers, retries) */
void         kvc_peers_prefault(struct kvx_engine *eng);
void         kvc_peer_hs_finish(kvt_job_t *job);
void         kvc_hs_handler(void *arg, const char *from, const char *msg,
                            size_t len, char **reply_p, size_t *len_p);
/* kvc_peer_parts: how this engine's heads relate to peer's (sharded
 * heterogeneous TP, SPEC §4), from the rank map: *n_p = 1 (whole blocks)
 * unless this is a READ consumer of an instance with another TP size and
 * sharded heads; then it reads head slice *idx_p of *n_p of the peer's
 * heads (*gather_p 0, D tp > P tp) or the peer holds part *idx_p of *n_p
 * of its heads (*gather_p 1, D tp < P tp). A WRITE producer with P tp = r x
 * D tp puts its heads as part *idx_p of *n_p of its D rank's (*gather_p 2:
 * local is a slice of the remote unit, as for 0), or holds a replica of
 * that part and puts nothing (*gather_p 3: replicated KV heads). */
void kvc_peer_parts(const struct kvx_engine *eng, const kvc_peer_t *peer,
                    uint32_t *idx_p, uint32_t *n_p, int *gather_p);
/* plan.c: KV heads per rank for the rank map (kvc_rankmap_heads): of the
 * first layer that is not key-only; 0 if every layer is key-only;
 * KVC_HEADS_SHARDED for a peer whose metadata is not known yet. */
uint32_t kvc_eng_heads(const struct kvx_engine *eng);
uint32_t kvc_meta_heads(const kvc_hs_meta_t *m);

/* early.c: control messages that overtook their transfer */
/* kvc_early_keep stores m (its owned fields are moved out). */
void kvc_early_keep(struct kvx_engine *eng, kvc_msg_t *m);
/* kvc_early_replay hands every stored message of tid, in arrival order, to
 * the mode's handler (the transfer was just published). */
void kvc_early_replay(struct kvx_engine *eng, const char *tid);
void kvc_early_expire(struct kvx_engine *eng, uint64_t now);
void kvc_early_free_all(struct kvx_engine *eng);

/* dispatch.c */
/* kvc_msg_ignore: a handler for messages that change nothing (heartbeat). */
void kvc_msg_ignore(struct kvx_engine *eng, kvc_msg_t *m, char *reason,
                    size_t reason_len, int *ok_p);
void kvc_reply(int ok, const char *reason, char **reply_p, size_t *len_p);
/* kvc_dispatch: a decoded inbound message (m->from set) to the mode's
 * handler, counted (lock held). *ok_p 0 with reason: refused. */
void kvc_dispatch(struct kvx_engine *eng, kvc_msg_t *m, char *reason,
                  size_t reason_len, int *ok_p);
/* kvc_dp_next_nonce (D, lock held): the nonce of this engine's next
 * data-plane control message or READ release notice: a stamp
 * (kvt_clock_t.stamp), strictly increasing. */
uint64_t    kvc_dp_next_nonce(struct kvx_engine *eng);
/* kvc_use_nonce (lock held): an unguessable nonzero nonce naming one use
 * of a transfer id at this engine (mode_write_d.c). */
uint64_t    kvc_use_nonce(struct kvx_engine *eng);
/* kvc_dp_fresh (P, lock held): NULL when nonce, from the engine instance
 * inst of the host whose session is session, was never taken before and
 * is within the freshness window (kvc_replay_check; recorded then); else
 * the reason, warned about (rate limited) as what from `from`. With
 * control-plane TLS this is what stops a message or notice captured on
 * the unencrypted data plane from being replayed. */
const char *kvc_dp_fresh(struct kvx_engine *eng, uint64_t session,
                         uint64_t inst, uint64_t nonce, const char *what,
                         const char *from);
/* kvc_dp_ctl_handler (kvt_data_params_t.ctl): a control message a peer
 * sent on the data plane (a WRITE D's remote_blocks,
 * kvc_write_d_blocks_on_dp). Taken only when its mac is the one the
 * session this engine gives the address it claims gives (the sender
 * handshook from there: with control-plane TLS, over TLS), that address
 * is trusted (trusted_remote_hosts), it is a remote_blocks and it is fresh
 * (kvc_dp_fresh); then exactly as over the control plane (kvc_dispatch),
 * with no reply. Else counted (dp_msgs_refused). Progress owner, without
 * the transport's locks. */
void kvc_dp_ctl_handler(void *arg, const char *msg, size_t len,
                        uint64_t nonce, uint64_t mac, const char *from);
void kvc_notify_handler(void *arg, const char *from, const char *msg,
                        size_t len, char **reply_p, size_t *len_p);

/* target.c: request params -> the peer ranks to talk to */
kvx_status_t kvc_read_targets(struct kvx_engine *eng,
                              const kvc_xfer_params_t *p,
                              const kvc_peer_addr_t *addr,
                              const char *field, kvc_xfer_t *x);
kvx_status_t kvc_target_check_host(struct kvx_engine *eng,
                                   const kvc_peer_addr_t *addr,
                                   const char *field);
kvx_status_t kvc_write_same_tp(struct kvx_engine *eng, uint32_t rtp);
uint32_t     kvc_write_peer_rank(const struct kvx_engine *eng, uint32_t rtp);
/* kvc_target: resolve -> trust -> ports -> peer, for one remote rank. */
kvc_peer_t  *kvc_target(struct kvx_engine *eng, const kvc_xfer_params_t *p,
                        const kvc_peer_addr_t *addr, const char *field,
                        uint32_t dp_rank, uint32_t tp_rank,
                        kvx_status_t *st_p);
/* The peer ranks this engine issues one-sided operations to for an
 * instance (READ consumer: the P rank it reads from, or every P rank it
 * gathers heads from, into peers[KVC_RANKMAP_MAX], returning the count;
 * WRITE producer: its D rank at remote_dp_rank), after the same trust and
 * range checks as a request; lock held. 0 / NULL with *st_p on error. */
size_t      kvc_read_connect_targets(struct kvx_engine *eng,
                                     const kvc_xfer_params_t *p,
                                     const kvc_peer_addr_t *addr,
                                     const char *field, kvc_peer_t **peers,
                                     kvx_status_t *st_p);
size_t      kvc_write_connect_targets(struct kvx_engine *eng,
                                      const kvc_xfer_params_t *p,
                                      const kvc_peer_addr_t *addr,
                                      const char *field, kvc_peer_t **peers,
                                      kvx_status_t *st_p);
/* kvc_consumer_targets: the P ranks a D rank hands its blocks to or
 * releases (params parsed into *p, owned by the caller on KVX_OK). */
kvx_status_t kvc_consumer_targets(struct kvx_engine *eng, const char *req_id,
                                  const char *params_json,
                                  kvc_xfer_params_t *p, kvc_peer_t **peers,
                                  uint32_t *n_p);
/* kvc_consumer_abort (API consumer_abort, lock not held): the transfer is
 * over for the framework: on_xfer(eng, x) for a live x, its id terminal,
 * release sent to its P ranks. */
kvx_status_t kvc_consumer_abort(struct kvx_engine *eng, const char *req_id,
                                const char *params_json,
                                void (*on_xfer)(struct kvx_engine *eng,
                                                kvc_xfer_t *x));
/* kvc_engine_connect (API connect_peer): handshake ahead of the first
 * request; timeout_ms 0 returns at once, > 0 waits for the outcome. */
kvx_status_t kvc_engine_connect(struct kvx_engine *eng,
                                const char *params_json, int64_t timeout_ms);

/* report.c: stats and transports as JSON (API calls, lock not held) */
kvx_status_t kvc_report_stats(struct kvx_engine *eng, char **json_p);
kvx_status_t kvc_report_transports(struct kvx_engine *eng, char **json_p);

/* registration.c */
kvx_status_t kvc_reg_setup(struct kvx_engine *eng);
void         kvc_reg_tick(struct kvx_engine *eng);

/* mode_read.c */
kvx_status_t kvc_read_consumer(struct kvx_engine *eng, const char *req_id,
                               const char *params_json, const uint64_t *ids,
                               size_t n);
kvx_status_t kvc_read_producer(struct kvx_engine *eng, const char *req_id,
                               const char *params_json, const uint64_t *ids,
                               size_t n, char **response_p);
void         kvc_read_peer_ready(struct kvx_engine *eng, kvc_peer_t *peer);
void         kvc_read_peer_failed(struct kvx_engine *eng, kvc_peer_t *peer);

/* mode_write_push.c, mode_write_p.c, mode_write_d.c */
void         kvc_write_check(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_write_pump(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_write_route_blocks(struct kvx_engine *eng, kvc_xfer_t *x,
                                    kvc_msg_t *m, char *reason, size_t len,
                                    int *ok_p);
int          kvc_write_fanout_end(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_write_peer_ready(struct kvx_engine *eng, kvc_peer_t *peer);
void         kvc_write_peer_failed(struct kvx_engine *eng, kvc_peer_t *peer);
void         kvc_write_on_timer(struct kvx_engine *eng, kvc_xfer_t *x);
kvx_status_t kvc_write_producer(struct kvx_engine *eng, const char *req_id,
                                const char *params_json, const uint64_t *ids,
                                size_t n, char **response_p);
kvx_status_t kvc_write_layer_ready(struct kvx_engine *eng, const char *tid,
                                   uint32_t layer);
kvx_status_t kvc_write_seal(struct kvx_engine *eng, const char *tid);
void         kvc_write_on_release(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_write_free(kvc_xfer_t *x);
kvx_status_t kvc_write_consumer(struct kvx_engine *eng, const char *req_id,
                                const char *params_json, const uint64_t *ids,
                                size_t n);
void         kvc_write_d_send(kvc_xfer_t *x, kvc_msg_t *m, const char *what);
void         kvc_write_send_given_up(struct kvx_engine *eng,
                                     struct kvc_xfer *x);
void         kvc_write_stopped(struct kvx_engine *eng);
void         kvc_write_on_given_up(struct kvx_engine *eng, const kvc_msg_t *m,
                                   char *reason, size_t len, int *ok_p);
void         kvc_write_on_write_done(struct kvx_engine *eng,
                                     const kvc_msg_t *m, char *reason,
                                     size_t len, int *ok_p);
/* kvc_write_d_dp_timeout: x's deadline passed with ranks whose
 * remote_blocks went on the data plane not done: their control-only
 * endpoints may drop messages silently, and are not used for
 * KVC_CTL_RETRY_US (not closed: see the function). */
void kvc_write_d_dp_timeout(struct kvx_engine *eng, kvc_xfer_t *x);
/* kvc_write_on_notice (kvc_mode_t.on_notice): a P rank's data-plane
 * completion notice, the fast twin of its write_done. */
void         kvc_write_on_notice(struct kvx_engine *eng,
                                 const kvc_notice_t *nt);
/* kvc_write_on_tick (kvc_mode_t.on_tick): D transfers whose counted
 * notice came before the bytes it counts (mode_write_d.c). */
void         kvc_write_on_tick(struct kvx_engine *eng, uint64_t now);
void         kvc_write_d_on_reply(struct kvx_engine *eng, kvc_peer_t *peer,
                                  kvc_msg_type_t type, const char *tid,
                                  const kvc_reply_info_t *info);
void         kvc_write_d_peer_failed(struct kvx_engine *eng,
                                     kvc_peer_t *peer);
void         kvc_write_d_deadline(struct kvx_engine *eng, kvc_xfer_t *x);
void         kvc_write_d_fence(struct kvx_engine *eng, kvc_xfer_t *x,
                               kvx_status_t status, const char *why,
                               const kvc_peer_t *gone);
int          kvc_write_d_destroy(struct kvx_engine *eng, kvc_xfer_t *x);
kvx_status_t kvc_write_abort(struct kvx_engine *eng, const char *req_id,
                             const char *params_json);

#endif
