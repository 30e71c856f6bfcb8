/*
 * kvu_guard.h - a kernel filter on the listening sockets UCX opens, so only
 * senders in trusted_remote_hosts can connect to them.
 *
 * Why: UCX's tcp transport copies the payload of a zero-copy put frame to
 * whatever address the frame names, on any connection, with no rkey check
 * (uct_tcp_ep_handle_put_req, 1.13.1 .. 1.22.0; transports/ucx/README.md
 * "Not closed"), and kvxfer cannot filter below UCT. What it can do is keep
 * strangers from connecting at all: with trusted_remote_hosts set, every
 * tcp listening socket a kvxfer worker opens gets a classic BPF socket
 * filter (SO_ATTACH_FILTER) that drops segments from any other source, SYN
 * included, so the handshake never completes and no byte of theirs reaches
 * UCX. Peers that are trusted can still reach the hole; that needs UCX.
 *
 * Finding UCX's sockets: UCP has no call that names an interface's socket,
 * so the listening tcp sockets of the process are listed (/proc/self/fd)
 * before and after ucp_worker_create, under one process-wide lock that
 * every kvxfer worker creation takes, and a new one counts as the worker's
 * only if its port (network order) is in the worker's packed address.
 */
#ifndef KVU_GUARD_H
#define KVU_GUARD_H

#include "error.h"
#include "kvt.h"

#include <linux/filter.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The inodes of the process's listening tcp sockets; kvu_guard_list_free
 * frees. */
typedef struct kvu_guard_list {
    uint64_t *ino;
    size_t    n, cap;
    int       oom; /* an inode did not fit: the list is not whole */
} kvu_guard_list_t;

/* kvu_guard_lock/unlock: around every worker creation (and the lists taken
 * before and after it). */
void kvu_guard_lock(void);
void kvu_guard_unlock(void);

/* kvu_guard_listeners: the listening tcp sockets now (0, or -1 when
 * /proc/self/fd cannot be read or the list does not fit in memory: errno;
 * l is then freed). */
int  kvu_guard_listeners(kvu_guard_list_t *l);
void kvu_guard_list_free(kvu_guard_list_t *l);

/* kvu_guard_prog: the filter admitting sources in nets[0..n) (IPv4
 * networks match IPv4 packets, IPv6 networks IPv6 ones) into prog (max
 * instructions); returns its length, or 0 when max is too small. Pure. */
size_t kvu_guard_prog(const kvt_net_t *nets, size_t n, struct sock_filter *prog,
                      size_t max);

/* kvu_guard_attach_fd: that filter on socket fd (KVX_ERR_INTERNAL naming
 * the socket and errno when the kernel refuses it). */
kvx_status_t kvu_guard_attach_fd(int fd, const kvt_net_t *nets, size_t n);

/* kvu_guard_attach_new: the filter on every listening tcp socket not in
 * before whose port is in the worker address addr (addr_len bytes);
 * ports (may be NULL) gets their local ports, *n_p how many (at most
 * max_ports are written), *others_p (may be NULL) how many new listening
 * sockets were left alone (their port is not in addr: not this worker's,
 * or an address format this does not know). name is for errors. */
kvx_status_t kvu_guard_attach_new(const kvu_guard_list_t *before,
                                  const void *addr, size_t addr_len,
                                  const kvt_net_t *nets, size_t n,
                                  uint16_t *ports, size_t max_ports,
                                  size_t *n_p, size_t *others_p,
                                  const char *name);

#ifdef __cplusplus
}
#endif

#endif
