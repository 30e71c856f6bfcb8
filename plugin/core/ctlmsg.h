/*
 * ctlmsg.h - JSON codecs of the control plane (SPEC §5, §9): typed control
 * messages, their replies, the handshake request/metadata, base64 for
 * binary fields, and a bounded set of finished transfer ids.
 *
 * Decoders never trust their input: every field is type- and range-checked,
 * unknown "type" values and oversized input are rejected with
 * KVX_ERR_BAD_MESSAGE and a reason naming the field and value.
 *
 * Threading: codecs are pure; a kvc_idset_t is not locked (callers lock).
 */
#ifndef KVC_CTLMSG_H
#define KVC_CTLMSG_H

#include "config.h"
#include "error.h"
#include "layout.h"

#include <stddef.h>
#include <stdint.h>

#define KVC_MSG_MAX_BYTES  (4u << 20) /* larger control messages rejected */
#define KVC_SEEN_AS_MAX    64 /* bytes of a handshake's seen_as, with NUL */
/* 2: the data plane speaks protocol 4 (published rkeys end with a trailer,
 * transports/ucx/README.md): builds of protocol 1 and 2 refuse each other's
 * handshake metadata, whichever side dials. */
#define KVC_PROTO_VERSION  2

typedef enum kvc_msg_type {
    KVC_MSG_REMOTE_BLOCKS = 1, /* D -> P (WRITE) */
    KVC_MSG_WRITE_DONE    = 2, /* P -> D (WRITE) */
    KVC_MSG_RELEASE       = 3, /* D -> P */
    KVC_MSG_HEARTBEAT     = 4, /* either; liveness, no effect */
    KVC_MSG_HOLD          = 5, /* D -> P (READ): how much longer does this
                                  P rank hold the transfer's blocks? (the
                                  reply's hold_ms; refused: it does not) */
    KVC_MSG_GIVEN_UP      = 6, /* P -> D (WRITE): this P rank's engine
                                  stopped with the use (xfer_nonce) not
                                  written whole; none of its puts can land
                                  any more */
    /* a new type: the next value, KVC_MSG_NTYPES, and one entry in the
     * descriptor table of ctlmsg.c (plus the engine's handler) */
} kvc_msg_type_t;

/* Valid types are 1..KVC_MSG_NTYPES (contiguous): an array of
 * KVC_MSG_NTYPES + 1 elements indexed by kvc_msg_type_t is safe. ctlmsg.c
 * checks at compile time that its table has exactly these entries. */
#define KVC_MSG_NTYPES 6

typedef struct kvc_msg {
    kvc_msg_type_t type;
    char      transfer_id[KVX_ID_MAX];
    char      req_id[KVX_ID_MAX];     /* remote_blocks */
    uint64_t *block_ids;              /* owned; remote_blocks */
    size_t    num_block_ids;
    int32_t   decode_rank;            /* remote_blocks, >= 0 */
    int32_t   consumer_tp_size;       /* release: >= 1; absent → 1 */
    int32_t   consumer_rank;          /* release: sender's TP rank, for
                                         duplicate detection; -1 absent
                                         (encoded when >= 0) */
    int       legacy;                 /* decoded from a plain string */
    uint64_t  instance;               /* sender's instance id (0: absent,
                                         legacy peer) */
    uint64_t  to_instance;            /* receiver's instance the sender
                                         addresses (0: not known) */
    uint64_t  xfer_nonce;             /* WRITE: the use of the transfer id
                                         a message belongs to (0: absent) */
    int       done_by_notice;         /* remote_blocks: the D rank completes
                                         on P's data-plane notice alone, so
                                         P sends no write_done after one
                                         (0: absent, legacy: it must) */
    int       notice_counted;         /* remote_blocks, with done_by_notice:
                                         the D rank takes a counted notice
                                         (kvt.h notify_queued) right behind
                                         the puts, checked against the
                                         bytes it took (0: absent: only
                                         the notice after the flush) */
    /* Receiver side, set by the engine (not on the wire): */
    const char *from;                 /* sender's "ip:port", or "" */
    int       reply_fenced;           /* the handler's reply says "fenced" */
    int       reply_has_hold;         /* the handler's reply carries
                                         hold_ms = reply_hold_ms */
    uint32_t  reply_hold_ms;
} kvc_msg_t;

/* Receiving roles, bits of kvc_msg_desc_t.roles. */
#define KVC_MSG_TO_PRODUCER 1u
#define KVC_MSG_TO_CONSUMER 2u
#define KVC_MSG_ROLE(is_producer) \
    ((is_producer) ? KVC_MSG_TO_PRODUCER : KVC_MSG_TO_CONSUMER)

struct kvc_obj; /* ctlmsg.c's view of a decoded object */
struct kvc_jw;  /* jsonw.h */

/*
 * kvc_msg_desc_t: everything type-specific about a control message, one
 * entry a type. The decoder does the generic part (JSON, "type" lookup,
 * transfer_id, role check, plain-string compatibility) and then calls
 * decode_fields; the encoder writes "type" and "transfer_id" and then calls
 * encode_fields (both NULL for a type without further fields).
 */
typedef struct kvc_msg_desc {
    kvc_msg_type_t type;
    const char    *name;        /* wire "type" value, e.g. "remote_blocks" */
    const char    *stats_name;  /* key in the engine's stats JSON "rx" */
    unsigned       roles;       /* KVC_MSG_TO_*: who may receive it */
    int            id_optional; /* transfer_id may be absent (and is not
                                   encoded when empty) */
    /* type-specific fields, after transfer_id; KVX_ERR_BAD_MESSAGE naming
     * the field (block_ids allocated here are freed by kvc_msg_fini) */
    kvx_status_t (*decode_fields)(const struct kvc_obj *obj, kvc_msg_t *msg);
    void         (*encode_fields)(struct kvc_jw *w, const kvc_msg_t *msg);
} kvc_msg_desc_t;

/* kvc_msg_desc: the entry of type, NULL unless 1 <= type <= KVC_MSG_NTYPES. */
const kvc_msg_desc_t *kvc_msg_desc(kvc_msg_type_t type);
/* kvc_msg_desc_by_name: the entry whose name is the len bytes at name
 * (need not be NUL-terminated), or NULL. */
const kvc_msg_desc_t *kvc_msg_desc_by_name(const char *name, size_t len);

/*
 * kvc_msg_decode: buf is a JSON object with "type" (remote_blocks |
 * write_done | release | heartbeat; an object without "type" but with
 * "req_id" is remote_blocks), or a plain transfer-id string (raw bytes that
 * are not a JSON object, or a JSON string): on the producer it is release
 * with consumer_tp_size 1, on the consumer write_done. Checks: len <=
 * KVC_MSG_MAX_BYTES; transfer_id a non-empty string shorter than
 * KVX_ID_MAX of printable ASCII; remote_blocks needs a non-empty
 * block_notify_list of non-negative integers and decode_rank >= 0; release's
 * consumer_tp_size >= 1 when present; a type the receiving role does not
 * accept (remote_blocks or release on the consumer, write_done on the
 * producer) is rejected. Errors: KVX_ERR_BAD_MESSAGE.
 */
kvx_status_t kvc_msg_decode(const char *buf, size_t len, int is_producer,
                            kvc_msg_t *msg);
/* kvc_msg_decode_json_c: the same, always through json-c. kvc_msg_decode
 * reads objects in the flat reader's subset (pval.h) without it; tests and
 * fuzz_ctlmsg check that both ways give the same message and errors. */
kvx_status_t kvc_msg_decode_json_c(const char *buf, size_t len,
                                   int is_producer, kvc_msg_t *msg);
/* kvc_msg_encode returns a malloc'd NUL-terminated JSON text (len in
 * *len_p, may be NULL); a legacy message is its plain id, as a JSON string
 * when the id starts with '{' or '"' (raw, it would read as JSON). */
char *kvc_msg_encode(const kvc_msg_t *msg, size_t *len_p);
void  kvc_msg_fini(kvc_msg_t *msg);

/* Replies: {"ok":true} or {"ok":false,"error":"<reason>"}, optionally with
 * "instance" (the replier's instance id, decimal string), "fenced":true
 * (a release's reply: no operation of the replier can touch the blocks of
 * that transfer any more) and "hold_ms" (a hold's reply: the replier holds
 * the transfer's blocks at least that many more milliseconds, 0 ..
 * 4294967295). The encoder replaces bytes of reason that are not
 * well-formed UTF-8 by '?'. */
typedef struct kvc_reply_info {
    int      ok;
    uint64_t instance; /* 0: absent */
    int      fenced;
    int      has_hold;  /* "hold_ms" present */
    uint32_t hold_ms;
    /* Not on the wire, set by the engine for mode->on_reply: */
    int         delivered;   /* 0: no reply came (only the fields below
                                are set) */
    uint64_t    sent_xnonce; /* the xfer_nonce of the message answered */
    uint64_t    sent_us;     /* when that message was queued (kvc_now_us) */
    const char *reason;      /* a refusal's reason, or why none came */
} kvc_reply_info_t;

char        *kvc_reply_encode(int ok, const char *reason, size_t *len_p);
char        *kvc_reply_encode_info(const kvc_reply_info_t *info,
                                   const char *reason, size_t *len_p);
kvx_status_t kvc_reply_decode_info(const char *buf, size_t len,
                                   kvc_reply_info_t *info, char *reason_buf,
                                   size_t reason_len);
/* kvc_reply_decode: *ok_p, and reason copied into reason_buf (control bytes
 * and malformed UTF-8 as '?', cut on a character boundary). A reply that
 * is not such an object is KVX_ERR_BAD_MESSAGE. */
kvx_status_t kvc_reply_decode(const char *buf, size_t len, int *ok_p,
                              char *reason_buf, size_t reason_len);

/* Handshake request: {"type":"get_meta","version":V}. */
char        *kvc_hs_request_encode(size_t *len_p);
/* kvc_hs_request_decode: KVX_OK if buf is a get_meta request; the peer's
 * version in *version_p. */
kvx_status_t kvc_hs_request_decode(const char *buf, size_t len,
                                   uint32_t *version_p);

#define KVC_LAYER_NAME_MAX 128

typedef struct kvc_hs_layer {
    char       name[KVC_LAYER_NAME_MAX];
    uint64_t   base;      /* remote virtual address */
    uint64_t   length;    /* registered bytes */
    uint8_t   *rkey;      /* owned; packed UCX rkey */
    size_t     rkey_len;
    uint32_t   mem_type;  /* kvx_mem_type_t */
    kvc_geom_t geom;
} kvc_hs_layer_t;

typedef struct kvc_hs_meta {
    uint32_t        version;
    uint64_t        digest;            /* kvc_hs_digest of layers */
    char            engine_id[KVX_ID_MAX]; /* "host:handshake_port" */
    char            host[KVC_HOST_MAX];
    uint32_t        handshake_port, notify_port; /* base ports */
    uint32_t        dp_rank, dp_size, tp_rank, tp_size;
    uint32_t        is_producer;
    uint64_t        epoch;             /* random per engine start */
    uint64_t        session;           /* the requester's data-plane
                                          session (kvc_hs_with_session);
                                          0: none */
    char            seen_as[KVC_SEEN_AS_MAX]; /* the requester's address
                                          ("ip:port") the session was
                                          computed from; "": not sent */
    uint8_t        *worker_addr;       /* owned; UCP worker address */
    size_t          worker_addr_len;
    kvc_hs_layer_t *layers;            /* owned */
    size_t          num_layers;
} kvc_hs_meta_t;

/* kvc_hs_encode: JSON with binary fields in base64 and 64-bit integers as
 * decimal strings where they may exceed 2^53 (base, digest, epoch). */
char        *kvc_hs_encode(const kvc_hs_meta_t *meta, size_t *len_p);
/* kvc_hs_decode: every field checked (types, ranges: tp_rank < tp_size,
 * num_layers <= 4096, non-empty rkey/worker address, geometry kind valid,
 * block_len > 0 ...). KVX_ERR_BAD_MESSAGE naming the field; nothing to free
 * on error. */
kvx_status_t kvc_hs_decode(const char *buf, size_t len, kvc_hs_meta_t *meta);
/* kvc_hs_with_session: the encoded metadata (kvc_hs_encode, no session)
 * with member "session" (a decimal string) added for one requester, and
 * "seen_as", the requester's address the session was computed from, when
 * seen_as is an address ("ip:port", "[v6]:port": hex digits, '.', ':',
 * '[', ']' only, shorter than KVC_SEEN_AS_MAX; else left out): malloc'd,
 * NUL-terminated, length in *len_p; NULL without memory or when meta is no
 * JSON object text. */
char *kvc_hs_with_session(const char *meta, size_t len, uint64_t session,
                          const char *seen_as, size_t *len_p);
void         kvc_hs_fini(kvc_hs_meta_t *meta);
/* kvc_seen_as_ok: s is a seen_as kvc_hs_with_session would send. */
int          kvc_seen_as_ok(const char *s);

/* kvc_hs_digest: FNV-1a 64 over each layer's name, kind, block_len,
 * block_size, kernel_block_size, elem_size, num_kv_heads, head_size,
 * head_size_v, key_only and transfers_per_block, in order; excludes
 * num_blocks, strides, addresses and TP sizes. */
uint64_t kvc_hs_digest(const kvc_hs_layer_t *layers, size_t n);

/* base64 (RFC 4648, with padding). encode returns malloc'd text; decode
 * returns KVX_ERR_BAD_MESSAGE on bad input and a malloc'd buffer. */
char        *kvc_b64_encode(const uint8_t *data, size_t len);
kvx_status_t kvc_b64_decode(const char *text, size_t text_len,
                            uint8_t **data_p, size_t *len_p);

/* kvc_idset_t: bounded FIFO set of ids (oldest evicted at capacity). */
typedef struct kvc_idset {
    char     **ids;   /* ring, owned */
    size_t     cap;
    size_t     head;  /* next slot to write */
    size_t     count;
    uint32_t  *slots; /* hash index: ring position + 1, 0 = empty; owned */
    uint32_t  *hash;  /* per ring position: its id's hash (low 32 bits) */
    size_t     mask;  /* slots - 1 (power of two) */
} kvc_idset_t;

kvx_status_t kvc_idset_init(kvc_idset_t *set, size_t cap);
void         kvc_idset_fini(kvc_idset_t *set);
/* kvc_idset_add: adds id (no-op if present); evicts the oldest when full. */
kvx_status_t kvc_idset_add(kvc_idset_t *set, const char *id);
int          kvc_idset_contains(const kvc_idset_t *set, const char *id);

#endif
