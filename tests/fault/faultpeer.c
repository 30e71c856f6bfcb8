/*
 * faultpeer.c - one side (P or D) of the real-process fault campaign.
 *
 * Loads libkvxfer.so with dlopen and uses only the function table, like a
 * serving framework. The driver (faultrun.py) talks to it over stdin
 * (commands, one a line) and stdout (one JSON object a line); the same
 * result lines are appended to --log.
 *
 * P fills the blocks of transfer `gen` with a pattern derived from (gen,
 * layer, block, K/V, offset) and, the moment an event reports them free
 * (FINISHED_SENDING / FAILED), overwrites them with garbage, as a framework
 * reusing its blocks would. D keeps every block it does not own for a
 * transfer filled with FREE_BYTE; it checks every byte of a transfer
 * reported OK against P's pattern, and checks that free blocks stay
 * FREE_BYTE (a write after D was told the blocks are free is a violation).
 *
 * Commands (both):  STATS | CHECK | DESTROY | QUIT (or end of file)
 *   P: REQ tid gen n          producer_request (WRITE: then layer_ready of
 *                             every layer, --layer-gap-us apart, and seal)
 *   D: REQ tid gen n [json]   consumer_request; json = P's response (READ)
 *      ARM action layer       after layer `layer` of the next transfer
 *                             landed: action = abort | destroy
 * Every wait has a deadline; --max-life bounds the whole process.
 */
#define _GNU_SOURCE
#include <kvxfer/kvxfer.h>

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KVX_SO_PATH
#define KVX_SO_PATH "libkvxfer.so.1"
#endif

#define HOST      "127.0.0.1"
#define FREE_BYTE 0x5D /* D: content of a block no transfer owns */
#define MAX_XFERS 64
#define LINE_MAX_ 65536

typedef struct {
    const char *role; /* "p" or "d" */
    int         read_mode;
    const char *tls;
    int         hs, notify, peer_hs, peer_notify;
    const char *log;
    uint32_t    layers, pool, block_size, heads, head_dim;
    int         hs_to, xfer_to, defer_to;
    int         layer_gap_us;
    int         max_life_s;
    int         inst;
    int         corrupt; /* self-test: flip a byte of each OK transfer */
    const char *lib;
} opts_t;

static opts_t o = {
    .tls = "tcp", .layers = 16, .pool = 128, .block_size = 16, .heads = 8,
    .head_dim = 128, .hs_to = 2, .xfer_to = 3, .defer_to = 6,
    .layer_gap_us = 2000, .max_life_s = 120,
};

static const kvx_api_t *api;
static kvx_engine_t    *eng;
static uint8_t        **bufs;
static FILE            *logf;
static double           t_born;

/* --- time, output --------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Appends s to out as a JSON string literal. */
static void jstr(char *out, size_t cap, const char *s)
{
    size_t n = strlen(out);

    if (n + 2 >= cap) {
        return;
    }
    out[n++] = '"';
    for (; *s != '\0' && n + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n++] = '"';
    out[n]   = '\0';
}

static void cat(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cat(char *out, size_t cap, const char *fmt, ...)
{
    size_t  n = strlen(out);
    va_list ap;

    if (n >= cap) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(out + n, cap - n, fmt, ap);
    va_end(ap);
}

/* One JSON object per line on stdout; result lines also go to the log. */
static void emit(const char *json, bool to_log)
{
    printf("%s\n", json);
    fflush(stdout);
    if (to_log && logf != NULL) {
        fprintf(logf, "%s\n", json);
        fflush(logf);
    }
}

static void emitf(bool to_log, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void emitf(bool to_log, const char *fmt, ...)
{
    char    line[4096];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    emit(line, to_log);
}

static void die(const char *what, kvx_status_t st)
{
    char line[2048] = "";

    cat(line, sizeof(line), "{\"ev\":\"fatal\",\"side\":\"%s\",\"what\":",
        o.role);
    jstr(line, sizeof(line), what);
    cat(line, sizeof(line), ",\"status\":\"%s\",\"error\":",
        api ? api->status_name(st) : "?");
    jstr(line, sizeof(line), api ? api->last_error() : "");
    cat(line, sizeof(line), "}");
    emit(line, true);
    exit(2);
}

/* --- geometry and patterns ------------------------------------------------ */

static uint64_t unit_len(void)
{
    return (uint64_t)o.block_size * o.heads * o.head_dim * 2;
}

static uint8_t *unit_ptr(uint32_t layer, uint64_t block, int kv)
{
    return bufs[layer] + ((uint64_t)kv * o.pool + block) * unit_len();
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte i of the unit is byte i%8 of mix64(seed + i/8); seed from (tag,
 * gen, layer, block, kv). tag 1 = P's data, others = garbage. */
static void fill(uint8_t *p, uint64_t len, uint64_t tag, uint64_t gen,
                 uint32_t layer, uint64_t block, int kv)
{
    uint64_t seed = mix64(mix64(mix64(mix64(tag) ^ gen) ^ layer) ^ block) ^
                    (uint64_t)kv;

    for (uint64_t j = 0; j < len; j += 8) {
        uint64_t w = mix64(seed + j / 8);

        memcpy(p + j, &w, len - j < 8 ? len - j : 8);
    }
}

/* Blocks of transfer gen: scattered and distinct (stride coprime with half
 * the pool), in the half gen % 2, so that transfers gen and gen + 1 (live
 * at the same time) never share a block. */
static uint64_t blk(bool producer, uint64_t gen, size_t i)
{
    uint64_t half = o.pool / 2;

    return (gen % 2) * half + (producer ? (i * 3 + gen * 7) % half
                                        : (i * 5 + gen * 11) % half);
}

/* --- transfers ------------------------------------------------------------ */

typedef struct {
    bool     used;
    char     tid[KVX_ID_MAX];
    uint64_t gen;
    size_t   n;
    uint64_t ids[256];  /* local */
    uint64_t rids[256]; /* P's (D side) */
    char     params[4096];
    double   t_req;
    uint32_t next_layer; /* P WRITE: layer_ready schedule */
    bool     sealed;
} xfer_t;

static xfer_t xf[MAX_XFERS];
static bool   owned[4096]; /* D: block belongs to a live transfer */

static xfer_t *find_xfer(const char *tid)
{
    for (int i = 0; i < MAX_XFERS; i++) {
        if (xf[i].used && strcmp(xf[i].tid, tid) == 0) {
            return &xf[i];
        }
    }
    return NULL;
}

static xfer_t *new_xfer(void)
{
    for (int i = 0; i < MAX_XFERS; i++) {
        if (!xf[i].used) {
            memset(&xf[i], 0, sizeof(xf[i]));
            xf[i].used = true;
            return &xf[i];
        }
    }
    return NULL;
}

static void ids_json(char *out, size_t cap, const uint64_t *ids, size_t n)
{
    cat(out, cap, "[");
    for (size_t i = 0; i < n; i++) {
        cat(out, cap, "%s%" PRIu64, i ? "," : "", ids[i]);
    }
    cat(out, cap, "]");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static bool same_ids(const uint64_t *a, size_t na, const uint64_t *b, size_t nb)
{
    uint64_t x[256], y[256];

    if (na != nb || na > 256) {
        return false;
    }
    memcpy(x, a, na * 8);
    memcpy(y, b, na * 8);
    qsort(x, na, 8, cmp_u64);
    qsort(y, na, 8, cmp_u64);
    return memcmp(x, y, na * 8) == 0;
}

static const char *ev_name(kvx_event_type_t t)
{
    return t == KVX_EVENT_FINISHED_SENDING   ? "FINISHED_SENDING"
           : t == KVX_EVENT_FINISHED_RECVING ? "FINISHED_RECVING"
           : t == KVX_EVENT_FAILED           ? "FAILED"
                                             : "?";
}

/* The result line of one transfer. */
static void result(const xfer_t *x, const char *outcome, const kvx_event_t *ev,
                   int64_t wrong, const char *extra)
{
    char line[LINE_MAX_] = "";

    cat(line, sizeof(line),
        "{\"ev\":\"xfer\",\"side\":\"%s\",\"inst\":%d,\"tid\":", o.role,
        o.inst);
    jstr(line, sizeof(line), x->tid);
    cat(line, sizeof(line),
        ",\"gen\":%" PRIu64 ",\"outcome\":\"%s\",\"t_req\":%.6f,"
        "\"t_end\":%.6f,\"wrong_bytes\":%" PRId64,
        x->gen, outcome, x->t_req, now_s(), wrong);
    if (ev != NULL) {
        cat(line, sizeof(line), ",\"event\":\"%s\",\"status\":\"%s\","
            "\"reason\":", ev_name(ev->type), api->status_name(ev->status));
        jstr(line, sizeof(line), ev->reason);
        cat(line, sizeof(line), ",\"blocks\":");
        ids_json(line, sizeof(line), ev->block_ids, ev->num_block_ids);
        cat(line, sizeof(line), ",\"blocks_match\":%s",
            same_ids(ev->block_ids, ev->num_block_ids, x->ids, x->n)
                ? "true" : "false");
    }
    cat(line, sizeof(line), ",\"expected_blocks\":");
    ids_json(line, sizeof(line), x->ids, x->n);
    if (extra != NULL) {
        cat(line, sizeof(line), ",%s", extra);
    }
    cat(line, sizeof(line), "}");
    emit(line, true);
}

/* An event for a transfer this side does not hold (a violation). */
static void unknown_event(const kvx_event_t *ev)
{
    static xfer_t ghost;

    memset(&ghost, 0, sizeof(ghost));
    memcpy(ghost.tid, ev->transfer_id, sizeof(ghost.tid));
    ghost.tid[sizeof(ghost.tid) - 1] = '\0';
    result(&ghost, "unknown_event", ev, -1, NULL);
}

/* P: overwrite a transfer's blocks with garbage (they were reported free). */
static void p_scribble(const xfer_t *x)
{
    for (uint32_t l = 0; l < o.layers; l++) {
        for (size_t i = 0; i < x->n; i++) {
            for (int kv = 0; kv < 2; kv++) {
                fill(unit_ptr(l, x->ids[i], kv), unit_len(), 0xbad0 + o.inst,
                     x->gen, l, x->ids[i], kv);
            }
        }
    }
}

/* D: the blocks are free again. */
static void d_release(const xfer_t *x)
{
    for (uint32_t l = 0; l < o.layers; l++) {
        for (size_t i = 0; i < x->n; i++) {
            memset(unit_ptr(l, x->ids[i], 0), FREE_BYTE, unit_len());
            memset(unit_ptr(l, x->ids[i], 1), FREE_BYTE, unit_len());
        }
    }
    for (size_t i = 0; i < x->n; i++) {
        owned[x->ids[i]] = false;
    }
}

/* What a wrong unit holds: never written (FREE_BYTE), the garbage P
 * writes into blocks reported free, P's initial content, or other. */
static const char *classify(const uint8_t *got, const xfer_t *x,
                            uint32_t layer, size_t i, int kv, uint8_t *tmp)
{
    bool all_free = true;

    for (uint64_t j = 0; j < unit_len() && all_free; j++) {
        all_free = got[j] == FREE_BYTE;
    }
    if (all_free) {
        return "never_written";
    }
    for (int inst = 0; inst < 4; inst++) {
        fill(tmp, unit_len(), 0xbad0 + (uint64_t)inst, x->gen, layer,
             x->rids[i], kv);
        if (memcmp(tmp, got, unit_len()) == 0) {
            return "p_freed_garbage";
        }
        fill(tmp, unit_len(), 0x1e57 + (uint64_t)inst, 0, layer, x->rids[i],
             kv);
        if (memcmp(tmp, got, unit_len()) == 0) {
            return "p_initial_content";
        }
    }
    return "mixed";
}

/* D: bytes of the transfer's blocks that differ from P's pattern; *diag
 * gets per-layer counts of wrong K/V units and what the first one holds. */
static int64_t d_verify(const xfer_t *x, char *diag, size_t cap)
{
    uint8_t *exp = malloc(unit_len()), *tmp = malloc(unit_len());
    int64_t  wrong = 0;

    if (exp == NULL || tmp == NULL) {
        die("malloc", KVX_ERR_NO_MEMORY);
    }
    cat(diag, cap, "\"wrong_units_per_layer\":[");
    const char *first = NULL;
    for (uint32_t l = 0; l < o.layers; l++) {
        int units = 0;

        for (size_t i = 0; i < x->n; i++) {
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *got = unit_ptr(l, x->ids[i], kv);
                int64_t        w   = 0;

                fill(exp, unit_len(), 1, x->gen, l, x->rids[i], kv);
                for (uint64_t j = 0; j < unit_len(); j++) {
                    w += got[j] != exp[j];
                }
                if (w != 0) {
                    units++;
                    if (first == NULL) {
                        first = classify(got, x, l, i, kv, tmp);
                    }
                }
                wrong += w;
            }
        }
        cat(diag, cap, "%s%d", l ? "," : "", units);
    }
    cat(diag, cap, "],\"first_wrong_unit_holds\":\"%s\"",
        first ? first : "");
    free(exp);
    free(tmp);
    return wrong;
}

/* D: bytes of free blocks that are not FREE_BYTE (written after free). */
static void d_check_free(const char *when)
{
    int64_t  bad = 0;
    char     line[8192] = "";
    uint64_t bad_blocks[64];
    size_t   nbad = 0;

    for (uint64_t b = 0; b < o.pool; b++) {
        int64_t before = bad;

        if (owned[b]) {
            continue;
        }
        for (uint32_t l = 0; l < o.layers; l++) {
            for (int kv = 0; kv < 2; kv++) {
                const uint8_t *p = unit_ptr(l, b, kv);

                for (uint64_t j = 0; j < unit_len(); j++) {
                    bad += p[j] != FREE_BYTE;
                }
            }
        }
        if (bad != before && nbad < 64) {
            bad_blocks[nbad++] = b;
        }
    }
    cat(line, sizeof(line),
        "{\"ev\":\"check\",\"side\":\"d\",\"inst\":%d,\"when\":\"%s\","
        "\"late_bytes\":%" PRId64 ",\"late_blocks\":", o.inst, when, bad);
    ids_json(line, sizeof(line), bad_blocks, nbad);
    cat(line, sizeof(line), ",\"t\":%.6f}", now_s());
    emit(line, true);
    if (bad != 0) {
        /* Report each write-after-free once. */
        for (uint64_t b = 0; b < o.pool; b++) {
            if (!owned[b]) {
                for (uint32_t l = 0; l < o.layers; l++) {
                    memset(unit_ptr(l, b, 0), FREE_BYTE, unit_len());
                    memset(unit_ptr(l, b, 1), FREE_BYTE, unit_len());
                }
            }
        }
    }
}

/* --- engine ---------------------------------------------------------------- */

static void load_api(void)
{
    void *so = dlopen(o.lib ? o.lib : KVX_SO_PATH, RTLD_NOW | RTLD_LOCAL);

    if (so == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    kvx_get_api_fn_t get =
        (kvx_get_api_fn_t)(uintptr_t)dlsym(so, KVX_ENTRY_POINT_NAME);
    api = get ? get(KVX_ABI_MAJOR) : NULL;
    if (api == NULL || api->struct_size < sizeof(kvx_api_t)) {
        fprintf(stderr, "no compatible kvxfer function table\n");
        exit(2);
    }
}

static void engine_up(void)
{
    bool     producer = o.role[0] == 'p';
    uint64_t len      = 2ull * o.pool * unit_len();
    char     cfg[2048];
    /* KVX_FAULT_LOG_LEVEL (0 error .. 3 debug) to study a failed round. */
    const char *lv = getenv("KVX_FAULT_LOG_LEVEL");
    int         level = lv != NULL && lv[0] >= '0' && lv[0] <= '3' ? lv[0] - '0'
                                                                   : 0;

    snprintf(cfg, sizeof(cfg),
             "{\"role\":\"%s\",\"tp_rank\":0,\"tp_size\":1,\"dp_rank\":0,"
             "\"dp_size\":1,\"log_level\":%d,\"kv_connector_extra_config\":{"
             "\"host_ip\":\"" HOST "\",\"handshake_port\":%d,"
             "\"notify_port\":%d,\"read_mode\":%s,"
             "\"node_hosts\":[\"" HOST "\"],"
             "\"trusted_remote_hosts\":[\"127.0.0.0/8\"],"
             "\"ucx_tls\":\"%s\",\"handshake_timeout\":%d,"
             "\"transfer_timeout\":%d,\"defer_timeout\":%d}}",
             producer ? "kv_producer" : "kv_consumer", level, o.hs, o.notify,
             o.read_mode ? "true" : "false", o.tls, o.hs_to, o.xfer_to,
             o.defer_to);
    kvx_status_t st = api->engine_create(cfg, &eng);
    if (st != KVX_OK) {
        die("engine_create", st);
    }
    bufs = calloc(o.layers, sizeof(*bufs));
    if (bufs == NULL) {
        die("calloc", KVX_ERR_NO_MEMORY);
    }
    for (uint32_t l = 0; l < o.layers; l++) {
        kvx_layer_desc_t d;
        char             name[64];

        if (posix_memalign((void **)&bufs[l], 4096, len) != 0) {
            die("posix_memalign", KVX_ERR_NO_MEMORY);
        }
        for (uint64_t b = 0; b < o.pool; b++) {
            for (int kv = 0; kv < 2; kv++) {
                if (producer) { /* never P's pattern of any transfer */
                    fill(unit_ptr(l, b, kv), unit_len(), 0x1e57 + o.inst, 0,
                         l, b, kv);
                } else {
                    memset(unit_ptr(l, b, kv), FREE_BYTE, unit_len());
                }
            }
        }
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.attn", l);
        memset(&d, 0, sizeof(d));
        d.struct_size  = sizeof(d);
        d.name         = name;
        d.base         = bufs[l];
        d.length       = len;
        d.mem_type     = KVX_MEM_HOST;
        d.ndim         = 5;
        d.shape[0]     = 2;
        d.shape[1]     = o.pool;
        d.shape[2]     = o.block_size;
        d.shape[3]     = o.heads;
        d.shape[4]     = o.head_dim;
        d.elem_size    = 2;
        d.block_size   = o.block_size;
        d.num_kv_heads = o.heads;
        d.head_size    = o.head_dim;
        int64_t stride = 1;
        for (int k = 4; k >= 0; k--) {
            d.stride[k] = stride;
            stride *= d.shape[k];
        }
        st = api->register_layer(eng, &d);
        if (st != KVX_OK) {
            die("register_layer", st);
        }
    }
    st = api->start(eng);
    if (st != KVX_OK) {
        die("start", st);
    }
}

static void do_destroy(const char *why)
{
    double t0 = now_s();

    if (eng == NULL) {
        return;
    }
    api->engine_destroy(eng);
    eng = NULL;
    emitf(true, "{\"ev\":\"destroyed\",\"side\":\"%s\",\"inst\":%d,"
          "\"why\":\"%s\",\"t0\":%.6f,\"ms\":%.3f}", o.role, o.inst, why, t0,
          (now_s() - t0) * 1e3);
    /* Nothing may touch the memory of an engine that was destroyed: the
     * framework reuses every block at once. */
    for (int i = 0; i < MAX_XFERS; i++) {
        if (xf[i].used) {
            result(&xf[i], "destroyed", NULL, -1, NULL);
            if (o.role[0] == 'p') {
                p_scribble(&xf[i]);
            } else {
                d_release(&xf[i]);
            }
            xf[i].used = false;
        }
    }
}

static void do_stats(void)
{
    char *js = NULL;

    if (eng == NULL) {
        emitf(false, "{\"ev\":\"stats\",\"side\":\"%s\",\"stats\":null}",
              o.role);
        return;
    }
    kvx_status_t st = api->stats(eng, &js);
    if (st != KVX_OK) {
        die("stats", st);
    }
    int live = 0;
    for (int i = 0; i < MAX_XFERS; i++) {
        live += xf[i].used;
    }
    char *line = malloc(strlen(js) + 256);
    if (line == NULL) {
        die("malloc", KVX_ERR_NO_MEMORY);
    }
    sprintf(line, "{\"ev\":\"stats\",\"side\":\"%s\",\"inst\":%d,"
            "\"unreported\":%d,\"stats\":%s}", o.role, o.inst, live, js);
    emit(line, true);
    free(line);
    api->free(js);
}

/* --- P -------------------------------------------------------------------- */

static void p_events(void)
{
    kvx_event_t ev;

    while (eng != NULL && api->poll_events(eng, &ev, 1) == 1) {
        xfer_t *x = find_xfer(ev.transfer_id);

        if (x == NULL) {
            unknown_event(&ev);
        } else {
            result(x, ev.type == KVX_EVENT_FINISHED_SENDING && ev.status == 0
                          ? "ok" : "failed", &ev, -1, NULL);
            p_scribble(x); /* free: the framework reuses them now */
            x->used = false;
        }
        api->free(ev.block_ids);
    }
}

static void p_req(const char *tid, uint64_t gen, size_t n)
{
    xfer_t *x = new_xfer();
    char    params[1024], *resp = NULL;

    if (x == NULL || n == 0 || n > 256 || n > o.pool / 2) {
        die("REQ: too many transfers or blocks", KVX_ERR_INVALID_PARAM);
    }
    snprintf(x->tid, sizeof(x->tid), "%s", tid);
    x->gen = gen;
    x->n   = n;
    for (size_t i = 0; i < n; i++) {
        x->ids[i] = blk(true, gen, i);
        for (uint32_t l = 0; l < o.layers; l++) {
            for (int kv = 0; kv < 2; kv++) {
                fill(unit_ptr(l, x->ids[i], kv), unit_len(), 1, gen, l,
                     x->ids[i], kv);
            }
        }
    }
    if (o.read_mode) {
        snprintf(params, sizeof(params),
                 "{\"transfer_id\":\"%s\",\"do_remote_decode\":true}", tid);
    } else {
        snprintf(params, sizeof(params),
                 "{\"transfer_id\":\"%s\",\"do_remote_decode\":true,"
                 "\"remote_host\":\"" HOST "\",\"remote_handshake_port\":%d,"
                 "\"remote_notify_port\":%d,\"remote_tp_size\":1}",
                 tid, o.peer_hs, o.peer_notify);
    }
    x->t_req = now_s();
    char rid[160];
    snprintf(rid, sizeof(rid), "rq-%s", tid);
    kvx_status_t st = api->producer_request(eng, rid, params, x->ids, n,
                                            &resp);
    if (st != KVX_OK) {
        char extra[1024] = "\"error\":";

        jstr(extra, sizeof(extra), api->last_error());
        result(x, "request_failed", NULL, -1, extra);
        p_scribble(x);
        x->used = false;
        return;
    }
    char *line = malloc(strlen(resp) + 256);
    if (line == NULL) {
        die("malloc", KVX_ERR_NO_MEMORY);
    }
    sprintf(line, "{\"ev\":\"params\",\"tid\":\"%s\",\"params\":%s}", tid,
            resp);
    emit(line, false);
    free(line);
    api->free(resp);
}

/* P, WRITE: the next layer_ready of every transfer whose time has come;
 * returns ms until the next one is due (-1: none). */
static int p_schedule(void)
{
    int next = -1;

    for (int i = 0; eng != NULL && !o.read_mode && i < MAX_XFERS; i++) {
        xfer_t *x = &xf[i];

        if (!x->used || x->sealed) {
            continue;
        }
        double due = x->t_req + x->next_layer * o.layer_gap_us * 1e-6;
        double now = now_s();

        if (now >= due) {
            kvx_status_t st;

            if (x->next_layer < o.layers) {
                st = api->layer_ready(eng, x->tid, x->next_layer);
            } else {
                st = api->seal_transfer(eng, x->tid);
                x->sealed = true;
            }
            emitf(false, "{\"ev\":\"%s\",\"tid\":\"%s\",\"layer\":%u,"
                  "\"status\":\"%s\",\"t\":%.6f}",
                  x->sealed ? "seal" : "layer_ready", x->tid, x->next_layer,
                  api->status_name(st), now_s());
            x->next_layer++;
            next = 0;
        } else {
            int ms = (int)((due - now) * 1e3) + 1;

            next = next < 0 || ms < next ? ms : next;
        }
    }
    return next;
}

/* --- D -------------------------------------------------------------------- */

static char                  arm_action[16];
static int                   arm_layer = -1;
static volatile sig_atomic_t sig_fault;

static void on_fault_signal(int sig)
{
    sig_fault = sig;
}

static void d_params(const xfer_t *x, const char *p_resp, char *out,
                     size_t cap)
{
    if (o.read_mode) {
        char *dp = NULL;

        kvx_status_t st = api->build_decode_params(p_resp, x->tid, &dp);
        if (st != KVX_OK) {
            die("build_decode_params", st);
        }
        snprintf(out, cap, "%s", dp);
        api->free(dp);
    } else {
        snprintf(out, cap,
                 "{\"transfer_id\":\"%s\",\"do_remote_prefill\":true,"
                 "\"remote_host\":\"" HOST "\",\"remote_handshake_port\":%d,"
                 "\"remote_notify_port\":%d,\"remote_tp_size\":1}",
                 x->tid, o.peer_hs, o.peer_notify);
    }
}

/* Waits for the terminal event of x (bounded); 1 = got one, 0 = none. */
static int d_wait_event(xfer_t *x, kvx_event_t *out, double deadline)
{
    while (eng != NULL) {
        kvx_event_t ev;
        int         k = api->poll_events(eng, &ev, 1);

        if (k == 1) {
            if (strcmp(ev.transfer_id, x->tid) == 0) {
                *out = ev;
                return 1;
            }
            unknown_event(&ev);
            api->free(ev.block_ids);
            continue;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            return 0;
        }
        api->wait_events(eng, left > 0.05 ? 50 : (int64_t)(left * 1e3) + 1);
    }
    return 0;
}

static void d_req(const char *tid, uint64_t gen, size_t n, const char *p_resp)
{
    xfer_t      *x = new_xfer();
    char         rid[160], extra[4096] = "";
    kvx_event_t  ev;
    kvx_status_t st, wst = KVX_OK;
    const char  *fault = "";
    double       t_fault = 0;
    uint32_t     landed = 0;

    if (x == NULL || n == 0 || n > 256 || n > o.pool / 2) {
        die("REQ: too many transfers or blocks", KVX_ERR_INVALID_PARAM);
    }
    d_check_free("before_request");
    snprintf(x->tid, sizeof(x->tid), "%s", tid);
    x->gen = gen;
    x->n   = n;
    for (size_t i = 0; i < n; i++) {
        x->ids[i]  = blk(false, gen, i);
        x->rids[i] = blk(true, gen, i);
        owned[x->ids[i]] = true;
    }
    d_params(x, p_resp, x->params, sizeof(x->params));
    snprintf(rid, sizeof(rid), "rq-%s", tid);
    x->t_req = now_s();
    st = api->consumer_request(eng, rid, x->params, x->ids, n);
    if (st != KVX_OK) {
        cat(extra, sizeof(extra), "\"error\":");
        jstr(extra, sizeof(extra), api->last_error());
        result(x, "request_failed", NULL, -1, extra);
        d_release(x);
        x->used = false;
        return;
    }
    emitf(false, "{\"ev\":\"started\",\"tid\":\"%s\",\"t\":%.6f}", tid,
          x->t_req);
    double deadline = x->t_req + o.hs_to + o.xfer_to + o.defer_to + 5;
    uint32_t l = 0;
    for (;;) {
        /* A fault armed at this layer (READ) or signalled (SIGUSR1 abort,
         * SIGUSR2 destroy: WRITE, where layers land with write_done). */
        const char *act = NULL;

        if (arm_layer >= 0 && l > 0 && arm_layer == (int)l - 1) {
            act       = arm_action;
            arm_layer = -1;
        } else if (sig_fault != 0) {
            act       = sig_fault == SIGUSR1 ? "abort" : "destroy";
            sig_fault = 0;
        }
        if (act != NULL && fault[0] == '\0') {
            t_fault = now_s();
            if (strcmp(act, "destroy") == 0) {
                emitf(true, "{\"ev\":\"fault\",\"action\":\"destroy\","
                      "\"tid\":\"%s\",\"layers_landed\":%u,\"t\":%.6f}",
                      tid, l, t_fault);
                do_destroy("fault");
                return;
            }
            fault = "abort";
            st    = api->consumer_abort(eng, rid, x->params);
            emitf(true, "{\"ev\":\"fault\",\"action\":\"abort\","
                  "\"tid\":\"%s\",\"layers_landed\":%u,\"status\":\"%s\","
                  "\"t\":%.6f}", tid, l, api->status_name(st), t_fault);
        }
        if (l == o.layers || fault[0] != '\0' || wst != KVX_OK) {
            break;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            wst = KVX_ERR_TIMEOUT;
            break;
        }
        /* Short slices: the fault flags are polled between them. */
        wst = api->wait_layer(eng, tid, l, left > 0.005 ? 5 : 1);
        if (wst == KVX_ERR_TIMEOUT) {
            wst = KVX_OK;
            continue;
        }
        if (wst == KVX_OK) {
            emitf(true, "{\"ev\":\"layer\",\"tid\":\"%s\",\"layer\":%u,"
                  "\"t\":%.6f}", tid, l, now_s());
            landed = ++l;
        }
    }
    int got = d_wait_event(x, &ev, deadline);
    cat(extra, sizeof(extra), "\"wait_status\":\"%s\",\"layers_landed\":%u,"
        "\"fault\":\"%s\"", api->status_name(wst), landed, fault);
    if (got == 0) {
        result(x, "no_report", NULL, -1, extra);
        /* The blocks stay owned: nobody told D they are free. */
        x->used = false;
        return;
    }
    if (ev.type == KVX_EVENT_FINISHED_RECVING && ev.status == KVX_OK) {
        cat(extra, sizeof(extra), ",");
        if (o.corrupt) { /* the check must see one flipped bit */
            unit_ptr(o.layers - 1, x->ids[x->n - 1], 1)[unit_len() / 2] ^= 1;
        }
        int64_t wrong = d_verify(x, extra, sizeof(extra));

        result(x, "ok", &ev, wrong, extra);
    } else {
        result(x, "failed", &ev, -1, extra);
    }
    api->free(ev.block_ids);
    d_release(x);
    x->used = false;
}

/* --- main loop -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: kvx_faultpeer --role p|d --mode read|write --hs PORT "
            "--notify PORT\n"
            "  --peer-hs PORT --peer-notify PORT [--tls tcp|sm] [--log FILE]\n"
            "  [--inst N] [--layers N] [--pool N] [--timeouts HS,XFER,DEFER]\n"
            "  [--layer-gap-us N] [--max-life S] [--lib PATH] [--corrupt]\n");
}

static int parse(int argc, char **argv)
{
    static const struct option lo[] = {
        {"role", 1, NULL, 'r'},      {"mode", 1, NULL, 'm'},
        {"tls", 1, NULL, 't'},       {"hs", 1, NULL, 'h'},
        {"notify", 1, NULL, 'n'},    {"peer-hs", 1, NULL, 'H'},
        {"peer-notify", 1, NULL, 'N'}, {"log", 1, NULL, 'L'},
        {"inst", 1, NULL, 'i'},      {"layers", 1, NULL, 'l'},
        {"pool", 1, NULL, 'p'},      {"timeouts", 1, NULL, 'T'},
        {"layer-gap-us", 1, NULL, 'g'}, {"max-life", 1, NULL, 'M'},
        {"lib", 1, NULL, 'x'},       {"corrupt", 0, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'r': o.role = optarg; break;
        case 'm': o.read_mode = strcmp(optarg, "read") == 0; break;
        case 't': o.tls = optarg; break;
        case 'h': o.hs = atoi(optarg); break;
        case 'n': o.notify = atoi(optarg); break;
        case 'H': o.peer_hs = atoi(optarg); break;
        case 'N': o.peer_notify = atoi(optarg); break;
        case 'L': o.log = optarg; break;
        case 'i': o.inst = atoi(optarg); break;
        case 'l': o.layers = (uint32_t)atoi(optarg); break;
        case 'p': o.pool = (uint32_t)atoi(optarg); break;
        case 'T':
            if (sscanf(optarg, "%d,%d,%d", &o.hs_to, &o.xfer_to,
                       &o.defer_to) != 3) {
                return -1;
            }
            break;
        case 'g': o.layer_gap_us = atoi(optarg); break;
        case 'M': o.max_life_s = atoi(optarg); break;
        case 'x': o.lib = optarg; break;
        case 'C': o.corrupt = 1; break;
        default: return -1;
        }
    }
    if (o.role == NULL || (strcmp(o.role, "p") && strcmp(o.role, "d")) ||
        o.hs <= 0 || o.notify <= 0 || o.peer_hs <= 0 || o.peer_notify <= 0 ||
        o.layers == 0 || o.layers > 64 || o.pool == 0 || o.pool > 4096 ||
        o.pool % 2 != 0 || (o.pool / 2) % 3 == 0 || (o.pool / 2) % 5 == 0) {
        return -1;
    }
    return 0;
}

static void command(char *line)
{
    char     cmd[16] = "", tid[KVX_ID_MAX] = "";
    uint64_t gen = 0;
    size_t   n   = 0;
    int      off = 0;

    if (sscanf(line, "%15s%n", cmd, &off) < 1) {
        return;
    }
    if (strcmp(cmd, "REQ") == 0 && eng != NULL) {
        if (sscanf(line + off, "%255s %" SCNu64 " %zu %n", tid, &gen, &n,
                   &off) < 3) {
            die("REQ: want tid gen n", KVX_ERR_INVALID_PARAM);
        }
        char *rest = line + strlen(cmd) + off;
        if (o.role[0] == 'p') {
            p_req(tid, gen, n);
        } else {
            d_req(tid, gen, n, rest);
        }
    } else if (strcmp(cmd, "ARM") == 0) {
        if (sscanf(line + off, "%15s %d", arm_action, &arm_layer) != 2) {
            die("ARM: want action layer", KVX_ERR_INVALID_PARAM);
        }
    } else if (strcmp(cmd, "STATS") == 0) {
        do_stats();
    } else if (strcmp(cmd, "CHECK") == 0) {
        if (o.role[0] == 'd') {
            d_check_free("check");
        }
        emitf(false, "{\"ev\":\"checked\",\"side\":\"%s\"}", o.role);
    } else if (strcmp(cmd, "DESTROY") == 0) {
        emitf(true, "{\"ev\":\"fault\",\"action\":\"destroy\",\"side\":\"%s\","
              "\"t\":%.6f}", o.role, now_s());
        do_destroy("command");
    } else if (strcmp(cmd, "QUIT") == 0) {
        do_destroy("quit");
        exit(0);
    } else if (eng == NULL && strcmp(cmd, "REQ") == 0) {
        emitf(false, "{\"ev\":\"error\",\"what\":\"REQ after destroy\"}");
    } else {
        die("unknown command", KVX_ERR_INVALID_PARAM);
    }
}

int main(int argc, char **argv)
{
    static char buf[LINE_MAX_];
    size_t      len = 0;

    t_born = now_s();
    if (parse(argc, argv) != 0) {
        usage();
        return 2;
    }
    signal(SIGUSR1, on_fault_signal);
    signal(SIGUSR2, on_fault_signal);
    alarm((unsigned)o.max_life_s); /* never outlive the driver's patience */
    if (o.log != NULL) {
        logf = fopen(o.log, "a");
    }
    load_api();
    engine_up();
    emitf(false, "{\"ev\":\"ready\",\"side\":\"%s\",\"inst\":%d,\"pid\":%d}",
          o.role, o.inst, (int)getpid());
    for (;;) {
        int timeout = 2;

        if (o.role[0] == 'p') {
            p_events();
            int next = p_schedule();
            if (next >= 0 && next < timeout) {
                timeout = next;
            }
        }
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        int           pr  = poll(&pfd, 1, timeout);

        if (pr < 0 && errno != EINTR) {
            die("poll", KVX_ERR_INTERNAL);
        }
        if (pr > 0) {
            ssize_t k = read(0, buf + len, sizeof(buf) - 1 - len);

            if (k <= 0 && !(k < 0 && errno == EINTR)) {
                do_destroy("eof");
                return 0;
            }
            if (k > 0) {
                len += (size_t)k;
            }
            buf[len] = '\0';
            char *nl;
            while ((nl = strchr(buf, '\n')) != NULL) {
                *nl = '\0';
                command(buf);
                len -= (size_t)(nl + 1 - buf);
                memmove(buf, nl + 1, len + 1);
            }
            if (len >= sizeof(buf) - 1) {
                die("command line too long", KVX_ERR_INVALID_PARAM);
            }
        }
    }
}
