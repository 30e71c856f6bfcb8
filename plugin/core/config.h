/*
 * config.h - the engine configuration (SPEC §1), parsed from one JSON object.
 *
 * The top level holds the rank's identity: "role" (or "kv_role") =
 * "kv_producer" | "kv_consumer", "tp_rank", "tp_size", "dp_rank", "dp_size",
 * an optional "log_level" (0..3) and the object "kv_connector_extra_config"
 * whose keys are listed in kvc_config_t. Unknown keys (at either level) are
 * reported through the warn callback; wrong types and out-of-range values
 * are KVX_ERR_CONFIG errors whose text names the key, the value and the
 * rule. No environment variable is read.
 *
 * Threading: pure functions, any thread.
 */
#ifndef KVC_CONFIG_H
#define KVC_CONFIG_H

#include "error.h"
#include "kvt.h"

#include <stddef.h>
#include <stdint.h>

#define KVC_HOST_MAX 256

typedef enum kvc_err_mode {
    KVC_ERR_MODE_PEER = 0, /* UCP_ERR_HANDLING_MODE_PEER (default) */
    KVC_ERR_MODE_NONE = 1,
} kvc_err_mode_t;

typedef struct kvc_config {
    /* identity */
    int      is_producer;      /* role == kv_producer */
    uint32_t tp_rank, tp_size; /* tp_size >= 1, tp_rank < tp_size */
    uint32_t dp_rank, dp_size; /* dp_size >= 1, dp_rank < dp_size */
    int      log_level;        /* 0..3, default 1 (warn) */

    /* kv_connector_extra_config */
    char     host_ip[KVC_HOST_MAX]; /* default: first non-loopback IPv4, else
                                       127.0.0.1 */
    uint32_t handshake_port;        /* [6301], 1024..65535 and the highest
                                       rank's port (base + dp_size*tp_size-1)
                                       must be <= 65535 */
    uint32_t notify_port;           /* [61005], same rule */
    int      read_mode;             /* [false]; true/false/"true"/"false"/
                                       "1"/"0"/1/0 */
    int      read_bind_decode_host; /* [false], as read_mode: a READ P
                                       transfer is bound to the decode host
                                       its request id names (expose.c) */
    int      release_on_data_plane; /* [true], as read_mode: a READ D
                                       releases a P rank it read from with a
                                       data-plane notice (mode_read.c); a
                                       WRITE D completes on P's notice
                                       alone (no write_done;
                                       mode_write_d.c) */
    char   **node_hosts;            /* owned; [host_ip]; list or comma string,
                                       entries trimmed, empties dropped */
    size_t   num_node_hosts;
    char   **trusted_remote_hosts;  /* owned; list or comma string */
    size_t   num_trusted_remote_hosts;
    int      trusted_set;           /* key present */
    double   handshake_timeout;     /* [10] seconds, > 0 and <= 3600 */
    double   transfer_timeout;      /* [30] */
    double   defer_timeout;         /* [60] */
    double   clock_skew;            /* [0.5] how far the clocks of P and D
                                       hosts may disagree, seconds */
    char     proxy_ip[KVC_HOST_MAX]; /* [""] */
    uint32_t proxy_ping_port;       /* [0] = unset, else 1..65535 */
    double   proxy_ping_interval;   /* [5] s between registrations */
    uint32_t http_port;             /* [0] = unset, else 1..65535 */
    char     backend[16];           /* ["rdma"]: "rdma" | "xgmi" (MoRIIO) */
    uint32_t qp_per_transfer;       /* [1] 1..64 */
    int32_t  post_batch_size;       /* [-1] -1 or 1..4096 */
    uint32_t num_workers;           /* [1] 1..64 */

    /* UCX keys of kvxfer's design */
    char          ucx_tls[256];       /* ["" = UCX default] e.g. "tcp" */
    char          ucx_net_devices[256]; /* ["" = all] */
    char          ucx_tcp_port_range[16]; /* ["" = OS-chosen] "lo-hi" */
    char          ucx_lane_settings[512]; /* ["auto"] UCX settings, see
                                             transports/ucx/README.md */
    char        **ucx_required_transports; /* owned; [] e.g. ["rc_verbs"] */
    size_t        num_ucx_required_transports;
    kvc_err_mode_t ucx_error_mode;    /* ["peer"] | "none" */
    uint64_t      max_inflight_bytes; /* [16 MiB] per endpoint, >= 4096 */
    uint32_t      progress_spin_us;   /* [50] 0..100000 busy-poll before
                                         sleeping */
    uint32_t      progress_drive_us;  /* [200] 0..100000 a driving wait's
                                         idle poll, and its lease */
    int           progress_caller;    /* ["auto"] waits drive the progress
                                         (kvt drive_*): 0, 1 or
                                         KVC_PROGRESS_CALLER_AUTO */

    /* Device placement (SPEC §11: hwloc picks the NIC near the GPU) */
    char gpu_bus_id[32];      /* [""] = unknown; else the PCI bus id of this
                                 rank's GPU, "dddd:bb:dd.f" or "bb:dd.f"
                                 (hex, device <= 1f, function <= 7) */
    char hwloc_topology[256]; /* [""] = this machine; else the path of an
                                 hwloc XML topology to use instead */

    /* Control-plane mutual TLS (kvt_ctl_sec_t): keys tls_cert_file,
     * tls_key_file, tls_ca_file, tls_peer_name, all [""]; all four or
     * none. tls_proxy_name [""]: the name the proxy's certificate must
     * carry (registration); "" = tls_peer_name. */
    kvt_ctl_sec_t tls;
    char          tls_proxy_name[KVT_NAME_MAX];
} kvc_config_t;

typedef void (*kvc_warn_fn)(void *arg, const char *msg);

/* kvc_config_parse parses json into cfg (which it initialises). On error
 * nothing is left to free; on KVX_OK call kvc_config_fini. warn may be NULL
 * (then warnings go to kvc_log_warn with id "KVX-CONFIG-UNKNOWN-KEY"). */
kvx_status_t kvc_config_parse(const char *json, kvc_config_t *cfg,
                              kvc_warn_fn warn, void *warn_arg);

/* kvc_config_fini frees owned lists; a zeroed struct is a no-op. */
void kvc_config_fini(kvc_config_t *cfg);

/* kvc_config_dump returns the effective configuration as a JSON string in
 * the input format (malloc'd; caller frees), or NULL on no memory. */
char *kvc_config_dump(const kvc_config_t *cfg);

/* kvc_config_world returns dp_size * tp_size; kvc_config_rank the global
 * rank dp_rank * tp_size + tp_rank (SPEC §2). */
uint32_t kvc_config_world(const kvc_config_t *cfg);
uint32_t kvc_config_rank(const kvc_config_t *cfg);

/* kvc_config_ctl_sec: the control plane's TLS settings, NULL when TLS is
 * off; kvc_config_proxy_sec fills *buf for the registration client
 * (tls_proxy_name as the name to check) and returns it, or NULL. */
const kvt_ctl_sec_t *kvc_config_ctl_sec(const kvc_config_t *cfg);
const kvt_ctl_sec_t *kvc_config_proxy_sec(const kvc_config_t *cfg,
                                          kvt_ctl_sec_t *buf);


/* progress_caller "auto": waits drive the progress where every transport
 * the UCX_TLS list in force allows is local (kvc_tls_local_only), and
 * sleep otherwise. */
#define KVC_PROGRESS_CALLER_AUTO 2

/* kvc_tls_local_only: does the UCX_TLS list tls name only transports that
 * stay inside the host (shared memory, cma/knem/xpmem, self, GPU copy and
 * IPC)? Names are compared as UCX does (exactly; "\name" and "name:aux"
 * forms too). "" (UCX's default), "all", an exclusion ("^..."), an empty
 * entry, a name UCX would not take or any network transport (tcp, rc, ud,
 * dc, ib, ...) make it 0. */
int kvc_tls_local_only(const char *tls);

/* kvc_progress_caller_on: do waits drive the progress under cfg? env_tls:
 * the environment's UCX_TLS (NULL: unset), in force when ucx_tls is "". */
int kvc_progress_caller_on(const kvc_config_t *cfg, const char *env_tls);

#endif
