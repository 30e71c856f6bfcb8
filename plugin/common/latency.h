/*
 * latency.h - a bounded latency sample window (pure, no locking): the last
 * KVC_LAT_WINDOW samples in microseconds, with count, sum and max over all.
 */
#ifndef KVC_LATENCY_H
#define KVC_LATENCY_H

#include <stddef.h>
#include <stdint.h>

#define KVC_LAT_WINDOW 256

typedef struct kvc_lat {
    uint32_t ring[KVC_LAT_WINDOW];
    uint64_t count, sum_us, max_us;
} kvc_lat_t;

void     kvc_lat_add(kvc_lat_t *l, uint64_t us);
/* kvc_lat_quantile: the q-quantile (0..1, nearest rank) of the window;
 * 0 when empty. */
uint64_t kvc_lat_quantile(const kvc_lat_t *l, double q);

#endif
