/*
 * kvp_int.h - internals of kvxfer_perf shared by its modules.
 *
 *   kvp_util.c      clocks, statistics, RSS, byte patterns, logger, dlopen
 *   kvp_comm_sock.c bootstrap channel over a TCP socket / socketpair
 *   kvp_comm_mpi.c  bootstrap channel over MPI (only with MPI)
 *   kvp_side.c      one engine, its KV pool, block ids, fill and check
 *   kvp_run.c       the session protocol and the measurements
 *   kvp_report.c    table / CSV / JSON output
 */
#ifndef KVP_INT_H
#define KVP_INT_H

#include "kvp.h"

#include <kvxfer/kvxfer.h>

#include <stdarg.h>
#include <stdint.h>

/* --- util --------------------------------------------------------------- */

double   kvp_now_us(void);               /* CLOCK_MONOTONIC */
void     kvp_sleep_us(unsigned us);
void     kvp_timer_slack_min(void);      /* this thread: 1 us timer slack */
int      kvp_cmp_double(const void *a, const void *b);
/* kvp_pctl: linear-interpolated percentile p (0..100) of sorted v[n]. */
double   kvp_pctl(const double *sorted, size_t n, double p);
double   kvp_mean(const double *v, size_t n);
/* kvp_rss_kb: VmRSS and VmHWM of this process in KiB (-1 if unknown). */
void     kvp_rss_kb(int64_t *rss, int64_t *hwm);
void     kvp_boot_id(char *buf, size_t len);
uint64_t kvp_mix64(uint64_t x);
/* Pattern of unit u of block b of layer l on P rank r, byte i = byte i%8 of
 * mix64(seed + i/8). */
void     kvp_pattern_fill(uint8_t *p, uint64_t len, uint32_t rank,
                          uint32_t layer, uint64_t block, uint32_t unit);
int      kvp_parse_size(const char *s, uint64_t *v);
/* kvp_touch writes every page of p (calloc'd zero pages are not resident):
 * the tool's own per-point arrays then count before the first RSS sample,
 * so RSS growth during a point is the library's. */
void     kvp_touch(void *p, size_t len);
void     kvp_fmt_size(uint64_t v, char *buf, size_t len);

/* Messages: errors go to stderr with the role tag. */
void kvp_set_tag(const char *tag);
void kvp_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kvp_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern int kvp_verbose, kvp_quiet;

/* dlopen libkvxfer and return its table (NULL + message on failure). */
const kvx_api_t *kvp_load_api(const char *path, char *err, size_t errlen);
/* Process-wide logger: timestamps KVX-HANDSHAKE-OK, prints warnings. */
void   kvp_logger_install(const kvx_api_t *api);
double kvp_logger_last_handshake_us(void);

/* --- bootstrap channel ---------------------------------------------------- */

enum kvp_msg_type {
    KVP_MSG_HELLO = 1,
    KVP_MSG_ARGV,
    KVP_MSG_PING,
    KVP_MSG_PONG,
    KVP_MSG_SETUP,      /* D -> P: engine of setup s started */
    KVP_MSG_SETUP_ACK,  /* P -> D: mine too (carries host, ports) */
    KVP_MSG_POINT,      /* D -> P: start point */
    KVP_MSG_READY,      /* P -> D: requests registered */
    KVP_MSG_DONE,       /* D -> P: D's loop finished */
    KVP_MSG_PRECS,      /* P -> D: P's per-iteration records */
    KVP_MSG_BARRIER,
    KVP_MSG_ABORT,
    KVP_MSG_BYE,
    KVP_MSG_GATHER,
    KVP_MSG_BCAST,
    KVP_MSG_PACED,      /* P -> D: finished this many (--lead) */
};
/* recv's type that takes any message; its type is then c->last_type. */
#define KVP_MSG_ANY 0u

typedef struct kvp_comm kvp_comm_t;

typedef struct kvp_comm_ops {
    /* send to the pair peer */
    int (*send)(kvp_comm_t *c, uint32_t type, const void *buf, size_t len);
    /* receive the next message from the pair peer; it must be of `type`,
     * or any with KVP_MSG_ANY (c->last_type says which it was)
     * (KVP_MSG_ABORT is reported as an error with the peer's text).
     * The buffer (*buf) is malloc()ed (free it); returns 0, -1 error, -2 timeout. */
    int (*recv)(kvp_comm_t *c, uint32_t type, void **buf, size_t *len,
                double timeout_s);
    /* 1 when a message from the peer is waiting */
    int (*pending)(kvp_comm_t *c);
    /* every rank of the job */
    int (*barrier)(kvp_comm_t *c, double timeout_s);
    /* every rank contributes buf (may be empty); the reporter gets all
     * contributions in rank order (bufs, lens malloc()ed; n entries). */
    int (*gather)(kvp_comm_t *c, const void *buf, size_t len, void ***bufs,
                  size_t **lens, int *n, double timeout_s);
    /* root's *v is copied to every rank */
    int (*bcast_u64)(kvp_comm_t *c, uint64_t *v);
    /* fatal error: tell the peer (socket) or end the job (MPI) */
    void (*abort)(kvp_comm_t *c, const char *why);
    void (*close)(kvp_comm_t *c);
} kvp_comm_ops_t;

struct kvp_comm {
    const kvp_comm_ops_t *ops;
    int      producer;   /* this rank is P */
    uint32_t pair;       /* = tp_rank */
    uint32_t npairs;     /* = tp_size of each instance */
    int      reporter;   /* this rank prints the results */
    char     local_ip[64]; /* local address of the bootstrap connection */
    char     errmsg[512];  /* last error */
    uint32_t last_type;    /* type of the last message recv returned */
    void    *impl;
};

/* socket bootstrap */
int  kvp_comm_server(const char *bind_addr, uint16_t port, double timeout_s,
                     kvp_comm_t **c_p);
int  kvp_comm_client(const char *host, uint16_t port, double timeout_s,
                     kvp_comm_t **c_p);
/* in-process pair over a socketpair: *p for the P thread, *d for D */
int  kvp_comm_pair(kvp_comm_t **p, kvp_comm_t **d);
/* MPI bootstrap (kvp_comm_mpi.c); -1 with a message when not built */
int  kvp_comm_mpi(int *argc, char ***argv, kvp_comm_t **c_p, char *err,
                  size_t errlen);

/* --- geometry, engine, pool ----------------------------------------------- */

typedef struct kvp_geom {
    kvp_layout_t layout;
    uint32_t     layers;
    uint32_t     tokens, heads, head_dim, elem; /* heads: this rank's */
    uint32_t     units;        /* transfer units per block and layer */
    uint64_t     unit;         /* bytes of one K (or V) block of a layer */
    uint64_t     nb;           /* blocks in the pool */
    uint64_t     layer_bytes;  /* bytes of one layer tensor */
    uint64_t     layer_stride; /* bytes between layer tensors in the pool */
    uint64_t     pool_bytes;
    uint64_t     block_total;  /* bytes of one block over all layers */
} kvp_geom_t;

/* kvp_geom_make: geometry for tp_size, block bytes (0 = model's), pool;
 * nb_min is the smallest pool (in blocks) the sweep needs. */
int kvp_geom_make(const kvp_model_t *m, uint32_t tp_size, uint64_t block_bytes,
                  uint64_t pool_bytes, uint64_t nb_min, kvp_geom_t *g,
                  char *err, size_t errlen);

typedef struct kvp_side {
    const kvx_api_t *api;
    kvx_engine_t    *eng;
    int              producer;
    uint32_t         tp_rank, tp_size;
    kvp_geom_t       geom;
    kvp_mem_t        mem;
    uint8_t         *pool;     /* layers at pool + l * layer_stride */
    int              pool_mapped; /* 1: mmap()ed by us */
    char             host[64];
    uint32_t         hs_base, nt_base; /* instance bases of this setup */
} kvp_side_t;

typedef struct kvp_side_cfg {
    int          producer;
    uint32_t     tp_rank, tp_size;
    kvp_mode_t   mode;
    kvp_mem_t    mem;
    const char  *host;
    uint32_t     hs_base, nt_base;
    const char  *tls;
    uint64_t     max_inflight;
    const char  *extra;
    double       defer_timeout_s;
    double       transfer_timeout_s; /* 0: defer_timeout_s */
    int          fill_pattern; /* P with --check: pattern, else constant */
} kvp_side_cfg_t;

int  kvp_side_open(const kvx_api_t *api, const kvp_side_cfg_t *cfg,
                   const kvp_geom_t *g, kvp_side_t *s, char *err,
                   size_t errlen);
void kvp_side_close(kvp_side_t *s);
uint8_t *kvp_unit_ptr(const kvp_side_t *s, uint32_t layer, uint64_t block,
                      uint32_t unit);

/* Block ids: transfer i (batch b) uses, on each side, the next b entries
 * of a fixed random permutation of the pool (scattered; P and D differ) or
 * the next b-aligned slot (contiguous). Resident: every transfer uses the
 * ids of transfer 0 (same offsets reused, cache-resident like nixlbench's
 * and ucx_perftest's buffers). */
typedef struct kvp_idgen {
    uint64_t  nb;
    int       contiguous;
    int       resident;
    uint64_t *perm[2]; /* [D, P] */
} kvp_idgen_t;
int  kvp_idgen_init(kvp_idgen_t *ig, uint64_t nb, int contiguous);
void kvp_idgen_fini(kvp_idgen_t *ig);
void kvp_block_ids(const kvp_idgen_t *ig, int producer, uint64_t i,
                   uint32_t b, uint64_t *ids);
/* Contiguous runs (after the engine's merge rule) of one transfer. */
uint64_t kvp_count_runs(const kvp_geom_t *g, const uint64_t *lids,
                        const uint64_t *rids, uint32_t n);
/* D: fill the destination units of a transfer with 0xEE. */
void kvp_fill_dst(kvp_side_t *d, const uint64_t *dids, uint32_t n);
/* D: compare with P rank's pattern; 0 or -1 with the first mismatch. */
int  kvp_verify(const kvp_side_t *d, uint32_t p_rank, const uint64_t *dids,
                const uint64_t *pids, uint32_t n, char *err, size_t errlen);

/* --- results ---------------------------------------------------------------- */

/* One timed transfer, after merging P's and D's records (D's clock). */
typedef struct kvp_rec {
    double start_us, end_us;
    double prep_us, post_us, tx_us, notify_us;
} kvp_rec_t;

/* Header of the blob a pair sends to the reporter for one point. */
typedef struct kvp_blob_hdr {
    uint32_t setup, point, pair, n;
    uint32_t n_memcpy;
    uint32_t mode, mem, batch;
    uint64_t block_bytes, xfer_bytes;
    double   runs_per_xfer;
    double   handshake_us, first_xfer_us;
    double   ctl_rtt[3];   /* probe: library's control round trip of the
                              initiator (release / write_done): avg, p50,
                              p99 us (api->stats ctl_rtt); -1 unknown */
    double   hs_parts[3];  /* probe: handshake metadata, endpoint, rkeys */
    int64_t  rss_kb[2][3]; /* [P,D][start, mid, end of the point] */
    int64_t  hwm_kb[2];
    int32_t  rma_emulated;
    uint64_t xfers_done;   /* transfers this pair finished so far */
    uint32_t hold;         /* --hold: idle transfers P created before the
                              points of this setup */
    int64_t  p_xfers_end;  /* P's engine "transfers" (api->stats) at the
                              end of the point (-1 unknown): the holds
                              still held */
    double   hold_create_s; /* P: time to create the holds */
    int64_t  hold_rss_kb;  /* P: RSS growth while creating them */
    char     rma_mode[16]; /* api->transports "rma": rma|direct-shm|emulated */
    char     transports[512];
    char     geom_desc[160];
    /* followed by n kvp_rec_t, then n_memcpy doubles (memcpy Tx, us) */
} kvp_blob_hdr_t;

typedef struct kvp_row {
    uint32_t setup, point;
    kvp_mode_t mode;
    kvp_mem_t  mem;
    uint64_t block_bytes, xfer_bytes;
    uint32_t batch, iters, pairs;
    double   runs_per_xfer;
    double   bw_gbs, aggr_bw_gbs, avg_lat_us;
    double   prep_avg, prep_p99, post_avg, post_p99, tx_avg, tx_p99;
    double   ntfy_avg, ntfy_p99, post_per_run_us;
    double   xfer_rate, aggr_xfer_rate; /* timed transfers / (last end -
                                           first start), per pair / sum */
    double   wall_bw_gbs;  /* bytes / (last end - first start), per pair:
                              gaps between transfers count (bw_gbs counts
                              only time with a transfer in flight) */
    uint32_t hold;
    int64_t  p_xfers_end;
    double   hold_create_s;
    int64_t  hold_rss_kb;
    double   memcpy_bw_gbs, memcpy_tx_avg; /* < 0: not measured */
    double   handshake_us, first_xfer_us;
    double   ctl_rtt[3], hs_parts[3];
    int64_t  rss_kb[2][3], hwm_kb[2];
    uint64_t xfers_done;
    int      rma_emulated;
    char     rma_mode[16];
    char     transports[512];
    char     geom_desc[160];
} kvp_row_t;

typedef struct kvp_report kvp_report_t;
kvp_report_t *kvp_report_open(const kvp_opts_t *o);
void          kvp_report_row(kvp_report_t *r, const kvp_row_t *row);
/* kvp_report_close prints the summary (RSS) and closes files. */
void          kvp_report_close(kvp_report_t *r, int failed);

/* Reporter: reduce the blobs of one point (one per pair) to a row. */
int kvp_rows_from_blobs(void **bufs, size_t *lens, int n, kvp_row_t *row,
                        char *err, size_t errlen);

/* --- session ----------------------------------------------------------------- */

int kvp_session(const kvp_opts_t *o, const kvx_api_t *api, kvp_comm_t *c);

#endif
