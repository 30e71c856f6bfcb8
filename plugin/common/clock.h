/*
 * clock.h - the host's clocks (shared services).
 *
 * The engine reads time only through its kvc_clock_t (engine.h), which is
 * this monotonic clock in a real process and the simulator's virtual clock
 * under test; transports that really wait use these functions directly.
 */
#ifndef KVC_CLOCK_H
#define KVC_CLOCK_H

#include <stdint.h>
#include <time.h>

/* kvc_mono_us: CLOCK_MONOTONIC in microseconds. */
uint64_t kvc_mono_us(void);
/* kvc_abs_realtime: the CLOCK_REALTIME instant `ms` from now, for
 * pthread_cond_timedwait. */
void kvc_abs_realtime(struct timespec *ts, uint64_t ms);

#endif
