/*
 * timer_bench.c - what arming a near timer costs on this host: why
 * progress_caller's lease has no timer (perf/README.md, "The lease without
 * its timer").
 *
 * Until the twenty-sixth session, a waiter leaving wait_transfer armed a
 * timerfd for the end of its lease (progress_spin_us then, 50 us ahead; the
 * lease is progress_drive_us since the twenty-eighth session) and the
 * next wait disarmed it: two timerfd_settime calls per transfer. Arming a
 * timer that expires before the CPU's next tick reprograms the CPU's timer
 * device; a paravirtualised guest pays an exit to the hypervisor for that.
 * This tool arms a timerfd AHEAD microseconds in the future and disarms it
 * again, PAIRS times per loop, for several AHEAD values, and prints the
 * cost of one arm + disarm, min / median / max over REPS loops (the median
 * of an even count is the upper one), beside a plain system call
 * (getppid) for scale. A timer beyond the tick (4 ms at HZ=250) costs
 * about two system calls; one tens of microseconds ahead can cost ten
 * times that.
 *
 *   kvxfer_timer_bench [REPS (default 7)] [PAIRS (default 20000)]
 *
 * Run it pinned (taskset -c 1 ...) in a quiet window (uptime).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define TB_MAX_REPS 31

static uint64_t tb_now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int tb_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* tb_set: arm fd at the absolute monotonic time ns (0: disarm). */
static void tb_set(int fd, uint64_t ns)
{
    struct itimerspec its;

    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec  = (time_t)(ns / 1000000000u);
    its.it_value.tv_nsec = (long)(ns % 1000000000u);
    if (timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL) != 0) {
        fprintf(stderr, "timer_bench: timerfd_settime: %s\n", strerror(errno));
        exit(1);
    }
}

/* tb_loop: us per arm + disarm pair, ahead_us > 0; a getppid, ahead_us 0. */
static double tb_loop(int fd, uint64_t ahead_us, long pairs)
{
    uint64_t t0 = tb_now_ns();

    for (long i = 0; i < pairs; i++) {
        if (ahead_us == 0) {
            (void)getppid();
            continue;
        }
        tb_set(fd, tb_now_ns() + ahead_us * 1000u);
        tb_set(fd, 0);
    }
    return (double)(tb_now_ns() - t0) / 1e3 / (double)pairs;
}

static long tb_arg(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long  v;

    errno = 0;
    v     = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "timer_bench: %s '%s': must be an integer in "
                "%ld..%ld\n", what, s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    static const uint64_t ahead[] = {0, 50, 200, 1000, 4000, 10000, 1000000};
    int  reps  = argc > 1 ? (int)tb_arg(argv[1], 1, TB_MAX_REPS, "REPS") : 7;
    long pairs = argc > 2 ? tb_arg(argv[2], 1, 100000000L, "PAIRS") : 20000;
    int  fd;

    if (argc > 3) {
        fprintf(stderr, "usage: %s [REPS 1..%d] [PAIRS]\n", argv[0],
                TB_MAX_REPS);
        return 2;
    }
    fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "timer_bench: timerfd_create: %s\n", strerror(errno));
        return 1;
    }
    for (size_t k = 0; k < sizeof(ahead) / sizeof(ahead[0]); k++) {
        double r[TB_MAX_REPS];

        for (int i = 0; i < reps; i++) {
            r[i] = tb_loop(fd, ahead[k], pairs);
        }
        qsort(r, (size_t)reps, sizeof(r[0]), tb_cmp);
        if (ahead[k] == 0) {
            printf("%-27s %7.2f / %7.2f / %7.2f us\n", "getppid (for scale)",
                   r[0], r[reps / 2], r[reps - 1]);
        } else {
            printf("arm %7llu us ahead+disarm %7.2f / %7.2f / %7.2f us\n",
                   (unsigned long long)ahead[k], r[0], r[reps / 2],
                   r[reps - 1]);
        }
    }
    close(fd);
    return 0;
}
