/*
 * config.c - the engine configuration (SPEC §1): JSON text -> kvc_config_t.
 *
 * Everything is driven by kvc_cfg_fields[]: one row per key with its
 * default (as JSON text, parsed by the same typed parser as user input), the
 * parser/dumper pair, the struct offset and a doc sentence. The same table
 * yields the "unknown key" warnings and kvc_config_dump().
 */
#include "config.h"
#include "pci.h"
#include "tlsname.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <json-c/json.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KVC_CFG_EXTRA_KEY   "kv_connector_extra_config"
#define KVC_CFG_PATH_MAX    128
#define KVC_CFG_VALUE_SHOW  160 /* longest value text quoted in errors */
#define KVC_CFG_PORT_MAX    65535
#define KVC_CFG_SECONDS_MAX 3600.0

/* Field flags. */
#define KVC_CF_EXTRA  0x1u /* key lives in kv_connector_extra_config */
#define KVC_CF_MINUS1 0x2u /* int_range: -1 is accepted besides lo..hi */

_Static_assert(sizeof(kvc_err_mode_t) == sizeof(int),
               "ucx_error_mode is stored through an int");
_Static_assert(sizeof(int32_t) == sizeof(int),
               "post_batch_size is stored through an int");

typedef struct kvc_config_field kvc_config_field_t;

/* A parser stores val (a present key; NULL is JSON null) into cfg. */
typedef kvx_status_t (*kvc_cfg_parse_fn)(const kvc_config_field_t *f,
                                         const char *path, json_object *val,
                                         kvc_config_t *cfg);
/* A dumper returns the effective value as a new json_object. */
typedef json_object *(*kvc_cfg_dump_fn)(const kvc_config_field_t *f,
                                        const kvc_config_t *cfg);
/* A default function computes a default that is not constant. */
typedef kvx_status_t (*kvc_cfg_auto_fn)(kvc_config_t *cfg);

typedef struct kvc_cfg_type {
    kvc_cfg_parse_fn parse;
    kvc_cfg_dump_fn  dump;
} kvc_cfg_type_t;

struct kvc_config_field {
    const char           *key;
    const char           *alias;    /* accepted synonym, or NULL */
    const char           *dfl_json; /* NULL: computed (dfl_fn) or required */
    kvc_cfg_auto_fn       dfl_fn;
    const kvc_cfg_type_t *type;
    size_t                off;      /* offset of the value in kvc_config_t */
    size_t                off_n;    /* lists: offset of the count */
    size_t                size;     /* strings: buffer size */
    int64_t               lo, hi;   /* numbers: range; strings, lists: the
                                       minimum length / entry count (0, 1) */
    const char *const    *choices;  /* enums: NULL-terminated */
    unsigned              flags;
    const char           *doc;
};

typedef struct kvc_cfg_list {
    char **v; /* owned */
    size_t n;
} kvc_cfg_list_t;

#define KVC_CFG_AT(cfg, f, type) ((type *)((char *)(cfg) + (f)->off))
#define KVC_CFG_AT_C(cfg, f, type)                                             \
    ((const type *)((const char *)(cfg) + (f)->off))

/* ---- small helpers ----------------------------------------------------- */

/* kvc_cfg_fail reports "path: value <json>: <rule>" as KVX_ERR_CONFIG. */
static kvx_status_t KVC_PRINTF(3, 4)
kvc_cfg_fail(const char *path, json_object *val, const char *fmt, ...)
{
    char        rule[512];
    const char *text;
    va_list     ap;

    va_start(ap, fmt);
    vsnprintf(rule, sizeof(rule), fmt, ap);
    va_end(ap);
    text = json_object_to_json_string_ext(
        val, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (text == NULL) {
        text = "?";
    }
    if (strlen(text) > KVC_CFG_VALUE_SHOW) {
        return kvc_error(KVX_ERR_CONFIG, "%s: value %.*s...: %s", path,
                         KVC_CFG_VALUE_SHOW, text, rule);
    }
    return kvc_error(KVX_ERR_CONFIG, "%s: value %s: %s", path, text, rule);
}

/* kvc_cfg_trim returns s without leading/trailing white space in *len. */
static const char *kvc_cfg_trim(const char *s, size_t *len)
{
    size_t n = *len;

    while (n > 0 && isspace((unsigned char)s[0])) {
        s++;
        n--;
    }
    while (n > 0 && isspace((unsigned char)s[n - 1])) {
        n--;
    }
    *len = n;
    return s;
}

/* kvc_cfg_trimmed copies the trimmed string val into buf (size bytes);
 * -1 if val is not a string, -2 if it does not fit. */
static int kvc_cfg_trimmed(json_object *val, char *buf, size_t size)
{
    const char *s;
    size_t      n;

    if (!json_object_is_type(val, json_type_string)) {
        return -1;
    }
    n = (size_t)json_object_get_string_len(val);
    s = kvc_cfg_trim(json_object_get_string(val), &n);
    if (n >= size) {
        return -2;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

static void kvc_cfg_list_free(kvc_cfg_list_t *list)
{
    for (size_t i = 0; i < list->n; i++) {
        free(list->v[i]);
    }
    free(list->v);
    list->v = NULL;
    list->n = 0;
}

/* ---- integers ------------------------------------------------------------ */

/* kvc_cfg_get_int reads a JSON integer or a string holding a decimal
 * integer. Returns 0, -1 (wrong type) or -2 (outside int64). */
static int kvc_cfg_get_int(json_object *val, int64_t *out)
{
    char buf[64], *end;
    int  rc;

    if (json_object_is_type(val, json_type_int)) {
        *out = json_object_get_int64(val);
        if (*out == INT64_MAX && json_object_get_uint64(val) > INT64_MAX) {
            return -2;
        }
        return 0;
    }
    rc = kvc_cfg_trimmed(val, buf, sizeof(buf));
    if (rc == -2) {
        return -2;
    }
    if (rc != 0 || buf[0] == '\0') {
        return -1;
    }
    errno = 0;
    *out  = strtoll(buf, &end, 10);
    if (*end != '\0') {
        return -1;
    }
    return errno == ERANGE ? -2 : 0;
}

/* kvc_cfg_int_in reads an integer and checks f's range. */
static kvx_status_t kvc_cfg_int_in(const kvc_config_field_t *f,
                                   const char *path, json_object *val,
                                   int64_t *out)
{
    int rc = kvc_cfg_get_int(val, out);

    if (rc == -1) {
        return kvc_cfg_fail(path, val,
                            "expected an integer (or a string holding one)");
    }
    if (rc == 0 && *out >= f->lo && *out <= f->hi) {
        return KVX_OK;
    }
    if (rc == 0 && (f->flags & KVC_CF_MINUS1) && *out == -1) {
        return KVX_OK;
    }
    if (f->flags & KVC_CF_MINUS1) {
        return kvc_cfg_fail(path, val, "must be -1 or an integer in %lld..%lld",
                            (long long)f->lo, (long long)f->hi);
    }
    return kvc_cfg_fail(path, val, "must be an integer in %lld..%lld",
                        (long long)f->lo, (long long)f->hi);
}

static kvx_status_t kvc_cfg_parse_uint(const kvc_config_field_t *f,
                                       const char *path, json_object *val,
                                       kvc_config_t *cfg)
{
    int64_t      v;
    kvx_status_t st = kvc_cfg_int_in(f, path, val, &v);

    if (st == KVX_OK) {
        *KVC_CFG_AT(cfg, f, uint32_t) = (uint32_t)v;
    }
    return st;
}

static json_object *kvc_cfg_dump_uint(const kvc_config_field_t *f,
                                      const kvc_config_t *cfg)
{
    return json_object_new_int64(*KVC_CFG_AT_C(cfg, f, uint32_t));
}

static kvx_status_t kvc_cfg_parse_int(const kvc_config_field_t *f,
                                      const char *path, json_object *val,
                                      kvc_config_t *cfg)
{
    int64_t      v;
    kvx_status_t st = kvc_cfg_int_in(f, path, val, &v);

    if (st == KVX_OK) {
        *KVC_CFG_AT(cfg, f, int) = (int)v;
    }
    return st;
}

static json_object *kvc_cfg_dump_int(const kvc_config_field_t *f,
                                     const kvc_config_t *cfg)
{
    return json_object_new_int64(*KVC_CFG_AT_C(cfg, f, int));
}

static kvx_status_t kvc_cfg_parse_u64(const kvc_config_field_t *f,
                                      const char *path, json_object *val,
                                      kvc_config_t *cfg)
{
    int64_t      v;
    kvx_status_t st = kvc_cfg_int_in(f, path, val, &v);

    if (st == KVX_OK) {
        *KVC_CFG_AT(cfg, f, uint64_t) = (uint64_t)v;
    }
    return st;
}

static json_object *kvc_cfg_dump_u64(const kvc_config_field_t *f,
                                     const kvc_config_t *cfg)
{
    return json_object_new_int64((int64_t)*KVC_CFG_AT_C(cfg, f, uint64_t));
}

/* kvc_cfg_parse_port: a base port; SPEC §2 gives rank r the port base + r,
 * so the highest global rank's port must stay a valid port too. */
static kvx_status_t kvc_cfg_parse_port(const kvc_config_field_t *f,
                                       const char *path, json_object *val,
                                       kvc_config_t *cfg)
{
    int64_t      v;
    uint64_t     last;
    kvx_status_t st = kvc_cfg_int_in(f, path, val, &v);

    if (st != KVX_OK) {
        return st;
    }
    last = (uint64_t)v + kvc_config_world(cfg) - 1;
    if (last > KVC_CFG_PORT_MAX) {
        return kvc_cfg_fail(path, val,
                            "rank ports %lld..%llu (base + dp_size*tp_size - "
                            "1, dp_size %u, tp_size %u) would exceed 65535",
                            (long long)v, (unsigned long long)last,
                            cfg->dp_size, cfg->tp_size);
    }
    *KVC_CFG_AT(cfg, f, uint32_t) = (uint32_t)v;
    return KVX_OK;
}

/* ---- booleans, seconds --------------------------------------------------- */

/* kvc_cfg_parse_bool accepts true/false, 1/0 and the strings "true",
 * "false", "1", "0" (trimmed, any case), as MoRIIO's read_mode does. */
static kvx_status_t kvc_cfg_parse_bool(const kvc_config_field_t *f,
                                       const char *path, json_object *val,
                                       kvc_config_t *cfg)
{
    char buf[8];
    int  b = -1;

    if (json_object_is_type(val, json_type_boolean)) {
        b = json_object_get_boolean(val) ? 1 : 0;
    } else if (json_object_is_type(val, json_type_int)) {
        int64_t i = json_object_get_int64(val);
        b         = (i == 0 || i == 1) ? (int)i : -1;
    } else if (kvc_cfg_trimmed(val, buf, sizeof(buf)) == 0) {
        if (strcasecmp(buf, "true") == 0 || strcmp(buf, "1") == 0) {
            b = 1;
        } else if (strcasecmp(buf, "false") == 0 || strcmp(buf, "0") == 0) {
            b = 0;
        }
    }
    if (b < 0) {
        return kvc_cfg_fail(path, val,
                            "expected a boolean: true, false, \"true\", "
                            "\"false\", \"1\", \"0\", 1 or 0");
    }
    *KVC_CFG_AT(cfg, f, int) = b;
    return KVX_OK;
}

static json_object *kvc_cfg_dump_bool(const kvc_config_field_t *f,
                                      const kvc_config_t *cfg)
{
    return json_object_new_boolean(*KVC_CFG_AT_C(cfg, f, int) != 0);
}

/* kvc_cfg_parse_bool_auto: a boolean as kvc_cfg_parse_bool takes it, or
 * "auto" (trimmed, any case), stored as KVC_PROGRESS_CALLER_AUTO. */
static kvx_status_t kvc_cfg_parse_bool_auto(const kvc_config_field_t *f,
                                            const char *path,
                                            json_object *val,
                                            kvc_config_t *cfg)
{
    char buf[8];

    if (json_object_is_type(val, json_type_string) &&
        kvc_cfg_trimmed(val, buf, sizeof(buf)) == 0 &&
        strcasecmp(buf, "auto") == 0) {
        *KVC_CFG_AT(cfg, f, int) = KVC_PROGRESS_CALLER_AUTO;
        return KVX_OK;
    }
    if (kvc_cfg_parse_bool(f, path, val, cfg) != KVX_OK) {
        return kvc_cfg_fail(path, val,
                            "expected \"auto\" or a boolean: true, false, "
                            "\"true\", \"false\", \"1\", \"0\", 1 or 0");
    }
    return KVX_OK;
}

static json_object *kvc_cfg_dump_bool_auto(const kvc_config_field_t *f,
                                           const kvc_config_t *cfg)
{
    int v = *KVC_CFG_AT_C(cfg, f, int);

    return v == KVC_PROGRESS_CALLER_AUTO ? json_object_new_string("auto")
                                         : json_object_new_boolean(v != 0);
}

int kvc_tls_local_only(const char *tls)
{
    static const char *const local[] = {
        "sm",        "shm",      "mm",        "sysv",     "posix",
        "cma",       "knem",     "xpmem",     "self",     "rocm",
        "rocm_copy", "rocm_ipc", "rocm_gdr",  "cuda",     "cuda_copy",
        "cuda_ipc",  "gdr_copy", NULL};
    const char *p = tls;

    if (tls == NULL) {
        return 0;
    }
    for (;;) { /* each entry, the empty one after a trailing comma too */
        const char *end = strchr(p, ',');
        size_t      len = end != NULL ? (size_t)(end - p) : strlen(p);
        int         ok  = 0;

        for (size_t i = 0; local[i] != NULL; i++) {
            ok = ok || kvc_tl_is(p, len, local[i]);
        }
        if (!ok) {
            return 0; /* a network transport, "all", "^...", or empty */
        }
        if (end == NULL) {
            return 1;
        }
        p = end + 1;
    }
}

int kvc_progress_caller_on(const kvc_config_t *cfg, const char *env_tls)
{
    if (cfg->progress_caller != KVC_PROGRESS_CALLER_AUTO) {
        return cfg->progress_caller != 0;
    }
    /* The list in force, as the data plane takes it: ucx_tls, else the
     * UCX_TLS the process was started with. */
    return kvc_tls_local_only(cfg->ucx_tls[0] != '\0' ? cfg->ucx_tls
                              : env_tls != NULL        ? env_tls
                                                       : "");
}

/* kvc_cfg_get_number reads a JSON number or a string holding one; 0 or -1
 * (wrong type). */
static int kvc_cfg_get_number(json_object *val, double *out)
{
    char buf[64], *end;

    if (json_object_is_type(val, json_type_int) ||
        json_object_is_type(val, json_type_double)) {
        *out = json_object_get_double(val);
        return 0;
    }
    if (kvc_cfg_trimmed(val, buf, sizeof(buf)) != 0 || buf[0] == '\0') {
        return -1;
    }
    *out = strtod(buf, &end);
    return *end == '\0' ? 0 : -1;
}

static kvx_status_t kvc_cfg_parse_seconds(const kvc_config_field_t *f,
                                          const char *path, json_object *val,
                                          kvc_config_t *cfg)
{
    double s;

    if (kvc_cfg_get_number(val, &s) != 0) {
        return kvc_cfg_fail(path, val, "expected a number of seconds (or a "
                                       "string holding one)");
    }
    if (!isfinite(s) || s <= 0.0 || s > KVC_CFG_SECONDS_MAX) {
        return kvc_cfg_fail(path, val, "must be a number of seconds > 0 and "
                                       "<= 3600");
    }
    *KVC_CFG_AT(cfg, f, double) = s;
    return KVX_OK;
}

static json_object *kvc_cfg_dump_seconds(const kvc_config_field_t *f,
                                         const kvc_config_t *cfg)
{
    return json_object_new_double(*KVC_CFG_AT_C(cfg, f, double));
}

/* ---- strings, hosts, enums ----------------------------------------------- */

/* kvc_cfg_parse_str stores a trimmed string of f->lo..f->size-1 bytes. */
static kvx_status_t kvc_cfg_parse_str(const kvc_config_field_t *f,
                                      const char *path, json_object *val,
                                      kvc_config_t *cfg)
{
    char *buf = KVC_CFG_AT(cfg, f, char);
    int   rc  = kvc_cfg_trimmed(val, buf, f->size);

    if (rc == -1) {
        return kvc_cfg_fail(path, val, "expected a string");
    }
    if (rc == -2) {
        return kvc_cfg_fail(path, val, "must be shorter than %zu characters",
                            f->size);
    }
    if ((int64_t)strlen(buf) < f->lo) {
        return kvc_cfg_fail(path, val, "must not be empty");
    }
    return KVX_OK;
}

static json_object *kvc_cfg_dump_str(const kvc_config_field_t *f,
                                     const kvc_config_t *cfg)
{
    return json_object_new_string(KVC_CFG_AT_C(cfg, f, char));
}

/* kvc_cfg_enum_find returns the index of s in f->choices (any case) or -1. */
static int kvc_cfg_enum_find(const kvc_config_field_t *f, const char *s)
{
    for (int i = 0; f->choices[i] != NULL; i++) {
        if (strcasecmp(s, f->choices[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* kvc_cfg_choices writes every accepted choice of f into list. */
static void kvc_cfg_choices(const kvc_config_field_t *f, char *list,
                            size_t size)
{
    size_t used = 0;

    snprintf(list, size, "%s", f->choices == NULL ? "a value" : "");
    for (int i = 0; f->choices != NULL && f->choices[i] != NULL && used < size;
         i++) {
        used += (size_t)snprintf(list + used, size - used, "%s\"%s\"",
                                 i == 0 ? "" : " or ", f->choices[i]);
    }
}

/* kvc_cfg_enum_fail names the value and every accepted choice. */
static kvx_status_t kvc_cfg_enum_fail(const kvc_config_field_t *f,
                                      const char *path, json_object *val,
                                      const char *what)
{
    char list[256];

    kvc_cfg_choices(f, list, sizeof(list));
    return kvc_cfg_fail(path, val, "%s %s", what, list);
}

/* kvc_cfg_parse_enum stores the choice's index as an int, or, when
 * f->size > 0, the canonical choice text. */
static kvx_status_t kvc_cfg_parse_enum(const kvc_config_field_t *f,
                                       const char *path, json_object *val,
                                       kvc_config_t *cfg)
{
    char buf[64];
    int  idx;

    if (!json_object_is_type(val, json_type_string)) {
        return kvc_cfg_enum_fail(f, path, val, "expected a string,");
    }
    idx = kvc_cfg_trimmed(val, buf, sizeof(buf)) == 0
              ? kvc_cfg_enum_find(f, buf)
              : -1;
    if (idx < 0) {
        return kvc_cfg_enum_fail(f, path, val, "must be");
    }
    if (f->size > 0) {
        snprintf(KVC_CFG_AT(cfg, f, char), f->size, "%s", f->choices[idx]);
    } else {
        *KVC_CFG_AT(cfg, f, int) = idx;
    }
    return KVX_OK;
}

static json_object *kvc_cfg_dump_enum(const kvc_config_field_t *f,
                                      const kvc_config_t *cfg)
{
    int idx;

    if (f->size > 0) {
        return json_object_new_string(KVC_CFG_AT_C(cfg, f, char));
    }
    idx = *KVC_CFG_AT_C(cfg, f, int);
    return json_object_new_string(f->choices[idx]);
}

/* kvc_cfg_parse_busid: a trimmed string, empty or a PCI bus id. */
static kvx_status_t kvc_cfg_parse_busid(const kvc_config_field_t *f,
                                        const char *path, json_object *val,
                                        kvc_config_t *cfg)
{
    kvx_status_t st  = kvc_cfg_parse_str(f, path, val, cfg);
    char        *buf = KVC_CFG_AT(cfg, f, char);

    if (st != KVX_OK) {
        return st;
    }
    if (buf[0] != '\0' &&
        kvc_busid_parse(buf, NULL, NULL, NULL, NULL) != 0) {
        buf[0] = '\0';
        return kvc_cfg_fail(path, val, "must be empty or a PCI bus id "
                                       "\"dddd:bb:dd.f\" or \"bb:dd.f\" "
                                       "(hex; device <= 1f, function <= 7)");
    }
    return KVX_OK;
}

/* kvc_cfg_parse_port_range: a trimmed string, empty or "lo-hi" with
 * 1024 <= lo <= hi <= 65535 (UCX's TCP_PORT_RANGE syntax). */
static kvx_status_t kvc_cfg_parse_port_range(const kvc_config_field_t *f,
                                             const char *path,
                                             json_object *val,
                                             kvc_config_t *cfg)
{
    kvx_status_t st  = kvc_cfg_parse_str(f, path, val, cfg);
    char        *buf = KVC_CFG_AT(cfg, f, char);
    unsigned     lo, hi;
    int          used = 0;

    if (st != KVX_OK || buf[0] == '\0') {
        return st;
    }
    if (sscanf(buf, "%5u-%5u%n", &lo, &hi, &used) != 2 ||
        buf[used] != '\0' || lo < 1024 || lo > hi || hi > 65535) {
        buf[0] = '\0';
        return kvc_cfg_fail(path, val, "must be empty (ports chosen by the "
                                       "OS) or \"lo-hi\" with 1024 <= lo <= "
                                       "hi <= 65535");
    }
    return KVX_OK;
}

/* ---- host lists ---------------------------------------------------------- */

/* kvc_cfg_list_add appends the trimmed s[0..n) unless it is empty; 1 if the
 * entry is too long, -1 on no memory. */
static int kvc_cfg_list_add(kvc_cfg_list_t *list, const char *s, size_t n)
{
    s = kvc_cfg_trim(s, &n);
    if (n == 0) {
        return 0;
    }
    if (n >= KVC_HOST_MAX) {
        return 1;
    }
    list->v[list->n] = strndup(s, n);
    if (list->v[list->n] == NULL) {
        return -1;
    }
    list->n++;
    return 0;
}

/* kvc_cfg_list_split splits a comma-separated string into list. */
static int kvc_cfg_list_split(json_object *val, kvc_cfg_list_t *list)
{
    const char *s = json_object_get_string(val);
    size_t      slots = 1;
    int         rc    = 0;

    for (const char *p = s; *p != '\0'; p++) {
        slots += *p == ',';
    }
    list->v = calloc(slots, sizeof(char *));
    if (list->v == NULL) {
        return -1;
    }
    while (rc == 0) {
        const char *comma = strchr(s, ',');
        size_t      n     = comma != NULL ? (size_t)(comma - s) : strlen(s);

        rc = kvc_cfg_list_add(list, s, n);
        if (comma == NULL) {
            break;
        }
        s = comma + 1;
    }
    return rc;
}

/* kvc_cfg_list_array reads a JSON array of strings into list; 2 if an entry
 * is not a string. */
static int kvc_cfg_list_array(json_object *val, kvc_cfg_list_t *list)
{
    size_t len = json_object_array_length(val);
    int    rc  = 0;

    list->v = calloc(len + 1, sizeof(char *));
    if (list->v == NULL) {
        return -1;
    }
    for (size_t i = 0; i < len && rc == 0; i++) {
        json_object *e = json_object_array_get_idx(val, i);

        if (!json_object_is_type(e, json_type_string)) {
            return 2;
        }
        rc = kvc_cfg_list_add(list, json_object_get_string(e),
                              (size_t)json_object_get_string_len(e));
    }
    return rc;
}

/* kvc_cfg_list_read reads a list or comma string into list (owned by the
 * caller on KVX_OK, empty on error). */
static kvx_status_t kvc_cfg_list_read(const kvc_config_field_t *f,
                                      const char *path, json_object *val,
                                      kvc_cfg_list_t *list)
{
    int rc = 2;

    if (json_object_is_type(val, json_type_array)) {
        rc = kvc_cfg_list_array(val, list);
    } else if (json_object_is_type(val, json_type_string)) {
        rc = kvc_cfg_list_split(val, list);
    }
    if (rc == 0 && (int64_t)list->n >= f->lo) {
        return KVX_OK;
    }
    kvc_cfg_list_free(list);
    if (rc == -1) {
        return kvc_error(KVX_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    if (rc == 1) {
        return kvc_cfg_fail(path, val, "entries must be shorter than %d "
                                       "characters", KVC_HOST_MAX);
    }
    if (rc == 2) {
        return kvc_cfg_fail(path, val, "expected a list of strings or a "
                                       "comma-separated string");
    }
    return kvc_cfg_fail(path, val, "must list at least one non-empty "
                                   "entry");
}

static kvx_status_t kvc_cfg_parse_list(const kvc_config_field_t *f,
                                       const char *path, json_object *val,
                                       kvc_config_t *cfg)
{
    kvc_cfg_list_t list = {NULL, 0};
    kvx_status_t   st   = kvc_cfg_list_read(f, path, val, &list);

    if (st == KVX_OK) {
        *KVC_CFG_AT(cfg, f, char **)               = list.v;
        *(size_t *)((char *)cfg + f->off_n)         = list.n;
    }
    return st;
}

static json_object *kvc_cfg_dump_list(const kvc_config_field_t *f,
                                      const kvc_config_t *cfg)
{
    char *const *v   = *(char **const *)((const char *)cfg + f->off);
    size_t       n   = *(const size_t *)((const char *)cfg + f->off_n);
    json_object *arr = json_object_new_array_ext((int)n);

    for (size_t i = 0; arr != NULL && i < n; i++) {
        json_object *s = json_object_new_string(v[i]);

        if (s == NULL || json_object_array_add(arr, s) != 0) {
            json_object_put(s);
            json_object_put(arr);
            arr = NULL;
        }
    }
    return arr;
}

/* kvc_cfg_parse_trusted: null leaves the allow-list unset; anything else
 * is a host list and sets trusted_set (even when it lists no host). */
static kvx_status_t kvc_cfg_parse_trusted(const kvc_config_field_t *f,
                                          const char *path, json_object *val,
                                          kvc_config_t *cfg)
{
    kvx_status_t st;

    if (val == NULL) {
        cfg->trusted_set = 0;
        return KVX_OK;
    }
    st = kvc_cfg_parse_list(f, path, val, cfg);
    if (st == KVX_OK) {
        cfg->trusted_set = 1;
    }
    return st;
}

static json_object *kvc_cfg_dump_trusted(const kvc_config_field_t *f,
                                         const kvc_config_t *cfg)
{
    if (!cfg->trusted_set) {
        return NULL; /* JSON null */
    }
    return kvc_cfg_dump_list(f, cfg);
}

/* ---- computed defaults --------------------------------------------------- */

/* kvc_cfg_auto_host_ip: the first non-loopback IPv4 address of an
 * interface that is up, else 127.0.0.1. */
static kvx_status_t kvc_cfg_auto_host_ip(kvc_config_t *cfg)
{
    struct ifaddrs    *list, *ifa;
    struct sockaddr_in sin;

    snprintf(cfg->host_ip, sizeof(cfg->host_ip), "127.0.0.1");
    if (getifaddrs(&list) != 0) {
        return KVX_OK;
    }
    for (ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET ||
            !(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK)) {
            continue;
        }
        memcpy(&sin, ifa->ifa_addr, sizeof(sin));
        if ((ntohl(sin.sin_addr.s_addr) >> 24) == 127) {
            continue;
        }
        if (inet_ntop(AF_INET, &sin.sin_addr, cfg->host_ip,
                      sizeof(cfg->host_ip)) != NULL) {
            break;
        }
        snprintf(cfg->host_ip, sizeof(cfg->host_ip), "127.0.0.1");
    }
    freeifaddrs(list);
    return KVX_OK;
}

/* kvc_cfg_auto_node_hosts: [host_ip] (host_ip precedes it in the table). */
static kvx_status_t kvc_cfg_auto_node_hosts(kvc_config_t *cfg)
{
    cfg->node_hosts = calloc(1, sizeof(char *));
    if (cfg->node_hosts == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "node_hosts: out of memory");
    }
    cfg->node_hosts[0] = strdup(cfg->host_ip);
    if (cfg->node_hosts[0] == NULL) {
        free(cfg->node_hosts);
        cfg->node_hosts = NULL;
        return kvc_error(KVX_ERR_NO_MEMORY, "node_hosts: out of memory");
    }
    cfg->num_node_hosts = 1;
    return KVX_OK;
}

/* ---- the table ----------------------------------------------------------- */

static const kvc_cfg_type_t kvc_cfg_bool_loose = {kvc_cfg_parse_bool,
                                                  kvc_cfg_dump_bool};
static const kvc_cfg_type_t kvc_cfg_bool_auto = {kvc_cfg_parse_bool_auto,
                                                 kvc_cfg_dump_bool_auto};
static const kvc_cfg_type_t kvc_cfg_port = {kvc_cfg_parse_port,
                                            kvc_cfg_dump_uint};
static const kvc_cfg_type_t kvc_cfg_seconds = {kvc_cfg_parse_seconds,
                                               kvc_cfg_dump_seconds};
static const kvc_cfg_type_t kvc_cfg_str = {kvc_cfg_parse_str,
                                           kvc_cfg_dump_str};
static const kvc_cfg_type_t kvc_cfg_host_list = {kvc_cfg_parse_list,
                                                 kvc_cfg_dump_list};
static const kvc_cfg_type_t kvc_cfg_trusted = {kvc_cfg_parse_trusted,
                                               kvc_cfg_dump_trusted};
static const kvc_cfg_type_t kvc_cfg_uint_range = {kvc_cfg_parse_uint,
                                                  kvc_cfg_dump_uint};
static const kvc_cfg_type_t kvc_cfg_int_range = {kvc_cfg_parse_int,
                                                 kvc_cfg_dump_int};
static const kvc_cfg_type_t kvc_cfg_u64_range = {kvc_cfg_parse_u64,
                                                 kvc_cfg_dump_u64};
static const kvc_cfg_type_t kvc_cfg_enum = {kvc_cfg_parse_enum,
                                            kvc_cfg_dump_enum};
static const kvc_cfg_type_t kvc_cfg_busid = {kvc_cfg_parse_busid,
                                             kvc_cfg_dump_str};
static const kvc_cfg_type_t kvc_cfg_port_range = {kvc_cfg_parse_port_range,
                                                  kvc_cfg_dump_str};

/* Index = is_producer. */
static const char *const kvc_cfg_roles[] = {"kv_consumer", "kv_producer",
                                            NULL};
/* Index = kvc_err_mode_t. */
static const char *const kvc_cfg_err_modes[] = {"peer", "none", NULL};
static const char *const kvc_cfg_backends[]  = {"rdma", "xgmi", NULL};

#define KVC_OFF(member)  offsetof(kvc_config_t, member)
#define KVC_SIZE(member) sizeof(((kvc_config_t *)0)->member)
#define KVC_X            KVC_CF_EXTRA

/* Rows are parsed in order, the top level first (the port rule needs the
 * world size); host_ip precedes node_hosts (its default). */
static const kvc_config_field_t kvc_cfg_fields[] = {
    {.key = "role", .alias = "kv_role", .type = &kvc_cfg_enum,
     .off = KVC_OFF(is_producer), .choices = kvc_cfg_roles,
     .doc = "kv_producer (prefill) or kv_consumer (decode); required"},
    {.key = "tp_rank", .dfl_json = "0", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(tp_rank), .lo = 0, .hi = 65534,
     .doc = "tensor-parallel rank, < tp_size"},
    {.key = "tp_size", .dfl_json = "1", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(tp_size), .lo = 1, .hi = 65535,
     .doc = "tensor-parallel size"},
    {.key = "dp_rank", .dfl_json = "0", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(dp_rank), .lo = 0, .hi = 65534,
     .doc = "data-parallel rank, < dp_size"},
    {.key = "dp_size", .dfl_json = "1", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(dp_size), .lo = 1, .hi = 65535,
     .doc = "data-parallel size"},
    {.key = "log_level", .dfl_json = "1", .type = &kvc_cfg_int_range,
     .off = KVC_OFF(log_level), .lo = 0, .hi = 3,
     .doc = "0 error, 1 warn, 2 info, 3 debug"},
    {.key = "host_ip", .dfl_fn = kvc_cfg_auto_host_ip, .type = &kvc_cfg_str,
     .off = KVC_OFF(host_ip), .size = KVC_SIZE(host_ip), .lo = 1,
     .flags = KVC_X,
     .doc = "address advertised and bound; default: first non-loopback "
            "IPv4 address, else 127.0.0.1"},
    {.key = "handshake_port", .dfl_json = "6301", .type = &kvc_cfg_port,
     .off = KVC_OFF(handshake_port), .lo = 1024, .hi = 65535, .flags = KVC_X,
     .doc = "base port of the per-rank handshake listeners"},
    {.key = "notify_port", .dfl_json = "61005", .type = &kvc_cfg_port,
     .off = KVC_OFF(notify_port), .lo = 1024, .hi = 65535, .flags = KVC_X,
     .doc = "base port of the per-rank control-message listeners"},
    {.key = "read_mode", .dfl_json = "false", .type = &kvc_cfg_bool_loose,
     .off = KVC_OFF(read_mode), .flags = KVC_X,
     .doc = "true: D pulls (READ); false: P pushes (WRITE)"},
    {.key = "read_bind_decode_host", .dfl_json = "false",
     .type = &kvc_cfg_bool_loose, .off = KVC_OFF(read_bind_decode_host),
     .flags = KVC_X,
     .doc = "READ, P: only the decode host a request id names may read or "
            "release its transfer (each decode instance on one host)"},
    {.key = "release_on_data_plane", .dfl_json = "true",
     .type = &kvc_cfg_bool_loose, .off = KVC_OFF(release_on_data_plane),
     .flags = KVC_X,
     .doc = "READ, D: a release to a P rank it read from goes as a notice "
            "on that UCX endpoint, not over the control plane; WRITE, D: "
            "remote_blocks too, once the endpoint is up (also with "
            "control-plane TLS: authenticated under the session the TLS "
            "handshake gave, replays refused by the sender's stamp)"},
    {.key = "node_hosts", .dfl_fn = kvc_cfg_auto_node_hosts,
     .type = &kvc_cfg_host_list, .off = KVC_OFF(node_hosts),
     .off_n = KVC_OFF(num_node_hosts), .lo = 1, .flags = KVC_X,
     .doc = "hosts of this instance's ranks, rank-0 host first; default "
            "[host_ip]"},
    {.key = "trusted_remote_hosts", .dfl_json = "null",
     .type = &kvc_cfg_trusted, .off = KVC_OFF(trusted_remote_hosts),
     .off_n = KVC_OFF(num_trusted_remote_hosts), .lo = 0, .flags = KVC_X,
     .doc = "allow-list of peer hosts (names, addresses, CIDR); null: unset"},
    {.key = "handshake_timeout", .dfl_json = "10", .type = &kvc_cfg_seconds,
     .off = KVC_OFF(handshake_timeout), .flags = KVC_X,
     .doc = "handshake deadline, seconds"},
    {.key = "transfer_timeout", .dfl_json = "30", .type = &kvc_cfg_seconds,
     .off = KVC_OFF(transfer_timeout), .flags = KVC_X,
     .doc = "transfer deadline, seconds"},
    {.key = "defer_timeout", .dfl_json = "60", .type = &kvc_cfg_seconds,
     .off = KVC_OFF(defer_timeout), .flags = KVC_X,
     .doc = "how long P holds blocks for D, seconds"},
    {.key = "clock_skew", .dfl_json = "0.5", .type = &kvc_cfg_seconds,
     .off = KVC_OFF(clock_skew), .flags = KVC_X,
     .doc = "how far the clocks of P and D hosts may disagree, seconds: "
            "READ D stops reading that long before P's hold ends"},
    {.key = "proxy_ip", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(proxy_ip), .size = KVC_SIZE(proxy_ip), .lo = 0,
     .flags = KVC_X, .doc = "proxy registration target; empty: none"},
    {.key = "proxy_ping_port", .dfl_json = "0", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(proxy_ping_port), .lo = 0, .hi = 65535, .flags = KVC_X,
     .doc = "proxy registration port; 0: unset"},
    {.key = "proxy_ping_interval", .dfl_json = "5", .type = &kvc_cfg_seconds,
     .off = KVC_OFF(proxy_ping_interval), .flags = KVC_X,
     .doc = "seconds between registrations sent to the proxy (rank 0)"},
    {.key = "http_port", .dfl_json = "0", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(http_port), .lo = 0, .hi = 65535, .flags = KVC_X,
     .doc = "advertised HTTP port; 0: unset"},
    {.key = "backend", .dfl_json = "\"rdma\"", .type = &kvc_cfg_enum,
     .off = KVC_OFF(backend), .size = KVC_SIZE(backend),
     .choices = kvc_cfg_backends, .flags = KVC_X,
     .doc = "MoRIIO backend, accepted for compatibility"},
    {.key = "qp_per_transfer", .dfl_json = "1", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(qp_per_transfer), .lo = 1, .hi = 64, .flags = KVC_X,
     .doc = "MoRIIO queue pairs per transfer"},
    {.key = "post_batch_size", .dfl_json = "-1", .type = &kvc_cfg_int_range,
     .off = KVC_OFF(post_batch_size), .lo = 1, .hi = 4096,
     .flags = KVC_X | KVC_CF_MINUS1,
     .doc = "operations posted per batch; -1: all at once"},
    {.key = "num_workers", .dfl_json = "1", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(num_workers), .lo = 1, .hi = 64, .flags = KVC_X,
     .doc = "MoRIIO worker threads"},
    {.key = "ucx_tls", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(ucx_tls), .size = KVC_SIZE(ucx_tls), .lo = 0,
     .flags = KVC_X, .doc = "UCX_TLS for the engine's context; empty: UCX "
                            "default"},
    {.key = "ucx_net_devices", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(ucx_net_devices), .size = KVC_SIZE(ucx_net_devices),
     .lo = 0, .flags = KVC_X, .doc = "UCX_NET_DEVICES; empty: all"},
    {.key = "ucx_tcp_port_range", .dfl_json = "\"\"",
     .type = &kvc_cfg_port_range, .off = KVC_OFF(ucx_tcp_port_range),
     .size = KVC_SIZE(ucx_tcp_port_range), .lo = 0, .flags = KVC_X,
     .doc = "ports UCX's tcp transport listens on, \"lo-hi\" (UCX "
            "TCP_PORT_RANGE); empty: chosen by the OS"},
    {.key = "ucx_lane_settings", .dfl_json = "\"auto\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(ucx_lane_settings), .size = KVC_SIZE(ucx_lane_settings),
     .lo = 0, .flags = KVC_X,
     .doc = "UCX settings of the engine's context (ucp_config_modify), "
            "space-separated: \"auto\" (kvxfer's choice per UCX version and "
            "transports) and/or KEY=VALUE (UCX name without UCX_); \"none\" "
            "or empty: UCX defaults"},
    {.key = "ucx_required_transports", .dfl_json = "[]",
     .type = &kvc_cfg_host_list, .off = KVC_OFF(ucx_required_transports),
     .off_n = KVC_OFF(num_ucx_required_transports), .lo = 0, .flags = KVC_X,
     .doc = "transports every endpoint must use, e.g. [\"rc_verbs\"]"},
    {.key = "ucx_error_mode", .dfl_json = "\"peer\"", .type = &kvc_cfg_enum,
     .off = KVC_OFF(ucx_error_mode), .choices = kvc_cfg_err_modes,
     .flags = KVC_X, .doc = "UCP endpoint error handling mode"},
    {.key = "max_inflight_bytes", .dfl_json = "16777216",
     .type = &kvc_cfg_u64_range, .off = KVC_OFF(max_inflight_bytes),
     .lo = 4096, .hi = INT64_MAX, .flags = KVC_X,
     .doc = "bytes in flight per endpoint"},
    {.key = "progress_spin_us", .dfl_json = "50", .type = &kvc_cfg_uint_range,
     .off = KVC_OFF(progress_spin_us), .lo = 0, .hi = 100000, .flags = KVC_X,
     .doc = "busy-poll time before the progress thread sleeps"},
    {.key = "progress_drive_us", .dfl_json = "200",
     .type = &kvc_cfg_uint_range, .off = KVC_OFF(progress_drive_us),
     .lo = 0, .hi = 100000, .flags = KVC_X,
     .doc = "progress_caller: how long a waiter driving progress busy-polls "
            "idle before it sleeps, and the lease it holds after a satisfied "
            "wait (the progress thread stays aside, expecting it back)"},
    {.key = "progress_caller", .dfl_json = "\"auto\"",
     .type = &kvc_cfg_bool_auto, .off = KVC_OFF(progress_caller),
     .flags = KVC_X,
     .doc = "true: a thread waiting in wait_transfer / wait_layer / "
            "wait_events progresses the data plane itself (busy-polls up to "
            "progress_drive_us idle, then sleeps); false: it sleeps at once "
            "and the progress thread does all; \"auto\": true where "
            "ucx_tls (else the environment's UCX_TLS) names only transports "
            "inside the host (sm, cma, self, GPU copy/IPC), false "
            "otherwise (measured faster on shared memory, mixed on tcp)"},
    {.key = "gpu_bus_id", .dfl_json = "\"\"", .type = &kvc_cfg_busid,
     .off = KVC_OFF(gpu_bus_id), .size = KVC_SIZE(gpu_bus_id), .lo = 0,
     .flags = KVC_X,
     .doc = "PCI bus id of this rank's GPU (dddd:bb:dd.f or bb:dd.f): hwloc "
            "picks the nearest NIC and CPU set; empty: unknown"},
    {.key = "hwloc_topology", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(hwloc_topology), .size = KVC_SIZE(hwloc_topology),
     .lo = 0, .flags = KVC_X,
     .doc = "hwloc XML topology file to place by; empty: this machine"},
    {.key = "tls_cert_file", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(tls.cert_file), .size = KVC_SIZE(tls.cert_file), .lo = 0,
     .flags = KVC_X,
     .doc = "PEM certificate presented on the control plane; set: mutual "
            "TLS, plain connections refused both ways; empty: plain TCP"},
    {.key = "tls_key_file", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(tls.key_file), .size = KVC_SIZE(tls.key_file), .lo = 0,
     .flags = KVC_X, .doc = "PEM private key of tls_cert_file (unencrypted)"},
    {.key = "tls_ca_file", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(tls.ca_file), .size = KVC_SIZE(tls.ca_file), .lo = 0,
     .flags = KVC_X, .doc = "PEM CA certificate(s) every peer chains to"},
    {.key = "tls_peer_name", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(tls.peer_name), .size = KVC_SIZE(tls.peer_name), .lo = 0,
     .flags = KVC_X,
     .doc = "name (CN or DNS SAN) every peer's certificate must carry, in "
            "both directions"},
    {.key = "tls_proxy_name", .dfl_json = "\"\"", .type = &kvc_cfg_str,
     .off = KVC_OFF(tls_proxy_name), .size = KVC_SIZE(tls_proxy_name),
     .lo = 0, .flags = KVC_X,
     .doc = "name the proxy's certificate must carry; empty: tls_peer_name"},
};

#define KVC_CFG_NFIELDS (sizeof(kvc_cfg_fields) / sizeof(kvc_cfg_fields[0]))

/* ---- parse --------------------------------------------------------------- */

static void kvc_cfg_path(const kvc_config_field_t *f, const char *key,
                         char *path)
{
    snprintf(path, KVC_CFG_PATH_MAX, "%s%s%s",
             (f->flags & KVC_CF_EXTRA) ? KVC_CFG_EXTRA_KEY : "",
             (f->flags & KVC_CF_EXTRA) ? "." : "", key);
}

/* kvc_cfg_lookup finds f's key (or its alias) in obj; *key_p names the
 * spelling used. 1 if present, 0 if absent, <0 status on a conflict. */
static int kvc_cfg_lookup(const kvc_config_field_t *f, json_object *obj,
                          json_object **val_p, const char **key_p)
{
    json_object *alt = NULL;
    int          has_key, has_alias;

    *key_p    = f->key;
    has_key   = obj != NULL && json_object_object_get_ex(obj, f->key, val_p);
    has_alias = obj != NULL && f->alias != NULL &&
                json_object_object_get_ex(obj, f->alias, &alt);
    if (has_key && has_alias && !json_object_equal(*val_p, alt)) {
        char path[KVC_CFG_PATH_MAX];

        kvc_cfg_path(f, f->alias, path);
        return kvc_cfg_fail(path, alt, "conflicts with %s %s", f->key,
                            json_object_to_json_string(*val_p));
    }
    if (!has_key && has_alias) {
        *val_p = alt;
        *key_p = f->alias;
    }
    return has_key || has_alias;
}

/* kvc_cfg_load_default parses the table's default text with f's parser. */
static kvx_status_t kvc_cfg_load_default(const kvc_config_field_t *f,
                                         const char *path, kvc_config_t *cfg)
{
    enum json_tokener_error jerr;
    json_object            *dfl;
    kvx_status_t            st;

    if (f->dfl_json == NULL && f->dfl_fn != NULL) {
        return f->dfl_fn(cfg);
    }
    if (f->dfl_json == NULL) { /* required (only role is) */
        char list[256];

        kvc_cfg_choices(f, list, sizeof(list));
        return kvc_error(KVX_ERR_CONFIG, "%s: missing (also accepted as %s); "
                         "required: %s", path,
                         f->alias != NULL ? f->alias : "-", list);
    }
    dfl = json_tokener_parse_verbose(f->dfl_json, &jerr);
    if (jerr != json_tokener_success) {
        return kvc_error(KVX_ERR_INTERNAL, "%s: bad default %s", path,
                         f->dfl_json);
    }
    st = f->type->parse(f, path, dfl, cfg);
    json_object_put(dfl);
    return st;
}

/* kvc_cfg_field_load parses f from obj, or its default when absent. */
static kvx_status_t kvc_cfg_field_load(const kvc_config_field_t *f,
                                       json_object *obj, kvc_config_t *cfg)
{
    char         path[KVC_CFG_PATH_MAX];
    json_object *val = NULL;
    const char  *key;
    int          found = kvc_cfg_lookup(f, obj, &val, &key);

    if (found < 0) {
        return (kvx_status_t)found;
    }
    kvc_cfg_path(f, key, path);
    if (found == 0) {
        return kvc_cfg_load_default(f, path, cfg);
    }
    return f->type->parse(f, path, val, cfg);
}

/* kvc_cfg_known says whether key is a row of the given scope. */
static int kvc_cfg_known(const char *key, unsigned scope)
{
    for (size_t i = 0; i < KVC_CFG_NFIELDS; i++) {
        const kvc_config_field_t *f = &kvc_cfg_fields[i];

        if ((f->flags & KVC_CF_EXTRA) != scope) {
            continue;
        }
        if (strcmp(key, f->key) == 0 ||
            (f->alias != NULL && strcmp(key, f->alias) == 0)) {
            return 1;
        }
    }
    return scope == 0 && strcmp(key, KVC_CFG_EXTRA_KEY) == 0;
}

static void kvc_cfg_warn_unknown(json_object *obj, unsigned scope,
                                 kvc_warn_fn warn, void *warn_arg)
{
    char msg[KVC_CFG_PATH_MAX + 64];

    json_object_object_foreach(obj, key, val) {
        (void)val;
        if (kvc_cfg_known(key, scope)) {
            continue;
        }
        snprintf(msg, sizeof(msg), "%s%s%.*s: unknown key, ignored",
                 scope ? KVC_CFG_EXTRA_KEY : "", scope ? "." : "",
                 KVC_CFG_PATH_MAX, key);
        if (warn != NULL) {
            warn(warn_arg, msg);
        } else {
            kvc_log_warn("KVX-CONFIG-UNKNOWN-KEY", "%s", msg);
        }
    }
}

/* kvc_cfg_no_nul: no string value anywhere in the config holds a NUL
 * (JSON's \u0000): every value is used as C text, which would end there, so
 * the value used would not be the value given (host_ip "10.0.0.1\u0000x"
 * was taken as 10.0.0.1). path names the value; depth bounds the walk. */
static kvx_status_t kvc_cfg_no_nul(json_object *v, char *path, size_t cap,
                                   int depth)
{
    size_t       at = strlen(path);
    kvx_status_t st = KVX_OK;

    if (depth > 64) {
        return kvc_error(KVX_ERR_CONFIG, "config: %s: nested deeper than 64 "
                         "levels", path);
    }
    if (json_object_is_type(v, json_type_string)) {
        const char *sv = json_object_get_string(v);
        size_t      n  = (size_t)json_object_get_string_len(v);
        const char *z  = memchr(sv, '\0', n);

        if (z != NULL) {
            return kvc_error(KVX_ERR_CONFIG, "config: %s: NUL character at "
                             "offset %zu: a string value must not hold one",
                             path, (size_t)(z - sv));
        }
    } else if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);

        for (size_t i = 0; i < n && st == KVX_OK; i++) {
            snprintf(path + at, cap - at, "[%zu]", i);
            st = kvc_cfg_no_nul(json_object_array_get_idx(v, i), path, cap,
                                depth + 1);
        }
    } else if (json_object_is_type(v, json_type_object)) {
        json_object_object_foreach(v, key, val)
        {
            if (st == KVX_OK) {
                snprintf(path + at, cap - at, "%s%s", at > 0 ? "." : "",
                         key);
                st = kvc_cfg_no_nul(val, path, cap, depth + 1);
            }
        }
    }
    path[at] = '\0';
    return st;
}

/* kvc_cfg_tokenize parses the whole text as one JSON object. */
static kvx_status_t kvc_cfg_tokenize(const char *json, json_object **root_p)
{
    enum json_tokener_error jerr;
    json_tokener           *tok = json_tokener_new();
    size_t                  len = strlen(json);
    json_object            *root;

    if (len > INT32_MAX) {
        json_tokener_free(tok);
        return kvc_error(KVX_ERR_CONFIG, "config: %zu bytes: too long", len);
    }
    if (tok == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "config: out of memory");
    }
    root = json_tokener_parse_ex(tok, json, (int)len);
    jerr = json_tokener_get_error(tok);
    if (jerr == json_tokener_continue) {
        jerr = json_tokener_error_parse_eof;
    }
    if (jerr == json_tokener_success) {
        size_t end = json_tokener_get_parse_end(tok);

        while (end < len && isspace((unsigned char)json[end])) {
            end++;
        }
        if (end < len) {
            json_object_put(root);
            json_tokener_free(tok);
            return kvc_error(KVX_ERR_CONFIG, "config: invalid JSON: trailing "
                             "characters at offset %zu", end);
        }
    }
    json_tokener_free(tok);
    if (jerr != json_tokener_success) {
        json_object_put(root);
        return kvc_error(KVX_ERR_CONFIG, "config: invalid JSON: %s",
                         json_tokener_error_desc(jerr));
    }
    {
        char         path[256] = "";
        kvx_status_t st        = kvc_cfg_no_nul(root, path, sizeof(path), 0);

        if (st != KVX_OK) {
            json_object_put(root);
            return st;
        }
    }
    *root_p = root;
    return KVX_OK;
}

/* kvc_cfg_split checks the top level and finds the extra config object. */
static kvx_status_t kvc_cfg_split(json_object *root, json_object **extra_p)
{
    json_object *extra = NULL;

    if (!json_object_is_type(root, json_type_object)) {
        return kvc_cfg_fail("config", root, "expected a JSON object");
    }
    if (json_object_object_get_ex(root, KVC_CFG_EXTRA_KEY, &extra) &&
        !json_object_is_type(extra, json_type_object)) {
        return kvc_cfg_fail(KVC_CFG_EXTRA_KEY, extra,
                            "expected a JSON object");
    }
    *extra_p = extra;
    return KVX_OK;
}

/* kvc_cfg_check_ranks: each rank below its size (SPEC §1, §2). */
static kvx_status_t kvc_cfg_check_ranks(const kvc_config_t *cfg)
{
    if (cfg->tp_rank >= cfg->tp_size) {
        return kvc_error(KVX_ERR_CONFIG, "tp_rank: value %u: must be < "
                         "tp_size %u", cfg->tp_rank, cfg->tp_size);
    }
    if (cfg->dp_rank >= cfg->dp_size) {
        return kvc_error(KVX_ERR_CONFIG, "dp_rank: value %u: must be < "
                         "dp_size %u", cfg->dp_rank, cfg->dp_size);
    }
    return KVX_OK;
}

/* kvc_cfg_check_proxy: the registration target is both keys or neither;
 * its port is not a privileged one (the trust rule for peers). */
static kvx_status_t kvc_cfg_check_proxy(const kvc_config_t *cfg)
{
    if (cfg->proxy_ip[0] != '\0' && cfg->proxy_ping_port == 0) {
        return kvc_error(KVX_ERR_CONFIG, "proxy_ping_port: value 0: must be "
                         "set when proxy_ip ('%s') is", cfg->proxy_ip);
    }
    if (cfg->proxy_ip[0] != '\0' && cfg->proxy_ping_port < 1024) {
        return kvc_error(KVX_ERR_CONFIG, "proxy_ping_port: value %u: must be "
                         "1024..65535", cfg->proxy_ping_port);
    }
    return KVX_OK;
}

/* kvc_cfg_check_tls: the four TLS keys come together. */
static kvx_status_t kvc_cfg_check_tls(const kvc_config_t *cfg)
{
    const struct {
        const char *key;
        const char *val;
    } k[] = {{"tls_cert_file", cfg->tls.cert_file},
             {"tls_key_file", cfg->tls.key_file},
             {"tls_ca_file", cfg->tls.ca_file},
             {"tls_peer_name", cfg->tls.peer_name}};
    int set = 0;

    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        set += k[i].val[0] != '\0';
    }
    for (size_t i = 0; set > 0 && i < sizeof(k) / sizeof(k[0]); i++) {
        if (k[i].val[0] == '\0') {
            return kvc_error(KVX_ERR_CONFIG, "%s: value \"\": must be set "
                             "when any of tls_cert_file, tls_key_file, "
                             "tls_ca_file, tls_peer_name is (mutual TLS needs "
                             "all four)", k[i].key);
        }
    }
    if (set == 0 && cfg->tls_proxy_name[0] != '\0') {
        return kvc_error(KVX_ERR_CONFIG, "tls_proxy_name: value '%s': needs "
                         "tls_cert_file, tls_key_file, tls_ca_file and "
                         "tls_peer_name", cfg->tls_proxy_name);
    }
    return KVX_OK;
}

/* kvc_cfg_load_scope loads every row of the scope from obj (NULL: all
 * defaults), in table order. */
static kvx_status_t kvc_cfg_load_scope(json_object *obj, unsigned scope,
                                       kvc_config_t *cfg)
{
    kvx_status_t st = KVX_OK;

    for (size_t i = 0; st == KVX_OK && i < KVC_CFG_NFIELDS; i++) {
        if ((kvc_cfg_fields[i].flags & KVC_CF_EXTRA) == scope) {
            st = kvc_cfg_field_load(&kvc_cfg_fields[i], obj, cfg);
        }
    }
    return st;
}

kvx_status_t kvc_config_parse(const char *json, kvc_config_t *cfg,
                              kvc_warn_fn warn, void *warn_arg)
{
    json_object *root  = NULL;
    json_object *extra = NULL;
    kvx_status_t st;

    if (cfg == NULL || json == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "config: %s is NULL",
                         cfg == NULL ? "cfg" : "json");
    }
    memset(cfg, 0, sizeof(*cfg));
    st = kvc_cfg_tokenize(json, &root);
    if (st != KVX_OK) {
        return st;
    }
    st = kvc_cfg_split(root, &extra);
    if (st == KVX_OK) {
        kvc_cfg_warn_unknown(root, 0, warn, warn_arg);
        if (extra != NULL) {
            kvc_cfg_warn_unknown(extra, KVC_CF_EXTRA, warn, warn_arg);
        }
    }
    if (st == KVX_OK) {
        st = kvc_cfg_load_scope(root, 0, cfg);
    }
    if (st == KVX_OK) { /* before the port rule uses the world size */
        st = kvc_cfg_check_ranks(cfg);
    }
    if (st == KVX_OK) {
        st = kvc_cfg_load_scope(extra, KVC_CF_EXTRA, cfg);
    }
    if (st == KVX_OK) {
        st = kvc_cfg_check_proxy(cfg);
    }
    if (st == KVX_OK) {
        st = kvc_cfg_check_tls(cfg);
    }
    json_object_put(root);
    if (st != KVX_OK) {
        kvc_config_fini(cfg);
    }
    return st;
}

void kvc_config_fini(kvc_config_t *cfg)
{
    kvc_cfg_list_t lists[] = {
        {cfg->node_hosts, cfg->num_node_hosts},
        {cfg->trusted_remote_hosts, cfg->num_trusted_remote_hosts},
        {cfg->ucx_required_transports, cfg->num_ucx_required_transports},
    };

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        kvc_cfg_list_free(&lists[i]);
    }
    memset(cfg, 0, sizeof(*cfg));
}

/* ---- dump ---------------------------------------------------------------- */

/* kvc_cfg_dump_into adds every row of the scope to obj; -1 on no memory. */
static int kvc_cfg_dump_into(const kvc_config_t *cfg, unsigned scope,
                             json_object *obj)
{
    for (size_t i = 0; i < KVC_CFG_NFIELDS; i++) {
        const kvc_config_field_t *f = &kvc_cfg_fields[i];
        json_object              *v;

        if ((f->flags & KVC_CF_EXTRA) != scope) {
            continue;
        }
        v = f->type->dump(f, cfg);
        if (v == NULL && f->type != &kvc_cfg_trusted) {
            return -1;
        }
        if (json_object_object_add(obj, f->key, v) != 0) {
            json_object_put(v);
            return -1;
        }
    }
    return 0;
}

char *kvc_config_dump(const kvc_config_t *cfg)
{
    json_object *root  = json_object_new_object();
    json_object *extra = json_object_new_object();
    char        *out   = NULL;

    if (root != NULL && extra != NULL &&
        kvc_cfg_dump_into(cfg, 0, root) == 0 &&
        kvc_cfg_dump_into(cfg, KVC_CF_EXTRA, extra) == 0 &&
        json_object_object_add(root, KVC_CFG_EXTRA_KEY, extra) == 0) {
        const char *text = json_object_to_json_string_ext(
            root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);

        extra = NULL; /* owned by root now */
        out   = text != NULL ? strdup(text) : NULL;
    }
    json_object_put(extra);
    json_object_put(root);
    return out;
}

uint32_t kvc_config_world(const kvc_config_t *cfg)
{
    return cfg->dp_size * cfg->tp_size;
}

uint32_t kvc_config_rank(const kvc_config_t *cfg)
{
    return cfg->dp_rank * cfg->tp_size + cfg->tp_rank;
}

const kvt_ctl_sec_t *kvc_config_ctl_sec(const kvc_config_t *cfg)
{
    return cfg->tls.cert_file[0] != '\0' ? &cfg->tls : NULL;
}

const kvt_ctl_sec_t *kvc_config_proxy_sec(const kvc_config_t *cfg,
                                          kvt_ctl_sec_t *buf)
{
    if (cfg->tls.cert_file[0] == '\0') {
        return NULL;
    }
    *buf = cfg->tls;
    if (cfg->tls_proxy_name[0] != '\0') {
        snprintf(buf->peer_name, sizeof(buf->peer_name), "%s",
                 cfg->tls_proxy_name);
    }
    return buf;
}
