/*
 * latency.c - bounded latency sample window (see latency.h).
 */
#include "latency.h"

#include <stdlib.h>
#include <string.h>

void kvc_lat_add(kvc_lat_t *l, uint64_t us)
{
    l->ring[l->count % KVC_LAT_WINDOW] =
        us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    l->count++;
    l->sum_us += us;
    l->max_us  = us > l->max_us ? us : l->max_us;
}

static int kvc_lat_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return (x > y) - (x < y);
}

uint64_t kvc_lat_quantile(const kvc_lat_t *l, double q)
{
    uint32_t s[KVC_LAT_WINDOW];
    size_t   n = l->count < KVC_LAT_WINDOW ? (size_t)l->count : KVC_LAT_WINDOW;
    size_t   rank;

    if (n == 0) {
        return 0;
    }
    memcpy(s, l->ring, n * sizeof(s[0]));
    qsort(s, n, sizeof(s[0]), kvc_lat_cmp);
    q    = q < 0 ? 0 : (q > 1 ? 1 : q);
    rank = (size_t)(q * (double)n + 0.999999); /* nearest rank, 1-based */
    rank = rank < 1 ? 1 : (rank > n ? n : rank);
    return s[rank - 1];
}
