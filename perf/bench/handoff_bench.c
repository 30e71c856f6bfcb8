/*
 * handoff_bench.c - what one thread hand-off costs on this host: the floor
 * under a one-block transfer (perf/README.md, "What a hand-off costs").
 *
 * kvxfer's framework thread and its progress thread hand each transfer to
 * each other: the framework thread posts and sleeps on the engine's
 * condition variable in wait_transfer, the progress thread completes the
 * transfer and broadcasts that condition after it unlocked the engine
 * (kvc_unlock_waking). Two threads here pass a token the same way (lock,
 * wait until it is their turn, flip the turn, unlock, broadcast), so each
 * pass is one wake-up and one sleep. The tool also prints the context
 * switches the process made per pass (getrusage), so what a pass cost can
 * be read against how many switches it took:
 *
 *   same CPU    both threads pinned to one CPU (kvxfer pinned like
 *               nixlbench: each process on its CPU, two threads on it):
 *               every pass is a context switch;
 *   two CPUs    one thread per CPU: every pass is a wake-up across CPUs.
 *
 * Microseconds per pass, min / median / max over REPS timed loops (the
 * median of an even count is the upper one), and context switches per pass
 * of the median loop. The two CPUs are the first two this process may run
 * on (sched_getaffinity).
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
#include <sys/resource.h>
#include <time.h>

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
} hb_arg_t;

typedef struct {
    double us;  /* per pass */
    double csw; /* context switches per pass */
} hb_res_t;

static double hb_now_us(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int hb_cmp(const void *a, const void *b)
{
    double x = ((const hb_res_t *)a)->us, y = ((const hb_res_t *)b)->us;

    return x < y ? -1 : x > y;
}

static long hb_switches(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru); /* every thread of the process */
    return ru.ru_nvcsw + ru.ru_nivcsw;
}

static void *hb_run(void *v)
{
    hb_arg_t  *a = v;
    hb_pair_t *p = a->p;

    for (long i = 0; i < p->passes; i++) {
        pthread_mutex_lock(&p->lock);
        while (p->turn != a->me) {
            pthread_cond_wait(&p->cond, &p->lock);
        }
        p->turn = !a->me;
        pthread_mutex_unlock(&p->lock);
        pthread_cond_broadcast(&p->cond); /* after the unlock, as kvxfer */
    }
    return NULL;
}

/* hb_start: a thread pinned to cpu from its first instruction. */
static int hb_start(pthread_t *t, hb_arg_t *a, int cpu)
{
    pthread_attr_t attr;
    cpu_set_t      set;
    int            rc;

    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if ((rc = pthread_attr_init(&attr)) != 0) {
        return rc;
    }
    rc = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
    if (rc == 0) {
        rc = pthread_create(t, &attr, hb_run, a);
    }
    pthread_attr_destroy(&attr);
    return rc;
}

/* hb_loop: one timed loop of 2 x passes hand-offs between a thread on cpu0
 * and one on cpu1. */
static hb_res_t hb_loop(int cpu0, int cpu1, long passes)
{
    hb_pair_t p;
    hb_arg_t  a[2] = {{&p, 0}, {&p, 1}};
    pthread_t t[2];
    double    t0, t1;
    long      s0, s1;
    int       rc;

    memset(&p, 0, sizeof(p));
    if (pthread_mutex_init(&p.lock, NULL) != 0 ||
        pthread_cond_init(&p.cond, NULL) != 0) {
        fprintf(stderr, "handoff_bench: cannot create the lock\n");
        exit(1);
    }
    p.passes = passes;
    s0       = hb_switches();
    t0       = hb_now_us();
    if ((rc = hb_start(&t[0], &a[0], cpu0)) != 0) {
        fprintf(stderr, "handoff_bench: thread on CPU %d: %s\n", cpu0,
                strerror(rc));
        exit(1);
    }
    if ((rc = hb_start(&t[1], &a[1], cpu1)) != 0) {
        fprintf(stderr, "handoff_bench: thread on CPU %d: %s\n", cpu1,
                strerror(rc));
        exit(1); /* the first thread waits for its partner forever */
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    t1 = hb_now_us();
    s1 = hb_switches();
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    return (hb_res_t){(t1 - t0) / (2.0 * (double)passes),
                      (double)(s1 - s0) / (2.0 * (double)passes)};
}

static void hb_series(const char *name, int cpu0, int cpu1, int reps,
                      long passes)
{
    hb_res_t r[HB_MAX_REPS];

    for (int i = 0; i < reps; i++) {
        r[i] = hb_loop(cpu0, cpu1, passes);
    }
    qsort(r, (size_t)reps, sizeof(r[0]), hb_cmp);
    printf("%-10s CPUs %d,%d  %8.2f / %8.2f / %8.2f us per hand-off, "
           "%.2f context switches per hand-off\n",
           name, cpu0, cpu1, r[0].us, r[reps / 2].us, r[reps - 1].us,
           r[reps / 2].csw);
}

static long hb_arg(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long  v;

    errno = 0;
    v     = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "handoff_bench: %s '%s': must be an integer in "
                "%ld..%ld\n", what, s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int       reps   = argc > 1 ? (int)hb_arg(argv[1], 1, HB_MAX_REPS, "REPS")
                                : 7;
    long      passes = argc > 2 ? hb_arg(argv[2], 1, 1000000000L, "PASSES")
                                : 100000;
    int       cpu[2] = {-1, -1}, n = 0;
    cpu_set_t set;

    if (argc > 3) {
        fprintf(stderr, "usage: %s [REPS 1..%d] [PASSES]\n", argv[0],
                HB_MAX_REPS);
        return 2;
    }
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        perror("handoff_bench: sched_getaffinity");
        return 1;
    }
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++) {
        if (CPU_ISSET(c, &set)) {
            cpu[n++] = c;
        }
    }
    printf("# %d loops of %ld round trips; min / median / max\n", reps,
           passes);
    hb_series("same CPU", cpu[0], cpu[0], reps, passes);
    if (n == 2) {
        hb_series("two CPUs", cpu[0], cpu[1], reps, passes);
    } else {
        printf("two CPUs   (one CPU allowed: not measured)\n");
    }
    return 0;
}
