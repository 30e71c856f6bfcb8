/*
 * timerq.h - a deadline queue for timers (pure, no dependencies beyond
 * error.h): an intrusive binary min-heap keyed by (deadline_us, seq).
 *
 * The user embeds a kvc_timer_t in its own object; the queue holds only
 * pointers to them and never allocates or frees a timer. seq is taken from
 * the queue's counter on every kvc_timerq_set, so timers with equal
 * deadlines pop in the order they were (last) set: the order is a function
 * of the calls alone, which keeps seeded simulator replays deterministic.
 *
 * A zeroed kvc_timer_t is not queued. A timer may be in at most one queue.
 *
 * Threading: not locked; callers lock.
 */
#ifndef KVC_TIMERQ_H
#define KVC_TIMERQ_H

#include "error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvc_timer {
    uint64_t deadline_us;
    uint64_t seq;
    size_t   index; /* 0 = not queued, else heap slot + 1 */
} kvc_timer_t;

typedef struct kvc_timerq {
    kvc_timer_t **heap;
    size_t        n, cap;
    uint64_t      next_seq;
} kvc_timerq_t;

/* kvc_timerq_init makes q an empty queue (allocates nothing). */
void kvc_timerq_init(kvc_timerq_t *q);
/* kvc_timerq_fini frees the heap array only. Timers still queued are not
 * touched and keep their index: cancel or drain them first if they are to
 * be set again (in any queue). */
void kvc_timerq_fini(kvc_timerq_t *q);

/* kvc_timerq_set queues t at deadline_us, or moves it there if it is
 * already queued in q; either way t gets a fresh seq (it goes behind timers
 * already queued at the same deadline). O(log n). KVX_ERR_NO_MEMORY (with
 * kvc_error text) if the array cannot grow; t is then left unqueued. */
kvx_status_t kvc_timerq_set(kvc_timerq_t *q, kvc_timer_t *t,
                            uint64_t deadline_us);
/* kvc_timerq_cancel removes t from q; a no-op if t is not queued.
 * O(log n). */
void kvc_timerq_cancel(kvc_timerq_t *q, kvc_timer_t *t);
/* kvc_timer_queued: nonzero if t is in a queue. */
int  kvc_timer_queued(const kvc_timer_t *t);

/* kvc_timerq_peek returns the earliest timer (not removed), or NULL. */
kvc_timer_t *kvc_timerq_peek(const kvc_timerq_t *q);
/* kvc_timerq_pop_due removes and returns the earliest timer if its deadline
 * is <= now_us, else returns NULL. O(1) when nothing is due. */
kvc_timer_t *kvc_timerq_pop_due(kvc_timerq_t *q, uint64_t now_us);
/* kvc_timerq_size returns the number of queued timers. */
size_t       kvc_timerq_size(const kvc_timerq_t *q);

#endif
