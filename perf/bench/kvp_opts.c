/* kvp_opts.c - defaults, model presets and command-line parsing. */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef KVX_SO_PATH
#define KVX_SO_PATH "libkvxfer.so.1"
#endif

#define KVP_DEFAULT_PORT 13338

typedef struct {
    const char  *name;
    const char  *alias;
    kvp_model_t  m;
    const char  *what;
} kvp_preset_t;

static const kvp_preset_t kvp_presets[] = {
    {"llama-8b", "llama-3-8b",
     {"llama-8b", 32, KVP_LAYOUT_SPLIT, 16, 8, 128, 2},
     "32 layers, 8 KV heads x 128, bf16, 16 tokens/block: 32 KiB per K or "
     "V block"},
    {"llama-70b", "llama-3-70b",
     {"llama-70b", 80, KVP_LAYOUT_SPLIT, 16, 8, 128, 2},
     "80 layers, 8 KV heads x 128, bf16, 16 tokens/block: 32 KiB per K or "
     "V block at TP1"},
    {"deepseek-v3", "mla",
     {"deepseek-v3", 61, KVP_LAYOUT_KEY_ONLY, 64, 1, 576, 2},
     "MLA: 61 key-only layers, latent 512+64, bf16, 64 tokens/block: 72 "
     "KiB per block (replicated over TP)"},
    {"tiny", NULL,
     {"tiny", 4, KVP_LAYOUT_SPLIT, 4, 2, 16, 2},
     "4 layers, 2 heads x 16, bf16, 4 tokens/block: 256 B per K or V "
     "block (tests)"},
};

int kvp_model_preset(const char *name, kvp_model_t *m)
{
    for (size_t i = 0; i < sizeof(kvp_presets) / sizeof(kvp_presets[0]); i++) {
        if (strcasecmp(name, kvp_presets[i].name) == 0 ||
            (kvp_presets[i].alias != NULL &&
             strcasecmp(name, kvp_presets[i].alias) == 0)) {
            *m = kvp_presets[i].m;
            return 0;
        }
    }
    return -1;
}

void kvp_opts_defaults(kvp_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->role   = KVP_ROLE_SERVER;
    o->port   = KVP_DEFAULT_PORT;
    snprintf(o->bind_addr, sizeof(o->bind_addr), "0.0.0.0");
    snprintf(o->lib, sizeof(o->lib), "%s", KVX_SO_PATH);
    o->modes[0] = KVP_READ;
    o->nmodes   = 1;
    o->mems[0]  = KVP_MEM_APP;
    o->nmems    = 1;
    kvp_model_preset("llama-8b", &o->model);
    o->block_bytes[0] = 0;
    o->nblock_bytes   = 1;
    o->batches[0]     = 32;
    o->nbatches       = 1;
    o->iters          = 0;
    o->warmup         = UINT32_MAX;
    o->depth          = 1;
    o->lead           = 2048;
    o->pool_bytes     = 256ull << 20;
    o->timeout_s      = 120.0;
    o->hold           = 0;
    o->hold_timeout_s = 3600.0;
    o->accept_timeout_s = 600.0;
    o->format         = KVP_FMT_TABLE;
}

void kvp_usage(FILE *f, const char *prog)
{
    fprintf(f,
"Usage: %s [SERVER-HOST] [options]        (roles as in ucx_perftest)\n"
"\n"
"kvxfer_perf measures kvxfer (libkvxfer.so, dlopen()ed, public API only)\n"
"moving KV-cache blocks from a prefill engine (P) to a decode engine (D).\n"
"\n"
"Roles:\n"
"  (no host)              server = prefill side: waits for one client on -p\n"
"  SERVER-HOST            client = decode side: runs the tests, prints results\n"
"  -l, --loopback         P and D in this process (two engines, two threads)\n"
"      --mpi              under mpirun -np 2N: ranks 0..N-1 are the prefill TP=N\n"
"                         instance, N..2N-1 the decode one; rank 0 prints%s\n"
"  -p, --port PORT        bootstrap TCP port (%d)\n"
"      --bind ADDR        server listen address (0.0.0.0)\n"
"      --host-ip ADDR     address the engines advertise (default: the local\n"
"                         address of the bootstrap connection; 127.0.0.1 with -l)\n"
"      --lib PATH         libkvxfer.so to dlopen (%s)\n"
"\n"
"Test (client, loopback, MPI):\n"
"  -t, --op LIST          read | write | read,write (read)\n"
"  -m, --model NAME       llama-8b | llama-70b | deepseek-v3 (mla) | tiny (llama-8b)\n"
"      --layers N --layout split|interleaved|key-only --block-tokens N\n"
"      --kv-heads N --head-dim N --elem N      raw geometry (overrides the model)\n"
"  -s, --block-size LIST  bytes of one K (or V) block of one layer; sets the head\n"
"                         dim. List 32K,1M or doubling range 4K:1M (model's)\n"
"  -b, --batch LIST       KV blocks per transfer, e.g. 1,8,32 or 1:128 (32)\n"
"      --contiguous       consecutive block ids (runs merge); default scattered\n"
"      --resident         every transfer moves the same blocks (cache-resident,\n"
"                         like nixlbench and ucx_perftest); default: walk the pool\n"
"      --busy-poll        D spins on poll_events for its transfer's event (as\n"
"                         nixlbench spins on checkXfer) instead of sleeping in\n"
"                         wait_transfer as a framework thread would (csv: wait)\n"
"      --write-ahead      WRITE: P calls layer_ready for every layer and seal\n"
"                         right after its producer_request, before D asks (the\n"
"                         KV is computed; kvxfer posts the puts when D's\n"
"                         remote_blocks arrive); Tx then runs from D's\n"
"                         consumer_request. Default: P waits for remote_blocks\n"
"                         (Tx from P's first layer_ready)\n"
"      --connect-ahead    the initiator (READ: D, WRITE: P) calls connect_peer\n"
"                         before the first transfer; the header then gives\n"
"                         connect_peer's time and a first transfer without it\n"
"  -n, --iters N          timed transfers per point (auto: 1 GiB / transfer,\n"
"                         10..1000)\n"
"  -w, --warmup N         untimed transfers first (auto: n/10, >= 2, and at\n"
"                         least one pass over the pool)\n"
"  -d, --depth N          transfers in flight (1)\n"
"      --lead N           in points of more than N transfers, D runs at most\n"
"                         N transfers ahead of the ones P finished, then\n"
"                         waits for P's count (2048, more than --depth; a\n"
"                         direct READ never waits for P, and D's releases\n"
"                         that overtake P's producer_requests wait in P's\n"
"                         engine, which keeps at most 4,096 of them)\n"
"      --pool SIZE        KV pool per side (256M, larger than the 32 MiB LLC so\n"
"                         blocks are cold; grown to 2 x depth x batch blocks,\n"
"                         and to 3 blocks: a 2-block tensor is ambiguous)\n"
"      --mem LIST         app (framework-owned mmap, registered) | ucx\n"
"                         (api->alloc_region, like ucx_perftest) | app,ucx (app)\n"
"      --tls TLS          UCX transports (engine key ucx_tls; UCX default)\n"
"      --max-inflight SIZE engine max_inflight_bytes (engine default 16M)\n"
"      --extra JSON       more kv_connector_extra_config members, e.g.\n"
"                         '\"ucx_error_mode\":\"none\"'\n"
"      --tls-dir DIR      mutual TLS on the control plane: DIR/ca.crt,\n"
"                         DIR/peer.crt, DIR/peer.key, peer name kvxfer-peer\n"
"      --kv-port BASE     engine port base (auto)\n"
"      --check            verify every byte of every transfer\n"
"      --memcpy           add single-thread memcpy of the same blocks (limit)\n"
"      --timeout S        deadline of each point (120)\n"
"      --inject-error     (tests) flip one received byte: --check must fail\n"
"      --clock-sync       estimate the P-D clock offset by ping-pong even on\n"
"                         one host (done automatically across hosts)\n"
"      --hold N           before the measured points P creates N idle transfers\n"
"                         (producer_request, 1 block each, never read by D;\n"
"                         WRITE: never given remote_blocks) and holds them\n"
"                         until the setup ends: the cost of idle transfers on\n"
"                         new ones. Rows then carry the hold count (0)\n"
"      --hold-timeout S   engine defer_timeout with --hold, so the idle\n"
"                         transfers do not expire during the run (3600)\n"
"\n"
"Output:\n"
"  -f, --format table|csv|json   stdout format (table)\n"
"      --csv FILE, --json FILE    also write the rows there\n"
"  -q, --quiet            no warnings from the library\n"
"  -v, --verbose          progress and library info messages\n"
"  -h, --help\n"
"\n"
"Columns (nixlbench's): Block Size (B) = one K or V block of one layer;\n"
"Batch Size = KV blocks per transfer; B/W = bytes / time with a transfer in\n"
"flight (GB/s, 1e9); Avg Lat. = that time / (iters x batch); Prep = the\n"
"passive side's request call (READ: P producer_request, WRITE: D\n"
"consumer_request); Post = the initiator's posting calls (READ: D\n"
"consumer_request, WRITE: P layer_ready x layers + seal); Tx = from the post\n"
"to D's FINISHED_RECVING (final flush and completion notification\n"
"included). Extra: Runs/Xfer (contiguous runs after merging), Post/Run, and\n"
"Ntfy = release (READ: D done -> P freed) or write_done (WRITE: P flushed ->\n"
"D notified) latency; Xfer/s = timed transfers / (end of the last - start of\n"
"the first), per pair.\n",
            prog, kvp_have_mpi() ? "" : " (not built: no MPI)",
            KVP_DEFAULT_PORT, KVX_SO_PATH);
}

static int kvp_fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int kvp_fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* "a,b,c" or "a:b" (doubling). */
static int kvp_parse_list(const char *s, uint64_t *out, int max, int *n,
                          uint64_t lo)
{
    char  buf[1024];
    char *save = NULL, *tok;

    *n = 0;
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char    *colon = strchr(tok, ':');
        uint64_t a, b;

        if (colon != NULL) {
            *colon = '\0';
            if (kvp_parse_size(tok, &a) != 0 ||
                kvp_parse_size(colon + 1, &b) != 0 || a < lo || b < a) {
                return -1;
            }
            for (uint64_t v = a; v <= b; v *= 2) {
                if (*n >= max) {
                    return -1;
                }
                out[(*n)++] = v;
            }
        } else {
            if (kvp_parse_size(tok, &a) != 0 || a < lo || *n >= max) {
                return -1;
            }
            out[(*n)++] = a;
        }
    }
    return *n > 0 ? 0 : -1;
}

static int kvp_parse_u32(const char *s, uint32_t lo, uint32_t hi,
                         uint32_t *v)
{
    uint64_t x;

    if (kvp_parse_size(s, &x) != 0 || x < lo || x > hi) {
        return -1;
    }
    *v = (uint32_t)x;
    return 0;
}

enum {
    OPT_MPI = 256, OPT_BIND, OPT_HOST_IP, OPT_LIB, OPT_LAYERS, OPT_LAYOUT,
    OPT_TOKENS, OPT_HEADS, OPT_HEAD_DIM, OPT_ELEM, OPT_CONTIG, OPT_SCATTER,
    OPT_POOL, OPT_MEM, OPT_TLS, OPT_INFLIGHT, OPT_EXTRA, OPT_TLSDIR, OPT_KVPORT,
    OPT_CHECK, OPT_CONNECT_AHEAD, OPT_MEMCPY, OPT_TIMEOUT, OPT_CSV, OPT_JSON, OPT_ACCEPT,
    OPT_INJECT, OPT_CLOCK, OPT_HOLD, OPT_HOLD_TIMEOUT, OPT_RESIDENT, OPT_BUSY_POLL,
    OPT_WRITE_AHEAD, OPT_LEAD,
};

static const struct option kvp_longopts[] = {
    {"loopback", no_argument, NULL, 'l'},
    {"mpi", no_argument, NULL, OPT_MPI},
    {"port", required_argument, NULL, 'p'},
    {"bind", required_argument, NULL, OPT_BIND},
    {"host-ip", required_argument, NULL, OPT_HOST_IP},
    {"lib", required_argument, NULL, OPT_LIB},
    {"op", required_argument, NULL, 't'},
    {"model", required_argument, NULL, 'm'},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"layout", required_argument, NULL, OPT_LAYOUT},
    {"block-tokens", required_argument, NULL, OPT_TOKENS},
    {"kv-heads", required_argument, NULL, OPT_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"elem", required_argument, NULL, OPT_ELEM},
    {"block-size", required_argument, NULL, 's'},
    {"batch", required_argument, NULL, 'b'},
    {"contiguous", no_argument, NULL, OPT_CONTIG},
    {"scattered", no_argument, NULL, OPT_SCATTER},
    {"resident", no_argument, NULL, OPT_RESIDENT},
    {"busy-poll", no_argument, NULL, OPT_BUSY_POLL},
    {"lead", required_argument, NULL, OPT_LEAD},
    {"write-ahead", no_argument, NULL, OPT_WRITE_AHEAD},
    {"iters", required_argument, NULL, 'n'},
    {"warmup", required_argument, NULL, 'w'},
    {"depth", required_argument, NULL, 'd'},
    {"pool", required_argument, NULL, OPT_POOL},
    {"mem", required_argument, NULL, OPT_MEM},
    {"tls", required_argument, NULL, OPT_TLS},
    {"max-inflight", required_argument, NULL, OPT_INFLIGHT},
    {"extra", required_argument, NULL, OPT_EXTRA},
    {"tls-dir", required_argument, NULL, OPT_TLSDIR},
    {"kv-port", required_argument, NULL, OPT_KVPORT},
    {"check", no_argument, NULL, OPT_CHECK},
    {"connect-ahead", no_argument, NULL, OPT_CONNECT_AHEAD},
    {"memcpy", no_argument, NULL, OPT_MEMCPY},
    {"inject-error", no_argument, NULL, OPT_INJECT},
    {"clock-sync", no_argument, NULL, OPT_CLOCK},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"hold", required_argument, NULL, OPT_HOLD},
    {"hold-timeout", required_argument, NULL, OPT_HOLD_TIMEOUT},
    {"accept-timeout", required_argument, NULL, OPT_ACCEPT},
    {"format", required_argument, NULL, 'f'},
    {"csv", required_argument, NULL, OPT_CSV},
    {"json", required_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, 'q'},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int kvp_parse_enum2(const char *s, const char *a, const char *b,
                           int *vals, int *n)
{
    char  buf[64];
    char *save = NULL, *tok;

    *n = 0;
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        int v = strcasecmp(tok, a) == 0 ? 0 : strcasecmp(tok, b) == 0 ? 1 : -1;

        if (v < 0 || *n >= 2) {
            return -1;
        }
        for (int i = 0; i < *n; i++) {
            if (vals[i] == v) {
                return -1;
            }
        }
        vals[(*n)++] = v;
    }
    return *n > 0 ? 0 : -1;
}

int kvp_opts_parse(int argc, char **argv, kvp_opts_t *o, char *err,
                   size_t errlen)
{
    static const char *shortopts = "+lp:t:m:s:b:n:w:d:f:qvh";
    int      c, have_host = 0, mpi = 0, loop = 0;
    const char *tls_dir = NULL;
    int      raw_layers = 0, raw_layout = 0, raw_tokens = 0, raw_heads = 0,
             raw_dim = 0, raw_elem = 0;
    uint32_t layers = 0, tokens = 0, heads = 0, dim = 0, elem = 0;
    kvp_layout_t layout = KVP_LAYOUT_SPLIT;
    uint64_t list[KVP_MAX_SWEEP];
    int      n, vals[2];

    optind = 1;
    opterr = 0;
    for (;;) {
        int idx = 0;

        while (optind < argc && argv[optind][0] != '-') {
            if (have_host) {
                return kvp_fail(err, errlen, "unexpected argument '%s'",
                                argv[optind]);
            }
            snprintf(o->server, sizeof(o->server), "%s", argv[optind]);
            have_host = 1;
            optind++;
        }
        c = getopt_long(argc, argv, shortopts, kvp_longopts, &idx);
        if (c == -1) {
            break;
        }
        if (c == '?' || c == ':') {
            return kvp_fail(err, errlen, "unknown option or missing value: "
                            "'%s'", argv[optind - 1]);
        }
        switch (c) {
        case 'l':
            loop = 1;
            break;
        case OPT_MPI:
            mpi = 1;
            break;
        case 'p': {
            uint32_t v;

            if (kvp_parse_u32(optarg, 1, 65535, &v) != 0) {
                return kvp_fail(err, errlen, "--port %s: 1..65535", optarg);
            }
            o->port = (uint16_t)v;
            break;
        }
        case OPT_BIND:
            snprintf(o->bind_addr, sizeof(o->bind_addr), "%s", optarg);
            break;
        case OPT_HOST_IP:
            snprintf(o->host_ip, sizeof(o->host_ip), "%s", optarg);
            break;
        case OPT_LIB:
            snprintf(o->lib, sizeof(o->lib), "%s", optarg);
            break;
        case 't':
            if (kvp_parse_enum2(optarg, "read", "write", vals, &n) != 0) {
                return kvp_fail(err, errlen, "--op %s: read, write or "
                                "read,write", optarg);
            }
            o->nmodes = n;
            for (int i = 0; i < n; i++) {
                o->modes[i] = (kvp_mode_t)vals[i];
            }
            break;
        case 'm':
            if (kvp_model_preset(optarg, &o->model) != 0) {
                return kvp_fail(err, errlen, "--model %s: unknown (llama-8b, "
                                "llama-70b, deepseek-v3, tiny)", optarg);
            }
            break;
        case OPT_LAYERS:
            raw_layers = 1;
            if (kvp_parse_u32(optarg, 1, 4096, &layers) != 0) {
                return kvp_fail(err, errlen, "--layers %s: 1..4096", optarg);
            }
            break;
        case OPT_LAYOUT:
            raw_layout = 1;
            if (strcasecmp(optarg, "split") == 0) {
                layout = KVP_LAYOUT_SPLIT;
            } else if (strcasecmp(optarg, "interleaved") == 0) {
                layout = KVP_LAYOUT_INTERLEAVED;
            } else if (strcasecmp(optarg, "key-only") == 0 ||
                       strcasecmp(optarg, "mla") == 0) {
                layout = KVP_LAYOUT_KEY_ONLY;
            } else {
                return kvp_fail(err, errlen, "--layout %s: split, interleaved "
                                "or key-only", optarg);
            }
            break;
        case OPT_TOKENS:
            raw_tokens = 1;
            if (kvp_parse_u32(optarg, 1, 1u << 16, &tokens) != 0) {
                return kvp_fail(err, errlen, "--block-tokens %s", optarg);
            }
            break;
        case OPT_HEADS:
            raw_heads = 1;
            if (kvp_parse_u32(optarg, 1, 1024, &heads) != 0) {
                return kvp_fail(err, errlen, "--kv-heads %s", optarg);
            }
            break;
        case OPT_HEAD_DIM:
            raw_dim = 1;
            if (kvp_parse_u32(optarg, 1, 1u << 24, &dim) != 0) {
                return kvp_fail(err, errlen, "--head-dim %s", optarg);
            }
            break;
        case OPT_ELEM:
            raw_elem = 1;
            if (kvp_parse_u32(optarg, 1, 16, &elem) != 0) {
                return kvp_fail(err, errlen, "--elem %s: 1..16", optarg);
            }
            break;
        case 's':
            if (kvp_parse_list(optarg, o->block_bytes, KVP_MAX_SWEEP,
                               &o->nblock_bytes, 1) != 0) {
                return kvp_fail(err, errlen, "--block-size %s: sizes like "
                                "32K,1M or 4K:1M", optarg);
            }
            break;
        case 'b':
            if (kvp_parse_list(optarg, list, KVP_MAX_SWEEP, &n, 1) != 0) {
                return kvp_fail(err, errlen, "--batch %s: counts like 1,8,32 "
                                "or 1:128", optarg);
            }
            for (int i = 0; i < n; i++) {
                if (list[i] > (1u << 20)) {
                    return kvp_fail(err, errlen, "--batch %s: at most 1M "
                                    "blocks", optarg);
                }
                o->batches[i] = (uint32_t)list[i];
            }
            o->nbatches = n;
            break;
        case OPT_CONTIG:
            o->contiguous = 1;
            break;
        case OPT_CONNECT_AHEAD:
            o->connect_ahead = 1;
            break;
        case OPT_SCATTER:
            o->contiguous = 0;
            break;
        case OPT_RESIDENT:
            o->resident = 1;
            break;
        case OPT_BUSY_POLL:
            o->busy_poll = 1;
            break;
        case OPT_WRITE_AHEAD:
            o->write_ahead = 1;
            break;
        case 'n':
            if (kvp_parse_u32(optarg, 1, 100000000u, &o->iters) != 0) {
                return kvp_fail(err, errlen, "--iters %s: >= 1", optarg);
            }
            break;
        case 'w':
            if (kvp_parse_size(optarg, &list[0]) != 0 ||
                list[0] > 100000000u) {
                return kvp_fail(err, errlen, "--warmup %s", optarg);
            }
            o->warmup = (uint32_t)list[0];
            break;
        case 'd':
            if (kvp_parse_u32(optarg, 1, 1024, &o->depth) != 0) {
                return kvp_fail(err, errlen, "--depth %s: 1..1024", optarg);
            }
            break;
        case OPT_LEAD:
            if (kvp_parse_u32(optarg, 2, 4000, &o->lead) != 0) {
                return kvp_fail(err, errlen, "--lead %s: 2..4000 (below the "
                                "engine's 4,096 early messages)", optarg);
            }
            break;
        case OPT_POOL:
            if (kvp_parse_size(optarg, &o->pool_bytes) != 0 ||
                o->pool_bytes == 0) {
                return kvp_fail(err, errlen, "--pool %s", optarg);
            }
            break;
        case OPT_MEM:
            if (kvp_parse_enum2(optarg, "app", "ucx", vals, &n) != 0) {
                return kvp_fail(err, errlen, "--mem %s: app, ucx or app,ucx",
                                optarg);
            }
            o->nmems = n;
            for (int i = 0; i < n; i++) {
                o->mems[i] = (kvp_mem_t)vals[i];
            }
            break;
        case OPT_TLS:
            if (strchr(optarg, '"') != NULL || strchr(optarg, '\\') != NULL) {
                return kvp_fail(err, errlen, "--tls %s: no quotes", optarg);
            }
            snprintf(o->tls, sizeof(o->tls), "%s", optarg);
            break;
        case OPT_INFLIGHT:
            if (kvp_parse_size(optarg, &o->max_inflight) != 0 ||
                o->max_inflight == 0) {
                return kvp_fail(err, errlen, "--max-inflight %s", optarg);
            }
            break;
        case OPT_EXTRA:
            snprintf(o->extra, sizeof(o->extra), "%s", optarg);
            break;
        case OPT_TLSDIR:
            tls_dir = optarg;
            break;
        case OPT_KVPORT:
            if (kvp_parse_u32(optarg, 1024, 65000, &o->kv_port) != 0) {
                return kvp_fail(err, errlen, "--kv-port %s: 1024..65000",
                                optarg);
            }
            break;
        case OPT_CHECK:
            o->check = 1;
            break;
        case OPT_MEMCPY:
            o->memcpy_rows = 1;
            break;
        case OPT_INJECT:
            o->inject_error = 1;
            break;
        case OPT_CLOCK:
            o->clock_sync = 1;
            break;
        case OPT_HOLD:
            if (kvp_parse_u32(optarg, 0, 10000000u, &o->hold) != 0) {
                return kvp_fail(err, errlen, "--hold %s: 0..10M idle "
                                "transfers", optarg);
            }
            break;
        case OPT_HOLD_TIMEOUT:
        case OPT_TIMEOUT:
        case OPT_ACCEPT: {
            char  *end;
            double v = strtod(optarg, &end);

            if (*end != '\0' || !(v > 0) || v > 86400) {
                return kvp_fail(err, errlen, "--%s %s: seconds > 0",
                                c == OPT_TIMEOUT ? "timeout"
                                : c == OPT_HOLD_TIMEOUT ? "hold-timeout"
                                                        : "accept-timeout",
                                optarg);
            }
            if (c == OPT_TIMEOUT) {
                o->timeout_s = v;
            } else if (c == OPT_HOLD_TIMEOUT) {
                o->hold_timeout_s = v;
            } else {
                o->accept_timeout_s = v;
            }
            break;
        }
        case 'f':
            if (strcasecmp(optarg, "table") == 0) {
                o->format = KVP_FMT_TABLE;
            } else if (strcasecmp(optarg, "csv") == 0) {
                o->format = KVP_FMT_CSV;
            } else if (strcasecmp(optarg, "json") == 0) {
                o->format = KVP_FMT_JSON;
            } else {
                return kvp_fail(err, errlen, "--format %s: table, csv or json",
                                optarg);
            }
            break;
        case OPT_CSV:
            snprintf(o->csv_path, sizeof(o->csv_path), "%s", optarg);
            break;
        case OPT_JSON:
            snprintf(o->json_path, sizeof(o->json_path), "%s", optarg);
            break;
        case 'q':
            o->quiet = 1;
            break;
        case 'v':
            o->verbose++;
            break;
        case 'h':
            kvp_usage(stdout, argv[0]);
            return 1;
        default:
            return kvp_fail(err, errlen, "unhandled option");
        }
    }
    if (o->lead <= o->depth) {
        return kvp_fail(err, errlen, "--lead %u: must be more than --depth "
                        "%u (D would stop at the lead with fewer transfers "
                        "in flight than asked)", o->lead, o->depth);
    }
    if (tls_dir != NULL) {
        size_t n = strlen(o->extra);
        int    w = snprintf(o->extra + n, sizeof(o->extra) - n,
                            "%s\"tls_cert_file\":\"%s/peer.crt\","
                            "\"tls_key_file\":\"%s/peer.key\","
                            "\"tls_ca_file\":\"%s/ca.crt\","
                            "\"tls_peer_name\":\"kvxfer-peer\"",
                            n > 0 ? "," : "", tls_dir, tls_dir, tls_dir);

        if (w < 0 || (size_t)w >= sizeof(o->extra) - n) {
            return kvp_fail(err, errlen, "--tls-dir %s: path too long",
                            tls_dir);
        }
    }
    if (raw_layers) {
        o->model.layers = layers;
    }
    if (raw_layout) {
        o->model.layout = layout;
    }
    if (raw_tokens) {
        o->model.block_tokens = tokens;
    }
    if (raw_heads) {
        o->model.kv_heads = heads;
    }
    if (raw_dim) {
        o->model.head_dim = dim;
    }
    if (raw_elem) {
        o->model.elem = elem;
    }
    if (o->model.layout == KVP_LAYOUT_KEY_ONLY) {
        o->model.kv_heads = 1;
    }
    if (raw_layers || raw_layout || raw_tokens || raw_heads || raw_dim ||
        raw_elem) {
        char name[sizeof(o->model.name)];

        snprintf(name, sizeof(name), "%.20s+raw", o->model.name);
        memcpy(o->model.name, name, sizeof(name));
    }
    if (loop + mpi + have_host > 1) {
        return kvp_fail(err, errlen, "choose one role: SERVER-HOST (client), "
                        "--loopback or --mpi");
    }
    o->role = loop ? KVP_ROLE_LOOPBACK
                   : mpi ? KVP_ROLE_MPI
                         : have_host ? KVP_ROLE_CLIENT : KVP_ROLE_SERVER;
    kvp_verbose = o->verbose;
    kvp_quiet   = o->quiet;
    return 0;
}
