/*
 * fuzz_utf8.h - the fuzz targets' own UTF-8 oracle (RFC 3629), written
 * independently of the library's so that a defect in one is not mirrored
 * in the check.
 */
#ifndef KVX_FUZZ_UTF8_H
#define KVX_FUZZ_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* fz_utf8_valid: s[0..len) is well-formed UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static inline int fz_utf8_valid(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t               i = 0;

    while (i < len) {
        unsigned c = s[i];
        size_t   need;
        uint32_t cp, min;

        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0) {
            need = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            need = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            need = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (len - i <= need) {
            return 0;
        }
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                return 0;
            }
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return 0;
        }
        i += need + 1;
    }
    return 1;
}

#endif
