/*
 * fuzz.h - shared by the fuzz targets of tests/fuzz (see README.md).
 *
 * Each target defines LLVMFuzzerTestOneInput. Built with clang's libFuzzer
 * it is fuzzed; built with any compiler and replay.c it replays a corpus.
 * FZ_CHECK aborts with the failed invariant, which libFuzzer reports as a
 * crash and saves the input.
 */
#ifndef KVX_FUZZ_H
#define KVX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__,     \
                    __LINE__, #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            abort();                                                       \
        }                                                                  \
    } while (0)

/* fz_cstr: a NUL-terminated malloc'd copy of data[0..size) (the decoders
 * that take C strings see the bytes up to the first NUL). */
static inline char *fz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);

    if (s == NULL) {
        abort();
    }
    if (size > 0) {
        memcpy(s, data, size);
    }
    s[size] = '\0';
    return s;
}

/* fz_reader_t: structured values taken from the front of the input; past
 * its end every read is 0. */
typedef struct fz_reader {
    const uint8_t *p;
    size_t         n;
} fz_reader_t;

static inline uint64_t fz_take(fz_reader_t *r, unsigned bytes)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < bytes; i++) {
        v <<= 8;
        if (r->n > 0) {
            v |= *r->p++;
            r->n--;
        }
    }
    return v;
}

#endif
