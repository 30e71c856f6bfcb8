/*
 * mode.h - a transfer mode: READ (D pulls, mode_read.c) or WRITE (P pushes
 * layer by layer, mode_write_*.c), chosen once at engine_create from
 * read_mode. The rest of the engine (API, dispatch, handshake, ticks) calls
 * a mode only through this table; the two modes never call each other.
 *
 * Every function runs with the engine lock held unless it says otherwise.
 */
#ifndef KVC_MODE_H
#define KVC_MODE_H

#include "ctlmsg.h"

struct kvx_engine;
struct kvc_peer;
struct kvc_xfer;
struct kvc_xfer_params;

/* kvc_msg_fn handles an inbound control message of one type: *ok_p = 0 and
 * a reason to refuse it (the sender gets an error reply). m may be taken
 * over (its owned fields moved out). */
typedef void (*kvc_msg_fn)(struct kvx_engine *eng, kvc_msg_t *m,
                           char *reason, size_t reason_len, int *ok_p);

/* kvc_notice_t: a data-plane notice as the transport delivered it
 * (kvt_data_params_t.notice), nothing in it checked yet. */
typedef struct kvc_notice {
    uint64_t    tag, mac, nonce, instance, xnonce;
    const char *id;   /* NUL-terminated, 1..512 bytes */
    const char *from; /* the sender's claim of its address; "" none */
    uint64_t    count; /* KVC_COUNT_NONE (siphash.h), or a counted
                          notice's bytes (kvt.h notify_queued) */
} kvc_notice_t;

typedef struct kvc_mode {
    const char *name;                       /* "READ", "WRITE" */
    /* API entry points; lock NOT held. layer_ready, seal and abort are
     * NULL where the mode has no such call. */
    kvx_status_t (*producer_request)(struct kvx_engine *eng,
                                     const char *req_id, const char *params,
                                     const uint64_t *ids, size_t n,
                                     char **response_p);
    kvx_status_t (*consumer_request)(struct kvx_engine *eng,
                                     const char *req_id, const char *params,
                                     const uint64_t *ids, size_t n);
    kvx_status_t (*layer_ready)(struct kvx_engine *eng, const char *tid,
                                uint32_t layer);
    kvx_status_t (*seal)(struct kvx_engine *eng, const char *tid);
    kvx_status_t (*abort)(struct kvx_engine *eng, const char *req_id,
                          const char *params);
    /* connect_targets: the peer ranks the initiator of one-sided ops
     * (READ: D, WRITE: P) handshakes with for params, into
     * peers[KVC_RANKMAP_MAX]; 0 with *st_p on error. */
    size_t (*connect_targets)(struct kvx_engine *eng,
                              const struct kvc_xfer_params *p,
                              const kvc_peer_addr_t *addr, const char *field,
                              struct kvc_peer **peers, kvx_status_t *st_p);
    /* A peer's handshake finished (ready) or failed / its endpoint died. */
    void (*peer_ready)(struct kvx_engine *eng, struct kvc_peer *peer);
    void (*peer_failed)(struct kvx_engine *eng, struct kvc_peer *peer);
    /* on_reply (may be NULL): the reply to a control message of type
     * about transfer tid that this engine sent to peer (info->delivered 0:
     * none came; info->reason says why). */
    void (*on_reply)(struct kvx_engine *eng, struct kvc_peer *peer,
                     kvc_msg_type_t type, const char *tid,
                     const kvc_reply_info_t *info);
    /* Inbound control messages by type; NULL: refused in this mode. */
    kvc_msg_fn on_msg[KVC_MSG_NTYPES + 1];
    /* on_notice (may be NULL: dropped): a peer's data-plane notice (WRITE:
     * P's puts landed, mode_write_d.c; READ: D released, mode_read.c). */
    void (*on_notice)(struct kvx_engine *eng, const kvc_notice_t *nt);
    /* on_timer: x's deadline passed (its timer fired). */
    void (*on_timer)(struct kvx_engine *eng, struct kvc_xfer *x);
    /* on_tick (may be NULL): every engine tick (at least every 20 ms). */
    void (*on_tick)(struct kvx_engine *eng, uint64_t now_us);
    /* stopped (may be NULL): engine_destroy, every endpoint closed and
     * quiesced, before the queued messages go out (lock held). */
    void (*stopped)(struct kvx_engine *eng);
    /* destroy_xfer (may be NULL): engine_destroy gives up on live
     * transfer x as the framework's abort would, telling its peers (once;
     * called again while it returns 1). Returns 1 while a peer may still
     * operate on x's blocks (destroy waits, bounded, for it to end). */
    int (*destroy_xfer)(struct kvx_engine *eng, struct kvc_xfer *x);
} kvc_mode_t;

extern const kvc_mode_t kvc_mode_read;
extern const kvc_mode_t kvc_mode_write;

#endif
