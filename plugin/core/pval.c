/*
 * pval.c - see pval.h.
 */
#include "pval.h"

#include <string.h>

void kvc_pv_from_json(json_object *jo, kvc_pv_t *v)
{
    memset(v, 0, sizeof(*v));
    v->jo = jo;
    switch (jo == NULL ? json_type_null : json_object_get_type(jo)) {
    case json_type_null:
        v->type = KVC_PV_NULL;
        break;
    case json_type_boolean:
        v->type = KVC_PV_BOOL;
        v->b    = json_object_get_boolean(jo) ? 1 : 0;
        break;
    case json_type_int:
        v->type = KVC_PV_INT;
        v->i    = json_object_get_int64(jo);
        v->u    = json_object_get_uint64(jo);
        break;
    case json_type_string:
        v->type = KVC_PV_STR;
        v->s    = json_object_get_string(jo);
        v->len  = (size_t)json_object_get_string_len(jo);
        break;
    case json_type_array:
        v->type = KVC_PV_ARRAY;
        v->len  = json_object_array_length(jo);
        break;
    case json_type_object:
        v->type = KVC_PV_OBJECT;
        break;
    default:
        v->type = KVC_PV_OTHER;
        break;
    }
}

/* The reader never reads at or past end; kvc_flat_c gives '\0' there, a
 * byte no accepted text holds (strings refuse it, every other token is
 * checked character by character). */
static char kvc_flat_c(const char *p, const char *end)
{
    return p < end ? *p : '\0';
}

static const char *kvc_flat_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

static int kvc_flat_word(const char *p, const char *end, const char *w,
                         size_t n)
{
    return (size_t)(end - p) >= n && memcmp(p, w, n) == 0;
}

static int kvc_flat_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* kvc_flat_scalar reads one string, integer, true, false or null of the
 * subset at p into *v: the end of it, or NULL outside the subset. What
 * follows is the caller's to check. */
static const char *kvc_flat_scalar(const char *p, const char *end,
                                   kvc_pv_t *v)
{
    char c0 = kvc_flat_c(p, end);

    memset(v, 0, sizeof(*v));
    v->text = p;
    if (c0 == '"') {
        const char *s = ++p;

        for (; p < end && *p != '"'; p++) {
            unsigned char c = (unsigned char)*p;

            if (c < 0x20 || c > 0x7e || c == '\\') {
                return NULL;
            }
        }
        if (p == end) {
            return NULL;
        }
        v->type = KVC_PV_STR;
        v->s    = s;
        v->len  = (size_t)(p - s);
        p++;
    } else if (c0 == '-' || kvc_flat_digit(c0)) {
        int      neg = c0 == '-';
        uint64_t x   = 0;
        int      nd  = 0;
        char     c;

        p += neg;
        if (kvc_flat_c(p, end) == '0') {
            p++;
        } else {
            /* at most 18 digits: below 10^18, inside int64 either way */
            for (; p < end && kvc_flat_digit(*p) && nd < 18; p++, nd++) {
                x = x * 10 + (uint64_t)(*p - '0');
            }
            if (nd == 0) {
                return NULL;
            }
        }
        c = kvc_flat_c(p, end);
        if (kvc_flat_digit(c) || c == '.' || c == 'e' || c == 'E') {
            return NULL;
        }
        v->type = KVC_PV_INT;
        v->i    = neg ? -(int64_t)x : (int64_t)x;
        v->u    = neg ? 0 : x;
    } else if (kvc_flat_word(p, end, "true", 4) ||
               kvc_flat_word(p, end, "false", 5)) {
        v->type = KVC_PV_BOOL;
        v->b    = c0 == 't';
        p += v->b ? 4 : 5;
    } else if (kvc_flat_word(p, end, "null", 4)) {
        v->type = KVC_PV_NULL;
        p += 4;
    } else {
        return NULL;
    }
    v->text_len = (size_t)(p - v->text);
    return p;
}

/* kvc_flat_array reads '[' scalars ']' at p into *v; see kvc_flat_scalar. */
static const char *kvc_flat_array(const char *p, const char *end,
                                  kvc_pv_t *v)
{
    kvc_pv_t e;

    memset(v, 0, sizeof(*v));
    v->type = KVC_PV_ARRAY;
    v->text = p;
    p       = kvc_flat_ws(p + 1, end);
    if (kvc_flat_c(p, end) != ']') {
        for (;;) {
            p = kvc_flat_scalar(p, end, &e);
            if (p == NULL) {
                return NULL;
            }
            v->len++;
            p = kvc_flat_ws(p, end);
            if (kvc_flat_c(p, end) == ']') {
                break;
            }
            if (kvc_flat_c(p, end) != ',') {
                return NULL;
            }
            p = kvc_flat_ws(p + 1, end);
        }
    }
    p++;
    v->text_len = (size_t)(p - v->text);
    return p;
}

int kvc_flat_scan(const char *json, size_t len, kvc_flat_member_t *m,
                  size_t max, size_t *n_p)
{
    const char *end = json + len;
    const char *p   = kvc_flat_ws(json, end);
    size_t      n   = 0;
    kvc_pv_t    key;

    *n_p = 0;
    if (kvc_flat_c(p, end) != '{') {
        return 0;
    }
    p = kvc_flat_ws(p + 1, end);
    if (kvc_flat_c(p, end) != '}') {
        for (;;) {
            if (kvc_flat_c(p, end) != '"' || n == max) {
                return 0;
            }
            p = kvc_flat_scalar(p, end, &key);
            if (p == NULL) {
                return 0;
            }
            p = kvc_flat_ws(p, end);
            if (kvc_flat_c(p, end) != ':') {
                return 0;
            }
            p = kvc_flat_ws(p + 1, end);
            p = kvc_flat_c(p, end) == '['
                    ? kvc_flat_array(p, end, &m[n].val)
                    : kvc_flat_scalar(p, end, &m[n].val);
            if (p == NULL) {
                return 0;
            }
            m[n].key     = key.s;
            m[n].key_len = key.len;
            n++;
            p = kvc_flat_ws(p, end);
            if (kvc_flat_c(p, end) == '}') {
                break;
            }
            if (kvc_flat_c(p, end) != ',') {
                return 0;
            }
            p = kvc_flat_ws(p + 1, end);
        }
    }
    if (kvc_flat_ws(p + 1, end) != end) {
        return 0;
    }
    *n_p = n;
    return 1;
}

int kvc_pv_next(const kvc_pv_t *arr, kvc_pv_it_t *it, kvc_pv_t *e)
{
    const char *p, *end;

    if (arr->type != KVC_PV_ARRAY || it->idx >= arr->len) {
        return 0;
    }
    if (arr->jo != NULL) {
        kvc_pv_from_json(json_object_array_get_idx(arr->jo, it->idx), e);
        it->idx++;
        return 1;
    }
    /* kvc_flat_array checked the whole array, which ends at its ']' */
    end = arr->text + arr->text_len;
    p   = kvc_flat_ws(it->pos != NULL ? it->pos : arr->text + 1, end);
    if (kvc_flat_c(p, end) == ',') {
        p = kvc_flat_ws(p + 1, end);
    }
    it->pos = kvc_flat_scalar(p, end, e);
    it->idx = it->pos != NULL ? it->idx + 1 : arr->len;
    return it->pos != NULL;
}

const char *kvc_pv_show(const kvc_pv_t *v, int *len_p)
{
    const char *s;

    if (v->jo != NULL) {
        s = json_object_to_json_string_ext(v->jo, JSON_C_TO_STRING_PLAIN);
        s = s != NULL ? s : "?";
        *len_p = (int)strlen(s);
        return s;
    }
    if (v->text != NULL) {
        *len_p = (int)v->text_len;
        return v->text;
    }
    *len_p = 4;
    return "null";
}
