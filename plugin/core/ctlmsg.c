/*
 * ctlmsg.c - JSON codecs of the control plane (SPEC §5, §9).
 *
 * Every decoder goes through kvc_json_parse(), which checks the size limit,
 * rejects embedded NUL bytes and malformed UTF-8 (RFC 3629), parses exactly
 * len bytes with json-c in strict mode (depth limited) and rejects trailing
 * data. Control messages (remote_blocks, release: one per transfer) are
 * read by the flat reader first (pval.h: no allocation), and go to json-c
 * when it does not take them or any field fails, so json-c gives every
 * error. Field access goes through kvc_obj_t and the kvc_fld_* helpers,
 * whichever parsed the text; they type- and range-check each value and
 * name the field, the value and the rule in the error text.
 *
 * Threading: pure functions, any thread; kvc_idset_t is not locked.
 */
#include "ctlmsg.h"
#include "jsonw.h"
#include "pval.h"

#include <json-c/json.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVC_JSON_DEPTH     16
#define KVC_JSON_SAFE_MAX  (UINT64_C(1) << 53) /* exact in a double */
#define KVC_HS_MAX_LAYERS  4096
#define KVC_IDSET_MAX      (1u << 20)
#define KVC_VAL_SHOWN      64 /* bytes of an offending value quoted */
#define KVC_NELEM(a)       (sizeof(a) / sizeof((a)[0]))

_Static_assert(KVC_GEOM_BYTES_MAX == KVC_JSON_SAFE_MAX,
               "registration (layout.c) and handshake decoding agree on the "
               "largest geometry byte count");

static const char *const kvc_what_msg   = "control message";
static const char *const kvc_what_reply = "control reply";
static const char *const kvc_what_hsreq = "handshake request";
static const char *const kvc_what_meta  = "handshake metadata";

/* ------------------------------------------------------------------------ */
/* parsing and field helpers                                                */
/* ------------------------------------------------------------------------ */

static int kvc_is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* kvc_utf8_seq: the length (1..4) of the well-formed UTF-8 sequence at
 * s[0..len) (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF), or 0 when the bytes there are not one. */
static size_t kvc_utf8_seq(const unsigned char *s, size_t len)
{
    size_t   n, i;
    uint32_t cp;

    if (len == 0) {
        return 0;
    }
    if (s[0] < 0x80) {
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2, cp = s[0] & 0x1fu;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3, cp = s[0] & 0x0fu;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4, cp = s[0] & 0x07u;
    } else {
        return 0;
    }
    if (len < n) {
        return 0;
    }
    for (i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
        return 0;
    }
    return n;
}

/* kvc_buf_check: size limit, non-empty, no NUL byte, well-formed UTF-8
 * (json-c's own check lets overlong forms such as C1 87 through, which
 * then reach error texts and replies). */
static kvx_status_t kvc_buf_check(const char *what, const char *buf,
                                  size_t len)
{
    const char *nul;
    size_t      pos, n;

    if (len > KVC_MSG_MAX_BYTES) {
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: %zu bytes exceeds limit %u",
                         what, len, KVC_MSG_MAX_BYTES);
    }
    if (buf == NULL || len == 0) {
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: empty message", what);
    }
    nul = memchr(buf, '\0', len);
    if (nul != NULL) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: embedded NUL byte at offset %zu", what,
                         (size_t)(nul - buf));
    }
    for (pos = 0; pos < len; pos += n) {
        uint64_t w;

        /* eight ASCII bytes at a time (the usual message is all ASCII) */
        if (len - pos >= 8) {
            memcpy(&w, buf + pos, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                n = 8;
                continue;
            }
        }
        n = kvc_utf8_seq((const unsigned char *)buf + pos, len - pos);
        if (n == 0) {
            return kvc_error(KVX_ERR_BAD_MESSAGE,
                             "%s: byte 0x%02x at offset %zu: not well-formed "
                             "UTF-8", what, (unsigned char)buf[pos], pos);
        }
    }
    return KVX_OK;
}

/* kvc_json_parse parses exactly len bytes into one JSON value. On KVX_OK
 * the caller owns *obj_p (never NULL). */
static kvx_status_t kvc_json_parse(const char *what, const char *buf,
                                   size_t len, json_object **obj_p)
{
    json_tokener         *tok;
    json_object          *obj;
    enum json_tokener_error err;
    size_t                end;
    kvx_status_t          status = kvc_buf_check(what, buf, len);

    *obj_p = NULL;
    if (status != KVX_OK) {
        return status;
    }
    tok = json_tokener_new_ex(KVC_JSON_DEPTH);
    if (tok == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "%s: out of memory", what);
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT |
                                JSON_TOKENER_VALIDATE_UTF8);
    obj = json_tokener_parse_ex(tok, buf, (int)len);
    err = json_tokener_get_error(tok);
    end = json_tokener_get_parse_end(tok);
    if (obj == NULL && err == json_tokener_continue) {
        /* end of input: feed a terminator from our own storage so values
         * without an inherent end (numbers, null) complete */
        obj = json_tokener_parse_ex(tok, "", 1);
        if (obj == NULL &&
            json_tokener_get_error(tok) != json_tokener_success) {
            json_tokener_free(tok);
            return kvc_error(KVX_ERR_BAD_MESSAGE,
                             "%s: truncated JSON: input ends at byte %zu",
                             what, len);
        }
        err = json_tokener_success;
    }
    json_tokener_free(tok);
    if (err != json_tokener_success) {
        json_object_put(obj);
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: invalid JSON at offset %zu: %s", what, end,
                         json_tokener_error_desc(err));
    }
    if (obj == NULL) {
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: JSON null is not a message",
                         what);
    }
    *obj_p = obj;
    return KVX_OK;
}

/* kvc_json_object: parse and require a JSON object. */
static kvx_status_t kvc_json_object(const char *what, const char *buf,
                                    size_t len, json_object **obj_p)
{
    kvx_status_t status = kvc_json_parse(what, buf, len, obj_p);

    if (status == KVX_OK && !json_object_is_type(*obj_p, json_type_object)) {
        json_object_put(*obj_p);
        *obj_p = NULL;
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: not a JSON object", what);
    }
    return status;
}

/* kvc_obj_t: an object's members as json-c parsed them (jo) or as the
 * flat reader found them in the message text (m[0..n)). */
typedef struct kvc_obj {
    json_object             *jo;
    const kvc_flat_member_t *m;
    size_t                   n;
} kvc_obj_t;

/* kvc_obj_get: 1, with the value in *v (may be NULL), when key is a member
 * of o; of repeated keys the last, the one json-c keeps. */
static int kvc_obj_get(const kvc_obj_t *o, const char *key, kvc_pv_t *v)
{
    json_object *val = NULL;
    size_t       klen;

    if (o->jo != NULL) {
        if (!json_object_object_get_ex(o->jo, key, &val)) {
            return 0;
        }
        if (v != NULL) {
            kvc_pv_from_json(val, v);
        }
        return 1;
    }
    klen = strlen(key);
    for (size_t i = o->n; i-- > 0;) {
        if (o->m[i].key_len == klen && memcmp(o->m[i].key, key, klen) == 0) {
            if (v != NULL) {
                *v = o->m[i].val;
            }
            return 1;
        }
    }
    return 0;
}

/* kvc_val_text: the JSON text of a value for error messages (borrowed;
 * kvc_val_len bytes of it). */
static const char *kvc_val_text(const kvc_pv_t *val)
{
    int len;

    return kvc_pv_show(val, &len);
}

static size_t kvc_val_len(const kvc_pv_t *val)
{
    int len;

    kvc_pv_show(val, &len);
    return (size_t)len;
}

/* kvc_val_shown: how many bytes of text[0..avail) an error quotes: at most
 * KVC_VAL_SHOWN, never ending inside a multi-byte character (a cut
 * character would make the error text, and a reply carrying it, invalid
 * UTF-8). */
static int kvc_val_shown(const char *text, size_t avail)
{
    const unsigned char *s   = (const unsigned char *)text;
    /* +4: a character starting before the limit is seen whole */
    size_t               len = strnlen(text, avail < KVC_VAL_SHOWN + 4
                                                 ? avail
                                                 : KVC_VAL_SHOWN + 4);
    size_t               pos = 0, n;

    while (pos < len) {
        n = kvc_utf8_seq(s + pos, len - pos);
        if (n == 0) {
            n = 1; /* not UTF-8: quoted byte by byte */
        }
        if (pos + n > KVC_VAL_SHOWN) {
            break;
        }
        pos += n;
    }
    return (int)pos;
}

/* KVC_VAL: the "%.*s" arguments quoting a value (kvc_pv_t *) in an
 * error. */
#define KVC_VAL(val)                                                           \
    kvc_val_shown(kvc_val_text(val), kvc_val_len(val)), kvc_val_text(val)

static const char *kvc_type_name(kvc_pv_type_t type)
{
    switch (type) {
    case KVC_PV_STR:
        return "a string";
    case KVC_PV_INT:
        return "an integer";
    case KVC_PV_ARRAY:
        return "a list";
    case KVC_PV_OBJECT:
        return "an object";
    case KVC_PV_BOOL:
        return "a boolean";
    default:
        return "a value";
    }
}

/* kvc_fld_get: *val is the member `key` of obj checked to be of `type`
 * (never KVC_PV_NULL); when it is absent and not required, KVX_OK with
 * val->type KVC_PV_NULL. `field` names it in errors. */
static kvx_status_t kvc_fld_get(const char *what, const kvc_obj_t *obj,
                                const char *key, const char *field,
                                kvc_pv_type_t type, int required,
                                kvc_pv_t *val)
{
    if (!kvc_obj_get(obj, key, val)) {
        memset(val, 0, sizeof(*val));
        if (!required) {
            return KVX_OK;
        }
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: field %s: missing", what,
                         field);
    }
    if (val->type != type) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: field %s: value %.*s: must be %s", what, field,
                         KVC_VAL(val),
                         kvc_type_name(type));
    }
    return KVX_OK;
}

/* kvc_int_ok: val is a JSON integer in min..max, then in *out_p. */
static int kvc_int_ok(const kvc_pv_t *val, uint64_t min, uint64_t max,
                      uint64_t *out_p)
{
    if (val->type != KVC_PV_INT || val->i < 0 || val->u < min ||
        val->u > max) {
        return 0;
    }
    *out_p = val->u;
    return 1;
}

/* kvc_int_check: kvc_int_ok, or an error naming field, value and range. */
static kvx_status_t kvc_int_check(const char *what, const char *field,
                                  const kvc_pv_t *val, uint64_t min,
                                  uint64_t max, uint64_t *out_p)
{
    if (!kvc_int_ok(val, min, max, out_p)) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: field %s: value %.*s: must be an integer in "
                         "%" PRIu64 "..%" PRIu64 "%s",
                         what, field, KVC_VAL(val), min,
                         max,
                         max == KVC_JSON_SAFE_MAX
                             ? " (larger JSON integers are not exact)"
                             : "");
    }
    return KVX_OK;
}

/* kvc_fld_int: member `key` as an integer in min..max; *present_p (may be
 * NULL, then the field is required) tells whether it was there. */
static kvx_status_t kvc_fld_int(const char *what, const kvc_obj_t *obj,
                                const char *key, const char *field,
                                uint64_t min, uint64_t max, uint64_t *out_p,
                                int *present_p)
{
    kvc_pv_t val;

    if (present_p != NULL) {
        *present_p = kvc_obj_get(obj, key, &val);
        if (!*present_p) {
            return KVX_OK;
        }
    } else if (!kvc_obj_get(obj, key, &val)) {
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: field %s: missing", what,
                         field);
    }
    return kvc_int_check(what, field, &val, min, max, out_p);
}

/* kvc_text_check: len 1..max-1 bytes of printable ASCII (space allowed only
 * when allow_space). */
static kvx_status_t kvc_text_check(const char *what, const char *field,
                                   const char *s, size_t len, size_t max,
                                   int allow_space)
{
    size_t i;

    if (len == 0) {
        return kvc_error(KVX_ERR_BAD_MESSAGE, "%s: field %s: empty string",
                         what, field);
    }
    if (len >= max) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: field %s: length %zu exceeds limit %zu", what,
                         field, len, max - 1);
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c > 0x7e || c < 0x20 || (c == ' ' && !allow_space)) {
            return kvc_error(KVX_ERR_BAD_MESSAGE,
                             "%s: field %s: byte 0x%02x at offset %zu: must "
                             "be printable ASCII%s",
                             what, field, c, i,
                             allow_space ? "" : " without spaces");
        }
    }
    return KVX_OK;
}

/* kvc_str_copy: a checked JSON string value copied into dst[max]. */
static kvx_status_t kvc_str_copy(const char *what, const char *field,
                                 const kvc_pv_t *val, char *dst, size_t max,
                                 int allow_space)
{
    const char  *s   = val->s;
    size_t       len = val->len;
    kvx_status_t status;

    status = kvc_text_check(what, field, s, len, max, allow_space);
    if (status == KVX_OK) {
        memcpy(dst, s, len);
        dst[len] = '\0';
    }
    return status;
}

/* kvc_fld_str: member `key`, a string, checked and copied. */
static kvx_status_t kvc_fld_str(const char *what, const kvc_obj_t *obj,
                                const char *key, int required, char *dst,
                                size_t max, int allow_space)
{
    kvc_pv_t     val;
    kvx_status_t status;

    status = kvc_fld_get(what, obj, key, key, KVC_PV_STR, required, &val);
    if (status != KVX_OK || val.type == KVC_PV_NULL) {
        return status;
    }
    return kvc_str_copy(what, key, &val, dst, max, allow_space);
}

/* kvc_fld_dec: member `key`, a decimal string of a uint64 (canonical: no
 * sign, no leading zero). */
static kvx_status_t kvc_fld_dec(const char *what, const kvc_obj_t *obj,
                                const char *key, const char *field,
                                uint64_t *out_p)
{
    kvc_pv_t     val;
    const char  *s;
    size_t       len, i;
    uint64_t     v = 0;
    kvx_status_t status;

    status = kvc_fld_get(what, obj, key, field, KVC_PV_STR, 1, &val);
    if (status != KVX_OK) {
        return status;
    }
    s   = val.s;
    len = val.len;
    for (i = 0; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');

        if (v > (UINT64_MAX - d) / 10) {
            break;
        }
        v = v * 10 + d;
    }
    if (len == 0 || i != len || (len > 1 && s[0] == '0')) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "%s: field %s: value %.*s: must be a decimal string "
                         "of an integer in 0..%" PRIu64,
                         what, field, KVC_VAL(&val),
                         UINT64_MAX);
    }
    *out_p = v;
    return KVX_OK;
}

/* kvc_fld_dec_opt: as kvc_fld_dec, but an absent member leaves *out_p 0. */
static kvx_status_t kvc_fld_dec_opt(const char *what, const kvc_obj_t *obj,
                                    const char *key, uint64_t *out_p)
{
    if (!kvc_obj_get(obj, key, NULL)) {
        *out_p = 0;
        return KVX_OK;
    }
    return kvc_fld_dec(what, obj, key, key, out_p);
}

/* ------------------------------------------------------------------------ */
/* encoding helpers                                                         */
/* ------------------------------------------------------------------------ */

/* kvc_jadd adds val (consumed even on failure) to obj; -1 on failure. */
static int kvc_jadd(json_object *obj, const char *key, json_object *val)
{
    if (val == NULL) {
        return -1;
    }
    if (json_object_object_add(obj, key, val) != 0) {
        json_object_put(val);
        return -1;
    }
    return 0;
}

static int kvc_jadd_str(json_object *obj, const char *key, const char *s)
{
    return kvc_jadd(obj, key, json_object_new_string(s));
}

static int kvc_jadd_int(json_object *obj, const char *key, int64_t v)
{
    return kvc_jadd(obj, key, json_object_new_int64(v));
}

static int kvc_jadd_dec(json_object *obj, const char *key, uint64_t v)
{
    char text[24];

    snprintf(text, sizeof(text), "%" PRIu64, v);
    return kvc_jadd_str(obj, key, text);
}

static int kvc_jadd_b64(json_object *obj, const char *key,
                        const uint8_t *data, size_t len)
{
    char *text = kvc_b64_encode(data, len);
    int   rc   = text != NULL ? kvc_jadd_str(obj, key, text) : -1;

    free(text);
    return rc;
}

/* kvc_json_finish: the compact text of obj (malloc'd), consuming obj.
 * rc != 0 (a failed add) gives NULL. */
static char *kvc_json_finish(json_object *obj, int rc, size_t *len_p)
{
    const char *text = NULL;
    char       *out  = NULL;
    size_t      len  = 0;

    if (obj != NULL && rc == 0) {
        text = json_object_to_json_string_length(
            obj, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
            &len);
    }
    if (text != NULL) {
        out = malloc(len + 1);
    }
    if (out != NULL) {
        memcpy(out, text, len + 1);
        if (len_p != NULL) {
            *len_p = len;
        }
    } else {
        kvc_error(KVX_ERR_NO_MEMORY, "json encoding: out of memory");
    }
    json_object_put(obj);
    return out;
}

/* ------------------------------------------------------------------------ */
/* control messages                                                         */
/* ------------------------------------------------------------------------ */

/* kvc_msg_block_list: block_notify_list, a non-empty list of integers in
 * 0..2^53, into msg->block_ids (owned). */
static kvx_status_t kvc_msg_block_list(const kvc_obj_t *obj, kvc_msg_t *msg)
{
    kvc_pv_t     list, e;
    kvc_pv_it_t  it = {0};
    size_t       n, i;
    char         field[48];
    kvx_status_t status;

    status = kvc_fld_get(kvc_what_msg, obj, "block_notify_list",
                         "block_notify_list", KVC_PV_ARRAY, 1, &list);
    if (status != KVX_OK) {
        return status;
    }
    n = list.len;
    if (n == 0) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "control message: field block_notify_list: empty "
                         "list");
    }
    msg->block_ids = calloc(n, sizeof(*msg->block_ids));
    if (msg->block_ids == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "control message: out of memory for %zu block ids",
                         n);
    }
    msg->num_block_ids = n;
    for (i = 0; i < n && kvc_pv_next(&list, &it, &e); i++) {
        /* the field's name is printed only for the error */
        if (!kvc_int_ok(&e, 0, KVC_JSON_SAFE_MAX, &msg->block_ids[i])) {
            snprintf(field, sizeof(field), "block_notify_list[%zu]", i);
            return kvc_int_check(kvc_what_msg, field, &e, 0,
                                 KVC_JSON_SAFE_MAX, &msg->block_ids[i]);
        }
    }
    return KVX_OK;
}

/* kvc_msg_consumer_rank: the optional D TP rank of a release or
 * remote_blocks (-1 when absent). */
static kvx_status_t kvc_msg_consumer_rank(const kvc_obj_t *obj,
                                          kvc_msg_t *msg)
{
    uint64_t     v = 0;
    int          present;
    kvx_status_t status = kvc_fld_int(kvc_what_msg, obj, "consumer_rank",
                                      "consumer_rank", 0, INT32_MAX, &v,
                                      &present);

    msg->consumer_rank = status == KVX_OK && present ? (int32_t)v : -1;
    return status;
}

static void kvc_msg_encode_consumer_rank(kvc_jw_t *w, const kvc_msg_t *msg)
{
    if (msg->consumer_rank >= 0) {
        kvc_jw_key(w, "consumer_rank");
        kvc_jw_int(w, msg->consumer_rank);
    }
}

/* remote_blocks: req_id, decode_rank, consumer_rank (optional),
 * done_by_notice and notice_counted (optional, 0 or 1) and
 * block_notify_list. */
static kvx_status_t kvc_msg_decode_blocks(const kvc_obj_t *obj,
                                          kvc_msg_t *msg)
{
    uint64_t     v = 0;
    int          present = 0;
    kvx_status_t status;

    status = kvc_fld_str(kvc_what_msg, obj, "req_id", 1, msg->req_id,
                         KVX_ID_MAX, 1);
    if (status == KVX_OK) {
        status = kvc_fld_int(kvc_what_msg, obj, "decode_rank", "decode_rank",
                             0, INT32_MAX, &v, NULL);
        msg->decode_rank = (int32_t)v;
    }
    if (status == KVX_OK) {
        status = kvc_msg_consumer_rank(obj, msg);
    }
    if (status == KVX_OK) {
        status = kvc_fld_int(kvc_what_msg, obj, "done_by_notice",
                             "done_by_notice", 0, 1, &v, &present);
        msg->done_by_notice = present ? (int)v : 0;
    }
    if (status == KVX_OK) {
        status = kvc_fld_int(kvc_what_msg, obj, "notice_counted",
                             "notice_counted", 0, 1, &v, &present);
        msg->notice_counted = present ? (int)v : 0;
    }
    if (status == KVX_OK) {
        status = kvc_msg_block_list(obj, msg);
    }
    return status;
}

static void kvc_msg_encode_blocks(kvc_jw_t *w, const kvc_msg_t *msg)
{
    kvc_jw_key(w, "req_id");
    kvc_jw_str(w, msg->req_id);
    kvc_jw_key(w, "block_notify_list");
    kvc_jw_open(w, '[');
    for (size_t i = 0; i < msg->num_block_ids; i++) {
        kvc_jw_uint(w, msg->block_ids[i]);
    }
    kvc_jw_close(w, ']');
    kvc_msg_encode_consumer_rank(w, msg);
    if (msg->done_by_notice) {
        kvc_jw_key(w, "done_by_notice");
        kvc_jw_int(w, 1);
    }
    if (msg->notice_counted) {
        kvc_jw_key(w, "notice_counted");
        kvc_jw_int(w, 1);
    }
    kvc_jw_key(w, "decode_rank");
    kvc_jw_int(w, msg->decode_rank);
}

/* release: consumer_tp_size (optional, 1..65535 as a tp_size, default 1)
 * and consumer_rank (optional). P derives a READ quorum from the size
 * (kvc_ack_quorum: one rank map per D rank, under the engine lock). */
static kvx_status_t kvc_msg_decode_release(const kvc_obj_t *obj,
                                           kvc_msg_t *msg)
{
    uint64_t     v = 1;
    int          present;
    kvx_status_t status;

    status = kvc_fld_int(kvc_what_msg, obj, "consumer_tp_size",
                         "consumer_tp_size", 1, 65535, &v, &present);
    msg->consumer_tp_size = (int32_t)v;
    return status == KVX_OK ? kvc_msg_consumer_rank(obj, msg) : status;
}

static void kvc_msg_encode_release(kvc_jw_t *w, const kvc_msg_t *msg)
{
    if (msg->consumer_tp_size != 0) {
        kvc_jw_key(w, "consumer_tp_size");
        kvc_jw_int(w, msg->consumer_tp_size);
    }
    kvc_msg_encode_consumer_rank(w, msg);
}

/* ------------------------------------------------------------------------ */
/* control messages: the type table and the generic codec                   */
/* ------------------------------------------------------------------------ */

/* KVC_MSG_DESC: the entry of type t, at index t. */
#define KVC_MSG_DESC(t, ...) [t] = {.type = (t), __VA_ARGS__}

/* stats_name: the keys the engine's stats JSON has always used. */
static const kvc_msg_desc_t kvc_msg_table[] = {
    KVC_MSG_DESC(KVC_MSG_REMOTE_BLOCKS, .name = "remote_blocks",
                 .stats_name = "remote_blocks", .roles = KVC_MSG_TO_PRODUCER,
                 .decode_fields = kvc_msg_decode_blocks,
                 .encode_fields = kvc_msg_encode_blocks),
    KVC_MSG_DESC(KVC_MSG_WRITE_DONE, .name = "write_done",
                 .stats_name = "write_done", .roles = KVC_MSG_TO_CONSUMER),
    KVC_MSG_DESC(KVC_MSG_RELEASE, .name = "release", .stats_name = "release",
                 .roles = KVC_MSG_TO_PRODUCER,
                 .decode_fields = kvc_msg_decode_release,
                 .encode_fields = kvc_msg_encode_release),
    KVC_MSG_DESC(KVC_MSG_HEARTBEAT, .name = "heartbeat",
                 .stats_name = "heartbeat",
                 .roles = KVC_MSG_TO_PRODUCER | KVC_MSG_TO_CONSUMER,
                 .id_optional = 1),
    KVC_MSG_DESC(KVC_MSG_HOLD, .name = "hold", .stats_name = "hold",
                 .roles = KVC_MSG_TO_PRODUCER),
    KVC_MSG_DESC(KVC_MSG_GIVEN_UP, .name = "given_up",
                 .stats_name = "given_up", .roles = KVC_MSG_TO_CONSUMER),
};

_Static_assert(KVC_NELEM(kvc_msg_table) == KVC_MSG_NTYPES + 1,
               "kvc_msg_table: one entry per type 1..KVC_MSG_NTYPES");
_Static_assert(KVC_MSG_GIVEN_UP == KVC_MSG_NTYPES,
               "KVC_MSG_NTYPES must be the last kvc_msg_type_t value");

const kvc_msg_desc_t *kvc_msg_desc(kvc_msg_type_t type)
{
    size_t t = (size_t)type;

    if (t == 0 || t > KVC_MSG_NTYPES || kvc_msg_table[t].name == NULL) {
        return NULL;
    }
    return &kvc_msg_table[t];
}

const kvc_msg_desc_t *kvc_msg_desc_by_name(const char *name, size_t len)
{
    size_t t;

    for (t = 1; name != NULL && t <= KVC_MSG_NTYPES; t++) {
        const char *n = kvc_msg_table[t].name;

        if (n != NULL && strlen(n) == len && memcmp(n, name, len) == 0) {
            return &kvc_msg_table[t];
        }
    }
    return NULL;
}

/* kvc_msg_type_of: the entry of "type", or remote_blocks for a typeless
 * object with "req_id" (upstream compatibility). */
static kvx_status_t kvc_msg_type_of(const kvc_obj_t *obj,
                                    const kvc_msg_desc_t **desc_p)
{
    kvc_pv_t     val;
    kvx_status_t status;

    status = kvc_fld_get(kvc_what_msg, obj, "type", "type", KVC_PV_STR, 0,
                         &val);
    if (status != KVX_OK) {
        return status;
    }
    if (val.type == KVC_PV_NULL) {
        if (kvc_obj_get(obj, "req_id", NULL)) {
            *desc_p = kvc_msg_desc(KVC_MSG_REMOTE_BLOCKS);
            return KVX_OK;
        }
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "control message: field type: missing");
    }
    *desc_p = kvc_msg_desc_by_name(val.s, val.len);
    if (*desc_p == NULL) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "control message: unknown type %.*s", KVC_VAL(&val));
    }
    return KVX_OK;
}

/* kvc_msg_fields: the members of a message object into msg. */
static kvx_status_t kvc_msg_fields(const kvc_obj_t *obj, int is_producer,
                                   kvc_msg_t *msg)
{
    const kvc_msg_desc_t *desc = NULL;
    kvx_status_t          status;

    status = kvc_msg_type_of(obj, &desc);
    if (status == KVX_OK) {
        msg->type = desc->type;
        if (!(desc->roles & KVC_MSG_ROLE(is_producer))) {
            status = kvc_error(KVX_ERR_BAD_MESSAGE,
                               "control message: type %s not accepted by a "
                               "%s",
                               desc->name,
                               is_producer ? "producer" : "consumer");
        }
    }
    if (status == KVX_OK) {
        status = kvc_fld_str(kvc_what_msg, obj, "transfer_id",
                             !desc->id_optional, msg->transfer_id, KVX_ID_MAX,
                             1);
    }
    if (status == KVX_OK) {
        status = kvc_fld_dec_opt(kvc_what_msg, obj, "instance",
                                 &msg->instance);
    }
    if (status == KVX_OK) {
        status = kvc_fld_dec_opt(kvc_what_msg, obj, "to_instance",
                                 &msg->to_instance);
    }
    if (status == KVX_OK) {
        status = kvc_fld_dec_opt(kvc_what_msg, obj, "xfer_nonce",
                                 &msg->xfer_nonce);
    }
    if (status == KVX_OK && desc->decode_fields != NULL) {
        status = desc->decode_fields(obj, msg);
    }
    return status;
}

/* members of a control message the flat reader takes; more go to json-c */
#define KVC_MSG_FLAT_MAX 16

static kvx_status_t kvc_msg_decode_object(const char *buf, size_t len,
                                          int is_producer, kvc_msg_t *msg,
                                          int flat)
{
    kvc_flat_member_t m[KVC_MSG_FLAT_MAX];
    kvc_obj_t         obj = {0};
    json_object      *jo;
    kvx_status_t      status;

    if (flat && kvc_flat_scan(buf, len, m, KVC_MSG_FLAT_MAX, &obj.n)) {
        obj.m = m;
        if (kvc_msg_fields(&obj, is_producer, msg) == KVX_OK) {
            return KVX_OK;
        }
        /* json-c decides, and words the error */
        kvc_msg_fini(msg);
        memset(msg, 0, sizeof(*msg));
    }
    status = kvc_json_object(kvc_what_msg, buf, len, &jo);
    if (status != KVX_OK) {
        return status;
    }
    obj.jo = jo;
    status = kvc_msg_fields(&obj, is_producer, msg);
    json_object_put(jo);
    return status;
}

/* kvc_msg_decode_legacy: a plain transfer id, raw (text) or a JSON string
 * (buf starts with '"' after whitespace). */
static kvx_status_t kvc_msg_decode_legacy(const char *buf, size_t len,
                                          const char *text, size_t tlen,
                                          int is_producer, kvc_msg_t *msg)
{
    json_object *str = NULL;
    kvc_pv_t     val;
    kvx_status_t status;

    if (text[0] == '"') {
        status = kvc_json_parse(kvc_what_msg, buf, len, &str);
        if (status != KVX_OK) {
            return status;
        }
        kvc_pv_from_json(str, &val); /* a string: its text starts with '"' */
        status = kvc_str_copy(kvc_what_msg, "transfer_id (plain string)",
                              &val, msg->transfer_id, KVX_ID_MAX, 0);
        json_object_put(str);
    } else {
        status = kvc_text_check(kvc_what_msg, "transfer_id (plain text)",
                                text, tlen, KVX_ID_MAX, 0);
        if (status == KVX_OK) {
            memcpy(msg->transfer_id, text, tlen);
            msg->transfer_id[tlen] = '\0';
        }
    }
    if (status == KVX_OK) {
        msg->type = is_producer ? KVC_MSG_RELEASE : KVC_MSG_WRITE_DONE;
        msg->consumer_tp_size = 1;
        msg->consumer_rank    = -1;
        msg->legacy           = 1;
    }
    return status;
}

static kvx_status_t kvc_msg_decode_as(const char *buf, size_t len,
                                      int is_producer, kvc_msg_t *msg,
                                      int flat)
{
    size_t       start = 0, end = len;
    kvx_status_t status;

    if (msg == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "control message: msg is NULL");
    }
    memset(msg, 0, sizeof(*msg));
    status = kvc_buf_check(kvc_what_msg, buf, len);
    if (status != KVX_OK) {
        return status;
    }
    while (start < end && kvc_is_ws(buf[start])) {
        start++;
    }
    while (end > start && kvc_is_ws(buf[end - 1])) {
        end--;
    }
    if (start == end) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "control message: only whitespace");
    }
    if (buf[start] == '{') {
        status = kvc_msg_decode_object(buf, len, is_producer, msg, flat);
    } else {
        status = kvc_msg_decode_legacy(buf, len, buf + start, end - start,
                                       is_producer, msg);
    }
    if (status != KVX_OK) {
        kvc_msg_fini(msg);
    }
    return status;
}

kvx_status_t kvc_msg_decode(const char *buf, size_t len, int is_producer,
                            kvc_msg_t *msg)
{
    return kvc_msg_decode_as(buf, len, is_producer, msg, 1);
}

kvx_status_t kvc_msg_decode_json_c(const char *buf, size_t len,
                                   int is_producer, kvc_msg_t *msg)
{
    return kvc_msg_decode_as(buf, len, is_producer, msg, 0);
}

char *kvc_msg_encode(const kvc_msg_t *msg, size_t *len_p)
{
    const kvc_msg_desc_t *desc = msg != NULL ? kvc_msg_desc(msg->type) : NULL;
    kvc_jw_t              w    = KVC_JW_INIT;
    char                  dec[24], *out;
    size_t                len;
    const struct {
        const char *key;
        uint64_t    v;
    } decs[] = {{"instance", msg != NULL ? msg->instance : 0},
                {"to_instance", msg != NULL ? msg->to_instance : 0},
                {"xfer_nonce", msg != NULL ? msg->xfer_nonce : 0}};

    if (msg != NULL && msg->legacy && msg->transfer_id[0] != '{' &&
        msg->transfer_id[0] != '"') {
        char *text = strdup(msg->transfer_id);

        if (text != NULL && len_p != NULL) {
            *len_p = strlen(text);
        }
        return text;
    }
    if (msg != NULL && msg->legacy) {
        /* raw text starting with '{' or '"' reads as JSON: such an id
         * travels as a JSON string, the other plain form the decoder
         * accepts */
        return kvc_json_finish(json_object_new_string(msg->transfer_id), 0,
                               len_p);
    }
    if (desc == NULL) {
        kvc_error(KVX_ERR_INVALID_PARAM, "control message: no valid type");
        return NULL;
    }
    /* one per transfer: written directly (jsonw.h), the bytes json-c's
     * tree printed with JSON_C_TO_STRING_NOSLASHESCAPE */
    w.noslash = 1;
    kvc_jw_open(&w, '{');
    kvc_jw_key(&w, "type");
    kvc_jw_str(&w, desc->name);
    if (!desc->id_optional || msg->transfer_id[0]) {
        kvc_jw_key(&w, "transfer_id");
        kvc_jw_str(&w, msg->transfer_id);
    }
    for (size_t i = 0; i < KVC_NELEM(decs); i++) {
        if (decs[i].v != 0) {
            snprintf(dec, sizeof(dec), "%" PRIu64, decs[i].v);
            kvc_jw_key(&w, decs[i].key);
            kvc_jw_str(&w, dec);
        }
    }
    if (desc->encode_fields != NULL) {
        desc->encode_fields(&w, msg);
    }
    kvc_jw_close(&w, '}');
    len = w.len;
    out = kvc_jw_take(&w);
    if (out == NULL) {
        kvc_error(KVX_ERR_NO_MEMORY, "json encoding: out of memory");
    } else if (len_p != NULL) {
        *len_p = len;
    }
    return out;
}

void kvc_msg_fini(kvc_msg_t *msg)
{
    if (msg == NULL) {
        return;
    }
    free(msg->block_ids);
    msg->block_ids     = NULL;
    msg->num_block_ids = 0;
}

/* ------------------------------------------------------------------------ */
/* replies and the handshake request                                        */
/* ------------------------------------------------------------------------ */

/* kvc_utf8_clean: a malloc'd copy of s with every byte that does not begin
 * a well-formed UTF-8 sequence replaced by '?' (NULL on no memory). */
static char *kvc_utf8_clean(const char *s)
{
    size_t len = strlen(s), pos = 0, n;
    char  *out = malloc(len + 1);

    while (out != NULL && pos < len) {
        n = kvc_utf8_seq((const unsigned char *)s + pos, len - pos);
        if (n == 0) {
            out[pos++] = '?';
            continue;
        }
        memcpy(out + pos, s + pos, n);
        pos += n;
    }
    if (out != NULL) {
        out[len] = '\0';
    }
    return out;
}

/* kvc_reply_encode: the reason is made valid UTF-8 first (it may quote
 * hostile bytes or end in a cut character), since kvc_reply_decode
 * validates UTF-8 and would otherwise lose the whole reply. */
char *kvc_reply_encode(int ok, const char *reason, size_t *len_p)
{
    kvc_reply_info_t info = {.ok = ok};

    return kvc_reply_encode_info(&info, reason, len_p);
}

char *kvc_reply_encode_info(const kvc_reply_info_t *info, const char *reason,
                            size_t *len_p)
{
    json_object *obj = json_object_new_object();
    int          rc  = -1;
    char        *text;

    if (obj != NULL) {
        rc = kvc_jadd(obj, "ok", json_object_new_boolean(info->ok != 0));
    }
    if (rc == 0 && !info->ok) {
        text = kvc_utf8_clean(reason != NULL ? reason : "");
        rc   = text != NULL ? kvc_jadd_str(obj, "error", text) : -1;
        free(text);
    }
    if (rc == 0 && info->instance != 0) {
        rc = kvc_jadd_dec(obj, "instance", info->instance);
    }
    if (rc == 0 && info->fenced) {
        rc = kvc_jadd(obj, "fenced", json_object_new_boolean(1));
    }
    if (rc == 0 && info->ok && info->has_hold) {
        rc = kvc_jadd_int(obj, "hold_ms", (int64_t)info->hold_ms);
    }
    return kvc_json_finish(obj, rc, len_p);
}

/* kvc_reason_copy copies a peer's reason, replacing control bytes and
 * bytes that do not begin a well-formed UTF-8 sequence by '?', and cut to
 * max on a character boundary: the text is valid UTF-8, and encoding it in
 * a reply gives the same text back. */
static void kvc_reason_copy(const char *s, size_t len, char *dst, size_t max)
{
    size_t i = 0, n;

    if (dst == NULL || max == 0) {
        return;
    }
    while (i < len) {
        unsigned char c = (unsigned char)s[i];

        n = kvc_utf8_seq((const unsigned char *)s + i, len - i);
        if (n == 0 || c < 0x20 || c == 0x7f) {
            n = 1;
            c = '?';
        }
        if (i + n + 1 > max) {
            break;
        }
        if (n == 1) {
            dst[i] = (char)c;
        } else {
            memcpy(dst + i, s + i, n);
        }
        i += n;
    }
    dst[i] = '\0';
}

kvx_status_t kvc_reply_decode(const char *buf, size_t len, int *ok_p,
                              char *reason_buf, size_t reason_len)
{
    kvc_reply_info_t info;
    kvx_status_t     status;

    status = kvc_reply_decode_info(buf, len, &info, reason_buf, reason_len);
    if (status == KVX_OK && ok_p != NULL) {
        *ok_p = info.ok;
    }
    return status;
}

kvx_status_t kvc_reply_decode_info(const char *buf, size_t len,
                                   kvc_reply_info_t *info, char *reason_buf,
                                   size_t reason_len)
{
    json_object *jo;
    kvc_obj_t    obj = {0};
    kvc_pv_t     ok_val, err_val = {0}, fenced;
    int          ok;
    kvx_status_t status;

    memset(info, 0, sizeof(*info));

    status = kvc_json_object(kvc_what_reply, buf, len, &jo);
    if (status != KVX_OK) {
        return status;
    }
    obj.jo = jo;
    status = kvc_fld_get(kvc_what_reply, &obj, "ok", "ok", KVC_PV_BOOL, 1,
                         &ok_val);
    ok = status == KVX_OK && ok_val.b;
    if (status == KVX_OK && !ok) {
        status = kvc_fld_get(kvc_what_reply, &obj, "error", "error",
                             KVC_PV_STR, 1, &err_val);
    }
    if (status == KVX_OK) {
        kvc_reason_copy(err_val.s != NULL ? err_val.s : "", err_val.len,
                        reason_buf, reason_len);
        status = kvc_fld_dec_opt(kvc_what_reply, &obj, "instance",
                                 &info->instance);
    }
    if (status == KVX_OK) {
        status = kvc_fld_get(kvc_what_reply, &obj, "fenced", "fenced",
                             KVC_PV_BOOL, 0, &fenced);
    }
    if (status == KVX_OK) {
        uint64_t hold = 0;

        status = kvc_fld_int(kvc_what_reply, &obj, "hold_ms", "hold_ms", 0,
                             UINT32_MAX, &hold, &info->has_hold);
        info->hold_ms = (uint32_t)hold;
    }
    if (status == KVX_OK) {
        info->ok     = ok;
        info->fenced = fenced.type == KVC_PV_BOOL && fenced.b;
    }
    json_object_put(jo);
    return status;
}

char *kvc_hs_request_encode(size_t *len_p)
{
    json_object *obj = json_object_new_object();
    int          rc  = -1;

    if (obj != NULL) {
        rc = kvc_jadd_str(obj, "type", "get_meta");
    }
    if (rc == 0) {
        rc = kvc_jadd_int(obj, "version", KVC_PROTO_VERSION);
    }
    return kvc_json_finish(obj, rc, len_p);
}

kvx_status_t kvc_hs_request_decode(const char *buf, size_t len,
                                   uint32_t *version_p)
{
    json_object *jo;
    kvc_obj_t    obj = {0};
    kvc_pv_t     type;
    uint64_t     version = 0;
    kvx_status_t status;

    status = kvc_json_object(kvc_what_hsreq, buf, len, &jo);
    if (status != KVX_OK) {
        return status;
    }
    obj.jo = jo;
    status = kvc_fld_get(kvc_what_hsreq, &obj, "type", "type", KVC_PV_STR, 1,
                         &type);
    if (status == KVX_OK && strcmp(type.s, "get_meta") != 0) {
        status = kvc_error(KVX_ERR_BAD_MESSAGE,
                           "handshake request: field type: value %.*s: must "
                           "be \"get_meta\"",
                           KVC_VAL(&type));
    }
    if (status == KVX_OK) {
        status = kvc_fld_int(kvc_what_hsreq, &obj, "version", "version", 0,
                             UINT32_MAX, &version, NULL);
    }
    if (status == KVX_OK && version_p != NULL) {
        *version_p = (uint32_t)version;
    }
    json_object_put(jo);
    return status;
}

/* ------------------------------------------------------------------------ */
/* handshake metadata                                                       */
/* ------------------------------------------------------------------------ */

/* Integer fields of kvc_hs_meta_t (all uint32_t) and kvc_geom_t. */
typedef struct kvc_int_field {
    const char *key;
    size_t      offset;
    size_t      size; /* 4 or 8 */
    uint64_t    min, max;
} kvc_int_field_t;

#define KVC_META_U32(key, min, max)                                            \
    { #key, offsetof(kvc_hs_meta_t, key), 4, (min), (max) }

static const kvc_int_field_t kvc_meta_ints[] = {
    KVC_META_U32(version, 0, UINT32_MAX),
    KVC_META_U32(handshake_port, 1, 65535),
    KVC_META_U32(notify_port, 1, 65535),
    KVC_META_U32(dp_rank, 0, INT32_MAX - 1),
    KVC_META_U32(dp_size, 1, INT32_MAX),
    KVC_META_U32(tp_rank, 0, INT32_MAX - 1),
    KVC_META_U32(tp_size, 1, INT32_MAX),
};

#define KVC_GEOM_INT(key, size, min, max)                                      \
    { #key, offsetof(kvc_geom_t, key), (size), (min), (max) }

/* "kind" is handled separately (an enum); "tpb" is transfers_per_block. */
static const kvc_int_field_t kvc_geom_ints[] = {
    KVC_GEOM_INT(num_blocks, 8, 1, KVC_JSON_SAFE_MAX),
    KVC_GEOM_INT(block_len, 8, 1, KVC_JSON_SAFE_MAX),
    KVC_GEOM_INT(block_stride, 8, 0, KVC_JSON_SAFE_MAX),
    KVC_GEOM_INT(kv_stride, 8, 0, KVC_JSON_SAFE_MAX),
    {"tpb", offsetof(kvc_geom_t, transfers_per_block), 4, 1, 2},
    KVC_GEOM_INT(elem_size, 4, 1, 8),
    KVC_GEOM_INT(block_size, 4, 1, INT32_MAX),
    KVC_GEOM_INT(kernel_block_size, 4, 1, INT32_MAX),
    KVC_GEOM_INT(num_kv_heads, 4, 0, INT32_MAX),
    KVC_GEOM_INT(head_size, 4, 0, INT32_MAX),
    KVC_GEOM_INT(head_size_v, 4, 0, INT32_MAX),
    KVC_GEOM_INT(key_only, 4, 0, 1),
    KVC_GEOM_INT(unit_order, 4, 0, 4321),
    KVC_GEOM_INT(head_reps, 4, 0, INT32_MAX),
};


static uint64_t kvc_int_load(const void *base, const kvc_int_field_t *f)
{
    const char *p = (const char *)base + f->offset;
    uint32_t    v32;
    uint64_t    v64;

    if (f->size == 4) {
        memcpy(&v32, p, sizeof(v32));
        return v32;
    }
    memcpy(&v64, p, sizeof(v64));
    return v64;
}

static void kvc_int_store(void *base, const kvc_int_field_t *f, uint64_t v)
{
    char    *p   = (char *)base + f->offset;
    uint32_t v32 = (uint32_t)v;

    if (f->size == 4) {
        memcpy(p, &v32, sizeof(v32));
    } else {
        memcpy(p, &v, sizeof(v));
    }
}

static int kvc_ints_encode(json_object *obj, const void *base,
                           const kvc_int_field_t *fields, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (kvc_jadd_int(obj, fields[i].key,
                         (int64_t)kvc_int_load(base, &fields[i])) != 0) {
            return -1;
        }
    }
    return 0;
}

/* kvc_ints_decode: every field required; prefix names the enclosing
 * object in errors ("" at top level, "layers[3].geom." below). */
static kvx_status_t kvc_ints_decode(const kvc_obj_t *obj, void *base,
                                    const kvc_int_field_t *fields, size_t n,
                                    const char *prefix)
{
    char         field[96];
    uint64_t     v;
    size_t       i;
    kvx_status_t status;

    for (i = 0; i < n; i++) {
        snprintf(field, sizeof(field), "%s%s", prefix, fields[i].key);
        status = kvc_fld_int(kvc_what_meta, obj, fields[i].key, field,
                             fields[i].min, fields[i].max, &v, NULL);
        if (status != KVX_OK) {
            return status;
        }
        kvc_int_store(base, &fields[i], v);
    }
    return KVX_OK;
}

/*
 * kvc_hs_digest: FNV-1a 64 (offset basis 0xcbf29ce484222325, prime
 * 0x100000001b3) over, for each layer in order: the name's bytes followed
 * by one 0x00 byte, kind as a 4-byte and block_len as an 8-byte
 * little-endian value, then block_size, kernel_block_size, elem_size,
 * num_kv_heads, head_size, head_size_v, key_only and transfers_per_block as
 * 4-byte little-endian values. The byte order is fixed, so hosts of either
 * endianness agree. num_blocks, strides, addresses and TP sizes are left
 * out: they may differ between compatible peers.
 */
static uint64_t kvc_fnv_bytes(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t               i;

    for (i = 0; i < len; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static uint64_t kvc_fnv_le(uint64_t h, uint64_t v, size_t nbytes)
{
    unsigned char b[8];
    size_t        i;

    for (i = 0; i < nbytes; i++) {
        b[i] = (unsigned char)(v >> (8 * i));
    }
    return kvc_fnv_bytes(h, b, nbytes);
}

uint64_t kvc_hs_digest(const kvc_hs_layer_t *layers, size_t n)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    size_t   i;

    for (i = 0; i < n; i++) {
        const kvc_hs_layer_t *l = &layers[i];
        const kvc_geom_t     *g = &l->geom;

        h = kvc_fnv_bytes(h, l->name, strnlen(l->name, sizeof(l->name)));
        h = kvc_fnv_le(h, 0, 1);
        h = kvc_fnv_le(h, (uint64_t)g->kind, 4);
        h = kvc_fnv_le(h, g->block_len, 8);
        h = kvc_fnv_le(h, g->block_size, 4);
        h = kvc_fnv_le(h, g->kernel_block_size, 4);
        h = kvc_fnv_le(h, g->elem_size, 4);
        h = kvc_fnv_le(h, g->num_kv_heads, 4);
        h = kvc_fnv_le(h, g->head_size, 4);
        h = kvc_fnv_le(h, g->head_size_v, 4);
        h = kvc_fnv_le(h, g->key_only, 4);
        h = kvc_fnv_le(h, g->transfers_per_block, 4);
    }
    return h;
}

static json_object *kvc_hs_layer_encode(const kvc_hs_layer_t *l)
{
    json_object *obj  = json_object_new_object();
    json_object *geom = json_object_new_object();
    int          rc   = obj != NULL && geom != NULL ? 0 : -1;

    rc = rc ? rc : kvc_jadd_int(geom, "kind", (int64_t)l->geom.kind);
    rc = rc ? rc : kvc_ints_encode(geom, &l->geom, kvc_geom_ints,
                                   KVC_NELEM(kvc_geom_ints));
    rc = rc ? rc : kvc_jadd_str(obj, "name", l->name);
    rc = rc ? rc : kvc_jadd_dec(obj, "base", l->base);
    rc = rc ? rc : kvc_jadd_dec(obj, "length", l->length);
    rc = rc ? rc : kvc_jadd_b64(obj, "rkey", l->rkey, l->rkey_len);
    rc = rc ? rc : kvc_jadd_int(obj, "mem_type", l->mem_type);
    if (rc == 0) {
        rc   = kvc_jadd(obj, "geom", geom);
        geom = NULL;
    }
    json_object_put(geom);
    if (rc != 0) {
        json_object_put(obj);
        return NULL;
    }
    return obj;
}

static int kvc_hs_layers_encode(json_object *obj, const kvc_hs_meta_t *meta)
{
    json_object *list = json_object_new_array_ext((int)meta->num_layers);
    size_t       i;

    if (kvc_jadd(obj, "layers", list) != 0) {
        return -1;
    }
    for (i = 0; i < meta->num_layers; i++) {
        json_object *layer = kvc_hs_layer_encode(&meta->layers[i]);

        if (layer == NULL || json_object_array_add(list, layer) != 0) {
            json_object_put(layer);
            return -1;
        }
    }
    return 0;
}

char *kvc_hs_encode(const kvc_hs_meta_t *meta, size_t *len_p)
{
    json_object *obj;
    int          rc;

    if (meta == NULL || (meta->num_layers > 0 && meta->layers == NULL)) {
        kvc_error(KVX_ERR_INVALID_PARAM, "handshake metadata: no layers");
        return NULL;
    }
    obj = json_object_new_object();
    rc  = obj != NULL ? 0 : -1;
    rc  = rc ? rc : kvc_jadd_str(obj, "type", "meta");
    rc  = rc ? rc : kvc_ints_encode(obj, meta, kvc_meta_ints,
                                    KVC_NELEM(kvc_meta_ints));
    rc  = rc ? rc : kvc_jadd_dec(obj, "digest", meta->digest);
    rc  = rc ? rc : kvc_jadd_str(obj, "engine_id", meta->engine_id);
    rc  = rc ? rc : kvc_jadd_str(obj, "host", meta->host);
    rc  = rc ? rc : kvc_jadd(obj, "is_producer",
                             json_object_new_boolean(meta->is_producer != 0));
    rc  = rc ? rc : kvc_jadd_dec(obj, "epoch", meta->epoch);
    if (meta->session != 0) {
        rc = rc ? rc : kvc_jadd_dec(obj, "session", meta->session);
    }
    rc  = rc ? rc : kvc_jadd_b64(obj, "worker_addr", meta->worker_addr,
                                 meta->worker_addr_len);
    rc  = rc ? rc : kvc_hs_layers_encode(obj, meta);
    return kvc_json_finish(obj, rc, len_p);
}

/* kvc_fld_b64: member `key`, a non-empty base64 string, decoded (owned). */
static kvx_status_t kvc_fld_b64(const kvc_obj_t *obj, const char *key,
                                const char *field, uint8_t **data_p,
                                size_t *len_p)
{
    kvc_pv_t     val;
    char         reason[KVC_ERR_MAX];
    kvx_status_t status;

    status = kvc_fld_get(kvc_what_meta, obj, key, field, KVC_PV_STR, 1, &val);
    if (status != KVX_OK) {
        return status;
    }
    if (val.len == 0) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "handshake metadata: field %s: empty", field);
    }
    status = kvc_b64_decode(val.s, val.len, data_p, len_p);
    if (status != KVX_OK) {
        snprintf(reason, sizeof(reason), "%s", kvc_last_error());
        return kvc_error(status, "handshake metadata: field %s: %s", field,
                         reason);
    }
    return KVX_OK;
}

static kvx_status_t kvc_hs_geom_decode(const kvc_obj_t *layer, size_t idx,
                                       kvc_geom_t *geom)
{
    kvc_pv_t     val;
    kvc_obj_t    obj = {0};
    char         prefix[48], field[64];
    uint64_t     v;
    kvx_status_t status;

    snprintf(prefix, sizeof(prefix), "layers[%zu].geom.", idx);
    snprintf(field, sizeof(field), "layers[%zu].geom", idx);
    status = kvc_fld_get(kvc_what_meta, layer, "geom", field, KVC_PV_OBJECT,
                         1, &val);
    if (status != KVX_OK) {
        return status;
    }
    obj.jo = val.jo;
    snprintf(field, sizeof(field), "%skind", prefix);
    status = kvc_fld_int(kvc_what_meta, &obj, "kind", field,
                         KVC_LAYOUT_KEY_ONLY, KVC_LAYOUT_PACKED, &v, NULL);
    if (status != KVX_OK) {
        return status;
    }
    geom->kind = (kvc_layout_kind_t)v;
    status     = kvc_ints_decode(&obj, geom, kvc_geom_ints,
                                 KVC_NELEM(kvc_geom_ints), prefix);
    if (status == KVX_OK && (geom->elem_size & (geom->elem_size - 1)) != 0) {
        status = kvc_error(KVX_ERR_BAD_MESSAGE,
                           "handshake metadata: field %selem_size: value "
                           "%" PRIu32 ": must be 1, 2, 4 or 8",
                           prefix, geom->elem_size);
    }
    return status;
}

/* kvc_hs_layer_field: "layers[idx].key" into field[64]. */
static const char *kvc_hs_layer_field(char *field, size_t idx, const char *key)
{
    snprintf(field, 64, "layers[%zu].%s", idx, key);
    return field;
}

static kvx_status_t kvc_hs_layer_decode(const kvc_pv_t *layer, size_t idx,
                                        kvc_hs_layer_t *l)
{
    kvc_obj_t    o = {.jo = layer->jo}, *obj = &o;
    kvc_pv_t     name;
    char         f[64];
    uint64_t     v = 0;
    kvx_status_t status;

    if (layer->type != KVC_PV_OBJECT) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "handshake metadata: field layers[%zu]: value %.*s: "
                         "must be an object",
                         idx, KVC_VAL(layer));
    }
    status = kvc_fld_get(kvc_what_meta, obj, "name",
                         kvc_hs_layer_field(f, idx, "name"), KVC_PV_STR, 1,
                         &name);
    status = status ? status
                    : kvc_str_copy(kvc_what_meta, f, &name, l->name,
                                   sizeof(l->name), 1);
    status = status ? status
                    : kvc_fld_dec(kvc_what_meta, obj, "base",
                                  kvc_hs_layer_field(f, idx, "base"),
                                  &l->base);
    status = status ? status
                    : kvc_fld_dec(kvc_what_meta, obj, "length",
                                  kvc_hs_layer_field(f, idx, "length"),
                                  &l->length);
    status = status ? status
                    : kvc_fld_int(kvc_what_meta, obj, "mem_type",
                                  kvc_hs_layer_field(f, idx, "mem_type"),
                                  KVX_MEM_HOST, KVX_MEM_ROCM, &v, NULL);
    l->mem_type = (uint32_t)v;
    status = status ? status
                    : kvc_fld_b64(obj, "rkey",
                                  kvc_hs_layer_field(f, idx, "rkey"), &l->rkey,
                                  &l->rkey_len);
    return status ? status : kvc_hs_geom_decode(obj, idx, &l->geom);
}

static int kvc_layer_name_cmp(const void *a, const void *b)
{
    const kvc_hs_layer_t *const *la = a;
    const kvc_hs_layer_t *const *lb = b;

    return strcmp((*la)->name, (*lb)->name);
}

/* kvc_hs_names_unique: sorts pointers to the layers by name and compares
 * neighbours. */
static kvx_status_t kvc_hs_names_unique(const kvc_hs_meta_t *meta)
{
    const kvc_hs_layer_t **sorted;
    kvx_status_t           status = KVX_OK;
    size_t                 i;

    if (meta->num_layers < 2) {
        return KVX_OK;
    }
    sorted = malloc(meta->num_layers * sizeof(*sorted));
    if (sorted == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "handshake metadata: out of memory");
    }
    for (i = 0; i < meta->num_layers; i++) {
        sorted[i] = &meta->layers[i];
    }
    qsort(sorted, meta->num_layers, sizeof(*sorted), kvc_layer_name_cmp);
    for (i = 1; i < meta->num_layers && status == KVX_OK; i++) {
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            status = kvc_error(KVX_ERR_BAD_MESSAGE,
                               "handshake metadata: field layers[%zu].name: "
                               "value \"%s\": duplicate of layers[%zu]",
                               (size_t)(sorted[i] - meta->layers),
                               sorted[i]->name,
                               (size_t)(sorted[i - 1] - meta->layers));
        }
    }
    free(sorted);
    return status;
}

static kvx_status_t kvc_hs_layers_decode(const kvc_obj_t *obj,
                                         kvc_hs_meta_t *meta)
{
    kvc_pv_t     list, layer;
    kvc_pv_it_t  it = {0};
    size_t       n, i;
    kvx_status_t status;

    status = kvc_fld_get(kvc_what_meta, obj, "layers", "layers",
                         KVC_PV_ARRAY, 1, &list);
    if (status != KVX_OK) {
        return status;
    }
    n = list.len;
    if (n > KVC_HS_MAX_LAYERS) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "handshake metadata: field layers: %zu entries "
                         "exceeds limit %u",
                         n, KVC_HS_MAX_LAYERS);
    }
    if (n > 0) {
        meta->layers = calloc(n, sizeof(*meta->layers));
        if (meta->layers == NULL) {
            return kvc_error(KVX_ERR_NO_MEMORY,
                             "handshake metadata: out of memory for %zu "
                             "layers", n);
        }
    }
    meta->num_layers = n;
    for (i = 0; i < n && status == KVX_OK &&
                kvc_pv_next(&list, &it, &layer);
         i++) {
        status = kvc_hs_layer_decode(&layer, i, &meta->layers[i]);
    }
    return status == KVX_OK ? kvc_hs_names_unique(meta) : status;
}

/* kvc_hs_ident_decode: everything but the layers and the digest check. */
static kvx_status_t kvc_hs_ident_decode(const kvc_obj_t *obj,
                                        kvc_hs_meta_t *m)
{
    kvc_pv_t     val;
    kvx_status_t status;

    status = kvc_ints_decode(obj, m, kvc_meta_ints, KVC_NELEM(kvc_meta_ints),
                             "");
    if (status == KVX_OK && m->tp_rank >= m->tp_size) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "handshake metadata: field tp_rank: value %" PRIu32
                         ": must be below tp_size %" PRIu32,
                         m->tp_rank, m->tp_size);
    }
    if (status == KVX_OK && m->dp_rank >= m->dp_size) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "handshake metadata: field dp_rank: value %" PRIu32
                         ": must be below dp_size %" PRIu32,
                         m->dp_rank, m->dp_size);
    }
    status = status ? status
                    : kvc_fld_dec(kvc_what_meta, obj, "digest", "digest",
                                  &m->digest);
    status = status ? status
                    : kvc_fld_dec(kvc_what_meta, obj, "epoch", "epoch",
                                  &m->epoch);
    status = status ? status
                    : kvc_fld_dec_opt(kvc_what_meta, obj, "session",
                                      &m->session);
    if (status == KVX_OK) {
        /* A hint (READ releases on the data plane): one that is no address
         * this side would send is ignored, not a failed handshake. */
        kvc_pv_t sa;

        if (kvc_obj_get(obj, "seen_as", &sa) && sa.type == KVC_PV_STR &&
            kvc_seen_as_ok(sa.s)) {
            snprintf(m->seen_as, sizeof(m->seen_as), "%s", sa.s);
        }
    }
    status = status ? status
                    : kvc_fld_str(kvc_what_meta, obj, "engine_id", 1,
                                  m->engine_id, sizeof(m->engine_id), 1);
    status = status ? status
                    : kvc_fld_str(kvc_what_meta, obj, "host", 1, m->host,
                                  sizeof(m->host), 0);
    status = status ? status
                    : kvc_fld_get(kvc_what_meta, obj, "is_producer",
                                  "is_producer", KVC_PV_BOOL, 1, &val);
    if (status == KVX_OK) {
        m->is_producer = val.b;
    }
    return status ? status
                  : kvc_fld_b64(obj, "worker_addr", "worker_addr",
                                &m->worker_addr, &m->worker_addr_len);
}

kvx_status_t kvc_hs_decode(const char *buf, size_t len, kvc_hs_meta_t *meta)
{
    json_object  *jo;
    kvc_obj_t     obj = {0};
    kvc_hs_meta_t tmp;
    uint64_t      digest;
    kvx_status_t  status;

    if (meta == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "handshake metadata: meta is NULL");
    }
    memset(meta, 0, sizeof(*meta));
    memset(&tmp, 0, sizeof(tmp));
    status = kvc_json_object(kvc_what_meta, buf, len, &jo);
    if (status != KVX_OK) {
        return status;
    }
    obj.jo = jo;
    status = kvc_hs_ident_decode(&obj, &tmp);
    status = status ? status : kvc_hs_layers_decode(&obj, &tmp);
    json_object_put(jo);
    if (status == KVX_OK) {
        digest = kvc_hs_digest(tmp.layers, tmp.num_layers);
        if (digest != tmp.digest) {
            status = kvc_error(KVX_ERR_BAD_MESSAGE,
                               "handshake metadata: field digest: value "
                               "%" PRIu64 ": digest mismatch, the layers "
                               "give %" PRIu64,
                               tmp.digest, digest);
        }
    }
    if (status != KVX_OK) {
        kvc_hs_fini(&tmp);
        return status;
    }
    *meta = tmp;
    return KVX_OK;
}

/* kvc_seen_as_ok: an address as nng formats a peer's ("ip:port",
 * "[v6]:port"), nothing that needs escaping in JSON. */
int kvc_seen_as_ok(const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;

    if (n == 0 || n >= KVC_SEEN_AS_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strchr("0123456789abcdefABCDEF.:[]", s[i]) == NULL) {
            return 0;
        }
    }
    return 1;
}

char *kvc_hs_with_session(const char *meta, size_t len, uint64_t session,
                          const char *seen_as, size_t *len_p)
{
    char   member[48 + KVC_SEEN_AS_MAX + 16];
    char  *out;
    size_t end = len, n;

    while (end > 0 && meta[end - 1] != '}') {
        end--;
    }
    if (end < 2 || meta[0] != '{') {
        kvc_error(KVX_ERR_INVALID_PARAM, "handshake metadata: not a JSON "
                  "object");
        return NULL;
    }
    /* "{}" takes no separating comma. */
    if (kvc_seen_as_ok(seen_as)) {
        n = (size_t)snprintf(member, sizeof(member),
                             "%s\"session\":\"%" PRIu64 "\",\"seen_as\":"
                             "\"%s\"}", end > 2 ? "," : "", session, seen_as);
    } else {
        n = (size_t)snprintf(member, sizeof(member),
                             "%s\"session\":\"%" PRIu64 "\"}",
                             end > 2 ? "," : "", session);
    }
    out = malloc(end - 1 + n + 1);
    if (out == NULL) {
        kvc_error(KVX_ERR_NO_MEMORY, "handshake metadata: out of memory");
        return NULL;
    }
    memcpy(out, meta, end - 1);
    memcpy(out + end - 1, member, n + 1);
    *len_p = end - 1 + n;
    return out;
}

void kvc_hs_fini(kvc_hs_meta_t *meta)
{
    size_t i;

    if (meta == NULL) {
        return;
    }
    for (i = 0; i < meta->num_layers && meta->layers != NULL; i++) {
        free(meta->layers[i].rkey);
    }
    free(meta->layers);
    free(meta->worker_addr);
    meta->layers          = NULL;
    meta->num_layers      = 0;
    meta->worker_addr     = NULL;
    meta->worker_addr_len = 0;
}

/* ------------------------------------------------------------------------ */
/* base64 (RFC 4648 §4, standard alphabet, padded)                          */
/* ------------------------------------------------------------------------ */

static const char kvc_b64_alpha[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *kvc_b64_encode(const uint8_t *data, size_t len)
{
    size_t i, o = 0;
    char  *out;

    if (len > (SIZE_MAX - 1) / 4 * 3 - 3 || (data == NULL && len > 0)) {
        return NULL;
    }
    out = malloc((len + 2) / 3 * 4 + 1);
    if (out == NULL) {
        return NULL;
    }
    for (i = 0; i < len; i += 3) {
        uint32_t v    = (uint32_t)data[i] << 16;
        size_t   left = len - i;

        v |= left > 1 ? (uint32_t)data[i + 1] << 8 : 0;
        v |= left > 2 ? (uint32_t)data[i + 2] : 0;
        out[o++] = kvc_b64_alpha[(v >> 18) & 63];
        out[o++] = kvc_b64_alpha[(v >> 12) & 63];
        out[o++] = left > 1 ? kvc_b64_alpha[(v >> 6) & 63] : '=';
        out[o++] = left > 2 ? kvc_b64_alpha[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

/* kvc_b64_value: the 6-bit value of c, or -1. */
static int kvc_b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == '+') {
        return 62;
    }
    return c == '/' ? 63 : -1;
}

/* kvc_b64_shape: length a multiple of 4, at most two '=' and only at the
 * end; *pad_p their number. */
static kvx_status_t kvc_b64_shape(const char *text, size_t len, size_t *pad_p)
{
    size_t pad = 0, i;

    if (len % 4 != 0) {
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "base64: length %zu is not a multiple of 4", len);
    }
    while (pad < 2 && pad < len && text[len - 1 - pad] == '=') {
        pad++;
    }
    for (i = 0; i < len - pad; i++) {
        if (kvc_b64_value(text[i]) < 0) {
            unsigned char c = (unsigned char)text[i];

            return kvc_error(KVX_ERR_BAD_MESSAGE,
                             "base64: %s 0x%02x at offset %zu: %s",
                             c == '=' ? "padding" : "character", c, i,
                             c == '=' ? "only allowed in the last two "
                                        "positions"
                                      : "not in the alphabet");
        }
    }
    *pad_p = pad;
    return KVX_OK;
}

kvx_status_t kvc_b64_decode(const char *text, size_t text_len,
                            uint8_t **data_p, size_t *len_p)
{
    size_t       pad = 0, i, o = 0, n;
    uint8_t     *out;
    uint32_t     v = 0;
    kvx_status_t status;

    if (text == NULL && text_len > 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "base64: text is NULL");
    }
    status = kvc_b64_shape(text, text_len, &pad);
    if (status != KVX_OK) {
        return status;
    }
    n   = text_len / 4 * 3; /* pad > 0 only when text_len >= 4 */
    n   = n > pad ? n - pad : 0;
    out = malloc(n + 1);
    if (out == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "base64: out of memory");
    }
    for (i = 0; i < text_len - pad; i++) {
        v = (v << 6) | (uint32_t)kvc_b64_value(text[i]);
        if (i % 4 == 3) {
            out[o++] = (uint8_t)(v >> 16);
            out[o++] = (uint8_t)(v >> 8);
            out[o++] = (uint8_t)v;
            v        = 0;
        }
    }
    /* a padded tail: 2 chars (12 bits, 8 used) or 3 (18 bits, 16 used) */
    if (pad > 0 && (v & (pad == 2 ? 0xfu : 0x3u)) != 0) {
        free(out);
        return kvc_error(KVX_ERR_BAD_MESSAGE,
                         "base64: non-zero unused bits before the padding at "
                         "offset %zu",
                         text_len - pad);
    }
    if (pad == 2) {
        out[o++] = (uint8_t)(v >> 4);
    } else if (pad == 1) {
        out[o++] = (uint8_t)(v >> 10);
        out[o++] = (uint8_t)(v >> 2);
    }
    *data_p = out;
    *len_p  = o;
    return KVX_OK;
}

/* ------------------------------------------------------------------------ */
/* bounded FIFO id set                                                      */
/* ------------------------------------------------------------------------ */

/* The ring keeps insertion order (FIFO eviction); an open-addressing index
 * (linear probing, 2^k >= 2*cap slots holding ring position + 1) makes
 * lookups O(1). Removal shifts the following cluster back, so no
 * tombstones accumulate. */
static uint64_t kvc_idset_hash(const char *id)
{
    uint64_t h = 1469598103934665603ull;

    for (const unsigned char *p = (const unsigned char *)id; *p; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return h;
}

/* kvc_idset_find: the slot of id (hash h), or the empty slot ending its
 * probe chain. A slot's id is compared only when its stored hash matches,
 * so a probe reads the index and the hash array, not the ids. */
static size_t kvc_idset_find(const kvc_idset_t *set, const char *id,
                             uint32_t h)
{
    size_t i = (size_t)h & set->mask;

    while (set->slots[i] != 0 &&
           (set->hash[set->slots[i] - 1] != h ||
            strcmp(set->ids[set->slots[i] - 1], id) != 0)) {
        i = (i + 1) & set->mask;
    }
    return i;
}

static void kvc_idset_unindex(kvc_idset_t *set, size_t pos)
{
    size_t i = kvc_idset_find(set, set->ids[pos], set->hash[pos]), j = i;

    if (set->slots[i] == 0) {
        return;
    }
    set->slots[i] = 0;
    for (;;) {
        size_t home;

        j = (j + 1) & set->mask;
        if (set->slots[j] == 0) {
            return;
        }
        home = (size_t)set->hash[set->slots[j] - 1] & set->mask;
        /* move slot j back to the hole i unless its home lies in (i, j] */
        if ((j > i && (home <= i || home > j)) ||
            (j < i && (home <= i && home > j))) {
            set->slots[i] = set->slots[j];
            set->slots[j] = 0;
            i             = j;
        }
    }
}

kvx_status_t kvc_idset_init(kvc_idset_t *set, size_t cap)
{
    size_t nslots = 16;

    if (set == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "idset: set is NULL");
    }
    memset(set, 0, sizeof(*set));
    if (cap == 0 || cap > KVC_IDSET_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "idset: capacity %zu: must be in 1..%u", cap,
                         KVC_IDSET_MAX);
    }
    while (nslots < 2 * cap) {
        nslots *= 2;
    }
    set->ids   = calloc(cap, sizeof(*set->ids));
    set->slots = calloc(nslots, sizeof(*set->slots));
    set->hash  = calloc(cap, sizeof(*set->hash));
    if (set->ids == NULL || set->slots == NULL || set->hash == NULL) {
        free(set->ids);
        free(set->slots);
        free(set->hash);
        memset(set, 0, sizeof(*set));
        return kvc_error(KVX_ERR_NO_MEMORY, "idset: out of memory for %zu ids",
                         cap);
    }
    set->cap  = cap;
    set->mask = nslots - 1;
    return KVX_OK;
}

void kvc_idset_fini(kvc_idset_t *set)
{
    size_t i;

    if (set == NULL || set->ids == NULL) {
        return;
    }
    for (i = 0; i < set->cap; i++) {
        free(set->ids[i]);
    }
    free(set->ids);
    free(set->slots);
    free(set->hash);
    memset(set, 0, sizeof(*set));
}

kvx_status_t kvc_idset_add(kvc_idset_t *set, const char *id)
{
    char    *copy;
    size_t   slot;
    uint32_t h;

    if (set == NULL || set->ids == NULL || id == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "idset: set not initialised or id is NULL");
    }
    h    = (uint32_t)kvc_idset_hash(id);
    slot = kvc_idset_find(set, id, h);
    if (set->slots[slot] != 0) {
        return KVX_OK;
    }
    copy = strdup(id);
    if (copy == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "idset: out of memory");
    }
    /* when full, head is the oldest entry; unindexing it may move the
     * slot id's probe chain ends at, so find it again after */
    if (set->ids[set->head] != NULL) {
        kvc_idset_unindex(set, set->head);
        free(set->ids[set->head]);
        slot = kvc_idset_find(set, id, h);
    }
    set->ids[set->head]  = copy;
    set->hash[set->head] = h;
    set->slots[slot]     = (uint32_t)set->head + 1;
    set->head            = (set->head + 1) % set->cap;
    if (set->count < set->cap) {
        set->count++;
    }
    return KVX_OK;
}

int kvc_idset_contains(const kvc_idset_t *set, const char *id)
{
    if (set == NULL || set->ids == NULL || id == NULL) {
        return 0;
    }
    return set->slots[kvc_idset_find(set, id,
                                     (uint32_t)kvc_idset_hash(id))] != 0;
}
