/*
 * kvp_comm_mpi.c - bootstrap channel over MPI: mpirun -np 2N gives ranks
 * 0..N-1 the prefill TP=N instance and N..2N-1 the decode one; rank r < N
 * pairs with r + N. Rank 0 reports. Only this file calls MPI; kvxfer never
 * does. Waits use non-blocking calls polled with short sleeps, so
 * oversubscribed ranks (more ranks than cores) do not spin.
 */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVP_HAVE_MPI
#include <mpi.h>

typedef struct {
    int rank, size, peer;
} kvp_mpi_t;

static kvp_mpi_t *kvp_mpi(kvp_comm_t *c)
{
    return c->impl;
}

/* Waits for req with a deadline; -2 on timeout. */
static int kvp_mpi_wait(MPI_Request *req, MPI_Status *st, double deadline)
{
    int flag = 0;
    unsigned nap = 1;

    for (;;) {
        if (MPI_Test(req, &flag, st) != MPI_SUCCESS) {
            return -1;
        }
        if (flag) {
            return 0;
        }
        if (kvp_now_us() > deadline) {
            return -2;
        }
        kvp_sleep_us(nap);
        nap = nap < 200 ? nap * 2 : 200;
    }
}

static int kvp_mpi_send(kvp_comm_t *c, uint32_t type, const void *buf,
                        size_t len)
{
    MPI_Request req;

    if (len > (size_t)INT32_MAX) {
        snprintf(c->errmsg, sizeof(c->errmsg), "MPI message too large");
        return -1;
    }
    if (MPI_Isend(buf, (int)len, MPI_BYTE, kvp_mpi(c)->peer, (int)type,
                  MPI_COMM_WORLD, &req) != MPI_SUCCESS ||
        kvp_mpi_wait(&req, MPI_STATUS_IGNORE, kvp_now_us() + 600e6) != 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "MPI send to rank %d failed",
                 kvp_mpi(c)->peer);
        return -1;
    }
    return 0;
}

static int kvp_mpi_recv(kvp_comm_t *c, uint32_t type, void **buf,
                        size_t *len, double timeout_s)
{
    double     deadline = kvp_now_us() + timeout_s * 1e6;
    MPI_Status st;
    int        flag = 0, count;
    unsigned   nap  = 1;
    uint8_t   *p;

    *buf = NULL;
    if (len != NULL) {
        *len = 0;
    }
    for (;;) {
        if (MPI_Iprobe(kvp_mpi(c)->peer, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
                       &st) != MPI_SUCCESS) {
            snprintf(c->errmsg, sizeof(c->errmsg), "MPI_Iprobe failed");
            return -1;
        }
        if (flag) {
            break;
        }
        if (kvp_now_us() > deadline) {
            snprintf(c->errmsg, sizeof(c->errmsg), "MPI receive from rank %d: "
                     "timeout", kvp_mpi(c)->peer);
            return -2;
        }
        kvp_sleep_us(nap);
        nap = nap < 200 ? nap * 2 : 200;
    }
    MPI_Get_count(&st, MPI_BYTE, &count);
    p = malloc((size_t)count + 1);
    if (p == NULL) {
        return -1;
    }
    MPI_Recv(p, count, MPI_BYTE, kvp_mpi(c)->peer, st.MPI_TAG, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    p[count] = '\0';
    if (st.MPI_TAG == KVP_MSG_ABORT) {
        snprintf(c->errmsg, sizeof(c->errmsg), "peer aborted: %s", p);
        free(p);
        return -1;
    }
    if (type != KVP_MSG_ANY && (uint32_t)st.MPI_TAG != type) {
        snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap protocol: expected "
                 "message %u, got %d", type, st.MPI_TAG);
        free(p);
        return -1;
    }
    c->last_type = (uint32_t)st.MPI_TAG;
    *buf = p;
    if (len != NULL) {
        *len = (size_t)count;
    }
    return 0;
}

static int kvp_mpi_pending(kvp_comm_t *c)
{
    int flag = 0;

    MPI_Iprobe(kvp_mpi(c)->peer, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
               MPI_STATUS_IGNORE);
    return flag;
}

static int kvp_mpi_barrier(kvp_comm_t *c, double timeout_s)
{
    MPI_Request req;
    int         rc;

    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) {
        return -1;
    }
    rc = kvp_mpi_wait(&req, MPI_STATUS_IGNORE, kvp_now_us() + timeout_s * 1e6);
    if (rc != 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "MPI barrier: %s",
                 rc == -2 ? "timeout" : "failed");
    }
    return rc;
}

static int kvp_mpi_gather(kvp_comm_t *c, const void *buf, size_t len,
                          void ***bufs, size_t **lens, int *n,
                          double timeout_s)
{
    kvp_mpi_t  *m   = kvp_mpi(c);
    int         mine = (int)len, *counts = NULL, *displs = NULL, total = 0;
    uint8_t    *all = NULL;
    MPI_Request req;
    double      deadline = kvp_now_us() + timeout_s * 1e6;
    int         rc;

    *n = 0;
    if (c->reporter) {
        counts = calloc((size_t)m->size, sizeof(int));
        displs = calloc((size_t)m->size, sizeof(int));
        if (counts == NULL || displs == NULL) {
            free(counts);
            free(displs);
            return -1;
        }
    }
    if (MPI_Igather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD,
                    &req) != MPI_SUCCESS ||
        (rc = kvp_mpi_wait(&req, MPI_STATUS_IGNORE, deadline)) != 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "MPI gather: timeout");
        free(counts);
        free(displs);
        return -1;
    }
    if (c->reporter) {
        for (int i = 0; i < m->size; i++) {
            displs[i] = total;
            total += counts[i];
        }
        all = malloc((size_t)total + 1);
        if (all == NULL) {
            free(counts);
            free(displs);
            return -1;
        }
    }
    if (MPI_Igatherv(buf, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0,
                     MPI_COMM_WORLD, &req) != MPI_SUCCESS ||
        kvp_mpi_wait(&req, MPI_STATUS_IGNORE, deadline) != 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "MPI gatherv: timeout");
        free(counts);
        free(displs);
        free(all);
        return -1;
    }
    if (c->reporter) {
        void  **b = calloc((size_t)m->size, sizeof(*b));
        size_t *l = calloc((size_t)m->size, sizeof(*l));

        if (b == NULL || l == NULL) {
            free(b);
            free(l);
            free(counts);
            free(displs);
            free(all);
            return -1;
        }
        for (int i = 0; i < m->size; i++) {
            b[i] = malloc((size_t)counts[i] + 1);
            if (b[i] != NULL) {
                memcpy(b[i], all + displs[i], (size_t)counts[i]);
                l[i] = (size_t)counts[i];
            }
        }
        *bufs = b;
        *lens = l;
        *n    = m->size;
    }
    free(counts);
    free(displs);
    free(all);
    return 0;
}

static int kvp_mpi_bcast(kvp_comm_t *c, uint64_t *v)
{
    MPI_Request req;

    (void)c;
    if (MPI_Ibcast(v, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req) !=
        MPI_SUCCESS) {
        return -1;
    }
    return kvp_mpi_wait(&req, MPI_STATUS_IGNORE, kvp_now_us() + 120e6);
}

static void kvp_mpi_abort(kvp_comm_t *c, const char *why)
{
    fprintf(stderr, "kvxfer_perf: rank %d aborts the MPI job: %s\n",
            kvp_mpi(c)->rank, why);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void kvp_mpi_close(kvp_comm_t *c)
{
    if (c == NULL) {
        return;
    }
    free(c->impl);
    free(c);
    MPI_Finalize();
}

static const kvp_comm_ops_t kvp_mpi_ops = {
    .send      = kvp_mpi_send,
    .recv      = kvp_mpi_recv,
    .pending   = kvp_mpi_pending,
    .barrier   = kvp_mpi_barrier,
    .gather    = kvp_mpi_gather,
    .bcast_u64 = kvp_mpi_bcast,
    .abort     = kvp_mpi_abort,
    .close     = kvp_mpi_close,
};

int kvp_comm_mpi(int *argc, char ***argv, kvp_comm_t **c_p, char *err,
                 size_t errlen)
{
    kvp_comm_t *c;
    kvp_mpi_t  *m;
    int         provided;

    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) !=
        MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init failed");
        return -1;
    }
    c = calloc(1, sizeof(*c));
    m = calloc(1, sizeof(*m));
    if (c == NULL || m == NULL) {
        free(c);
        free(m);
        snprintf(err, errlen, "out of memory");
        MPI_Finalize();
        return -1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->size);
    if (m->size < 2 || m->size % 2 != 0) {
        snprintf(err, errlen, "--mpi needs an even number of ranks >= 2 "
                 "(first half prefill, second half decode); got %d", m->size);
        free(c);
        free(m);
        MPI_Finalize();
        return -1;
    }
    c->impl     = m;
    c->ops      = &kvp_mpi_ops;
    c->npairs   = (uint32_t)(m->size / 2);
    c->producer = m->rank < m->size / 2;
    c->pair     = (uint32_t)(c->producer ? m->rank : m->rank - m->size / 2);
    m->peer     = c->producer ? m->rank + m->size / 2 : m->rank - m->size / 2;
    c->reporter = m->rank == 0;
    snprintf(c->local_ip, sizeof(c->local_ip), "127.0.0.1");
    *c_p = c;
    return 0;
}

int kvp_have_mpi(void)
{
    return 1;
}

#else

int kvp_comm_mpi(int *argc, char ***argv, kvp_comm_t **c_p, char *err,
                 size_t errlen)
{
    (void)argc;
    (void)argv;
    (void)c_p;
    snprintf(err, errlen, "--mpi: this kvxfer_perf was built without MPI "
             "(install libopenmpi-dev and reconfigure)");
    return -1;
}

int kvp_have_mpi(void)
{
    return 0;
}

#endif
