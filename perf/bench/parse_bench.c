/*
 * parse_bench.c - the per-transfer JSON work, the flat reader against
 * json-c in the same run (perf/README.md, "Parsing without json-c").
 *
 * For each message a transfer carries (kv_transfer_params as D and P get
 * them, a WRITE D's remote_blocks as P decodes it) and for lists of 32 ..
 * 4,096 block ids: microseconds per call through kvc_params_parse /
 * kvc_msg_decode (flat reader first) and through their _json_c forms (the
 * path every call took before), min / median / max over REPS repetitions
 * of a timed loop, and the ratio of the medians. Also kvc_msg_encode.
 *
 *   kvxfer_parse_bench [REPS (default 7)]
 *
 * Pin it to a CPU and run it in a quiet window (taskset -c 1, uptime).
 */
#include "addr.h"
#include "ctlmsg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PB_MAX_REPS 31

static double pb_now_us(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int pb_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

typedef int (*pb_fn_t)(const char *text, size_t len, int variant);

static int pb_params(const char *text, size_t len, int json_c)
{
    kvc_xfer_params_t p;
    kvx_status_t      st = json_c ? kvc_params_parse_json_c(text, &p)
                                  : kvc_params_parse(text, &p);

    (void)len;
    kvc_params_fini(&p);
    return st == KVX_OK ? 0 : -1;
}

static int pb_msg(const char *text, size_t len, int json_c)
{
    kvc_msg_t    m;
    kvx_status_t st = json_c ? kvc_msg_decode_json_c(text, len, 1, &m)
                             : kvc_msg_decode(text, len, 1, &m);

    kvc_msg_fini(&m);
    return st == KVX_OK ? 0 : -1;
}

/* pb_time: median us per call of fn(text, variant) over reps loops of
 * iters calls; min and max through *min_p, *max_p. -1 if a call fails. */
static double pb_time(pb_fn_t fn, const char *text, int variant, int reps,
                      int iters, double *min_p, double *max_p)
{
    double t[PB_MAX_REPS];
    size_t len = strlen(text);

    for (int r = 0; r < reps; r++) {
        double t0 = pb_now_us();

        for (int i = 0; i < iters; i++) {
            if (fn(text, len, variant) != 0) {
                fprintf(stderr, "parse_bench: '%.80s': %s\n", text,
                        kvc_last_error());
                return -1;
            }
        }
        t[r] = (pb_now_us() - t0) / iters;
    }
    qsort(t, (size_t)reps, sizeof(t[0]), pb_cmp);
    *min_p = t[0];
    *max_p = t[reps - 1];
    return t[reps / 2];
}

static int pb_row(const char *name, pb_fn_t fn, const char *text, int reps,
                  int iters)
{
    double fmin, fmax, jmin, jmax;
    double flat = pb_time(fn, text, 0, reps, iters, &fmin, &fmax);
    double jc   = pb_time(fn, text, 1, reps, iters, &jmin, &jmax);

    if (flat < 0 || jc < 0) {
        return -1;
    }
    printf("%-34s %7zu  %8.3f / %8.3f / %8.3f  %8.3f / %8.3f / %8.3f  %6.1fx\n",
           name, strlen(text), fmin, flat, fmax, jmin, jc, jmax, jc / flat);
    return 0;
}

/* pb_ids: "[a,b,...]" of n block ids, scattered like a paged cache's. */
static char *pb_ids(size_t n)
{
    char  *s = malloc(n * 12 + 3);
    size_t len = 0;

    if (s == NULL) {
        return NULL;
    }
    s[len++] = '[';
    for (size_t i = 0; i < n; i++) {
        len += (size_t)sprintf(s + len, "%s%" PRIu64, i ? "," : "",
                               (uint64_t)(i * 7919 % 1000003));
    }
    s[len++] = ']';
    s[len]   = '\0';
    return s;
}

static double pb_encode(size_t nblocks, int reps, int iters)
{
    kvc_msg_t m;
    double    t[PB_MAX_REPS];
    uint64_t *ids = calloc(nblocks, sizeof(*ids));

    if (ids == NULL) {
        return -1;
    }
    memset(&m, 0, sizeof(m));
    m.type          = KVC_MSG_REMOTE_BLOCKS;
    m.block_ids     = ids;
    m.num_block_ids = nblocks;
    m.instance      = 1234567890123ULL;
    m.to_instance   = 987654321ULL;
    m.xfer_nonce    = 244837814094590ULL;
    m.consumer_rank = -1;
    m.done_by_notice = 1;
    snprintf(m.transfer_id, sizeof(m.transfer_id), "kvp-1a2b3c4d-0-17");
    snprintf(m.req_id, sizeof(m.req_id), "req-kvp-1a2b3c4d-0-17");
    for (size_t i = 0; i < nblocks; i++) {
        ids[i] = i * 7919 % 1000003;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = pb_now_us();

        for (int i = 0; i < iters; i++) {
            free(kvc_msg_encode(&m, NULL));
        }
        t[r] = (pb_now_us() - t0) / iters;
    }
    free(ids);
    qsort(t, (size_t)reps, sizeof(t[0]), pb_cmp);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    int         reps = argc > 1 ? atoi(argv[1]) : 7;
    const char *head =
        "{\"transfer_id\":\"kvp-1a2b3c4d-0-17\",\"do_remote_prefill\":true,"
        "\"remote_host\":\"127.0.0.1\",\"remote_handshake_port\":40123,"
        "\"remote_notify_port\":40124,\"remote_tp_size\":1,"
        "\"remote_engine_id\":\"kvp-prefill\",\"remote_block_ids\":";
    const char *msg_head =
        "{\"type\":\"remote_blocks\",\"transfer_id\":\"kvp-1a2b3c4d-0-17\","
        "\"instance\":\"1234567890123\",\"to_instance\":\"987654321\","
        "\"xfer_nonce\":\"244837814094590\",\"req_id\":"
        "\"req-kvp-1a2b3c4d-0-17\",\"done_by_notice\":1,\"decode_rank\":0,"
        "\"block_notify_list\":";
    const size_t counts[] = {1, 32, 1024, 4096};
    char         name[64], *ids, *text;
    int          rc = 0;

    if (reps < 1 || reps > PB_MAX_REPS) {
        fprintf(stderr, "usage: %s [REPS 1..%d]\n", argv[0], PB_MAX_REPS);
        return 2;
    }
    printf("%-34s %7s  %-30s  %-30s  %7s\n", "message", "bytes",
           "flat us (min / median / max)", "json-c us (min / median / max)",
           "json-c/flat");
    rc |= pb_row("P's READ params", pb_params,
                 "{\"transfer_id\":\"kvp-1a2b3c4d-0-17\","
                 "\"do_remote_decode\":true}",
                 reps, 100000);
    rc |= pb_row("P's WRITE params", pb_params,
                 "{\"transfer_id\":\"kvp-1a2b3c4d-0-17\",\"do_remote_decode\":"
                 "true,\"remote_host\":\"127.0.0.1\",\"remote_handshake_"
                 "port\":40123,\"remote_notify_port\":40124,"
                 "\"remote_tp_size\":1}",
                 reps, 100000);
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        int iters = counts[k] > 100 ? 1000 : 50000;

        ids  = pb_ids(counts[k]);
        text = ids != NULL ? malloc(strlen(msg_head) + strlen(ids) + 2)
                           : NULL;
        if (text == NULL) {
            free(ids);
            return 1;
        }
        sprintf(text, "%s%s}", head, ids);
        snprintf(name, sizeof(name), "D's params, %zu block id%s", counts[k],
                 counts[k] > 1 ? "s" : "");
        rc |= pb_row(name, pb_params, text, reps, iters);
        sprintf(text, "%s%s}", msg_head, ids);
        snprintf(name, sizeof(name), "remote_blocks, %zu block id%s",
                 counts[k], counts[k] > 1 ? "s" : "");
        rc |= pb_row(name, pb_msg, text, reps, iters);
        printf("%-34s %7s  %8s   %8.3f\n", "  its encoding (kvc_msg_encode)", "",
               "", pb_encode(counts[k], reps, iters));
        free(text);
        free(ids);
    }
    return rc != 0;
}
