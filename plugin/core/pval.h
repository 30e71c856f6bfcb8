/*
 * pval.h - one view of a JSON value whether json-c parsed it or the flat
 * reader found it in the message text, and the flat reader itself.
 *
 * kv_transfer_params arrive with every request, on both sides, and json-c
 * builds a tree of allocated objects for them: about 3 us for D's params of
 * one block, over 1 ms for 4,096 block ids (perf/README.md, "Parsing
 * without json-c"). Most params are one object of strings without escapes, small
 * integers, booleans and lists of them. kvc_flat_scan reads exactly that
 * subset of JSON in place, with no allocation, and refuses everything else,
 * which the caller then gives to json-c. What it accepts, json-c parses to
 * the same values: the subset is defined so that no byte is read
 * differently (no escapes, no bytes outside printable ASCII in strings, no
 * numbers but -?(0|[1-9][0-9]{0,17}), only lowercase true/false/null,
 * nothing after the object but JSON whitespace).
 *
 * Threading: pure functions, any thread.
 */
#ifndef KVC_PVAL_H
#define KVC_PVAL_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVC_PV_NULL = 0,
    KVC_PV_BOOL,
    KVC_PV_INT,
    KVC_PV_STR,
    KVC_PV_ARRAY,
    KVC_PV_OBJECT, /* json-c's only: the flat reader takes none */
    KVC_PV_OTHER   /* a double */
} kvc_pv_type_t;

typedef struct kvc_pv {
    kvc_pv_type_t type;
    int           b;    /* BOOL */
    int64_t       i;    /* INT, as json_object_get_int64 */
    uint64_t      u;    /* INT, as json_object_get_uint64 (0 if negative) */
    const char   *s;    /* STR: its bytes, not NUL-terminated in flat text */
    size_t        len;  /* STR: bytes; ARRAY: elements */
    const char   *text; /* flat: the value's JSON text (text_len bytes) */
    size_t        text_len;
    json_object  *jo;   /* json-c's value; NULL for a flat one */
} kvc_pv_t;

/* kvc_pv_it_t walks an array's elements (zero it first). */
typedef struct kvc_pv_it {
    size_t      idx;
    const char *pos;
} kvc_pv_it_t;

/* kvc_pv_from_json fills *v from a json-c value (NULL is JSON null). */
void kvc_pv_from_json(json_object *jo, kvc_pv_t *v);

/* kvc_pv_next gives arr's next element in *e: 1, or 0 after the last. */
int kvc_pv_next(const kvc_pv_t *arr, kvc_pv_it_t *it, kvc_pv_t *e);

/* kvc_pv_show gives v as JSON text for an error message: *len_p bytes at
 * the returned pointer (owned by v's message or json-c value). */
const char *kvc_pv_show(const kvc_pv_t *v, int *len_p);

typedef struct kvc_flat_member {
    const char *key; /* not NUL-terminated */
    size_t      key_len;
    kvc_pv_t    val;
} kvc_flat_member_t;

/*
 * kvc_flat_scan reads json[0..len) (no NUL needed) as one object whose
 * members' values are strings, integers, booleans, null or arrays of those, all in
 * the subset above, with at most max members; a NUL byte is outside it.
 * 1: m[0..*n_p) are its members in document order (keys may repeat). 0: json is outside the
 * subset (or not JSON at all); nothing is reported, the caller parses it
 * with json-c, which gives the error if there is one.
 */
int kvc_flat_scan(const char *json, size_t len, kvc_flat_member_t *m,
                  size_t max, size_t *n_p);

#endif
