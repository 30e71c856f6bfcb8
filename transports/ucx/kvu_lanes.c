/*
 * kvu_lanes.c - the lane report parsed from ucp_ep_print_info text (see
 * kvu_lanes.h for both formats).
 */
#include "kvu_lanes.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kvu_roles[] = {
    "am", "am_bw", "rma", "rma_bw", "amo", "rkey_ptr", "tag_offload",
    "keepalive", "wireup", "device"};

static const char *const kvu_shm_tls[] = {"sysv", "posix", "xpmem", "knem"};

int kvu_lanes_is_shm(const char *tl)
{
    for (size_t i = 0; i < sizeof(kvu_shm_tls) / sizeof(kvu_shm_tls[0]); i++) {
        if (strcmp(tl, kvu_shm_tls[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* kvu_role_of: the role a token names ("am_bw#0" -> "am_bw#0", "wireup{..}"
 * -> "wireup"), written to out; 0 when it is not a role. */
static int kvu_role_of(const char *tok, size_t n, char *out, size_t outlen)
{
    size_t base = 0, end;

    while (base < n && (islower((unsigned char)tok[base]) || tok[base] == '_')) {
        base++;
    }
    end = base;
    if (end < n && tok[end] == '#') {
        end++;
        if (end >= n || !isdigit((unsigned char)tok[end])) {
            return 0;
        }
        while (end < n && isdigit((unsigned char)tok[end])) {
            end++;
        }
    }
    if (end < n && tok[end] != '{') {
        return 0;
    }
    for (size_t i = 0; i < sizeof(kvu_roles) / sizeof(kvu_roles[0]); i++) {
        if (strlen(kvu_roles[i]) == base &&
            strncmp(tok, kvu_roles[i], base) == 0 && end < outlen) {
            memcpy(out, tok, end);
            out[end] = '\0';
            return 1;
        }
    }
    return 0;
}

static int kvu_has_role(const char *roles, const char *base)
{
    size_t n = strlen(base);

    for (const char *p = roles; (p = strstr(p, base)) != NULL; p += n) {
        int start = p == roles || p[-1] == ' ';
        int end   = p[n] == '\0' || p[n] == ' ' || p[n] == '#';

        if (start && end) {
            return 1;
        }
    }
    return 0;
}

static void kvu_add_role(kvu_lane_t *lane, const char *role)
{
    size_t used = strlen(lane->roles);

    snprintf(lane->roles + used, sizeof(lane->roles) - used, "%s%s",
             used ? " " : "", role);
}

/* kvu_next_tok: the next space-separated token of *p (length *n), or NULL. */
static const char *kvu_next_tok(const char **p, size_t *n)
{
    const char *s = *p;

    while (*s == ' ' || *s == '\t') {
        s++;
    }
    if (*s == '\0') {
        return NULL;
    }
    *n = strcspn(s, " \t");
    *p = s + *n;
    return s;
}

/* kvu_parse_lane parses what follows "lane[i]:"; 0 for a data lane. */
static int kvu_parse_lane(const char *s, kvu_lane_t *lane, int *saw_seg)
{
    const char *arrow, *tok, *p;
    char        name[128];
    size_t      n;
    int         rsc;
    char       *slash, *dot;

    memset(lane, 0, sizeof(*lane));
    if (sscanf(s, " %d:%127s", &rsc, name) != 2 ||
        (slash = strchr(name, '/')) == NULL) {
        return -1; /* "cm <name>" and anything unknown */
    }
    *slash = '\0';
    /* "lo.0": the device, then the path index after the last dot */
    dot = strrchr(slash + 1, '.');
    if (dot != NULL && dot[1] != '\0' &&
        strspn(dot + 1, "0123456789") == strlen(dot + 1)) {
        *dot = '\0';
    }
    snprintf(lane->tl, sizeof(lane->tl), "%.*s", (int)sizeof(lane->tl) - 1, name);
    snprintf(lane->dev, sizeof(lane->dev), "%.*s", (int)sizeof(lane->dev) - 1, slash + 1);
    arrow = strstr(s, "->");
    if (arrow == NULL) {
        return 0;
    }
    p = arrow + 2;
    if (kvu_next_tok(&p, &n) == NULL) { /* destination md[..]/cmpt/sysdev */
        return 0;
    }
    while ((tok = kvu_next_tok(&p, &n)) != NULL) {
        char role[48];

        if (n == 3 && strncmp(tok, "seg", 3) == 0) {
            *saw_seg = 1;
            (void)kvu_next_tok(&p, &n); /* its size is never a role */
        } else if (kvu_role_of(tok, n, role, sizeof(role)) &&
                   !kvu_has_role(lane->roles, role)) {
            kvu_add_role(lane, role);
        }
    }
    return 0;
}

int kvu_lanes_parse(const char *text, kvu_lanes_t *out)
{
    int         rma_v1[KVU_LANES_MAX] = {0};
    int         saw_seg = 0, saw_v1 = 0, index[KVU_LANES_MAX];
    const char *line = text;

    memset(out, 0, sizeof(*out));
    while (line != NULL && *line != '\0') {
        const char *eol = strchr(line, '\n');
        size_t      len = eol ? (size_t)(eol - line) : strlen(line);
        char        buf[512];
        const char *s, *lane;
        int         idx;

        snprintf(buf, sizeof(buf), "%.*s", (int)len, line);
        line = eol ? eol + 1 : NULL;
        s    = buf + strspn(buf, "# \t");
        if ((lane = strstr(s, "lane[")) != NULL && lane == s) {
            int off = 0;

            if (sscanf(s, "lane[%d]:%n", &idx, &off) == 1 && off > 0 &&
                out->n < KVU_LANES_MAX &&
                kvu_parse_lane(s + off, &out->lane[out->n], &saw_seg) == 0) {
                index[out->n++] = idx;
            }
        } else if ((strncmp(s, "put[", 4) == 0 ||
                    strncmp(s, "get[", 4) == 0) &&
                   sscanf(s + 4, "%d]:", &idx) == 1) {
            saw_v1 = 1;
            if (idx >= 0 && idx < KVU_LANES_MAX) {
                rma_v1[idx] = 1;
            }
        } else if (strstr(s, "..<") != NULL || strncmp(s, "rma_bw: mds", 11) == 0) {
            saw_v1 = 1; /* a v1 protocol threshold table */
        }
    }
    out->proto_v2 = saw_seg || !saw_v1;
    for (int i = 0; i < out->n; i++) {
        kvu_lane_t *l = &out->lane[i];

        if (out->proto_v2) {
            l->rma = kvu_has_role(l->roles, "rma_bw") ||
                     kvu_has_role(l->roles, "rma") || kvu_lanes_is_shm(l->tl);
        } else {
            l->rma = index[i] >= 0 && index[i] < KVU_LANES_MAX &&
                     rma_v1[index[i]];
        }
    }
    return out->n;
}

int kvu_lanes_set_names(kvu_lanes_t *l, const char *const *tl,
                        const char *const *dev, int n)
{
    if (n != l->n) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        snprintf(l->lane[i].tl, sizeof(l->lane[i].tl), "%s", tl[i]);
        snprintf(l->lane[i].dev, sizeof(l->lane[i].dev), "%s", dev[i]);
    }
    return 0;
}

int kvu_lanes_rma_emulated(const kvu_lanes_t *l)
{
    for (int i = 0; i < l->n; i++) {
        if (l->lane[i].rma) {
            return 0;
        }
    }
    return 1;
}

/* kvu_lanes_fifo: some lane is a memory-mapped FIFO (with role "am"
 * when am). */
static int kvu_lanes_fifo(const kvu_lanes_t *l, int am)
{
    static const char *const fifo_tls[] = {"sysv", "posix", "xpmem"};

    for (int i = 0; i < l->n; i++) {
        if (am && !kvu_has_role(l->lane[i].roles, "am")) {
            continue;
        }
        for (size_t k = 0; k < sizeof(fifo_tls) / sizeof(fifo_tls[0]); k++) {
            if (strcmp(l->lane[i].tl, fifo_tls[k]) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

int kvu_lanes_am_fifo(const kvu_lanes_t *l)
{
    return kvu_lanes_fifo(l, 1);
}

int kvu_lanes_any_fifo(const kvu_lanes_t *l)
{
    return kvu_lanes_fifo(l, 0);
}

int kvu_lanes_rma_on(const kvu_lanes_t *l, const char *tl)
{
    for (int i = 0; i < l->n; i++) {
        if (l->lane[i].rma && strcmp(l->lane[i].tl, tl) == 0) {
            return 1;
        }
    }
    return 0;
}

int kvu_lanes_rma_shm_or(const kvu_lanes_t *l, const char *tl)
{
    for (int i = 0; i < l->n; i++) {
        if (l->lane[i].rma && strcmp(l->lane[i].tl, tl) != 0 &&
            !kvu_lanes_is_shm(l->lane[i].tl)) {
            return 0;
        }
    }
    return kvu_lanes_rma_on(l, tl);
}

int kvu_lanes_rma_shm_only(const kvu_lanes_t *l)
{
    int any = 0;

    for (int i = 0; i < l->n; i++) {
        if (l->lane[i].rma) {
            if (!kvu_lanes_is_shm(l->lane[i].tl)) {
                return 0;
            }
            any = 1;
        }
    }
    return any;
}

int kvu_lanes_format(const kvu_lanes_t *l, char *buf, size_t len)
{
    size_t used = 0;

    if (len > 0) {
        buf[0] = '\0';
    }
    for (int i = 0; i < l->n; i++) {
        const kvu_lane_t *ln  = &l->lane[i];
        int               add = ln->rma && !kvu_has_role(ln->roles, "rma");
        int               k   = snprintf(used < len ? buf + used : NULL,
                                         used < len ? len - used : 0,
                                         "%s%s/%s[%s%s%s]", i ? " " : "",
                                         ln->tl, ln->dev, ln->roles,
                                         add && ln->roles[0] ? " " : "",
                                         add ? "rma" : "");

        if (k < 0) {
            return k;
        }
        used += (size_t)k;
    }
    return (int)used;
}
