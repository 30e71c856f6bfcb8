/*
 * tlsname.c - UCX transport names as UCX compares them.
 */
#include "tlsname.h"

#include <string.h>

int kvc_tl_is(const char *tok, size_t n, const char *name)
{
    size_t len = strlen(name);

    if (n > 0 && tok[0] == '\\') {
        tok++;
        n--;
    }
    if (n > 4 && strncmp(tok + n - 4, ":aux", 4) == 0) {
        n -= 4;
    }
    return n > 0 && n == len && strncmp(tok, name, n) == 0;
}
