/*
 * pci.c - PCI bus ids.
 */
#include "pci.h"

#include <ctype.h>
#include <string.h>

/* kvc_pci_hex reads exactly n hex digits at *s into *out and advances *s. */
static int kvc_pci_hex(const char **s, int n, unsigned *out)
{
    unsigned v = 0;

    for (int i = 0; i < n; i++) {
        char c = (*s)[i];

        if (!isxdigit((unsigned char)c)) {
            return -1;
        }
        v = v * 16u + (unsigned)(isdigit((unsigned char)c)
                                     ? c - '0'
                                     : tolower((unsigned char)c) - 'a' + 10);
    }
    *s += n;
    *out = v;
    return 0;
}

int kvc_busid_parse(const char *s, unsigned *domain, unsigned *bus,
                           unsigned *dev, unsigned *func)
{
    unsigned d = 0, b, v, f;

    if (s == NULL) {
        return -1;
    }
    /* The domain "dddd:" is there exactly when the text has 12 characters. */
    if (strlen(s) == 12 && (kvc_pci_hex(&s, 4, &d) != 0 || *s++ != ':')) {
        return -1;
    }
    if (kvc_pci_hex(&s, 2, &b) != 0 || *s++ != ':' ||
        kvc_pci_hex(&s, 2, &v) != 0 || *s++ != '.' ||
        kvc_pci_hex(&s, 1, &f) != 0 || *s != '\0' || v > 0x1f || f > 7) {
        return -1;
    }
    if (domain != NULL) {
        *domain = d;
    }
    if (bus != NULL) {
        *bus = b;
    }
    if (dev != NULL) {
        *dev = v;
    }
    if (func != NULL) {
        *func = f;
    }
    return 0;
}
