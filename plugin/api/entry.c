/*
 * entry.c - the only exported symbol of libkvxfer.so.
 */
#include "api.h"

__attribute__((visibility("default"))) const kvx_api_t *
kvx_get_api(uint32_t abi_major)
{
    if (abi_major != KVX_ABI_MAJOR) {
        return NULL;
    }
    return kvc_api_table();
}
