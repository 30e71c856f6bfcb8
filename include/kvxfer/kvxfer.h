/*
 * kvxfer.h - public API of the kvxfer KV-cache transfer plugin.
 *
 * kvxfer moves KV-cache blocks from a prefill instance (P, kv_producer) to a
 * decode instance (D, kv_consumer). Block data moves with UCX one-sided
 * get/put; handshakes and control messages travel over nng req/rep as JSON.
 *
 * A serving framework dlopen()s libkvxfer.so, resolves the single exported
 * symbol KVX_ENTRY_POINT_NAME ("kvx_get_api"), calls it with the ABI major it
 * was built against, and uses only the returned function table. Nothing else
 * is exported.
 *
 * Threading: every function in the table may be called from any thread, and
 * several engines may live in one process. Calls on one engine are serialised
 * internally. Callbacks run on the engine's progress thread, never inside the
 * call that submitted the operation. If a call that takes a callback returns
 * an error, the callback is never called. engine_destroy blocks until the
 * engine's threads have stopped; never call it from a kvxfer callback (nor
 * call kvxfer from the logger). Calls on the engine already running in
 * other threads when engine_destroy begins end first: waits return
 * KVX_ERR_CANCELED at once, calls that begin meanwhile KVX_ERR_BAD_STATE;
 * no call may begin once engine_destroy returned (the engine is gone).
 *
 * Errors: every function that fails returns a negative kvx_status_t and sets
 * a thread-local message (last_error) that names the field, the value and the
 * rule that was broken. Since ABI 1.3 every call of the table except
 * last_error, status_name and status_string clears it first, so after a
 * success last_error is "" (1.2 left an older message in place after some
 * calls: config_dump, poll_events, stats, transports, regions).
 *
 * Memory: strings returned through a `char **` out-parameter and the
 * block_ids arrays of events are owned by the caller; release them with
 * api->free(). Input pointers are borrowed for the duration of the call only,
 * except registered layer memory, which must stay valid until the engine is
 * destroyed.
 */
#ifndef KVXFER_KVXFER_H
#define KVXFER_KVXFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVX_ABI_MAJOR 1
#define KVX_ABI_MINOR 3

#define KVX_ENTRY_POINT_NAME "kvx_get_api"

/* Sizes of the fixed strings carried by events. A request_id or
 * transfer_id of KVX_ID_MAX characters or more is refused
 * (KVX_ERR_INVALID_PARAM naming the limit), never truncated. */
#define KVX_ID_MAX     256
#define KVX_REASON_MAX 512

/*
 * Status codes: 0 is success, 1 "in progress", negatives are errors grouped
 * by blast radius (-1..-19 argument/config, -20..-39 peer/control plane,
 * -40..-59 transfer/data plane, -90 and below internal).
 */
#define KVX_STATUS_MAP(X)                                                      \
    X(KVX_OK, 0, "success")                                                    \
    X(KVX_INPROGRESS, 1, "operation in progress")                              \
    X(KVX_ERR_INVALID_PARAM, -1, "invalid parameter")                          \
    X(KVX_ERR_CONFIG, -2, "invalid configuration")                             \
    X(KVX_ERR_NOT_SUPPORTED, -3, "not supported")                              \
    X(KVX_ERR_BAD_STATE, -4, "call not valid in the current state")            \
    X(KVX_ERR_NOT_FOUND, -5, "no such object")                                 \
    X(KVX_ERR_EXISTS, -6, "object already exists")                             \
    X(KVX_ERR_LAYOUT, -7, "unsupported or ambiguous KV layout")                \
    X(KVX_ERR_ABI, -8, "ABI version mismatch")                                 \
    X(KVX_ERR_UNTRUSTED_PEER, -20, "peer address rejected")                    \
    X(KVX_ERR_HANDSHAKE, -21, "handshake failed")                              \
    X(KVX_ERR_HANDSHAKE_TIMEOUT, -22, "handshake timed out")                   \
    X(KVX_ERR_PEER_VERSION, -23, "peer protocol version mismatch")             \
    X(KVX_ERR_PEER_INCOMPATIBLE, -24, "peer KV geometry incompatible")         \
    X(KVX_ERR_BAD_MESSAGE, -25, "malformed control message")                   \
    X(KVX_ERR_CONTROL, -26, "control plane failure")                           \
    X(KVX_ERR_TIMEOUT, -27, "deadline expired")                                \
    X(KVX_ERR_ENDPOINT, -40, "data plane endpoint failure")                    \
    X(KVX_ERR_TRANSFER_TIMEOUT, -41, "transfer timed out")                     \
    X(KVX_ERR_OUT_OF_BOUNDS, -42, "block or range outside registered memory")  \
    X(KVX_ERR_CANCELED, -43, "operation canceled")                             \
    X(KVX_ERR_TRANSPORT, -44, "required transport not available")             \
    X(KVX_ERR_DEVICE, -45, "device memory not supported here")                 \
    X(KVX_ERR_NOT_EXPOSED, -46, "blocks not held by a live transfer of the peer") \
    X(KVX_ERR_NO_MEMORY, -90, "out of memory")                                 \
    X(KVX_ERR_INTERNAL, -91, "internal error")

#define KVX_STATUS_ENUM_ENTRY(name, value, msg) name = (value),
typedef enum kvx_status { KVX_STATUS_MAP(KVX_STATUS_ENUM_ENTRY) } kvx_status_t;
#undef KVX_STATUS_ENUM_ENTRY

#define KVX_IS_CONFIG_ERROR(s)    ((s) <= -1 && (s) >= -19)
#define KVX_IS_PEER_ERROR(s)      ((s) <= -20 && (s) >= -39)
#define KVX_IS_TRANSFER_ERROR(s)  ((s) <= -40 && (s) >= -59)
#define KVX_IS_INTERNAL_ERROR(s)  ((s) <= -90)

typedef struct kvx_engine kvx_engine_t;

/* Memory type of a registered layer. */
typedef enum kvx_mem_type {
    KVX_MEM_HOST = 0,
    KVX_MEM_ROCM = 1,
} kvx_mem_type_t;

/*
 * kvx_layer_desc_t describes one registered KV-cache tensor: its memory, the
 * tensor's shape and strides (in elements, as torch reports them) and the
 * attention spec of the layer. The engine derives the per-block geometry
 * (SPEC §6) from these; an ambiguous or unsupported shape is an error.
 */
typedef struct kvx_layer_desc {
    size_t         struct_size;  /* sizeof(kvx_layer_desc_t) */
    const char    *name;         /* layer name; identical on P and D */
    void          *base;         /* first byte of the tensor */
    size_t         length;       /* bytes registered from base */
    kvx_mem_type_t mem_type;
    uint32_t       ndim;         /* 3, 4 or 5 */
    int64_t        shape[8];
    int64_t        stride[8];    /* elements */
    uint32_t       elem_size;    /* bytes per element (2 for bf16) */
    uint32_t       block_size;   /* logical tokens per block (spec) */
    uint32_t       num_kv_heads; /* KV heads held by this rank */
    uint32_t       head_size;    /* K head dim (latent dim for MLA) */
    uint32_t       head_size_v;  /* V head dim; 0 = head_size */
    uint32_t       key_only;     /* 1: MLA / indexer / key-only cache */
} kvx_layer_desc_t;

typedef enum kvx_event_type {
    KVX_EVENT_FINISHED_SENDING   = 1, /* P: blocks of transfer may be freed */
    KVX_EVENT_FINISHED_RECVING   = 2, /* D: all blocks of transfer landed */
    KVX_EVENT_FAILED             = 3, /* either side: transfer failed */
} kvx_event_type_t;

/*
 * kvx_event_t reports a transfer outcome. On KVX_EVENT_FAILED, block_ids
 * lists the local blocks the framework must recompute (D) or may free (P);
 * block_ids is owned by the caller and released with api->free().
 */
typedef struct kvx_event {
    kvx_event_type_t type;
    kvx_status_t     status;
    char             transfer_id[KVX_ID_MAX];
    char             request_id[KVX_ID_MAX];
    char             reason[KVX_REASON_MAX];
    uint64_t        *block_ids;
    size_t           num_block_ids;
} kvx_event_t;

/* Logger: level 0 error, 1 warn, 2 info, 3 debug. */
typedef void (*kvx_log_fn_t)(void *arg, int level, const char *id,
                             const char *msg);

/*
 * kvx_api_t is the versioned function table. New functions are appended;
 * check struct_size before using a member newer than the ABI you built with.
 */
typedef struct kvx_api {
    uint32_t abi_major;
    uint32_t abi_minor;
    size_t   struct_size;

    /* status_name returns "KVX_ERR_..."; status_string a sentence. Both
     * constant; an unknown code gives "unknown status". */
    const char *(*status_name)(kvx_status_t status);
    const char *(*status_string)(kvx_status_t status);
    /* last_error returns the calling thread's last error message; borrowed,
     * valid until the next kvxfer call on this thread. */
    const char *(*last_error)(void);
    /* free releases strings and arrays kvxfer handed to the caller. */
    void (*free)(void *ptr);
    /* set_logger installs a process-wide logger (NULL: stderr) and level. */
    void (*set_logger)(kvx_log_fn_t fn, void *arg, int max_level);

    /* engine_create parses the JSON config (SPEC §1) and creates one engine
     * for one rank: UCP context and worker, progress thread. */
    kvx_status_t (*engine_create)(const char *config_json,
                                  kvx_engine_t **engine_p);
    /* engine_destroy stops listeners and threads and releases everything;
     * NULL is a no-op. Blocks; never call from a callback. Ends the waits
     * of other threads on this engine (KVX_ERR_CANCELED) and waits (at
     * most 5 s) for their calls in progress to return. */
    void (*engine_destroy)(kvx_engine_t *engine);
    /* config_dump returns the effective configuration as JSON (caller
     * frees). */
    kvx_status_t (*config_dump)(kvx_engine_t *engine, char **json_p);

    /* alloc_region allocates host memory through UCX (shared-memory peers
     * then copy directly); the region may hold layers registered next. */
    kvx_status_t (*alloc_region)(kvx_engine_t *engine, size_t length,
                                 void **ptr_p);
    /* free_region releases a region from alloc_region (after destroy of all
     * users, or at engine_destroy automatically). */
    kvx_status_t (*free_region)(kvx_engine_t *engine, void *ptr);
    /* register_layer registers one KV tensor, before start(). Layer index =
     * registration order. */
    kvx_status_t (*register_layer)(kvx_engine_t *engine,
                                   const kvx_layer_desc_t *desc);
    /* start binds the handshake and notify listeners (SPEC §2). */
    kvx_status_t (*start)(kvx_engine_t *engine);
    /* registration_payload returns the proxy registration JSON (SPEC §3). */
    kvx_status_t (*registration_payload)(kvx_engine_t *engine,
                                         char **json_p);

    /* producer_request (P): the prefill of request_id finished with its KV in
     * block_ids. The engine holds the transfer until the consumer releases it
     * (or defer_timeout), then reports KVX_EVENT_FINISHED_SENDING. Returns
     * the kv_transfer_params P gives back to the proxy (caller frees). In
     * READ mode they bind the transfer to this engine instance
     * (remote_instance, remote_tp_rank): if another instance of that P
     * rank answers D (P restarted on the same address), D's transfer
     * fails instead of reading the new instance's blocks; with P TP > 1,
     * so does one of another P rank started after this call
     * (remote_accepted). */
    kvx_status_t (*producer_request)(kvx_engine_t *engine,
                                     const char *request_id,
                                     const char *params_json,
                                     const uint64_t *block_ids,
                                     size_t num_blocks,
                                     char **response_params_p);
    /* consumer_request (D): start receiving the KV of request_id into
     * block_ids (READ: handshake if needed, then gets for every layer).
     * Returns at once; progress is reported by waits and events. The
     * transfer is named by params' transfer_id. */
    kvx_status_t (*consumer_request)(kvx_engine_t *engine,
                                     const char *request_id,
                                     const char *params_json,
                                     const uint64_t *block_ids,
                                     size_t num_blocks);
    /* wait_layer blocks until layer `layer` of the transfer has landed
     * (KVX_OK), failed (its error), or timeout_ms passed (KVX_ERR_TIMEOUT).
     * timeout_ms < 0 means the transfer's own deadline. READ mode: D's gets
     * of that layer completed while the P ranks held the blocks (with P TP
     * > 1, once every P rank read from other than the one whose response
     * D got confirmed its hold: about one control round trip). WRITE mode
     * on D: D cannot see P's puts
     * land one layer at a time; it learns of them all at once from
     * write_done, so wait_layer returns when the whole transfer has landed
     * (as wait_transfer). Waits are for D: on P they return
     * KVX_ERR_BAD_STATE. */
    kvx_status_t (*wait_layer)(kvx_engine_t *engine, const char *transfer_id,
                               uint32_t layer, int64_t timeout_ms);
    /* wait_transfer is wait_layer for every layer of the transfer. */
    kvx_status_t (*wait_transfer)(kvx_engine_t *engine,
                                  const char *transfer_id,
                                  int64_t timeout_ms);
    /* poll_events copies up to max pending events; returns the count
     * (>= 0) or a negative status. */
    int (*poll_events)(kvx_engine_t *engine, kvx_event_t *events, int max);
    /* transports returns a JSON array describing every UCX endpoint of the
     * engine: peer, lanes, transports, whether RMA is emulated. */
    kvx_status_t (*transports)(kvx_engine_t *engine, char **json_p);

    /* build_decode_params (proxy helper, no engine): from P's response
     * params and the transfer_id, build the kv_transfer_params a proxy sends
     * to D (SPEC §3). Caller frees. */
    kvx_status_t (*build_decode_params)(const char *prefill_response_json,
                                        const char *transfer_id,
                                        char **decode_params_p);

    /* --- ABI 1.1: WRITE mode (read_mode false) ------------------------- */
    /* In WRITE mode producer_request is called when P allocated the
     * request's blocks (before or during prefill); consumer_request when D
     * allocated its blocks: D then sends remote_blocks to its P rank and
     * reports KVX_EVENT_FINISHED_RECVING on write_done.
     *
     * layer_ready (P): the KV of `layer` is computed for this transfer;
     * its puts start as soon as D's blocks are known. Calling it twice is a
     * no-op; any order. In READ mode it is a no-op. Once the transfer has
     * failed (its FAILED event may still be queued) it returns the failure
     * (KVX_ERR_BAD_STATE after the event; the same for seal_transfer), so
     * the framework can stop; after FINISHED_SENDING it is a no-op. */
    kvx_status_t (*layer_ready)(kvx_engine_t *engine, const char *transfer_id,
                                uint32_t layer);
    /* seal_transfer (P): no more layers will be scheduled; write_done goes
     * to D once every scheduled layer's puts completed. No-op in READ. */
    kvx_status_t (*seal_transfer)(kvx_engine_t *engine,
                                  const char *transfer_id);
    /* consumer_abort (D): the request finished or was aborted before (or
     * instead of) receiving: P is released at once (no timeout), and a
     * pending WRITE transfer of this id fails with KVX_ERR_CANCELED. */
    kvx_status_t (*consumer_abort)(kvx_engine_t *engine,
                                   const char *request_id,
                                   const char *params_json);
    /* stats returns counters as JSON (caller frees): control messages
     * received by type and rejected, sent and failed, handshakes, bytes
     * read and written, active transfers, pending events. */
    kvx_status_t (*stats)(kvx_engine_t *engine, char **json_p);
    /* build_prefill_params (proxy helper, no engine): from D's registration
     * payload build the kv_transfer_params a proxy sends to P: D's address,
     * sizes and remote_hosts = D's node_hosts (SPEC §3). Caller frees. */
    kvx_status_t (*build_prefill_params)(const char *decode_registration_json,
                                         const char *transfer_id,
                                         char **prefill_params_p);

    /* --- ABI 1.2 (check struct_size / abi_minor >= 2) --- */

    /* connect_peer handshakes ahead of the first request with the rank of
     * a remote instance that this engine would issue one-sided operations
     * to (READ kv_consumer: its P rank; WRITE kv_producer: its D rank at
     * remote_dp_rank), so that request does not wait for it. params_json
     * takes the addressing keys of kv_transfer_params: remote_host,
     * remote_handshake_port, remote_notify_port (required), remote_tp_size,
     * remote_dp_size, remote_dp_rank, remote_hosts; the same trust and
     * range checks apply. timeout_ms 0: start it and return KVX_OK;
     * > 0: wait for the outcome (KVX_OK when connected, the handshake's
     * error, or KVX_ERR_TIMEOUT; the handshake itself is bounded by
     * handshake_timeout). A connected peer is a no-op. The other roles get
     * KVX_ERR_NOT_SUPPORTED (they answer handshakes, never make them). */
    kvx_status_t (*connect_peer)(kvx_engine_t *engine, const char *params_json,
                                 int64_t timeout_ms);
    /* wait_events blocks until at least one event is pending (KVX_OK; take
     * it with poll_events) or timeout_ms (>= 0) passed (KVX_ERR_TIMEOUT):
     * a producer can sleep until FINISHED_SENDING / FAILED instead of
     * polling. */
    kvx_status_t (*wait_events)(kvx_engine_t *engine, int64_t timeout_ms);

    /* --- ABI 1.3 (check struct_size / abi_minor >= 3) --- */

    /* event_fd returns a file descriptor (an eventfd) that is readable
     * exactly while at least one event is pending, for an event loop's
     * poll/epoll/select (asyncio loop.add_reader): no thread need sit in
     * wait_events. poll_events drains it when it takes the last pending
     * event; never read() it yourself. The descriptor is created on the first
     * call, the same one is returned after, and it is owned by the engine:
     * closed by engine_destroy (do not close it). Level-triggered, non-
     * blocking, close-on-exec. */
    kvx_status_t (*event_fd)(kvx_engine_t *engine, int *fd_p);
} kvx_api_t;

/*
 * kvx_get_api is the only exported symbol. It returns the function table if
 * abi_major equals KVX_ABI_MAJOR, else NULL.
 */
typedef const kvx_api_t *(*kvx_get_api_fn_t)(uint32_t abi_major);
const kvx_api_t *kvx_get_api(uint32_t abi_major);

#ifdef __cplusplus
}
#endif

#endif /* KVXFER_KVXFER_H */
