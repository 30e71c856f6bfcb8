/*
 * evfd.c - the engine's pollable event descriptor (ABI 1.3 event_fd): an
 * eventfd that is readable exactly while the event queue is non-empty, so a
 * framework's event loop (asyncio loop.add_reader, epoll) learns of events
 * without a thread parked in wait_events.
 *
 * Threading: every kvc_evfd_* function is called with engine->lock held,
 * except kvc_evfd_close (destroy, no other thread left). The invariant
 * "counter > 0 iff ev_head != NULL" holds under that lock: the push that
 * makes the queue non-empty signals, the poll that empties it drains.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

void kvc_evfd_signal(struct kvx_engine *eng)
{
    uint64_t one = 1;

    if (eng->ev_fd >= 0 && write(eng->ev_fd, &one, sizeof(one)) < 0 &&
        errno != EAGAIN) {
        kvc_log_error("KVX-EVENT-FD", "event fd write: %s", strerror(errno));
    }
}

void kvc_evfd_drain(struct kvx_engine *eng)
{
    uint64_t v;

    if (eng->ev_fd >= 0 && eng->ev_head == NULL) {
        /* Non-blocking: EAGAIN when already drained. */
        (void)!read(eng->ev_fd, &v, sizeof(v));
    }
}

kvx_status_t kvc_evfd_get(struct kvx_engine *eng, int *fd_p)
{
    if (eng->ev_fd < 0) {
        int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

        if (fd < 0) {
            return kvc_error(KVX_ERR_INTERNAL, "event_fd: eventfd: %s",
                             strerror(errno));
        }
        eng->ev_fd = fd;
        if (eng->ev_head != NULL) {
            kvc_evfd_signal(eng); /* events queued before the first call */
        }
    }
    *fd_p = eng->ev_fd;
    return KVX_OK;
}

void kvc_evfd_close(struct kvx_engine *eng)
{
    if (eng->ev_fd >= 0) {
        close(eng->ev_fd);
        eng->ev_fd = -1;
    }
}
