/*
 * kvu_guard.h - a kernel filter on the listening sockets UCX opens, so only
 * senders in trusted_remote_hosts can connect to them.
 *
 * Why: UCX's tcp transport copies the payload of a zero-copy put frame to
 * whatever address the frame names, on any connection, with no rkey check
 * (uct_tcp_ep_handle_put_req, 1.13.1 .. 1.22.0; transports/ucx/README.md
 * "Narrowed, not closed"), and kvxfer cannot filter below UCT. What it can do is keep
 * strangers from connecting at all: with trusted_remote_hosts set, every
 * tcp listening socket a kvxfer worker opens gets a classic BPF socket
 * filter (SO_ATTACH_FILTER) that drops segments from any other source, SYN
 * included, so the handshake never completes and no byte of theirs reaches
 * UCX. Peers that are trusted can still reach the hole; that needs UCX.
 *
 * Finding UCX's sockets: UCP has no call that names an interface's socket,
 * so the listening tcp sockets of the process are listed (/proc/self/fd)
 * before and after ucp_worker_create, under kvt_listen_lock (every kvxfer
 * worker and nng listener is created under it), and a new one counts as
 * the worker's only if its port (network order) and, unless it is bound to
 * a wildcard or loopback address, that address are in the worker's packed
 * address. New
 * listeners none of which is the worker's fail the worker (it would run
 * unguarded). Connections completed before the filter went on are closed
 * (kvu_guard_sweep).
 */
#ifndef KVU_GUARD_H
#define KVU_GUARD_H

#include "error.h"
#include "kvt.h"

#include <linux/filter.h>
#include <sys/socket.h>
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

/* kvu_guard_attach_fd: that filter on socket fd (KVX_ERR_CONFIG naming
 * trusted_remote_hosts when the program is too long for the kernel or for
 * net.core.optmem_max, KVX_ERR_INTERNAL naming the socket and errno when
 * the kernel refuses it otherwise). */
kvx_status_t kvu_guard_attach_fd(int fd, const kvt_net_t *nets, size_t n);

/* kvu_guard_admits: is the address sa (AF_INET, AF_INET6; an IPv4-mapped
 * IPv6 address counts as its IPv4 one) in one of nets[0..n)? Pure. */
int kvu_guard_admits(const kvt_net_t *nets, size_t n,
                     const struct sockaddr *sa);

/* kvu_guard_sweep: after the filter went on listening socket lfd, close
 * what came in before it: connections waiting in its accept queue
 * (accepted here and closed; lfd must be non-blocking, else they are left)
 * and accepted connections to its address from outside nets (shut down).
 * Returns how many. */
size_t kvu_guard_sweep(int lfd, const kvt_net_t *nets, size_t n);

/* What kvu_guard_attach_new did. */
typedef struct kvu_guard_report {
    uint16_t ports[8]; /* local ports filtered (the first 8) */
    size_t   found;    /* listening sockets filtered */
    size_t   others;   /* new listening sockets left alone (not this
                          worker's as far as its address tells) */
    size_t   closed;   /* connections closed by kvu_guard_sweep */
} kvu_guard_report_t;

/* kvu_guard_attach_new: the filter (and kvu_guard_sweep) on every listening
 * tcp socket not in before whose port, and address unless a wildcard, are
 * in the worker address addr (addr_len bytes). When the worker may listen
 * (its UCX context may use tcp), new listening sockets none of which is the
 * worker's are an error (KVX_ERR_TRANSPORT: the worker would run
 * unguarded). name is for errors. */
kvx_status_t kvu_guard_attach_new(const kvu_guard_list_t *before,
                                  const void *addr, size_t addr_len,
                                  const kvt_net_t *nets, size_t n,
                                  int may_listen, kvu_guard_report_t *rep,
                                  const char *name);

#ifdef __cplusplus
}
#endif

#endif
