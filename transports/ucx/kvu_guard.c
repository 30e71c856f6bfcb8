/*
 * kvu_guard.c - the kernel filter on UCX's listening tcp sockets
 * (kvu_guard.h says why and how the sockets are found).
 */
#define _GNU_SOURCE
#include "kvu_guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* kvu_guard_tcp: is fd a tcp socket, listening (want_listen) or not? Its
 * inode into *ino. */
static int kvu_guard_tcp(int fd, int want_listen, uint64_t *ino)
{
    struct stat st;
    int         v = 0;
    socklen_t   vl = sizeof(v);

    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        return 0;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &vl) != 0 ||
        v != IPPROTO_TCP) {
        return 0;
    }
    vl = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) != 0 ||
        (v != 0) != (want_listen != 0)) {
        return 0;
    }
    *ino = (uint64_t)st.st_ino;
    return 1;
}

/* kvu_guard_each: fn(fd, inode, arg) for every tcp socket of the process
 * that is listening (want_listen) or not; stops at a non-zero return. -1
 * (errno) when the list cannot be read. fn gets a duplicate of the
 * process's descriptor, checked and closed here: what fn does (getsockname,
 * setsockopt, accept, shutdown) goes to the socket that was checked, even
 * if another thread closes the original number and it is reused. */
static int kvu_guard_each(int want_listen,
                          int (*fn)(int fd, uint64_t ino, void *arg),
                          void *arg)
{
    DIR           *d = opendir("/proc/self/fd");
    struct dirent *e;
    int            dfd;

    if (d == NULL) {
        return -1;
    }
    dfd = dirfd(d);
    while ((e = readdir(d)) != NULL) {
        char    *end;
        long     fd = strtol(e->d_name, &end, 10);
        uint64_t ino;
        int      dup_fd, stop;

        if (e->d_name[0] == '.' || *end != '\0' || fd < 0 || fd > INT_MAX ||
            fd == dfd) {
            continue;
        }
        dup_fd = fcntl((int)fd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0) {
            continue; /* closed meanwhile */
        }
        stop = kvu_guard_tcp(dup_fd, want_listen, &ino) &&
               fn(dup_fd, ino, arg);
        close(dup_fd);
        if (stop) {
            break;
        }
    }
    closedir(d);
    return 0;
}

static int kvu_guard_add(int fd, uint64_t ino, void *arg)
{
    kvu_guard_list_t *l = arg;

    (void)fd;
    if (l->n == l->cap) {
        size_t    cap = l->cap ? l->cap * 2 : 16;
        uint64_t *p   = realloc(l->ino, cap * sizeof(*p));

        if (p == NULL) {
            l->oom = 1;
            return 1;
        }
        l->ino = p;
        l->cap = cap;
    }
    l->ino[l->n++] = ino;
    return 0;
}

int kvu_guard_listeners(kvu_guard_list_t *l)
{
    memset(l, 0, sizeof(*l));
    if (kvu_guard_each(1, kvu_guard_add, l) != 0 || l->oom) {
        int err = l->oom ? ENOMEM : errno;

        kvu_guard_list_free(l);
        errno = err;
        return -1;
    }
    return 0;
}

void kvu_guard_list_free(kvu_guard_list_t *l)
{
    free(l->ino);
    memset(l, 0, sizeof(*l));
}

/* --- the program ---------------------------------------------------------
 * A socket filter on a tcp socket sees the segment from its tcp header on;
 * SKF_NET_OFF reaches the IP header. Returning 0 drops the segment (a
 * dropped SYN never completes a connection); 0xffffffff keeps it whole.
 * The source address is loaded once into scratch memory (a load at a
 * negative offset is a helper call once the kernel converts the program to
 * eBPF, charged against net.core.optmem_max; a scratch load is one
 * instruction), then compared per network:
 *
 *     ldb  [net + 0]; rsh #4               IP version
 *     jeq  #4, v4, 0; ja v6
 *   v4: ld [net + 12]; st M[0]
 *     per IPv4 network: ld M[0]; (and #mask); jeq #addr, 0, 1; ret #-1
 *     ret #0
 *   v6: jeq #6, 0, drop
 *     ld [net + 8 + 4w]; st M[w]           w = 0..3
 *     per IPv6 network, per 32-bit word of its prefix:
 *         ld M[w]; (and #mask); jeq #word, 0, next network
 *       ret #-1
 *   drop: ret #0
 * ("and" only for a partial word.) Every conditional jump is local (at most
 * 12 ahead), so the 8-bit jump offsets of classic BPF hold any number of
 * networks. */

#define KVU_NET(off) ((uint32_t)(SKF_NET_OFF + (off)))

typedef struct {
    struct sock_filter *p;
    size_t              n, max;
} kvu_prog_t;

static void kvu_emit(kvu_prog_t *g, uint16_t code, uint8_t jt, uint8_t jf,
                     uint32_t k)
{
    if (g->n < g->max) {
        g->p[g->n].code = code;
        g->p[g->n].jt   = jt;
        g->p[g->n].jf   = jf;
        g->p[g->n].k    = k;
    }
    g->n++;
}

/* kvu_patch: the jf (or, jt != 0, the jt) of instruction at to jump to
 * instruction target; the k of an unconditional ja. */
static void kvu_patch(kvu_prog_t *g, size_t at, size_t target, int jt)
{
    if (at >= g->max) {
        return;
    }
    if (g->p[at].code == (BPF_JMP | BPF_JA)) {
        g->p[at].k = (uint32_t)(target - at - 1);
    } else if (jt) {
        g->p[at].jt = (uint8_t)(target - at - 1);
    } else {
        g->p[at].jf = (uint8_t)(target - at - 1);
    }
}

/* kvu_word: 32 bits of a network address from byte 4w, and its mask. */
static void kvu_word(const kvt_net_t *net, unsigned w, uint32_t *val,
                     uint32_t *mask)
{
    uint32_t bits = net->prefix > 32 * w ? net->prefix - 32 * w : 0;

    if (bits > 32) {
        bits = 32;
    }
    *mask = bits == 0 ? 0 : bits == 32 ? 0xffffffffu
                                       : ~((1u << (32 - bits)) - 1u);
    *val = ((uint32_t)net->addr[4 * w] << 24 |
            (uint32_t)net->addr[4 * w + 1] << 16 |
            (uint32_t)net->addr[4 * w + 2] << 8 |
            (uint32_t)net->addr[4 * w + 3]) & *mask;
}

/* kvu_emit_net: one network's test against the source address in M[0..]:
 * ret #-1 when it matches, else on to what follows. */
static void kvu_emit_net(kvu_prog_t *g, const kvt_net_t *net)
{
    unsigned words = net->family == 4 ? 1 : 4;
    size_t   jeq[4];
    unsigned nj = 0;

    for (unsigned w = 0; w < words; w++) {
        uint32_t val, mask;

        kvu_word(net, w, &val, &mask);
        if (mask == 0) {
            continue;
        }
        kvu_emit(g, BPF_LD | BPF_MEM, 0, 0, w);
        if (mask != 0xffffffffu) {
            kvu_emit(g, BPF_ALU | BPF_AND | BPF_K, 0, 0, mask);
        }
        jeq[nj++] = g->n;
        kvu_emit(g, BPF_JMP | BPF_JEQ | BPF_K, 0, 0, val);
    }
    kvu_emit(g, BPF_RET | BPF_K, 0, 0, 0xffffffffu);
    for (unsigned j = 0; j < nj; j++) {
        kvu_patch(g, jeq[j], g->n, 0); /* no match: the next network */
    }
}

size_t kvu_guard_prog(const kvt_net_t *nets, size_t n, struct sock_filter *prog,
                      size_t max)
{
    kvu_prog_t g = {prog, 0, max};
    size_t     to_v6, to_drop;

    kvu_emit(&g, BPF_LD | BPF_B | BPF_ABS, 0, 0, KVU_NET(0));
    kvu_emit(&g, BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4);
    kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 4); /* 4: past the ja */
    to_v6 = g.n;
    kvu_emit(&g, BPF_JMP | BPF_JA, 0, 0, 0);
    kvu_emit(&g, BPF_LD | BPF_W | BPF_ABS, 0, 0, KVU_NET(12));
    kvu_emit(&g, BPF_ST, 0, 0, 0);
    for (size_t i = 0; i < n; i++) {
        if (nets[i].family == 4) {
            kvu_emit_net(&g, &nets[i]);
        }
    }
    kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0);
    kvu_patch(&g, to_v6, g.n, 0);
    kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 6); /* 6: past the ja */
    to_drop = g.n;
    kvu_emit(&g, BPF_JMP | BPF_JA, 0, 0, 0);
    for (unsigned w = 0; w < 4; w++) {
        kvu_emit(&g, BPF_LD | BPF_W | BPF_ABS, 0, 0, KVU_NET(8 + 4 * w));
        kvu_emit(&g, BPF_ST, 0, 0, w);
    }
    for (size_t i = 0; i < n; i++) {
        if (nets[i].family == 6) {
            kvu_emit_net(&g, &nets[i]);
        }
    }
    kvu_patch(&g, to_drop, g.n, 0);
    kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0);
    return g.n <= max ? g.n : 0;
}

int kvu_guard_admits(const kvt_net_t *nets, size_t n,
                     const struct sockaddr *sa)
{
    uint8_t a[16] = {0};
    int     fam;

    if (sa->sa_family == AF_INET) {
        memcpy(a, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        fam = 4;
    } else if (sa->sa_family == AF_INET6) {
        const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};

        if (memcmp(b, mapped, sizeof(mapped)) == 0) {
            memcpy(a, b + 12, 4); /* an IPv4 peer of a dual-stack socket */
            fam = 4;
        } else {
            memcpy(a, b, 16);
            fam = 6;
        }
    } else {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        int match = nets[i].family == fam;

        for (unsigned w = 0; match && w < (fam == 4 ? 1u : 4u); w++) {
            uint32_t val, mask, x;

            kvu_word(&nets[i], w, &val, &mask);
            x = (uint32_t)a[4 * w] << 24 | (uint32_t)a[4 * w + 1] << 16 |
                (uint32_t)a[4 * w + 2] << 8 | (uint32_t)a[4 * w + 3];
            match = (x & mask) == val;
        }
        if (match) {
            return 1;
        }
    }
    return 0;
}

kvx_status_t kvu_guard_attach_fd(int fd, const kvt_net_t *nets, size_t n)
{
    size_t              max = 24 + 13 * n;
    struct sock_filter *p   = calloc(max, sizeof(*p));
    struct sock_fprog   fp;
    size_t              len;
    int                 rc, err;

    if (p == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "socket filter: out of memory");
    }
    len = kvu_guard_prog(nets, n, p, max);
    if (len == 0 || len > BPF_MAXINSNS) {
        free(p);
        return kvc_error(KVX_ERR_CONFIG, "trusted_remote_hosts: %zu "
                         "networks make a socket filter longer than the "
                         "kernel takes (%d instructions)", n, BPF_MAXINSNS);
    }
    fp.len    = (unsigned short)len;
    fp.filter = p;
    rc  = setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fp, sizeof(fp));
    err = errno;
    free(p);
    if (rc != 0 && err == ENOMEM) {
        return kvc_error(KVX_ERR_CONFIG, "trusted_remote_hosts: the socket "
                         "filter of its %zu networks (%zu instructions) does "
                         "not fit in the kernel's socket option memory "
                         "(net.core.optmem_max): fewer networks, or wider "
                         "CIDR ranges", n, len);
    }
    if (rc != 0) {
        return kvc_error(KVX_ERR_INTERNAL, "socket %d: SO_ATTACH_FILTER: %s",
                         fd, strerror(err));
    }
    return KVX_OK;
}

/* --- closing what came in before the filter ------------------------------
 * A connection the kernel completed before the filter was attached is a
 * socket of its own without it: in the listener's accept queue, or
 * accepted by UCX already (its async thread accepts at once). No
 * legitimate peer can know a port that was opened a moment ago (the worker
 * address is not published yet), so what waits in the queue is accepted
 * here and closed, and what UCX accepted from outside the networks is shut
 * down (UCX sees the connection end). Once the queue is empty nothing
 * unfiltered can follow: the last segment of every later handshake passes
 * the filter. */

typedef struct {
    const struct sockaddr_storage *local;
    const kvt_net_t               *nets;
    size_t                         n, closed;
} kvu_sweep_t;

static int kvu_same_local(const struct sockaddr_storage *a,
                          const struct sockaddr_storage *l)
{
    if (a->ss_family != l->ss_family) {
        return 0;
    }
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)l;

        return x->sin_port == y->sin_port &&
               (y->sin_addr.s_addr == htonl(INADDR_ANY) ||
                x->sin_addr.s_addr == y->sin_addr.s_addr);
    }
    {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)l;

        return x->sin6_port == y->sin6_port &&
               (IN6_IS_ADDR_UNSPECIFIED(&y->sin6_addr) ||
                memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0);
    }
}

static int kvu_sweep_one(int fd, uint64_t ino, void *arg)
{
    kvu_sweep_t            *w = arg;
    struct sockaddr_storage la, pa;
    socklen_t               ll = sizeof(la), pl = sizeof(pa);

    (void)ino;
    if (getsockname(fd, (struct sockaddr *)&la, &ll) != 0 ||
        !kvu_same_local(&la, w->local) ||
        getpeername(fd, (struct sockaddr *)&pa, &pl) != 0 ||
        kvu_guard_admits(w->nets, w->n, (struct sockaddr *)&pa)) {
        return 0;
    }
    (void)shutdown(fd, SHUT_RDWR);
    w->closed++;
    return 0;
}

size_t kvu_guard_sweep(int lfd, const kvt_net_t *nets, size_t n)
{
    struct sockaddr_storage local;
    socklen_t               ll = sizeof(local);
    kvu_sweep_t             w  = {&local, nets, n, 0};
    int                     fl = fcntl(lfd, F_GETFL);

    if (getsockname(lfd, (struct sockaddr *)&local, &ll) != 0) {
        return 0;
    }
    /* The accept queue: only a non-blocking listener (UCX's are) can be
     * drained without the risk of waiting for its next connection. */
    while (fl >= 0 && (fl & O_NONBLOCK)) {
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

        if (c < 0) {
            if (errno == EINTR) {
                continue;
            }
            break; /* EAGAIN: empty */
        }
        close(c);
        w.closed++;
    }
    (void)kvu_guard_each(0, kvu_sweep_one, &w);
    return w.closed;
}

/* --- this worker's listeners ---------------------------------------------- */

typedef struct {
    const kvu_guard_list_t *before;
    const uint8_t          *addr;
    size_t                  addr_len;
    const kvt_net_t        *nets;
    size_t                  n;
    uint16_t               *ports;
    size_t                  max_ports, found, others, closed;
    kvx_status_t            st;
} kvu_guard_new_t;

/* kvu_has: are the k bytes b somewhere in the len bytes of a? */
static int kvu_has(const uint8_t *a, size_t len, const void *b, size_t k)
{
    for (size_t i = 0; i + k <= len; i++) {
        if (memcmp(a + i, b, k) == 0) {
            return 1;
        }
    }
    return 0;
}

static int kvu_guard_one(int fd, uint64_t ino, void *arg)
{
    kvu_guard_new_t        *a = arg;
    struct sockaddr_storage ss;
    socklen_t               sl = sizeof(ss);
    uint16_t                port;
    int                     mine;

    for (size_t i = 0; i < a->before->n; i++) {
        if (a->before->ino[i] == ino) {
            return 0;
        }
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        return 0;
    }
    /* This worker's: its port (network order) and, bound to an address,
     * that address are both in the worker address UCX packed (a loopback
     * interface's address is not: UCX describes it by host and network
     * namespace instead). */
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        uint32_t            ip = ntohl(in->sin_addr.s_addr);

        port = in->sin_port;
        mine = kvu_has(a->addr, a->addr_len, &port, 2) &&
               (ip == INADDR_ANY || (ip >> 24) == 127 ||
                kvu_has(a->addr, a->addr_len, &in->sin_addr, 4));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

        port = in6->sin6_port;
        mine = kvu_has(a->addr, a->addr_len, &port, 2) &&
               (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) ||
                IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
                kvu_has(a->addr, a->addr_len, &in6->sin6_addr, 16));
    } else {
        return 0;
    }
    if (!mine) {
        a->others++;
        return 0;
    }
    a->st = kvu_guard_attach_fd(fd, a->nets, a->n);
    if (a->st != KVX_OK) {
        return 1;
    }
    a->closed += kvu_guard_sweep(fd, a->nets, a->n);
    if (a->ports != NULL && a->found < a->max_ports) {
        a->ports[a->found] = ntohs(port);
    }
    a->found++;
    return 0;
}

kvx_status_t kvu_guard_attach_new(const kvu_guard_list_t *before,
                                  const void *addr, size_t addr_len,
                                  const kvt_net_t *nets, size_t n,
                                  int may_listen, kvu_guard_report_t *rep,
                                  const char *name)
{
    kvu_guard_new_t a = {before, addr, addr_len, nets, n, rep->ports,
                         sizeof(rep->ports) / sizeof(rep->ports[0]),
                         0, 0, 0, KVX_OK};

    if (kvu_guard_each(1, kvu_guard_one, &a) != 0) {
        return kvc_error(KVX_ERR_INTERNAL, "%s: trusted_remote_hosts: "
                         "/proc/self/fd: %s: cannot find UCX's listening "
                         "sockets to filter", name, strerror(errno));
    }
    if (a.st != KVX_OK) {
        return kvc_error(a.st, "%s: trusted_remote_hosts on UCX's listening "
                         "socket: %s", name, kvc_last_error());
    }
    rep->found  = a.found;
    rep->others = a.others;
    rep->closed = a.closed;
    if (may_listen && a.found == 0 && a.others > 0) {
        /* Listening sockets appeared and none is this worker's as far as
         * its address tells: a UCX whose address format hides the port, or
         * another thread's; either way this worker's cannot be told. */
        return kvc_error(KVX_ERR_TRANSPORT, "%s: trusted_remote_hosts: %zu "
                         "tcp listening socket(s) appeared while UCX created "
                         "the worker and none carries a port of its address: "
                         "cannot tell which to filter, so the worker is not "
                         "started unguarded", name, a.others);
    }
    return KVX_OK;
}
