/*
 * handoff_bench.c - what one thread hand-off costs on this host: the floor
 * under a one-block transfer (perf/README.md, "What a hand-off costs").
 *
 * kvxfer's framework thread and its progress thread hand each transfer to
 * each other through the engine's mutex and condition variable: the
 * framework thread posts and sleeps in wait_transfer, the progress thread
 * completes the transfer and wakes it. Two threads here pass a token the
 * same way (lock, wait until it is their turn, flip the turn, broadcast,
 * unlock), so each pass is one wake-up and one sleep:
 *
 *   same CPU    both threads pinned to one CPU (kvxfer pinned like
 *               nixlbench: each process on its CPU, two threads on it):
 *               every pass is a context switch;
 *   two CPUs    one thread per CPU: every pass is a wake-up across CPUs.
 *
 * Microseconds per pass, min / median / max over REPS timed loops.
 *
 *   kvxfer_handoff_bench [REPS (default 7)] [PASSES (default 100000)]
 *
 * Run it in a quiet window (uptime), on a machine with two CPUs or more.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HB_MAX_REPS 31

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    int             turn;
    long            passes;
} hb_pair_t;

typedef struct {
    hb_pair_t *p;
    int        me;
    int        cpu;
    int        err; /* pthread_setaffinity_np's error, 0 if pinned */
} hb_arg_t;

static double hb_now_us(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int hb_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static void *hb_run(void *v)
{
    hb_arg_t  *a = v;
    hb_pair_t *p = a->p;
    cpu_set_t  set;

    CPU_ZERO(&set);
    CPU_SET(a->cpu, &set);
    a->err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    for (long i = 0; i < p->passes; i++) {
        pthread_mutex_lock(&p->lock);
        while (p->turn != a->me) {
            pthread_cond_wait(&p->cond, &p->lock);
        }
        p->turn = !a->me;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* hb_loop: one timed loop of 2 x passes hand-offs between a thread on cpu0
 * and one on cpu1; microseconds per hand-off, or -1. */
static double hb_loop(int cpu0, int cpu1, long passes)
{
    hb_pair_t p;
    hb_arg_t  a[2] = {{&p, 0, cpu0, 0}, {&p, 1, cpu1, 0}};
    pthread_t t[2];
    double    t0, t1;
    int       rc0, rc1;

    memset(&p, 0, sizeof(p));
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    p.passes = passes;
    t0       = hb_now_us();
    rc0      = pthread_create(&t[0], NULL, hb_run, &a[0]);
    rc1      = rc0 == 0 ? pthread_create(&t[1], NULL, hb_run, &a[1]) : rc0;
    if (rc1 != 0) {
        fprintf(stderr, "handoff_bench: pthread_create: %s\n", strerror(rc1));
        exit(1); /* a thread may wait for its partner forever */
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    t1 = hb_now_us();
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    if (a[0].err != 0 || a[1].err != 0) {
        fprintf(stderr, "handoff_bench: cannot pin to CPUs %d and %d: %s\n",
                cpu0, cpu1, strerror(a[0].err != 0 ? a[0].err : a[1].err));
        return -1;
    }
    return (t1 - t0) / (2.0 * (double)passes);
}

static int hb_series(const char *name, int cpu0, int cpu1, int reps,
                     long passes)
{
    double us[HB_MAX_REPS];

    for (int r = 0; r < reps; r++) {
        if ((us[r] = hb_loop(cpu0, cpu1, passes)) < 0) {
            return -1;
        }
    }
    qsort(us, (size_t)reps, sizeof(us[0]), hb_cmp);
    printf("%-10s CPUs %d,%d  %8.2f / %8.2f / %8.2f us per hand-off\n", name,
           cpu0, cpu1, us[0], us[reps / 2], us[reps - 1]);
    return 0;
}

int main(int argc, char **argv)
{
    int  reps   = argc > 1 ? atoi(argv[1]) : 7;
    long passes = argc > 2 ? atol(argv[2]) : 100000;
    long ncpu   = sysconf(_SC_NPROCESSORS_ONLN);
    int  rc     = 0;

    if (reps < 1 || reps > HB_MAX_REPS || passes < 1) {
        fprintf(stderr, "usage: %s [REPS 1..%d] [PASSES >= 1]\n", argv[0],
                HB_MAX_REPS);
        return 2;
    }
    printf("# %d loops of %ld round trips; min / median / max\n", reps,
           passes);
    rc |= hb_series("same CPU", 0, 0, reps, passes);
    if (ncpu >= 2) {
        rc |= hb_series("two CPUs", 0, 1, reps, passes);
    } else {
        printf("two CPUs   (one CPU online: not measured)\n");
    }
    return rc != 0;
}
