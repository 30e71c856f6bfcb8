/*
 * timerq.c - deadline queue: intrusive binary min-heap of timers keyed by
 * (deadline_us, seq) (see timerq.h).
 *
 * Threading: not locked; callers lock.
 */
#include "timerq.h"

#include <assert.h>
#include <stdlib.h>

#define KVC_TIMERQ_MIN_CAP 16

/* a before b: earlier deadline, or the same deadline and set earlier. */
static int kvc_timer_before(const kvc_timer_t *a, const kvc_timer_t *b)
{
    if (a->deadline_us != b->deadline_us) {
        return a->deadline_us < b->deadline_us;
    }
    return a->seq < b->seq;
}

/* Put t in slot i and record the slot in t. */
static void kvc_timerq_place(kvc_timerq_t *q, size_t i, kvc_timer_t *t)
{
    q->heap[i] = t;
    t->index   = i + 1;
}

/* Move the timer in slot i towards the root while it is before its parent;
 * returns its final slot. */
static size_t kvc_timerq_sift_up(kvc_timerq_t *q, size_t i)
{
    kvc_timer_t *t = q->heap[i];

    while (i > 0) {
        size_t parent = (i - 1) / 2;

        if (!kvc_timer_before(t, q->heap[parent])) {
            break;
        }
        kvc_timerq_place(q, i, q->heap[parent]);
        i = parent;
    }
    kvc_timerq_place(q, i, t);
    return i;
}

/* Move the timer in slot i towards the leaves while a child is before it. */
static void kvc_timerq_sift_down(kvc_timerq_t *q, size_t i)
{
    kvc_timer_t *t = q->heap[i];

    for (;;) {
        size_t left = 2 * i + 1;
        size_t child;

        if (left >= q->n) {
            break;
        }
        child = left;
        if (left + 1 < q->n &&
            kvc_timer_before(q->heap[left + 1], q->heap[left])) {
            child = left + 1;
        }
        if (!kvc_timer_before(q->heap[child], t)) {
            break;
        }
        kvc_timerq_place(q, i, q->heap[child]);
        i = child;
    }
    kvc_timerq_place(q, i, t);
}

/* Restore the heap order around slot i after its key changed. */
static void kvc_timerq_fix(kvc_timerq_t *q, size_t i)
{
    if (kvc_timerq_sift_up(q, i) == i) {
        kvc_timerq_sift_down(q, i);
    }
}

static kvx_status_t kvc_timerq_grow(kvc_timerq_t *q)
{
    size_t        cap;
    kvc_timer_t **heap;

    if (q->cap > SIZE_MAX / 2 / sizeof(*heap)) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "timerq: cannot grow past %zu timers", q->cap);
    }
    cap  = q->cap ? q->cap * 2 : KVC_TIMERQ_MIN_CAP;
    heap = realloc(q->heap, cap * sizeof(*heap));
    if (heap == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "timerq: out of memory growing to %zu timers", cap);
    }
    q->heap = heap;
    q->cap  = cap;
    return KVX_OK;
}

void kvc_timerq_init(kvc_timerq_t *q)
{
    q->heap     = NULL;
    q->n        = 0;
    q->cap      = 0;
    q->next_seq = 0;
}

void kvc_timerq_fini(kvc_timerq_t *q)
{
    free(q->heap);
    kvc_timerq_init(q);
}

kvx_status_t kvc_timerq_set(kvc_timerq_t *q, kvc_timer_t *t,
                            uint64_t deadline_us)
{
    if (t->index != 0) {
        size_t i = t->index - 1;

        assert(i < q->n && q->heap[i] == t);
        t->deadline_us = deadline_us;
        t->seq         = q->next_seq++;
        kvc_timerq_fix(q, i);
        return KVX_OK;
    }
    if (q->n == q->cap) {
        kvx_status_t st = kvc_timerq_grow(q);

        if (st != KVX_OK) {
            return st;
        }
    }
    t->deadline_us = deadline_us;
    t->seq         = q->next_seq++;
    kvc_timerq_place(q, q->n, t);
    q->n++;
    kvc_timerq_sift_up(q, q->n - 1);
    return KVX_OK;
}

void kvc_timerq_cancel(kvc_timerq_t *q, kvc_timer_t *t)
{
    size_t i;

    if (t->index == 0) {
        return;
    }
    i = t->index - 1;
    assert(i < q->n && q->heap[i] == t);
    t->index = 0;
    q->n--;
    if (i == q->n) {
        return; /* it was the last slot: nothing moves */
    }
    /* The last timer fills the hole; it may belong above or below it. */
    kvc_timerq_place(q, i, q->heap[q->n]);
    kvc_timerq_fix(q, i);
}

int kvc_timer_queued(const kvc_timer_t *t)
{
    return t->index != 0;
}

kvc_timer_t *kvc_timerq_peek(const kvc_timerq_t *q)
{
    return q->n ? q->heap[0] : NULL;
}

kvc_timer_t *kvc_timerq_pop_due(kvc_timerq_t *q, uint64_t now_us)
{
    kvc_timer_t *t = kvc_timerq_peek(q);

    if (t == NULL || t->deadline_us > now_us) {
        return NULL;
    }
    kvc_timerq_cancel(q, t);
    return t;
}

size_t kvc_timerq_size(const kvc_timerq_t *q)
{
    return q->n;
}
