// kvu_test_util.h - small helpers shared by the kvu tests.
#ifndef KVU_TEST_UTIL_H
#define KVU_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

// all_eq: every one of the n bytes at p is v.
static inline bool all_eq(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            return false;
        }
    }
    return true;
}

#endif
