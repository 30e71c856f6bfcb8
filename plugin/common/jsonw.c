/*
 * jsonw.c - the append-only JSON writer (jsonw.h).
 */
#include "jsonw.h"

#include <stdlib.h>
#include <string.h>

static int kvc_jw_room(kvc_jw_t *w, size_t more)
{
    size_t cap;
    char  *b;

    if (w->oom) {
        return 0;
    }
    if (w->len + more + 1 <= w->cap) {
        return 1;
    }
    cap = w->cap != 0 ? w->cap : 256;
    while (cap < w->len + more + 1) {
        cap *= 2;
    }
    b = realloc(w->buf, cap);
    if (b == NULL) {
        w->oom = 1;
        return 0;
    }
    w->buf = b;
    w->cap = cap;
    return 1;
}

static void kvc_jw_put(kvc_jw_t *w, const char *s, size_t n)
{
    if (kvc_jw_room(w, n)) {
        memcpy(w->buf + w->len, s, n);
        w->len += n;
        w->buf[w->len] = '\0';
    }
}

static void kvc_jw_sep(kvc_jw_t *w)
{
    if (w->comma) {
        kvc_jw_put(w, ",", 1);
    }
    w->comma = 1;
}

/* kvc_jw_quoted: s between quotes, escaped as json-c escapes it (its
 * json_escape_str without JSON_C_TO_STRING_NOSLASHESCAPE): the two-letter
 * escapes for \b \n \r \t \f " \ and /, \u00xx (lower-case hex) for the
 * other bytes below 0x20, every other byte as it is. */
static void kvc_jw_quoted(kvc_jw_t *w, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t            from = 0, i;

    kvc_jw_put(w, "\"", 1);
    for (i = 0; s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        char          esc[6];
        size_t        n = 2;

        switch (c) {
        case '\b': memcpy(esc, "\\b", 2); break;
        case '\n': memcpy(esc, "\\n", 2); break;
        case '\r': memcpy(esc, "\\r", 2); break;
        case '\t': memcpy(esc, "\\t", 2); break;
        case '\f': memcpy(esc, "\\f", 2); break;
        case '"': memcpy(esc, "\\\"", 2); break;
        case '\\': memcpy(esc, "\\\\", 2); break;
        case '/':
            if (w->noslash) {
                continue;
            }
            memcpy(esc, "\\/", 2);
            break;
        default:
            if (c >= 0x20) {
                continue;
            }
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xf];
            n      = 6;
        }
        kvc_jw_put(w, s + from, i - from);
        kvc_jw_put(w, esc, n);
        from = i + 1;
    }
    kvc_jw_put(w, s + from, i - from);
    kvc_jw_put(w, "\"", 1);
}

void kvc_jw_open(kvc_jw_t *w, char bracket)
{
    kvc_jw_sep(w);
    kvc_jw_put(w, &bracket, 1);
    w->comma = 0;
}

void kvc_jw_close(kvc_jw_t *w, char bracket)
{
    kvc_jw_put(w, &bracket, 1);
    w->comma = 1;
}

void kvc_jw_key(kvc_jw_t *w, const char *key)
{
    kvc_jw_sep(w);
    kvc_jw_quoted(w, key);
    kvc_jw_put(w, ":", 1);
    w->comma = 0;
}

void kvc_jw_str(kvc_jw_t *w, const char *s)
{
    kvc_jw_sep(w);
    kvc_jw_quoted(w, s);
}

/* kvc_jw_num: what "%" PRId64 (neg) or "%" PRIu64 prints for a value of
 * magnitude u, without the format parser. */
static void kvc_jw_num(kvc_jw_t *w, uint64_t u, int neg)
{
    char  num[24];
    char *p = num + sizeof(num);

    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (neg) {
        *--p = '-';
    }
    kvc_jw_sep(w);
    kvc_jw_put(w, p, (size_t)(num + sizeof(num) - p));
}

void kvc_jw_int(kvc_jw_t *w, int64_t v)
{
    kvc_jw_num(w, v < 0 ? 0 - (uint64_t)v : (uint64_t)v, v < 0);
}

void kvc_jw_uint(kvc_jw_t *w, uint64_t v)
{
    kvc_jw_num(w, v, 0);
}

void kvc_jw_bool(kvc_jw_t *w, int v)
{
    kvc_jw_sep(w);
    if (v) {
        kvc_jw_put(w, "true", 4);
    } else {
        kvc_jw_put(w, "false", 5);
    }
}

char *kvc_jw_take(kvc_jw_t *w)
{
    char *s;

    if (w->buf == NULL) {
        kvc_jw_put(w, "", 0); /* nothing written: an empty string */
    }
    s = w->oom ? NULL : w->buf;

    if (s == NULL) {
        free(w->buf);
    }
    w->buf = NULL;
    w->len = w->cap = 0;
    w->oom = w->comma = 0;
    return s;
}

void kvc_jw_fini(kvc_jw_t *w)
{
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
    w->oom = w->comma = 0;
}
