/*
 * kvp.h - kvxfer_perf as a small library: options, model presets and the
 * entry point that runs one role (loopback, server, client or MPI rank).
 *
 * The tool measures kvxfer through its public API only: libkvxfer.so is
 * dlopen()ed like a serving framework does and used through kvx_get_api().
 * A session is one prefill side (P, kv_producer) and one decode side (D,
 * kv_consumer) per pair; with MPI there are N pairs (TP=N instances).
 *
 * Threading: kvp_run() uses the calling thread (and, in loopback mode, one
 * extra thread for the P side). Not reentrant (one process-wide logger).
 */
#ifndef KVP_H
#define KVP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVP_MAX_SWEEP 64

typedef enum kvp_role {
    KVP_ROLE_LOOPBACK = 0, /* P and D in this process */
    KVP_ROLE_SERVER   = 1, /* P: waits for one client */
    KVP_ROLE_CLIENT   = 2, /* D: connects, drives, reports */
    KVP_ROLE_MPI      = 3, /* under mpirun: first N ranks P, last N D */
} kvp_role_t;

typedef enum kvp_mode { KVP_READ = 0, KVP_WRITE = 1 } kvp_mode_t;
typedef enum kvp_mem { KVP_MEM_APP = 0, KVP_MEM_UCX = 1 } kvp_mem_t;
typedef enum kvp_layout {
    KVP_LAYOUT_SPLIT       = 0, /* [2, NB, T, H, D] */
    KVP_LAYOUT_INTERLEAVED = 1, /* [NB, 2, T, H, D] */
    KVP_LAYOUT_KEY_ONLY    = 2, /* [NB, T, D] (MLA latent, indexer) */
} kvp_layout_t;

typedef enum kvp_format {
    KVP_FMT_TABLE = 0,
    KVP_FMT_CSV   = 1,
    KVP_FMT_JSON  = 2,
} kvp_format_t;

/* A model's KV geometry at TP1; heads are divided by the TP size. */
typedef struct kvp_model {
    char         name[32];
    uint32_t     layers;
    kvp_layout_t layout;
    uint32_t     block_tokens; /* tokens per block */
    uint32_t     kv_heads;     /* KV heads at TP1 (1 for key-only) */
    uint32_t     head_dim;     /* K head dim (latent dim for MLA) */
    uint32_t     elem;         /* bytes per element */
} kvp_model_t;

typedef struct kvp_opts {
    kvp_role_t  role;
    char        server[256];   /* client: server host */
    uint16_t    port;          /* bootstrap port */
    char        bind_addr[64]; /* server listen address */
    char        host_ip[64];   /* engine host_ip; "" = derive */
    char        lib[1024];     /* libkvxfer.so path */

    kvp_mode_t  modes[2];
    int         nmodes;
    kvp_mem_t   mems[2];
    int         nmems;
    kvp_model_t model;
    uint64_t    block_bytes[KVP_MAX_SWEEP]; /* 0 entry = model's own */
    int         nblock_bytes;
    uint32_t    batches[KVP_MAX_SWEEP];
    int         nbatches;
    int         contiguous;
    int         resident;      /* --resident: same block ids every transfer */
    int         busy_poll;     /* --busy-poll: D spins on poll_events
                                  instead of sleeping in wait_transfer */
    int         write_ahead;   /* --write-ahead: WRITE P readies every
                                  layer and seals before D asks */
    uint32_t    iters;         /* 0 = auto */
    uint32_t    warmup;        /* UINT32_MAX = auto */
    uint32_t    depth;
    uint32_t    lead;          /* D's most transfers ahead of P's finished
                                  ones before it waits for P (2048) */
    uint64_t    pool_bytes;
    int         check;
    int         memcpy_rows;
    int         inject_error; /* test: flip one received byte */
    int         clock_sync;   /* ping-pong clock offset even on one host */
    int         connect_ahead; /* initiator calls api->connect_peer before
                                  the first transfer of each setup */
    char        tls[256];
    uint64_t    max_inflight;  /* 0 = engine default */
    char        extra[1024];   /* extra members of kv_connector_extra_config */
    uint32_t    kv_port;       /* 0 = auto */
    double      timeout_s;     /* per point */
    uint32_t    hold;          /* --hold: idle transfers P holds during the
                                  measured points (0 = none) */
    double      hold_timeout_s; /* their defer_timeout (3600) */
    double      accept_timeout_s;

    kvp_format_t format;
    char        csv_path[1024];
    char        json_path[1024];
    int         verbose;
    int         quiet;
} kvp_opts_t;

/* kvp_opts_defaults fills o with the defaults (llama-8b, READ, batch 32,
 * scattered, app-owned memory, 256 MiB pool, loopback). */
void kvp_opts_defaults(kvp_opts_t *o);

/* kvp_opts_parse parses argv (as the CLI gets it) into o. Returns 0, 1 when
 * help was printed, or -1 with a message in err. */
int kvp_opts_parse(int argc, char **argv, kvp_opts_t *o, char *err,
                   size_t errlen);

/* kvp_model_preset fills m from a preset name; -1 if unknown. */
int kvp_model_preset(const char *name, kvp_model_t *m);

void kvp_usage(FILE *f, const char *prog);

/* kvp_run runs the role of o; returns the process exit code (0 = every
 * transfer succeeded, every check passed). */
int kvp_run(const kvp_opts_t *o);

/* kvp_have_mpi: 1 when the MPI bootstrap was compiled in. */
int kvp_have_mpi(void);

#endif
