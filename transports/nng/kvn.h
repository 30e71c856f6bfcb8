/*
 * kvn.h - the nng control plane: REP servers that answer JSON requests with
 * several contexts in flight, and REQ clients with per-request deadlines.
 *
 * A server's handler runs on an nng callback thread, may run concurrently
 * for different contexts, must not block for long, and always produces a
 * reply (the listener never stops on a bad message). A client is used by one
 * thread at a time.
 *
 * Threading: kvn_server_destroy blocks until running handlers return; never
 * call it from a handler.
 */
#ifndef KVN_H
#define KVN_H

#include "error.h"
#include "kvt.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvn_server kvn_server_t;
typedef struct kvn_client kvn_client_t;

/* kvn_handler_fn (kvt_handler_fn): msg is len bytes (not NUL-terminated)
 * from `from` ("ip:port" of the sender's connection, "" when unknown). Set
 * *reply_p to a malloc'd buffer of *reply_len_p bytes (kvn frees it). */
typedef kvt_handler_fn kvn_handler_fn;
typedef kvt_reply_fn   kvn_reply_fn;

#define KVN_FROM_MAX 64

/* kvn_url formats "tcp://host:port" ("tcp://[v6]:port" for IPv6);
 * kvn_url_sec "tls+tcp://..." when sec turns TLS on. */
void kvn_url(const char *host, uint32_t port, char *buf, size_t len);
void kvn_url_sec(const char *host, uint32_t port, const kvt_ctl_sec_t *sec,
                 char *buf, size_t len);

/* kvn_server_create binds a REP socket at host:port (host "0.0.0.0" or "::"
 * for any) with nctx contexts. Messages above max_msg bytes are dropped by
 * nng (connection closed); the handler sees everything up to that size. */
kvx_status_t kvn_server_create(const char *host, uint32_t port, int nctx,
                               size_t max_msg, kvn_handler_fn fn, void *arg,
                               kvn_server_t **srv_p);
/* kvn_server_create_sec: the same with mutual TLS when sec is non-NULL
 * with cert_file set (kvt.h); a reply not taken by its connection within
 * KVN_REPLY_TIMEOUT_MS closes that connection. */
kvx_status_t kvn_server_create_sec(const char *host, uint32_t port, int nctx,
                                   size_t max_msg, const kvt_ctl_sec_t *sec,
                                   kvn_handler_fn fn, void *arg,
                                   kvn_server_t **srv_p);
void         kvn_server_destroy(kvn_server_t *srv);

/* kvn_client_open creates a REQ socket that dials host:port in the
 * background (reconnecting). */
kvx_status_t kvn_client_open(const char *host, uint32_t port,
                             kvn_client_t **cli_p);
/* kvn_client_request sends msg and waits at most timeout_ms for the reply
 * (malloc'd, caller frees). KVX_ERR_TIMEOUT when nothing answered. */
kvx_status_t kvn_client_request(kvn_client_t *cli, const void *msg,
                                size_t len, int timeout_ms, char **reply_p,
                                size_t *reply_len_p);

/* Asynchronous requests: a client opened with kvn_client_open_async has
 * nctx REQ contexts, so up to nctx requests are in flight at once (each
 * with its own deadline) instead of one round trip after another.
 *
 * kvn_reply_fn runs on an nng thread, never inside kvn_client_post, exactly
 * once per accepted request (also when the client is closed: then st is
 * KVX_ERR_CANCELED). On KVX_OK, reply is len bytes plus a NUL, valid during
 * the call; otherwise err says what failed and reply is NULL. The callback
 * may take locks that the caller of kvn_client_post holds (nng calls it
 * with no lock of its own held). */


kvx_status_t kvn_client_open_async(const char *host, uint32_t port, int nctx,
                                   kvn_client_t **cli_p);
/* kvn_client_open_sec: kvn_client_open_async with mutual TLS (kvt.h). */
kvx_status_t kvn_client_open_sec(const char *host, uint32_t port, int nctx,
                                 const kvt_ctl_sec_t *sec,
                                 kvn_client_t **cli_p);
/* kvn_client_post copies msg and sends it on a free context. KVX_OK: fn
 * will be called. KVX_ERR_BAD_STATE: every context is busy (nothing sent,
 * fn not called); other errors: nothing sent, fn not called. */
kvx_status_t kvn_client_post(kvn_client_t *cli, const void *msg, size_t len,
                             int timeout_ms, kvn_reply_fn fn, void *arg);
/* kvn_client_idle_contexts: contexts free for kvn_client_post now. */
int          kvn_client_idle_contexts(kvn_client_t *cli);
/* kvn_client_close: pending asynchronous requests complete (canceled)
 * before it returns; never call it from a kvn_reply_fn. */
void         kvn_client_close(kvn_client_t *cli);
/* kvn_client_watch: fn(arg, up) on an nng thread when a connection of cli
 * comes up or is lost (kvt_ctl_ops_t.client_watch); first, in the calling
 * thread, what happened since the dial started (a connection up, a
 * reconnect, none up now). */
void         kvn_client_watch(kvn_client_t *cli, kvt_conn_fn fn, void *arg);
const char  *kvn_client_url(const kvn_client_t *cli);

/* kvn_pin_library keeps libnng mapped for the life of the process (its
 * threads outlive a dlclose of kvxfer). Idempotent, any thread. */
void kvn_pin_library(void);

/* kvt_nng_ops: this control plane as the engine's operation table
 * (client_open is kvn_client_open_async). */
const kvt_ctl_ops_t *kvt_nng_ops(void);

/* kvn_status_from_nng converts an nng error number. */
kvx_status_t kvn_status_from_nng(int rv);

#endif
