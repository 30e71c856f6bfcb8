/*
 * jsonw.h - an append-only JSON writer for the hot paths that build a
 * message per transfer (a producer's kv_transfer_params response): one
 * growing buffer, no object tree. Its output is byte for byte what json-c's
 * json_object_to_json_string_ext(JSON_C_TO_STRING_PLAIN) prints for the
 * same members in the same order (strings escaped as json-c escapes them,
 * '/' included), so readers and tests see no difference; test
 * JsonW.* compares the two.
 *
 * Usage: kvc_jw_t w = KVC_JW_INIT; kvc_jw_open(&w, '{'); kvc_jw_key(&w,
 * "a"); kvc_jw_int(&w, 1); ... kvc_jw_close(&w, '}'); char *s =
 * kvc_jw_take(&w) (NULL if any step ran out of memory; the caller frees s).
 * Commas are placed by the writer. kvc_jw_fini frees an unfinished buffer.
 * Setting w.noslash prints '/' unescaped, as json-c does with
 * JSON_C_TO_STRING_NOSLASHESCAPE.
 *
 * Threading: pure, any thread; a writer belongs to one thread.
 */
#ifndef KVC_JSONW_H
#define KVC_JSONW_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvc_jw {
    char  *buf;
    size_t len, cap;
    int    oom;     /* a step ran out of memory: kvc_jw_take gives NULL */
    int    comma;   /* the next member or element needs a ',' first */
    int    noslash; /* '/' as it is (JSON_C_TO_STRING_NOSLASHESCAPE) */
} kvc_jw_t;

#define KVC_JW_INIT {NULL, 0, 0, 0, 0, 0}

void  kvc_jw_open(kvc_jw_t *w, char bracket);  /* '{' or '[' */
void  kvc_jw_close(kvc_jw_t *w, char bracket); /* '}' or ']' */
void  kvc_jw_key(kvc_jw_t *w, const char *key);
void  kvc_jw_str(kvc_jw_t *w, const char *s);
void  kvc_jw_int(kvc_jw_t *w, int64_t v);
void  kvc_jw_uint(kvc_jw_t *w, uint64_t v);
void  kvc_jw_bool(kvc_jw_t *w, int v);
char *kvc_jw_take(kvc_jw_t *w);
void  kvc_jw_fini(kvc_jw_t *w);

#endif
