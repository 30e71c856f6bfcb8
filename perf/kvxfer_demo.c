/*
 * kvxfer_demo.c - the main job of kvxfer, end to end, as two processes.
 *
 * A prefill process (P, kv_producer) holds a llama-3-8b-like KV cache and a
 * decode process (D, kv_consumer) pulls the blocks of one request from it
 * with UCX one-sided gets (READ mode), after a handshake over nng. Both load
 * libkvxfer.so with dlopen() exactly as a serving framework does: the only
 * symbol resolved is "kvx_get_api" and everything goes through the function
 * table. D then compares every byte of its KV cache with what it must hold.
 *
 * Without --role this program is the orchestrator (a stand-in for the
 * proxy): it picks free ports, spawns itself as `--role prefill`, reads the
 * `PARAMS <json>` line P prints (P's kv_transfer_params response), turns it
 * into D's params with the library's build_decode_params helper, and spawns
 * itself as `--role decode` with those params on stdin and the proxy-format
 * request_id on the command line. It waits for both with a deadline and
 * exits non-zero if anything failed.
 *
 *   kvxfer_demo [--model llama-3-8b|tiny] [--tls tcp|sm|...] [--blocks N]
 *               [--port BASE] [--lib PATH] [--region] [--timeout S]
 *               [--verbose]
 */
#define _GNU_SOURCE
#include <kvxfer/kvxfer.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#ifndef KVX_SO_PATH
#define KVX_SO_PATH "libkvxfer.so.1"
#endif
#ifndef KVX_SO_INSTALLED
#define KVX_SO_INSTALLED "libkvxfer.so.1"
#endif

#define HOST            "127.0.0.1"
#define FILL_BYTE       0xEE /* D's initial content */
#define P_RANK          0u   /* tp rank of the prefill process */
#define P_EVENT_WAIT_S  40   /* P waits this long for FINISHED_SENDING */
#define P_DEFER_S       30   /* ... and frees unreleased blocks after this */
#define D_WAIT_MS       30000
#define D_EVENT_WAIT_MS 10000
#define MAX_LINE        (1u << 20)

/* --- model -------------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *desc;
    uint32_t    layers;
    uint32_t    block_size; /* tokens per block */
    uint32_t    heads;      /* KV heads of this rank */
    uint32_t    head_dim;
    uint32_t    elem;       /* bytes per element (bf16) */
    uint32_t    nb_p;       /* blocks of P's cache */
    uint32_t    nb_d;       /* blocks of D's cache */
    uint32_t    blocks;     /* default blocks per transfer */
} model_t;

static const model_t models[] = {
    {"llama-3-8b", "llama-3-8b-like, one TP1 rank", 32, 16, 8, 128, 2, 256,
     192, 64},
    {"tiny", "tiny test model", 4, 4, 2, 16, 2, 64, 48, 16},
};

/* Bytes of one K (or V) block. */
static uint64_t unit_len(const model_t *m)
{
    return (uint64_t)m->block_size * m->heads * m->head_dim * m->elem;
}

/* Split K/V layout [2, NB, BS, H, D]: K of block b at b*unit, V at
 * NB*unit + b*unit. */
static uint64_t unit_off(const model_t *m, uint32_t nb, uint64_t block,
                         int unit)
{
    return ((uint64_t)unit * nb + block) * unit_len(m);
}

static uint64_t layer_len(const model_t *m, uint32_t nb)
{
    return 2ull * nb * unit_len(m);
}

/* --- pattern ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t pattern_seed(uint32_t rank, uint32_t layer, uint64_t block,
                             int unit)
{
    uint64_t h = mix64(0x6b7678666572ull ^ rank);

    h = mix64(h ^ layer);
    h = mix64(h ^ block);
    return mix64(h ^ (uint64_t)unit);
}

/* Byte i of the unit (rank, layer, block, unit) is byte i%8 of
 * mix64(seed + i/8). */
static void pattern_fill(uint8_t *p, uint64_t len, uint32_t rank,
                         uint32_t layer, uint64_t block, int unit)
{
    uint64_t seed = pattern_seed(rank, layer, block, unit);
    uint64_t j;

    for (j = 0; j + 8 <= len; j += 8) {
        uint64_t w = mix64(seed + j / 8);

        memcpy(p + j, &w, 8);
    }
    if (j < len) {
        uint64_t w = mix64(seed + j / 8);

        memcpy(p + j, &w, len - j);
    }
}

/* Block lists: scattered and distinct (stride coprime with the cache
 * size). */
static uint64_t p_block(const model_t *m, size_t i)
{
    return (i * 3 + 1) % m->nb_p;
}

static uint64_t d_block(const model_t *m, size_t i)
{
    return (i * 5 + 2) % m->nb_d;
}

/* --- options ------------------------------------------------------------ */

typedef struct {
    const char    *role; /* NULL: orchestrator */
    const char    *lib;
    const char    *tls;
    const model_t *model;
    long           blocks;
    int            port;
    int            hs_port, notify_port;
    int            timeout_s;
    int            verbose;
    int            region;
    int            corrupt;
    int            hold_fd;
    const char    *transfer_id;
    const char    *request_id;
    const char    *tls_dir;  /* control-plane TLS: ca.crt, peer.crt/.key */
    const char    *tls_name; /* the name both sides' certificates carry */
    const char    *trusted;  /* trusted_remote_hosts entry */
} opts_t;

static opts_t o = {
    .tls = "tcp", .model = &models[0], .blocks = -1, .timeout_s = 100,
    .hold_fd = -1,
};

static const char *tag(void)
{
    return o.role ? o.role : "demo";
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;

    printf("%-7s | ", tag());
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "%s: FAILED: ", tag());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvxfer_demo [options]\n"
        "  --model NAME     llama-3-8b (default: 32 layers, split K/V\n"
        "                   [2,NB,16,8,128] bf16, P 256 / D 192 blocks) or\n"
        "                   tiny (4 layers, [2,NB,4,2,16], P 64 / D 48)\n"
        "  --tls LIST       UCX transports (ucx_tls), default tcp; e.g. sm\n"
        "  --blocks N       blocks per transfer (default 64; tiny 16)\n"
        "  --port BASE      P handshake/notify BASE, BASE+1; D BASE+2, "
        "BASE+3\n"
        "                   (default: 4 free ports probed in [17600, 22000))\n"
        "  --lib PATH       libkvxfer.so to dlopen (default %s)\n"
        "  --region         put the KV cache in memory from alloc_region\n"
        "  --timeout S      overall deadline in seconds (default 100)\n"
        "  --tls-dir DIR    mutual TLS on the control plane with DIR/ca.crt,\n"
        "                   DIR/peer.crt and DIR/peer.key (both processes)\n"
        "  --tls-name NAME  name the peer certificates carry (default\n"
        "                   kvxfer-peer)\n"
        "  --trusted CIDR   trusted_remote_hosts (default 127.0.0.0/8)\n"
        "  --corrupt        self-test of the check: D flips one received byte\n"
        "                   before verifying, so the demo must fail\n"
        "  --verbose        library info logs, configs and endpoint JSON\n"
        "\n"
        "Without --role this is the orchestrator: it spawns itself as both\n"
        "sides. One side alone (as the orchestrator runs it, or by hand):\n"
        "  --role prefill|decode  with --hs-port P --notify-port P\n"
        "                   --transfer-id ID --request-id RID (proxy format)\n"
        "  prefill prints 'PARAMS <json>' (its kv_transfer_params response),\n"
        "  holds the blocks until D released them, then waits for end of\n"
        "  file on stdin (bounded by --timeout). decode reads D's params\n"
        "  JSON, or P's 'PARAMS <json>' line, on stdin, pulls, verifies and\n"
        "  prints the summary. By hand, e.g.:\n"
        "    RID=___prefill_addr_host:127.0.0.1,handshake:17000,notify:17001"
        "___decode_addr_host:127.0.0.1,handshake:17002,notify:17003_"
        "0123456789abcdef0123456789abcdef\n"
        "    kvxfer_demo --role prefill --hs-port 17000 --notify-port 17001 \\\n"
        "      --transfer-id tx-1 --request-id $RID > p.out &\n"
        "    grep -m1 ^PARAMS p.out | kvxfer_demo --role decode --hs-port "
        "17002 \\\n"
        "      --notify-port 17003 --transfer-id tx-1 --request-id $RID\n",
        KVX_SO_PATH);
}

static const model_t *find_model(const char *name)
{
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        if (strcmp(models[i].name, name) == 0) {
            return &models[i];
        }
    }
    if (strcmp(name, "llama8b") == 0 || strcmp(name, "llama-8b") == 0 ||
        strcmp(name, "default") == 0) {
        return &models[0];
    }
    return NULL;
}

static int parse_int(const char *s, long lo, long hi, long *v)
{
    char *end;

    errno = 0;
    *v    = strtol(s, &end, 10);
    return errno == 0 && end != s && *end == '\0' && *v >= lo && *v <= hi
               ? 0
               : -1;
}

static int parse_opts(int argc, char **argv)
{
    enum { O_ROLE = 256, O_HS, O_NOTIFY, O_TID, O_RID, O_HOLD, O_TLSDIR,
           O_TLSNAME, O_TRUSTED };
    static const struct option lo[] = {
        {"role", required_argument, NULL, O_ROLE},
        {"lib", required_argument, NULL, 'l'},
        {"tls", required_argument, NULL, 't'},
        {"model", required_argument, NULL, 'm'},
        {"blocks", required_argument, NULL, 'b'},
        {"port", required_argument, NULL, 'p'},
        {"timeout", required_argument, NULL, 'T'},
        {"region", no_argument, NULL, 'r'},
        {"corrupt", no_argument, NULL, 'C'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {"hs-port", required_argument, NULL, O_HS},
        {"notify-port", required_argument, NULL, O_NOTIFY},
        {"transfer-id", required_argument, NULL, O_TID},
        {"request-id", required_argument, NULL, O_RID},
        {"hold-fd", required_argument, NULL, O_HOLD},
        {"tls-dir", required_argument, NULL, O_TLSDIR},
        {"tls-name", required_argument, NULL, O_TLSNAME},
        {"trusted", required_argument, NULL, O_TRUSTED},
        {NULL, 0, NULL, 0},
    };
    int  c;
    long v;

    while ((c = getopt_long(argc, argv, "l:t:m:b:p:T:rvh", lo, NULL)) != -1) {
        switch (c) {
        case O_ROLE:
            if (strcmp(optarg, "prefill") != 0 &&
                strcmp(optarg, "decode") != 0) {
                fprintf(stderr, "--role: '%s': must be prefill or decode\n",
                        optarg);
                return -1;
            }
            o.role = optarg;
            break;
        case 'l': o.lib = optarg; break;
        case O_TLSDIR: o.tls_dir = optarg; break;
        case O_TLSNAME: o.tls_name = optarg; break;
        case O_TRUSTED: o.trusted = optarg; break;
        case 't': o.tls = optarg; break;
        case 'm':
            o.model = find_model(optarg);
            if (o.model == NULL) {
                fprintf(stderr, "--model: '%s': must be llama-3-8b or tiny\n",
                        optarg);
                return -1;
            }
            break;
        case 'b':
            if (parse_int(optarg, 1, 1 << 20, &o.blocks) != 0) {
                fprintf(stderr, "--blocks: '%s': must be a positive integer\n",
                        optarg);
                return -1;
            }
            break;
        case 'p':
            if (parse_int(optarg, 1024, 65532, &v) != 0) {
                fprintf(stderr, "--port: '%s': must be 1024..65532\n", optarg);
                return -1;
            }
            o.port = (int)v;
            break;
        case 'T':
            if (parse_int(optarg, 1, 3600, &v) != 0) {
                fprintf(stderr, "--timeout: '%s': must be 1..3600 seconds\n",
                        optarg);
                return -1;
            }
            o.timeout_s = (int)v;
            break;
        case 'r': o.region = 1; break;
        case 'C': o.corrupt = 1; break;
        case 'v': o.verbose = 1; break;
        case 'h': usage(stdout); exit(0);
        case O_HS:
        case O_NOTIFY:
            if (parse_int(optarg, 1024, 65535, &v) != 0) {
                fprintf(stderr, "--%s: '%s': must be 1024..65535\n",
                        c == O_HS ? "hs-port" : "notify-port", optarg);
                return -1;
            }
            *(c == O_HS ? &o.hs_port : &o.notify_port) = (int)v;
            break;
        case O_TID: o.transfer_id = optarg; break;
        case O_RID: o.request_id = optarg; break;
        case O_HOLD:
            if (parse_int(optarg, 3, 1023, &v) != 0) {
                fprintf(stderr, "--hold-fd: '%s': must be 3..1023\n", optarg);
                return -1;
            }
            o.hold_fd = (int)v;
            break;
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o.blocks < 0) {
        o.blocks = o.model->blocks;
    }
    if ((uint64_t)o.blocks > o.model->nb_d ||
        (uint64_t)o.blocks > o.model->nb_p) {
        fprintf(stderr, "--blocks %ld: model %s holds %u blocks on D\n",
                o.blocks, o.model->name, o.model->nb_d);
        return -1;
    }
    if (o.role != NULL &&
        (o.hs_port == 0 || o.notify_port == 0 || o.transfer_id == NULL ||
         o.request_id == NULL)) {
        fprintf(stderr, "--role %s needs --hs-port, --notify-port, "
                "--transfer-id and --request-id\n", o.role);
        return -1;
    }
    return 0;
}

/* --- the library, through the table only -------------------------------- */

static void *so_handle;

static const kvx_api_t *load_api(void)
{
    const char *paths[3] = {o.lib, KVX_SO_PATH, KVX_SO_INSTALLED};
    const char *first_err = NULL;
    char        errbuf[1024] = "";

    for (int i = 0; i < 3 && so_handle == NULL; i++) {
        if (paths[i] == NULL || (i > 0 && o.lib != NULL)) {
            continue;
        }
        so_handle = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (so_handle == NULL && first_err == NULL) {
            first_err = dlerror();
            snprintf(errbuf, sizeof(errbuf), "%s", first_err ? first_err : "");
            first_err = errbuf;
        } else if (so_handle != NULL) {
            o.lib = paths[i];
        }
    }
    if (so_handle == NULL) {
        fail("dlopen: %s", errbuf);
        return NULL;
    }
    /* The one symbol a framework resolves. */
    kvx_get_api_fn_t get = (kvx_get_api_fn_t)(uintptr_t)dlsym(
        so_handle, KVX_ENTRY_POINT_NAME);
    if (get == NULL) {
        fail("dlsym(%s): %s", KVX_ENTRY_POINT_NAME, dlerror());
        return NULL;
    }
    const kvx_api_t *api = get(KVX_ABI_MAJOR);
    if (api == NULL || api->abi_major != KVX_ABI_MAJOR ||
        api->struct_size < sizeof(kvx_api_t)) {
        fail("%s(%d): no compatible function table", KVX_ENTRY_POINT_NAME,
             KVX_ABI_MAJOR);
        return NULL;
    }
    return api;
}

static const kvx_api_t *api;

static int check(kvx_status_t st, const char *what)
{
    if (st == KVX_OK) {
        return 0;
    }
    fail("%s: %s (%d): %s", what, api->status_name(st), (int)st,
         api->last_error());
    return -1;
}

/* --- one engine: config, layers ----------------------------------------- */

typedef struct {
    kvx_engine_t     *eng;
    uint32_t          nb;
    uint8_t         **bufs;  /* per layer */
    void             *region;
    char            (*names)[64];
    kvx_layer_desc_t *descs;
} rank_t;

static int engine_up(rank_t *r, bool producer, uint32_t nb)
{
    const model_t *m = o.model;
    char           cfg[4096], sec[2048] = "";
    uint64_t       len = layer_len(m, nb);

    memset(r, 0, sizeof(*r));
    r->nb = nb;
    if (o.tls_dir != NULL) {
        snprintf(sec, sizeof(sec),
                 "\"tls_cert_file\":\"%s/peer.crt\",\"tls_key_file\":"
                 "\"%s/peer.key\",\"tls_ca_file\":\"%s/ca.crt\","
                 "\"tls_peer_name\":\"%s\",", o.tls_dir, o.tls_dir, o.tls_dir,
                 o.tls_name != NULL ? o.tls_name : "kvxfer-peer");
    }
    snprintf(cfg, sizeof(cfg),
             "{\"role\":\"%s\",\"tp_rank\":%u,\"tp_size\":1,\"dp_rank\":0,"
             "\"dp_size\":1,\"kv_connector_extra_config\":{"
             "\"host_ip\":\"" HOST "\",\"handshake_port\":%d,"
             "\"notify_port\":%d,\"read_mode\":true,"
             "\"node_hosts\":[\"" HOST "\"],"
             "\"trusted_remote_hosts\":[\"%s\"],%s"
             "\"ucx_tls\":\"%s\",\"handshake_timeout\":10,"
             "\"transfer_timeout\":30,\"defer_timeout\":%d}}",
             producer ? "kv_producer" : "kv_consumer", P_RANK, o.hs_port,
             o.notify_port, o.trusted != NULL ? o.trusted : "127.0.0.0/8",
             sec, o.tls, P_DEFER_S);
    if (o.verbose) {
        say("config %s", cfg);
    }
    if (check(api->engine_create(cfg, &r->eng), "engine_create") != 0) {
        return -1;
    }
    r->bufs  = calloc(m->layers, sizeof(*r->bufs));
    r->names = calloc(m->layers, sizeof(*r->names));
    r->descs = calloc(m->layers, sizeof(*r->descs));
    if (r->bufs == NULL || r->names == NULL || r->descs == NULL) {
        fail("out of memory");
        return -1;
    }
    if (o.region) {
        if (check(api->alloc_region(r->eng, len * m->layers, &r->region),
                  "alloc_region") != 0) {
            return -1;
        }
    }
    for (uint32_t l = 0; l < m->layers; l++) {
        kvx_layer_desc_t *d = &r->descs[l];

        if (o.region) {
            r->bufs[l] = (uint8_t *)r->region + (uint64_t)l * len;
        } else if (posix_memalign((void **)&r->bufs[l], 4096, len) != 0) {
            fail("out of memory (layer %u, %" PRIu64 " bytes)", l, len);
            return -1;
        }
        if (producer) {
            for (uint64_t b = 0; b < nb; b++) {
                for (int u = 0; u < 2; u++) {
                    pattern_fill(r->bufs[l] + unit_off(m, nb, b, u),
                                 unit_len(m), P_RANK, l, b, u);
                }
            }
        } else {
            memset(r->bufs[l], FILL_BYTE, len);
        }
        snprintf(r->names[l], sizeof(r->names[l]),
                 "model.layers.%u.self_attn.attn", l);
        d->struct_size  = sizeof(*d);
        d->name         = r->names[l];
        d->base         = r->bufs[l];
        d->length       = len;
        d->mem_type     = KVX_MEM_HOST;
        d->ndim         = 5;
        d->shape[0]     = 2;
        d->shape[1]     = nb;
        d->shape[2]     = m->block_size;
        d->shape[3]     = m->heads;
        d->shape[4]     = m->head_dim;
        d->elem_size    = m->elem;
        d->block_size   = m->block_size;
        d->num_kv_heads = m->heads;
        d->head_size    = m->head_dim;
        int64_t stride  = 1;
        for (int k = 4; k >= 0; k--) {
            d->stride[k] = stride;
            stride *= d->shape[k];
        }
        if (check(api->register_layer(r->eng, d), "register_layer") != 0) {
            return -1;
        }
    }
    return check(api->start(r->eng), "start");
}

static void engine_down(rank_t *r)
{
    api->engine_destroy(r->eng); /* releases the region too */
    if (!o.region && r->bufs != NULL) {
        for (uint32_t l = 0; l < o.model->layers; l++) {
            free(r->bufs[l]);
        }
    }
    free(r->bufs);
    free(r->names);
    free(r->descs);
    memset(r, 0, sizeof(*r));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* Same multiset of block ids? */
static bool same_ids(const uint64_t *a, size_t na, const uint64_t *b,
                     size_t nb)
{
    bool      same = na == nb;
    uint64_t *x, *y;

    if (!same || na == 0) {
        return same;
    }
    x = malloc(na * sizeof(*x));
    y = malloc(na * sizeof(*y));
    if (x == NULL || y == NULL) {
        free(x);
        free(y);
        return false;
    }
    memcpy(x, a, na * sizeof(*x));
    memcpy(y, b, na * sizeof(*y));
    qsort(x, na, sizeof(*x), cmp_u64);
    qsort(y, na, sizeof(*y), cmp_u64);
    same = memcmp(x, y, na * sizeof(*x)) == 0;
    free(x);
    free(y);
    return same;
}

/* Polls events until one for transfer_id arrives or timeout_ms passed.
 * Returns 1 and fills *ev (caller frees ev->block_ids), 0 on timeout, -1 on
 * error. Events of other transfers are reported and dropped. */
static int wait_event(kvx_engine_t *eng, const char *tid, int timeout_ms,
                      kvx_event_t *ev)
{
    double end = now_s() + timeout_ms / 1000.0;

    for (;;) {
        kvx_event_t e;
        int         n = api->poll_events(eng, &e, 1);

        if (n < 0) {
            check((kvx_status_t)n, "poll_events");
            return -1;
        }
        if (n == 1) {
            if (strcmp(e.transfer_id, tid) == 0) {
                *ev = e;
                return 1;
            }
            say("event for another transfer '%s' ignored", e.transfer_id);
            api->free(e.block_ids);
            continue;
        }
        if (now_s() >= end) {
            return 0;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static const char *event_name(kvx_event_type_t t)
{
    switch (t) {
    case KVX_EVENT_FINISHED_SENDING: return "FINISHED_SENDING";
    case KVX_EVENT_FINISHED_RECVING: return "FINISHED_RECVING";
    case KVX_EVENT_FAILED: return "FAILED";
    }
    return "?";
}

/* --- prefill ------------------------------------------------------------ */

/* Waits until fd reaches end of file (the orchestrator closes the other end
 * when this process may leave) or timeout_ms passed. */
static bool wait_fd_eof(int fd, int timeout_ms)
{
    double end = now_s() + timeout_ms / 1000.0;
    char   buf[256];

    for (;;) {
        struct pollfd pfd  = {.fd = fd, .events = POLLIN};
        int           left = (int)((end - now_s()) * 1000);
        int           pr   = left > 0 ? poll(&pfd, 1, left) : 0;

        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr <= 0) {
            return false;
        }
        ssize_t k = read(fd, buf, sizeof(buf));

        if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
            return true;
        }
    }
}

static int run_prefill(void)
{
    const model_t *m = o.model;
    size_t         n = (size_t)o.blocks;
    uint64_t      *ids = calloc(n, sizeof(*ids));
    rank_t         r;
    char          *resp = NULL, params[512];
    kvx_event_t    ev;
    int            rc = 1, got;
    double         t0 = now_s();

    if (ids == NULL) {
        fail("out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        ids[i] = p_block(m, i);
    }
    if (engine_up(&r, true, m->nb_p) != 0) {
        goto out;
    }
    say("kv_producer up: %u layers x %u blocks (%.1f MiB) registered, "
        "listening on " HOST ":%d (handshake) and :%d (notify) in %.2f s",
        m->layers, m->nb_p,
        (double)layer_len(m, m->nb_p) * m->layers / (1 << 20), o.hs_port,
        o.notify_port, now_s() - t0);
    if (o.verbose) {
        char *reg = NULL;

        if (check(api->registration_payload(r.eng, &reg),
                  "registration_payload") == 0) {
            say("registration %s", reg);
        }
        api->free(reg);
    }
    /* Prefill of the request is done: hand its blocks to the connector. */
    snprintf(params, sizeof(params),
             "{\"transfer_id\":\"%s\",\"do_remote_decode\":true}",
             o.transfer_id);
    if (check(api->producer_request(r.eng, o.request_id, params, ids, n,
                                    &resp), "producer_request") != 0) {
        goto out;
    }
    printf("PARAMS %s\n", resp);
    fflush(stdout);
    api->free(resp);
    /* Hold the blocks until D released them. */
    got = wait_event(r.eng, o.transfer_id, P_EVENT_WAIT_S * 1000, &ev);
    if (got == 0) {
        fail("no event for %s within %d s", o.transfer_id, P_EVENT_WAIT_S);
    } else if (got == 1) {
        if (ev.type != KVX_EVENT_FINISHED_SENDING || ev.status != KVX_OK) {
            fail("event %s status %s: %s", event_name(ev.type),
                 api->status_name(ev.status), ev.reason);
        } else if (!same_ids(ev.block_ids, ev.num_block_ids, ids, n)) {
            fail("FINISHED_SENDING lists %zu blocks, not the %zu held",
                 ev.num_block_ids, n);
        } else {
            say("FINISHED_SENDING %s: %zu blocks released by the consumer",
                ev.transfer_id, ev.num_block_ids);
            printf("RELEASED %s\n", ev.transfer_id); /* for the orchestrator */
            fflush(stdout);
            rc = 0;
            /* A prefill server stays up: leave when the demo is over. */
            if (!wait_fd_eof(0, o.timeout_s * 1000)) {
                say("no end-of-demo signal within %d s; leaving",
                    o.timeout_s);
            }
        }
        api->free(ev.block_ids);
    }
out:
    if (r.eng != NULL || r.bufs != NULL) {
        engine_down(&r);
    }
    free(ids);
    return rc;
}

/* --- decode ------------------------------------------------------------- */

/* Reads all of stdin (bounded by a deadline). */
static char *read_stdin(int timeout_ms)
{
    size_t cap = 4096, len = 0;
    char  *buf = malloc(cap);
    double end = now_s() + timeout_ms / 1000.0;

    while (buf != NULL) {
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        int           left = (int)((end - now_s()) * 1000);
        ssize_t       k;

        int           pr   = left > 0 ? poll(&pfd, 1, left) : 0;

        if (pr < 0 && errno == EINTR) {
            continue;
        }
        if (pr <= 0) {
            fail("no decode params on stdin within %d ms", timeout_ms);
            free(buf);
            return NULL;
        }
        if (len + 1 >= cap) {
            char *nb = cap < MAX_LINE ? realloc(buf, cap * 2) : NULL;

            if (nb == NULL) {
                fail("decode params too long");
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        k = read(0, buf + len, cap - len - 1);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            break;
        }
        len += (size_t)k;
    }
    if (buf != NULL) {
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) {
            len--;
        }
        buf[len] = '\0';
    }
    return buf;
}

/* Value of "key":"..." or "key":literal in a flat JSON object text. */
static void json_field(const char *json, const char *key, char *out,
                       size_t size)
{
    char        pat[64];
    const char *p;
    size_t      n = 0;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    out[0] = '\0';
    p      = json ? strstr(json, pat) : NULL;
    if (p == NULL) {
        return;
    }
    p += strlen(pat);
    if (*p == '"') {
        p++;
        while (*p && *p != '"' && n + 1 < size) {
            if (*p == '\\' && p[1] != '\0') {
                p++; /* \/ \" \\ as the character itself */
            }
            out[n++] = *p++;
        }
    } else {
        while (*p && *p != ',' && *p != '}' && n + 1 < size) {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
}

/* Compares every byte of D's cache with what it must hold: P's pattern for
 * the received blocks, the initial fill for the others. */
static int verify(const rank_t *r, const uint64_t *local,
                  const uint64_t *remote, size_t n, uint64_t *checked_p,
                  uint64_t *moved_p)
{
    const model_t *m   = o.model;
    uint64_t       ul  = unit_len(m);
    uint8_t       *exp = malloc(ul), *fill = malloc(ul);
    int64_t       *src = malloc(r->nb * sizeof(*src));
    uint64_t       checked = 0, moved = 0;
    int            rc = 0;

    if (exp == NULL || fill == NULL || src == NULL) {
        fail("out of memory");
        rc = -1;
        goto out;
    }
    memset(fill, FILL_BYTE, ul);
    for (uint32_t b = 0; b < r->nb; b++) {
        src[b] = -1;
    }
    for (size_t i = 0; i < n; i++) {
        src[local[i]] = (int64_t)remote[i];
    }
    for (uint32_t l = 0; l < m->layers && rc == 0; l++) {
        for (uint32_t b = 0; b < r->nb && rc == 0; b++) {
            for (int u = 0; u < 2 && rc == 0; u++) {
                const uint8_t *got = r->bufs[l] + unit_off(m, r->nb, b, u);
                const uint8_t *want = fill;

                if (src[b] >= 0) {
                    pattern_fill(exp, ul, P_RANK, l, (uint64_t)src[b], u);
                    want = exp;
                    moved += ul;
                }
                if (memcmp(got, want, ul) != 0) {
                    uint64_t i = 0;

                    while (got[i] == want[i]) {
                        i++;
                    }
                    printf("%-7s | MISMATCH layer %u block %u %s byte %" PRIu64
                           ": got 0x%02x want 0x%02x (%s)\n", tag(), l, b,
                           u ? "V" : "K", i, got[i], want[i],
                           src[b] >= 0 ? "P's pattern" : "initial fill");
                    fflush(stdout);
                    rc = -1;
                }
                checked += ul;
            }
        }
    }
out:
    free(exp);
    free(fill);
    free(src);
    *checked_p = checked;
    *moved_p   = moved;
    return rc;
}

static int run_decode(void)
{
    const model_t *m = o.model;
    size_t         n = (size_t)o.blocks;
    uint64_t      *ids = calloc(n, sizeof(*ids)), *rids = calloc(n, 8);
    char          *params = NULL, *tj = NULL, tls[512], emu[16];
    rank_t         r;
    kvx_event_t    ev;
    uint64_t       checked = 0, moved = 0, total;
    double         t0, t1, tv;
    int            rc = 1, got;

    memset(&r, 0, sizeof(r));
    if (ids == NULL || rids == NULL) {
        fail("out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ids[i]  = d_block(m, i);
        rids[i] = p_block(m, i);
    }
    params = read_stdin(o.timeout_s * 1000);
    if (params == NULL) {
        goto out;
    }
    if (strncmp(params, "PARAMS ", 7) == 0) {
        /* P's own output line (by hand): do the proxy's part here. */
        char *dp = NULL;

        if (check(api->build_decode_params(params + 7, o.transfer_id, &dp),
                  "build_decode_params") != 0) {
            goto out;
        }
        free(params);
        params = strdup(dp);
        api->free(dp);
        if (params == NULL) {
            fail("out of memory");
            goto out;
        }
    }
    if (o.verbose) {
        say("kv_transfer_params %s", params);
    }
    t0 = now_s();
    if (engine_up(&r, false, m->nb_d) != 0) {
        goto out;
    }
    say("kv_consumer up: %u layers x %u blocks (%.1f MiB) registered in "
        "%.2f s", m->layers, m->nb_d,
        (double)layer_len(m, m->nb_d) * m->layers / (1 << 20),
        now_s() - t0);

    /* The measured part: request -> every layer landed. */
    t0 = now_s();
    if (check(api->consumer_request(r.eng, o.request_id, params, ids, n),
              "consumer_request") != 0) {
        goto out;
    }
    for (uint32_t l = 0; l < m->layers; l++) {
        if (check(api->wait_layer(r.eng, o.transfer_id, l, D_WAIT_MS),
                  "wait_layer") != 0) {
            goto out;
        }
        say("layer %2u %-32s landed  +%8.3f ms", l, r.names[l],
            (now_s() - t0) * 1e3);
    }
    if (check(api->wait_transfer(r.eng, o.transfer_id, D_WAIT_MS),
              "wait_transfer") != 0) {
        goto out;
    }
    t1 = now_s();
    /* The endpoint that carried the transfer (queried now: P may leave once
     * it has been released). */
    if (check(api->transports(r.eng, &tj), "transports") != 0) {
        goto out;
    }
    json_field(tj, "transports", tls, sizeof(tls));
    json_field(tj, "rma_emulated", emu, sizeof(emu));
    if (o.verbose) {
        say("endpoints %s", tj);
    }
    if (tls[0] == '\0') {
        fail("transports() reports no ready endpoint: %s", tj);
        goto out;
    }

    if (o.corrupt) {
        /* Last received block, V plane of the last layer, a middle byte. */
        uint8_t *b = r.bufs[m->layers - 1] +
                     unit_off(m, r.nb, ids[n - 1], 1) + unit_len(m) / 2;

        *b ^= 0x01;
        say("--corrupt: flipped one bit of layer %u block %" PRIu64
            " V byte %" PRIu64, m->layers - 1, ids[n - 1], unit_len(m) / 2);
    }
    tv = now_s();
    if (verify(&r, ids, rids, n, &checked, &moved) != 0) {
        goto out;
    }
    tv    = now_s() - tv;
    total = layer_len(m, m->nb_d) * m->layers;
    if (checked != total) {
        printf("%-7s | MISMATCH compared %" PRIu64 " of %" PRIu64 " bytes\n",
               tag(), checked, total);
        goto out;
    }

    got = wait_event(r.eng, o.transfer_id, D_EVENT_WAIT_MS, &ev);
    if (got <= 0) {
        if (got == 0) {
            fail("no FINISHED_RECVING event within %d ms", D_EVENT_WAIT_MS);
        }
        goto out;
    }
    if (ev.type != KVX_EVENT_FINISHED_RECVING || ev.status != KVX_OK) {
        fail("event %s status %s: %s", event_name(ev.type),
             api->status_name(ev.status), ev.reason);
        api->free(ev.block_ids);
        goto out;
    }
    api->free(ev.block_ids);
    say("event FINISHED_RECVING %s", ev.transfer_id);

    uint64_t bytes = (uint64_t)n * m->layers * 2 * unit_len(m);
    double   el    = t1 - t0;

    if (bytes != moved) {
        printf("%-7s | MISMATCH %" PRIu64 " bytes expected to move, %" PRIu64
               " verified\n", tag(), bytes, moved);
        goto out;
    }
    printf("\n=== kvxfer demo summary "
           "==============================================\n"
           "model        %s (%s): %u layers, split K/V [2, NB, %u, %u, %u] "
           "bf16,\n"
           "             %" PRIu64 " bytes per K or V block; P holds %u "
           "blocks, D %u\n"
           "transfer     %s, READ (D pulls), %zu blocks "
           "(P ids %" PRIu64 ",%" PRIu64 ",%" PRIu64 ",... -> D ids %" PRIu64
           ",%" PRIu64 ",%" PRIu64 ",...)\n"
           "layers       %u (each waited separately)\n"
           "moved        %zu blocks x %u layers x K+V = %" PRIu64
           " bytes (%.1f MiB)\n"
           "elapsed      %.3f ms (consumer_request -> wait_transfer)\n"
           "bandwidth    %.3f GB/s\n"
           "transports   %s (ucx_tls \"%s\")\n"
           "rma emulated %s\n"
           "check        verified: %" PRIu64 " bytes compared (%" PRIu64
           " received against P's pattern, %" PRIu64
           " untouched against the initial fill) in %.2f s\n"
           "======================================================="
           "===============\n",
           m->name, m->desc, m->layers, m->block_size, m->heads, m->head_dim,
           unit_len(m), m->nb_p, m->nb_d, o.transfer_id, n, rids[0],
           n > 1 ? rids[1] : rids[0], n > 2 ? rids[2] : rids[0], ids[0],
           n > 1 ? ids[1] : ids[0], n > 2 ? ids[2] : ids[0], m->layers, n,
           m->layers, bytes, (double)bytes / (1 << 20), el * 1e3,
           (double)bytes / el / 1e9, tls, o.tls,
           strcmp(emu, "true") == 0 ? "yes (RMA over active messages)" : "no",
           checked, moved, checked - moved, tv);
    fflush(stdout);
    rc = 0;
    /* A decode server stays up too: its engine (and the release it queued
     * for P) lives until the orchestrator saw P finish. */
    if (o.hold_fd >= 0 && !wait_fd_eof(o.hold_fd, o.timeout_s * 1000)) {
        say("no end-of-demo signal within %d s; leaving", o.timeout_s);
    }
out:
    api->free(tj);
    if (r.eng != NULL || r.bufs != NULL) {
        engine_down(&r);
    }
    free(params);
    free(ids);
    free(rids);
    return rc;
}

/* --- orchestrator ------------------------------------------------------- */

/* Can a listener bind 127.0.0.1:port (as nng does, with SO_REUSEADDR)? */
static bool port_free(int port)
{
    struct sockaddr_in a  = {.sin_family = AF_INET};
    int                fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int                one = 1;
    bool               ok;

    if (fd < 0) {
        return false;
    }
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port        = htons((uint16_t)port);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Picks n consecutive free ports. They come from [17600, 22000): below
 * Linux's ephemeral range (32768+), so no outgoing connection of any process
 * can take one between this probe and the engines' listen(), and clear of
 * the test suites' ranges. Falls back to ports the kernel hands out for
 * port 0. */
static int free_ports(int *ports, int n)
{
    uint64_t r = mix64((uint64_t)getpid() ^ (uint64_t)(now_s() * 1e9));

    for (int attempt = 0; attempt < 200; attempt++) {
        int  base = 17600 + (int)((r = mix64(r)) % (uint64_t)(4400 - n));
        bool ok   = true;

        for (int i = 0; i < n && ok; i++) {
            ok = port_free(base + i);
        }
        if (ok) {
            for (int i = 0; i < n; i++) {
                ports[i] = base + i;
            }
            return 0;
        }
    }
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a  = {.sin_family = AF_INET};
        socklen_t          al = sizeof(a);
        int                fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
            getsockname(fd, (struct sockaddr *)&a, &al) != 0) {
            fail("cannot find a free port: %s", strerror(errno));
            if (fd >= 0) {
                close(fd);
            }
            return -1;
        }
        ports[i] = ntohs(a.sin_port);
        close(fd);
    }
    return 0;
}

static void random_hex(char *out, size_t nbytes)
{
    unsigned char b[32];
    int           fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    size_t        got = 0;

    if (fd >= 0) {
        ssize_t k = read(fd, b, nbytes);

        got = k > 0 ? (size_t)k : 0;
        close(fd);
    }
    for (size_t i = got; i < nbytes; i++) {
        b[i] = (unsigned char)mix64((uint64_t)now_s() * 1e9 + getpid() + i);
    }
    for (size_t i = 0; i < nbytes; i++) {
        sprintf(out + 2 * i, "%02x", b[i]);
    }
}

typedef struct {
    const char *name;
    pid_t       pid;
    int         status;
    bool        done;
} child_t;

static int spawn_self(child_t *c, const char *role, int hs, int notify,
                      const char *tid, const char *rid, int in_fd,
                      int out_fd, int hold_fd)
{
    char  hs_s[16], nt_s[16], bl_s[32], to_s[16];
    char *argv[32];
    int   k = 0, err;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t          at;
    sigset_t                   def;

    snprintf(hs_s, sizeof(hs_s), "%d", hs);
    snprintf(nt_s, sizeof(nt_s), "%d", notify);
    snprintf(bl_s, sizeof(bl_s), "%ld", o.blocks);
    snprintf(to_s, sizeof(to_s), "%d", o.timeout_s);
    argv[k++] = (char *)"kvxfer_demo";
    argv[k++] = (char *)"--role";
    argv[k++] = (char *)role;
    argv[k++] = (char *)"--model";
    argv[k++] = (char *)o.model->name;
    argv[k++] = (char *)"--tls";
    argv[k++] = (char *)o.tls;
    argv[k++] = (char *)"--blocks";
    argv[k++] = bl_s;
    argv[k++] = (char *)"--lib";
    argv[k++] = (char *)o.lib;
    argv[k++] = (char *)"--hs-port";
    argv[k++] = hs_s;
    argv[k++] = (char *)"--notify-port";
    argv[k++] = nt_s;
    argv[k++] = (char *)"--transfer-id";
    argv[k++] = (char *)tid;
    argv[k++] = (char *)"--request-id";
    argv[k++] = (char *)rid;
    argv[k++] = (char *)"--timeout";
    argv[k++] = to_s;
    if (o.region) {
        argv[k++] = (char *)"--region";
    }
    if (o.verbose) {
        argv[k++] = (char *)"--verbose";
    }
    if (o.corrupt) {
        argv[k++] = (char *)"--corrupt";
    }
    if (o.tls_dir != NULL) {
        argv[k++] = (char *)"--tls-dir";
        argv[k++] = (char *)o.tls_dir;
    }
    if (o.tls_name != NULL) {
        argv[k++] = (char *)"--tls-name";
        argv[k++] = (char *)o.tls_name;
    }
    if (o.trusted != NULL) {
        argv[k++] = (char *)"--trusted";
        argv[k++] = (char *)o.trusted;
    }
    if (hold_fd >= 0) {
        argv[k++] = (char *)"--hold-fd";
        argv[k++] = (char *)"3";
    }
    argv[k] = NULL;

    posix_spawn_file_actions_init(&fa);
    if (in_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    }
    if (out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    }
    if (hold_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, hold_fd, 3);
    }
    posix_spawnattr_init(&at);
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
    err = posix_spawn(&c->pid, "/proc/self/exe", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (err != 0) {
        fail("posix_spawn(%s): %s", role, strerror(err));
        return -1;
    }
    c->name = role;
    if (o.verbose) {
        say("spawned %s, pid %d", role, (int)c->pid);
    }
    return 0;
}

/* Reaps c if it exited; returns true once it is done. */
static bool reap(child_t *c)
{
    if (c->pid > 0 && !c->done) {
        pid_t p = waitpid(c->pid, &c->status, WNOHANG);

        if (p == c->pid) {
            c->done = true;
        }
    }
    return c->pid <= 0 || c->done;
}

static bool child_ok(const child_t *c)
{
    return c->done && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
}

static void child_kill(child_t *c)
{
    if (c->pid > 0 && !c->done) {
        kill(c->pid, SIGKILL);
        if (waitpid(c->pid, &c->status, 0) == c->pid) {
            c->done = true;
        }
    }
}

static void child_report(const child_t *c)
{
    if (c->pid <= 0) {
        return;
    }
    if (!c->done) {
        say("%s (pid %d): still running", c->name, (int)c->pid);
    } else if (WIFEXITED(c->status)) {
        say("%s (pid %d): exit %d", c->name, (int)c->pid,
            WEXITSTATUS(c->status));
    } else if (WIFSIGNALED(c->status)) {
        say("%s (pid %d): killed by signal %d", c->name, (int)c->pid,
            WTERMSIG(c->status));
    }
}

/* Forwards complete lines of P's stdout; captures the PARAMS line. */
typedef struct {
    int    fd;
    char  *buf;
    size_t len, cap;
    char  *params;
    bool   released; /* P reported FINISHED_SENDING */
    bool   eof;
} linepipe_t;

static int pipe_pump(linepipe_t *lp, int timeout_ms)
{
    struct pollfd pfd = {.fd = lp->fd, .events = POLLIN};
    ssize_t       k;
    char         *nl;

    if (lp->eof) {
        if (timeout_ms > 0) {
            poll(NULL, 0, timeout_ms);
        }
        return 0;
    }
    if (poll(&pfd, 1, timeout_ms) <= 0) {
        return 0;
    }
    if (lp->len + 4096 > lp->cap) {
        size_t cap = lp->cap ? lp->cap * 2 : 65536;
        char  *nb  = cap <= 4 * MAX_LINE ? realloc(lp->buf, cap) : NULL;

        if (nb == NULL) {
            fail("prefill output line too long");
            return -1;
        }
        lp->buf = nb;
        lp->cap = cap;
    }
    k = read(lp->fd, lp->buf + lp->len, lp->cap - lp->len - 1);
    if (k < 0 && errno == EINTR) {
        return 0;
    }
    if (k <= 0) {
        lp->eof = true;
        return 0;
    }
    lp->len += (size_t)k;
    lp->buf[lp->len] = '\0';
    while ((nl = strchr(lp->buf, '\n')) != NULL) {
        *nl = '\0';
        if (strncmp(lp->buf, "RELEASED ", 9) == 0) {
            lp->released = true;
        } else if (strncmp(lp->buf, "PARAMS ", 7) == 0 &&
                   lp->params == NULL) {
            lp->params = strdup(lp->buf + 7);
            if (o.verbose) {
                say("prefill response %s", lp->params);
            }
        } else {
            printf("%s\n", lp->buf);
            fflush(stdout);
        }
        lp->len -= (size_t)(nl + 1 - lp->buf);
        memmove(lp->buf, nl + 1, lp->len + 1);
    }
    return 0;
}

/* Writes all of s to fd with a deadline. */
static int write_all(int fd, const char *s, size_t len, double end)
{
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int           left = (int)((end - now_s()) * 1000);
        ssize_t       k;

        if (left <= 0 || poll(&pfd, 1, left) <= 0) {
            return -1;
        }
        k = write(fd, s, len);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return -1;
        }
        s += k;
        len -= (size_t)k;
    }
    return 0;
}

static int run_orchestrator(void)
{
    int        ports[4];
    char       tid[64], rid[512], hex[33], uuid[33];
    int        p_out[2] = {-1, -1}, d_in[2] = {-1, -1}, p_in[2] = {-1, -1};
    int        d_hold[2] = {-1, -1};
    child_t    P = {0}, D = {0};
    linepipe_t lp = {0};
    char      *dparams = NULL;
    double     end = now_s() + o.timeout_s;
    int        rc = 1;
    bool       timed_out = false;

    signal(SIGPIPE, SIG_IGN);
    if (o.port != 0) {
        for (int i = 0; i < 4; i++) {
            ports[i] = o.port + i;
        }
    } else if (free_ports(ports, 4) != 0) {
        return 1;
    }
    random_hex(uuid, 16);
    random_hex(hex, 16);
    snprintf(tid, sizeof(tid), "tx-%.8s-%.4s-4%.3s-a%.3s-%.12s", uuid,
             uuid + 8, uuid + 12, uuid + 15, uuid + 18);
    snprintf(rid, sizeof(rid),
             "___prefill_addr_host:" HOST ",handshake:%d,notify:%d"
             "___decode_addr_host:" HOST ",handshake:%d,notify:%d_%s",
             ports[0], ports[1], ports[2], ports[3], hex);
    say("kvxfer demo: model %s, %u layers, %ld blocks per transfer, "
        "ucx_tls %s", o.model->name, o.model->layers, o.blocks, o.tls);
    say("library %s", o.lib);
    say("P " HOST " handshake %d notify %d | D " HOST
        " handshake %d notify %d", ports[0], ports[1], ports[2], ports[3]);
    say("transfer_id %s", tid);
    say("request_id  %s", rid);

    if (pipe2(p_out, O_CLOEXEC) != 0 || pipe2(d_in, O_CLOEXEC) != 0 ||
        pipe2(p_in, O_CLOEXEC) != 0 || pipe2(d_hold, O_CLOEXEC) != 0) {
        fail("pipe: %s", strerror(errno));
        goto out;
    }
    lp.fd = p_out[0];
    if (spawn_self(&P, "prefill", ports[0], ports[1], tid, rid, p_in[0],
                   p_out[1], -1) != 0) {
        goto out;
    }
    close(p_out[1]);
    close(p_in[0]);
    p_out[1] = p_in[0] = -1;

    /* The proxy's part: P's response -> D's params. */
    while (lp.params == NULL && !lp.eof && now_s() < end) {
        if (pipe_pump(&lp, 50) != 0) {
            goto out;
        }
        reap(&P);
    }
    if (lp.params == NULL) {
        timed_out = now_s() >= end;
        fail("prefill gave no PARAMS line%s", timed_out ? " in time" : "");
        goto out;
    }
    if (check(api->build_decode_params(lp.params, tid, &dparams),
              "build_decode_params") != 0) {
        goto out;
    }
    if (o.verbose) {
        say("decode kv_transfer_params %s", dparams);
    }
    if (spawn_self(&D, "decode", ports[2], ports[3], tid, rid, d_in[0],
                   -1, d_hold[0]) != 0) {
        goto out;
    }
    close(d_in[0]);
    close(d_hold[0]);
    d_in[0] = d_hold[0] = -1;
    if (write_all(d_in[1], dparams, strlen(dparams), end) != 0 ||
        write_all(d_in[1], "\n", 1, end) != 0) {
        fail("cannot hand the params to decode: %s", strerror(errno));
        goto out;
    }
    close(d_in[1]);
    d_in[1] = -1;

    /* Wait for both, forwarding P's output; a failure ends the other. Once
     * P was released (or left), closing D's hold pipe lets D go; once D is
     * done, closing P's stdin tells P the demo is over. */
    for (;;) {
        bool pd = reap(&P), dd = reap(&D);

        if ((lp.released || pd) && d_hold[1] >= 0) {
            close(d_hold[1]);
            d_hold[1] = -1;
        }
        if (dd && p_in[1] >= 0) {
            close(p_in[1]);
            p_in[1] = -1;
        }
        if (pipe_pump(&lp, 20) != 0) {
            goto out;
        }
        if (pd && dd) {
            while (!lp.eof && pipe_pump(&lp, 10) == 0 && now_s() < end) {
            }
            break;
        }
        if ((pd && !child_ok(&P)) || (dd && !child_ok(&D))) {
            /* Give the other a moment to report, then stop it. */
            double grace = now_s() + 2.0;

            if (p_in[1] >= 0) {
                close(p_in[1]);
                p_in[1] = -1;
            }
            if (d_hold[1] >= 0) {
                close(d_hold[1]);
                d_hold[1] = -1;
            }
            while (!(reap(&P) && reap(&D)) && now_s() < grace) {
                pipe_pump(&lp, 20);
            }
            break;
        }
        if (now_s() >= end) {
            timed_out = true;
            fail("deadline of %d s passed", o.timeout_s);
            break;
        }
    }
    rc = child_ok(&P) && child_ok(&D) ? 0 : 1;
out:
    if (rc != 0) {
        child_report(&P);
        child_report(&D);
    }
    child_kill(&P);
    child_kill(&D);
    for (int i = 0; i < 2; i++) {
        if (p_out[i] >= 0) {
            close(p_out[i]);
        }
        if (d_in[i] >= 0) {
            close(d_in[i]);
        }
        if (p_in[i] >= 0) {
            close(p_in[i]);
        }
        if (d_hold[i] >= 0) {
            close(d_hold[i]);
        }
    }
    api->free(dparams);
    free(lp.params);
    free(lp.buf);
    say("%s%s", rc == 0 ? "OK: both processes succeeded" : "FAILED",
        timed_out ? " (timeout)" : "");
    return rc;
}

int main(int argc, char **argv)
{
    int rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_opts(argc, argv) != 0) {
        return 2;
    }
    api = load_api();
    if (api == NULL) {
        return 1;
    }
    api->set_logger(NULL, NULL, o.verbose ? 2 : 1);
    if (o.role == NULL) {
        rc = run_orchestrator();
    } else if (strcmp(o.role, "prefill") == 0) {
        rc = run_prefill();
    } else {
        rc = run_decode();
    }
    /* A framework may unload the plugin once its engines are gone. */
    dlclose(so_handle);
    return rc;
}
