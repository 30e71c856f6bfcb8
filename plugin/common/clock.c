/*
 * clock.c - the host's clocks.
 */
#define _GNU_SOURCE
#include "clock.h"
#include "kvt.h"

#include <sys/random.h>
#include <unistd.h>

uint64_t kvc_mono_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void kvc_abs_realtime(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static uint64_t kvt_real_now(void *arg)
{
    (void)arg;
    return kvc_mono_us();
}

static uint64_t kvt_real_random(void *arg)
{
    uint64_t        v = 0;
    struct timespec ts;

    (void)arg;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        v = kvc_mono_us() ^ ((uint64_t)getpid() << 32);
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u)
               << 12 |
           (v & 0xfffu);
}

static uint64_t kvt_real_stamp(void *arg)
{
    struct timespec ts;

    (void)arg;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u)
               << 12 |
           0xfffu;
}

static void kvt_real_wait(void *arg, pthread_cond_t *cond,
                          pthread_mutex_t *lock, uint64_t deadline_us)
{
    uint64_t        now = kvc_mono_us();
    struct timespec ts;

    (void)arg;
    if (deadline_us <= now) {
        return;
    }
    kvc_abs_realtime(&ts, (deadline_us - now + 999) / 1000);
    pthread_cond_timedwait(cond, lock, &ts);
}

const kvt_clock_t *kvt_real_clock(void)
{
    static const kvt_clock_t clock = {
        .now_us   = kvt_real_now,
        .random64 = kvt_real_random,
        .stamp    = kvt_real_stamp,
        .stamp_shift = 12,
        .wait     = kvt_real_wait,
        .arg      = NULL,
    };

    return &clock;
}
