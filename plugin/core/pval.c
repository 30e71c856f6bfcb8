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
    default:
        v->type = KVC_PV_OTHER;
        break;
    }
}

static const char *kvc_flat_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    return p;
}

static int kvc_flat_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* kvc_flat_scalar reads one string, integer, true, false or null of the
 * subset at p into *v: the end of it, or NULL outside the subset. What
 * follows is the caller's to check. */
static const char *kvc_flat_scalar(const char *p, kvc_pv_t *v)
{
    memset(v, 0, sizeof(*v));
    v->text = p;
    if (*p == '"') {
        const char *s = ++p;

        for (; *p != '"'; p++) {
            unsigned char c = (unsigned char)*p;

            /* the terminating NUL lands here too */
            if (c < 0x20 || c > 0x7e || c == '\\') {
                return NULL;
            }
        }
        v->type = KVC_PV_STR;
        v->s    = s;
        v->len  = (size_t)(p - s);
        p++;
    } else if (*p == '-' || kvc_flat_digit(*p)) {
        int      neg = *p == '-';
        uint64_t x   = 0;
        int      nd  = 0;

        p += neg;
        if (*p == '0') {
            p++;
        } else {
            /* at most 18 digits: below 10^18, inside int64 either way */
            for (; kvc_flat_digit(*p) && nd < 18; p++, nd++) {
                x = x * 10 + (uint64_t)(*p - '0');
            }
            if (nd == 0) {
                return NULL;
            }
        }
        if (kvc_flat_digit(*p) || *p == '.' || *p == 'e' || *p == 'E') {
            return NULL;
        }
        v->type = KVC_PV_INT;
        v->i    = neg ? -(int64_t)x : (int64_t)x;
        v->u    = neg ? 0 : x;
    } else if (strncmp(p, "true", 4) == 0 || strncmp(p, "false", 5) == 0) {
        v->type = KVC_PV_BOOL;
        v->b    = *p == 't';
        p += v->b ? 4 : 5;
    } else if (strncmp(p, "null", 4) == 0) {
        v->type = KVC_PV_NULL;
        p += 4;
    } else {
        return NULL;
    }
    v->text_len = (size_t)(p - v->text);
    return p;
}

/* kvc_flat_array reads '[' scalars ']' at p into *v; see kvc_flat_scalar. */
static const char *kvc_flat_array(const char *p, kvc_pv_t *v)
{
    kvc_pv_t e;

    memset(v, 0, sizeof(*v));
    v->type = KVC_PV_ARRAY;
    v->text = p;
    p       = kvc_flat_ws(p + 1);
    if (*p != ']') {
        for (;;) {
            p = kvc_flat_scalar(p, &e);
            if (p == NULL) {
                return NULL;
            }
            v->len++;
            p = kvc_flat_ws(p);
            if (*p == ']') {
                break;
            }
            if (*p != ',') {
                return NULL;
            }
            p = kvc_flat_ws(p + 1);
        }
    }
    p++;
    v->text_len = (size_t)(p - v->text);
    return p;
}

int kvc_flat_scan(const char *json, kvc_flat_member_t *m, size_t max,
                  size_t *n_p)
{
    const char *p = kvc_flat_ws(json);
    size_t      n = 0;
    kvc_pv_t    key;

    *n_p = 0;
    if (*p != '{') {
        return 0;
    }
    p = kvc_flat_ws(p + 1);
    if (*p == '}') {
        return *kvc_flat_ws(p + 1) == '\0';
    }
    for (;;) {
        if (*p != '"' || n == max) {
            return 0;
        }
        p = kvc_flat_scalar(p, &key);
        if (p == NULL) {
            return 0;
        }
        p = kvc_flat_ws(p);
        if (*p != ':') {
            return 0;
        }
        p = kvc_flat_ws(p + 1);
        p = *p == '[' ? kvc_flat_array(p, &m[n].val)
                      : kvc_flat_scalar(p, &m[n].val);
        if (p == NULL) {
            return 0;
        }
        m[n].key     = key.s;
        m[n].key_len = key.len;
        n++;
        p = kvc_flat_ws(p);
        if (*p == '}') {
            break;
        }
        if (*p != ',') {
            return 0;
        }
        p = kvc_flat_ws(p + 1);
    }
    if (*kvc_flat_ws(p + 1) != '\0') {
        return 0;
    }
    *n_p = n;
    return 1;
}

int kvc_pv_next(const kvc_pv_t *arr, kvc_pv_it_t *it, kvc_pv_t *e)
{
    const char *p;

    if (arr->type != KVC_PV_ARRAY || it->idx >= arr->len) {
        return 0;
    }
    if (arr->jo != NULL) {
        kvc_pv_from_json(json_object_array_get_idx(arr->jo, it->idx), e);
        it->idx++;
        return 1;
    }
    /* kvc_flat_array checked the whole array: no bound is needed here */
    p = kvc_flat_ws(it->pos != NULL ? it->pos : arr->text + 1);
    if (*p == ',') {
        p = kvc_flat_ws(p + 1);
    }
    it->pos = kvc_flat_scalar(p, e);
    it->idx++;
    return 1;
}

const char *kvc_pv_show(const kvc_pv_t *v, int *len_p)
{
    const char *s;

    if (v->jo != NULL) {
        s      = json_object_to_json_string_ext(v->jo, JSON_C_TO_STRING_PLAIN);
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
