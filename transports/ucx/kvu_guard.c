/*
 * kvu_guard.c - the kernel filter on UCX's listening tcp sockets
 * (kvu_guard.h says why and how the sockets are found).
 */
#define _GNU_SOURCE
#include "kvu_guard.h"

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t kvu_guard_mu = PTHREAD_MUTEX_INITIALIZER;

void kvu_guard_lock(void)
{
    pthread_mutex_lock(&kvu_guard_mu);
}

void kvu_guard_unlock(void)
{
    pthread_mutex_unlock(&kvu_guard_mu);
}

/* kvu_guard_is_listener: is fd a listening tcp socket? Its inode into
 * *ino. */
static int kvu_guard_is_listener(int fd, uint64_t *ino)
{
    struct stat st;
    int         v = 0;
    socklen_t   vl = sizeof(v);

    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        return 0;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) != 0 || v == 0) {
        return 0;
    }
    vl = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &vl) != 0 ||
        v != IPPROTO_TCP) {
        return 0;
    }
    *ino = (uint64_t)st.st_ino;
    return 1;
}

/* kvu_guard_each: fn(fd, inode, arg) for every listening tcp socket of the
 * process; stops at a non-zero return. -1 (errno) when the list cannot be
 * read. */
static int kvu_guard_each(int (*fn)(int fd, uint64_t ino, void *arg),
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

        if (e->d_name[0] == '.' || *end != '\0' || fd < 0 || fd == dfd) {
            continue;
        }
        if (kvu_guard_is_listener((int)fd, &ino) && fn((int)fd, ino, arg)) {
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
    if (kvu_guard_each(kvu_guard_add, l) != 0 || l->oom) {
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
 *
 *     ldb  [net + 0]; rsh #4          IP version
 *     jeq  #4, v4, 0; ja v6
 *   v4: per IPv4 network: ld [net + 12]; and #mask; jeq #addr, 0, 1; ret #-1
 *     ret #0
 *   v6: jeq #6, 0, drop
 *     per IPv6 network, per 32-bit word of its prefix:
 *         ld [net + 8 + 4w]; and #mask; jeq #word, 0, next network
 *       ret #-1
 *     ret #0
 * Every conditional jump is local (at most 10 ahead), so the 8-bit jump
 * offsets of classic BPF hold any number of networks. */

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

size_t kvu_guard_prog(const kvt_net_t *nets, size_t n, struct sock_filter *prog,
                      size_t max)
{
    kvu_prog_t g = {prog, 0, max};
    size_t     ja;

    kvu_emit(&g, BPF_LD | BPF_B | BPF_ABS, 0, 0, KVU_NET(0));
    kvu_emit(&g, BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4);
    kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 4);
    ja = g.n;
    kvu_emit(&g, BPF_JMP | BPF_JA, 0, 0, 0); /* k: below */
    for (size_t i = 0; i < n; i++) {
        uint32_t val, mask;

        if (nets[i].family != 4) {
            continue;
        }
        kvu_word(&nets[i], 0, &val, &mask);
        kvu_emit(&g, BPF_LD | BPF_W | BPF_ABS, 0, 0, KVU_NET(12));
        kvu_emit(&g, BPF_ALU | BPF_AND | BPF_K, 0, 0, mask);
        kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, val);
        kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0xffffffffu);
    }
    kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0);
    if (ja < g.max) {
        g.p[ja].k = (uint32_t)(g.n - ja - 1);
    }
    kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 6);
    kvu_emit(&g, BPF_JMP | BPF_JA, 0, 0, 0); /* jf of the jeq: below */
    {
        size_t drop_ja = g.n - 1;

        if (drop_ja - 1 < g.max) {
            g.p[drop_ja - 1].jt = 1; /* 6: past the ja */
        }
        for (size_t i = 0; i < n; i++) {
            unsigned words[4], nw = 0;

            if (nets[i].family != 6) {
                continue;
            }
            for (unsigned w = 0; w < 4; w++) {
                uint32_t val, mask;

                kvu_word(&nets[i], w, &val, &mask);
                if (mask != 0) {
                    words[nw++] = w;
                }
            }
            for (unsigned j = 0; j < nw; j++) {
                uint32_t val, mask;

                kvu_word(&nets[i], words[j], &val, &mask);
                kvu_emit(&g, BPF_LD | BPF_W | BPF_ABS, 0, 0,
                         KVU_NET(8 + 4 * words[j]));
                kvu_emit(&g, BPF_ALU | BPF_AND | BPF_K, 0, 0, mask);
                kvu_emit(&g, BPF_JMP | BPF_JEQ | BPF_K, 0,
                         (uint8_t)(3 * (nw - 1 - j) + 1), val);
            }
            kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0xffffffffu);
        }
        if (drop_ja < g.max) {
            g.p[drop_ja].k = (uint32_t)(g.n - drop_ja - 1);
        }
        kvu_emit(&g, BPF_RET | BPF_K, 0, 0, 0);
    }
    return g.n <= max ? g.n : 0;
}

kvx_status_t kvu_guard_attach_fd(int fd, const kvt_net_t *nets, size_t n)
{
    size_t              max = 8 + 13 * n;
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
                         "kernel takes", n);
    }
    fp.len    = (unsigned short)len;
    fp.filter = p;
    rc  = setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fp, sizeof(fp));
    err = errno;
    free(p);
    if (rc != 0) {
        return kvc_error(KVX_ERR_INTERNAL, "socket %d: SO_ATTACH_FILTER: %s",
                         fd, strerror(err));
    }
    return KVX_OK;
}

typedef struct {
    const kvu_guard_list_t *before;
    const uint8_t          *addr;
    size_t                  addr_len;
    const kvt_net_t        *nets;
    size_t                  n;
    uint16_t               *ports;
    size_t                  max_ports, found, others;
    kvx_status_t            st;
} kvu_guard_new_t;

static int kvu_guard_one(int fd, uint64_t ino, void *arg)
{
    kvu_guard_new_t        *a = arg;
    struct sockaddr_storage ss;
    socklen_t               sl = sizeof(ss);
    uint16_t                port;
    const uint8_t          *pb;
    int                     in_addr = 0;

    for (size_t i = 0; i < a->before->n; i++) {
        if (a->before->ino[i] == ino) {
            return 0;
        }
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        return 0;
    }
    if (ss.ss_family == AF_INET) {
        port = ((struct sockaddr_in *)&ss)->sin_port;
    } else if (ss.ss_family == AF_INET6) {
        port = ((struct sockaddr_in6 *)&ss)->sin6_port;
    } else {
        return 0;
    }
    pb = (const uint8_t *)&port; /* network order */
    for (size_t i = 0; i + 1 < a->addr_len && !in_addr; i++) {
        in_addr = a->addr[i] == pb[0] && a->addr[i + 1] == pb[1];
    }
    if (!in_addr) {
        a->others++;
        return 0;
    }
    a->st = kvu_guard_attach_fd(fd, a->nets, a->n);
    if (a->st != KVX_OK) {
        return 1;
    }
    if (a->ports != NULL && a->found < a->max_ports) {
        a->ports[a->found] = ntohs(port);
    }
    a->found++;
    return 0;
}

kvx_status_t kvu_guard_attach_new(const kvu_guard_list_t *before,
                                  const void *addr, size_t addr_len,
                                  const kvt_net_t *nets, size_t n,
                                  uint16_t *ports, size_t max_ports,
                                  size_t *n_p, size_t *others_p,
                                  const char *name)
{
    kvu_guard_new_t a = {before, addr, addr_len, nets, n, ports, max_ports,
                         0, 0, KVX_OK};

    if (kvu_guard_each(kvu_guard_one, &a) != 0) {
        return kvc_error(KVX_ERR_INTERNAL, "%s: trusted_remote_hosts: "
                         "/proc/self/fd: %s: cannot find UCX's listening "
                         "sockets to filter", name, strerror(errno));
    }
    if (a.st != KVX_OK) {
        return kvc_error(a.st, "%s: trusted_remote_hosts on UCX's listening "
                         "socket: %s", name, kvc_last_error());
    }
    if (n_p != NULL) {
        *n_p = a.found;
    }
    if (others_p != NULL) {
        *others_p = a.others;
    }
    return KVX_OK;
}
