/* kvp_util.c - clocks, statistics, RSS, patterns, messages, dlopen. */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

int kvp_verbose, kvp_quiet;
static _Thread_local char kvp_tag[16] = "perf";

double kvp_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void kvp_sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000u,
                          .tv_nsec = (long)(us % 1000000u) * 1000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void kvp_timer_slack_min(void)
{
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
}

int kvp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y ? 1 : 0;
}

double kvp_pctl(const double *v, size_t n, double p)
{
    double rank, frac;
    size_t idx;

    if (n == 0) {
        return 0.0;
    }
    if (p <= 0) {
        return v[0];
    }
    if (p >= 100) {
        return v[n - 1];
    }
    rank = p / 100.0 * (double)(n - 1);
    idx  = (size_t)rank;
    frac = rank - (double)idx;
    return idx + 1 < n ? v[idx] * (1.0 - frac) + v[idx + 1] * frac : v[idx];
}

double kvp_mean(const double *v, size_t n)
{
    double s = 0;

    for (size_t i = 0; i < n; i++) {
        s += v[i];
    }
    return n ? s / (double)n : 0.0;
}

void kvp_rss_kb(int64_t *rss, int64_t *hwm)
{
    FILE *f = fopen("/proc/self/status", "r");
    char  line[256];

    *rss = *hwm = -1;
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        long long v;

        if (sscanf(line, "VmRSS: %lld", &v) == 1) {
            *rss = v;
        } else if (sscanf(line, "VmHWM: %lld", &v) == 1) {
            *hwm = v;
        }
    }
    fclose(f);
}

void kvp_boot_id(char *buf, size_t len)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    snprintf(buf, len, "unknown");
    if (f != NULL) {
        if (fgets(buf, (int)len, f) == NULL) {
            snprintf(buf, len, "unknown");
        }
        buf[strcspn(buf, "\n")] = '\0';
        fclose(f);
    }
}

uint64_t kvp_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void kvp_pattern_fill(uint8_t *p, uint64_t len, uint32_t rank, uint32_t layer,
                      uint64_t block, uint32_t unit)
{
    uint64_t seed = kvp_mix64(0x6b7670657266ull ^ rank);
    uint64_t j;

    seed = kvp_mix64(seed ^ layer);
    seed = kvp_mix64(seed ^ block);
    seed = kvp_mix64(seed ^ unit);
    for (j = 0; j + 8 <= len; j += 8) {
        uint64_t w = kvp_mix64(seed + j / 8);

        memcpy(p + j, &w, 8);
    }
    if (j < len) {
        uint64_t w = kvp_mix64(seed + j / 8);

        memcpy(p + j, &w, len - j);
    }
}

void kvp_touch(void *p, size_t len)
{
    volatile char *c = p;

    for (size_t i = 0; p != NULL && i < len; i += 4096) {
        c[i] = 0;
    }
}

int kvp_parse_size(const char *s, uint64_t *v)
{
    char              *end;
    unsigned long long x;
    uint64_t           mul = 1;

    errno = 0;
    if (s == NULL || !isdigit((unsigned char)*s)) {
        return -1;
    }
    x = strtoull(s, &end, 10);
    if (errno != 0) {
        return -1;
    }
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default:
        return -1;
    }
    if (mul > 1 && (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0)) {
        end += strlen(end);
    }
    if (*end != '\0' || (x != 0 && mul > UINT64_MAX / x)) {
        return -1;
    }
    *v = (uint64_t)x * mul;
    return 0;
}

void kvp_fmt_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1ull << 30) && v % (1ull << 30) == 0) {
        snprintf(buf, len, "%" PRIu64 "G", v >> 30);
    } else if (v >= (1ull << 20) && v % (1ull << 20) == 0) {
        snprintf(buf, len, "%" PRIu64 "M", v >> 20);
    } else if (v >= (1ull << 10) && v % (1ull << 10) == 0) {
        snprintf(buf, len, "%" PRIu64 "K", v >> 10);
    } else {
        snprintf(buf, len, "%" PRIu64, v);
    }
}

void kvp_set_tag(const char *tag)
{
    snprintf(kvp_tag, sizeof(kvp_tag), "%s", tag);
}

void kvp_err(const char *fmt, ...)
{
    char    msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvxfer_perf[%s] error: %s\n", kvp_tag, msg);
    fflush(stderr);
}

void kvp_info(const char *fmt, ...)
{
    char    msg[2048];
    va_list ap;

    if (!kvp_verbose) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvxfer_perf[%s] %s\n", kvp_tag, msg);
    fflush(stderr);
}

const kvx_api_t *kvp_load_api(const char *path, char *err, size_t errlen)
{
    void            *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    kvx_get_api_fn_t get;
    const kvx_api_t *api;

    if (so == NULL) {
        snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
        return NULL;
    }
    *(void **)(&get) = dlsym(so, KVX_ENTRY_POINT_NAME);
    if (get == NULL) {
        snprintf(err, errlen, "%s: no symbol %s", path, KVX_ENTRY_POINT_NAME);
        dlclose(so);
        return NULL;
    }
    api = get(KVX_ABI_MAJOR);
    if (api == NULL || api->struct_size < sizeof(kvx_api_t)) {
        snprintf(err, errlen, "%s: ABI %d.%d not offered", path,
                 KVX_ABI_MAJOR, KVX_ABI_MINOR);
        dlclose(so);
        return NULL;
    }
    /* Kept loaded for the life of the process (engines' threads). */
    return api;
}

/* --- logger ------------------------------------------------------------- */

static _Atomic uint64_t kvp_hs_stamp_ns;

static void kvp_log_cb(void *arg, int level, const char *id, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug"};

    (void)arg;
    if (strcmp(id, "KVX-HANDSHAKE-OK") == 0) {
        atomic_store(&kvp_hs_stamp_ns, (uint64_t)(kvp_now_us() * 1000.0));
    }
    if ((level <= 1 && !kvp_quiet) || kvp_verbose) {
        fprintf(stderr, "kvxfer %s [%s] %s\n",
                names[level < 0 ? 0 : (level > 3 ? 3 : level)], id, msg);
    }
}

void kvp_logger_install(const kvx_api_t *api)
{
    api->set_logger(kvp_log_cb, NULL, kvp_verbose > 1 ? 3 : 2);
}

double kvp_logger_last_handshake_us(void)
{
    return (double)atomic_load(&kvp_hs_stamp_ns) / 1000.0;
}
