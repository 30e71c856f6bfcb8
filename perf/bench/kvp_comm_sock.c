/*
 * kvp_comm_sock.c - the benchmark's own bootstrap channel over one stream
 * socket (TCP between a server and a client, like ucx_perftest's side
 * socket, or a socketpair between the two threads of loopback mode).
 *
 * Frames: {u32 magic, u32 type, u64 len} + len bytes. Rank 0 is P, rank 1
 * is D; D is the reporter.
 */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVP_MAGIC 0x4b565046u /* "KVPF" */
#define KVP_MAX_FRAME (1ull << 31)

typedef struct {
    uint32_t magic, type;
    uint64_t len;
} kvp_frame_t;

typedef struct {
    int fd;
} kvp_sock_t;

static int kvp_sock_fd(kvp_comm_t *c)
{
    return ((kvp_sock_t *)c->impl)->fd;
}

static int kvp_io_wait(int fd, short ev, double deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = ev};
        double        left = deadline - kvp_now_us();
        int           rc;

        if (left <= 0) {
            return -2;
        }
        rc = poll(&pfd, 1, left > 1e9 ? 1000000 : (int)(left / 1000) + 1);
        if (rc > 0) {
            return 0;
        }
        if (rc < 0 && errno != EINTR) {
            return -1;
        }
    }
}

static int kvp_write_all(kvp_comm_t *c, const void *buf, size_t len)
{
    const uint8_t *p  = buf;
    int            fd = kvp_sock_fd(c);
    double         deadline = kvp_now_us() + 600e6;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (kvp_io_wait(fd, POLLOUT, deadline) != 0) {
                break;
            }
            continue;
        }
        snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap send: %s",
                 n == 0 ? "closed" : strerror(errno));
        return -1;
    }
    if (len > 0) {
        snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap send: timeout");
        return -1;
    }
    return 0;
}

static int kvp_read_all(kvp_comm_t *c, void *buf, size_t len, double deadline)
{
    uint8_t *p  = buf;
    int      fd = kvp_sock_fd(c);

    while (len > 0) {
        int     rc = kvp_io_wait(fd, POLLIN, deadline);
        ssize_t n;

        if (rc != 0) {
            snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap receive: %s",
                     rc == -2 ? "timeout" : strerror(errno));
            return rc;
        }
        n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            snprintf(c->errmsg, sizeof(c->errmsg),
                     "bootstrap receive: peer closed the connection");
            return -1;
        } else if (errno != EINTR && errno != EAGAIN) {
            snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap receive: %s",
                     strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int kvp_sock_send(kvp_comm_t *c, uint32_t type, const void *buf,
                         size_t len)
{
    kvp_frame_t h = {.magic = KVP_MAGIC, .type = type, .len = len};

    if (kvp_write_all(c, &h, sizeof(h)) != 0) {
        return -1;
    }
    return len ? kvp_write_all(c, buf, len) : 0;
}

static int kvp_sock_recv(kvp_comm_t *c, uint32_t type, void **buf,
                         size_t *len, double timeout_s)
{
    double      deadline = kvp_now_us() + timeout_s * 1e6;
    kvp_frame_t h;
    uint8_t    *p;
    int         rc;

    *buf = NULL;
    if (len != NULL) {
        *len = 0;
    }
    rc = kvp_read_all(c, &h, sizeof(h), deadline);
    if (rc != 0) {
        return rc;
    }
    if (h.magic != KVP_MAGIC || h.len > KVP_MAX_FRAME) {
        snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap: bad frame");
        return -1;
    }
    p = malloc(h.len + 1);
    if (p == NULL) {
        snprintf(c->errmsg, sizeof(c->errmsg), "bootstrap: out of memory");
        return -1;
    }
    rc = kvp_read_all(c, p, h.len, deadline + 10e6);
    if (rc != 0) {
        free(p);
        return rc;
    }
    p[h.len] = '\0';
    if (h.type == KVP_MSG_ABORT) {
        snprintf(c->errmsg, sizeof(c->errmsg), "peer aborted: %s", p);
        free(p);
        return -1;
    }
    if (type != KVP_MSG_ANY && h.type != type) {
        snprintf(c->errmsg, sizeof(c->errmsg),
                 "bootstrap protocol: expected message %u, got %u", type,
                 h.type);
        free(p);
        return -1;
    }
    c->last_type = h.type;
    *buf = p;
    if (len != NULL) {
        *len = h.len;
    }
    return 0;
}

static int kvp_sock_pending(kvp_comm_t *c)
{
    struct pollfd pfd = {.fd = kvp_sock_fd(c), .events = POLLIN};

    return poll(&pfd, 1, 0) > 0;
}

static int kvp_sock_barrier(kvp_comm_t *c, double timeout_s)
{
    void *b;

    if (kvp_sock_send(c, KVP_MSG_BARRIER, NULL, 0) != 0 ||
        kvp_sock_recv(c, KVP_MSG_BARRIER, &b, NULL, timeout_s) != 0) {
        return -1;
    }
    free(b);
    return 0;
}

static int kvp_sock_gather(kvp_comm_t *c, const void *buf, size_t len,
                           void ***bufs, size_t **lens, int *n,
                           double timeout_s)
{
    void  *peer;
    size_t plen;
    void **b;
    size_t *l;

    *n = 0;
    if (!c->reporter) {
        return kvp_sock_send(c, KVP_MSG_GATHER, buf, len);
    }
    if (kvp_sock_recv(c, KVP_MSG_GATHER, &peer, &plen, timeout_s) != 0) {
        return -1;
    }
    b = calloc(2, sizeof(*b));
    l = calloc(2, sizeof(*l));
    if (b == NULL || l == NULL || (b[1] = malloc(len ? len : 1)) == NULL) {
        free(b);
        free(l);
        free(peer);
        return -1;
    }
    /* rank order: P (rank 0), D (rank 1) */
    b[0] = peer;
    l[0] = plen;
    memcpy(b[1], buf, len);
    l[1] = len;
    *bufs = b;
    *lens = l;
    *n    = 2;
    return 0;
}

static int kvp_sock_bcast(kvp_comm_t *c, uint64_t *v)
{
    void *b;
    size_t len;

    if (c->producer) {
        return kvp_sock_send(c, KVP_MSG_BCAST, v, sizeof(*v));
    }
    if (kvp_sock_recv(c, KVP_MSG_BCAST, &b, &len, 60) != 0) {
        return -1;
    }
    if (len == sizeof(*v)) {
        memcpy(v, b, sizeof(*v));
    }
    free(b);
    return len == sizeof(*v) ? 0 : -1;
}

static void kvp_sock_abort(kvp_comm_t *c, const char *why)
{
    (void)kvp_sock_send(c, KVP_MSG_ABORT, why, strlen(why));
}

static void kvp_sock_close(kvp_comm_t *c)
{
    if (c == NULL) {
        return;
    }
    close(kvp_sock_fd(c));
    free(c->impl);
    free(c);
}

static const kvp_comm_ops_t kvp_sock_ops = {
    .send      = kvp_sock_send,
    .recv      = kvp_sock_recv,
    .pending   = kvp_sock_pending,
    .barrier   = kvp_sock_barrier,
    .gather    = kvp_sock_gather,
    .bcast_u64 = kvp_sock_bcast,
    .abort     = kvp_sock_abort,
    .close     = kvp_sock_close,
};

static kvp_comm_t *kvp_sock_new(int fd, int producer)
{
    kvp_comm_t *c = calloc(1, sizeof(*c));
    kvp_sock_t *s = calloc(1, sizeof(*s));
    int         one = 1;

    if (c == NULL || s == NULL) {
        free(c);
        free(s);
        close(fd);
        return NULL;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    s->fd       = fd;
    c->impl     = s;
    c->ops      = &kvp_sock_ops;
    c->producer = producer;
    c->pair     = 0;
    c->npairs   = 1;
    c->reporter = !producer;
    return c;
}

static void kvp_local_ip(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t               sl = sizeof(ss);

    snprintf(buf, len, "127.0.0.1");
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        return;
    }
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf,
                  (socklen_t)len);
    } else if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf,
                  (socklen_t)len);
    }
}

int kvp_comm_server(const char *bind_addr, uint16_t port, double timeout_s,
                    kvp_comm_t **c_p)
{
    struct addrinfo hints, *ai = NULL;
    char            ports[16];
    int             lfd, fd, one = 1, rc;
    double          deadline = kvp_now_us() + timeout_s * 1e6;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_PASSIVE | AI_NUMERICHOST;
    snprintf(ports, sizeof(ports), "%u", port);
    rc = getaddrinfo(bind_addr, ports, &hints, &ai);
    if (rc != 0) {
        kvp_err("--bind %s: %s", bind_addr, gai_strerror(rc));
        return -1;
    }
    lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 ||
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 1) != 0) {
        kvp_err("listen on %s:%u: %s", bind_addr, port, strerror(errno));
        if (lfd >= 0) {
            close(lfd);
        }
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    fprintf(stderr, "kvxfer_perf: server waiting for a client on %s:%u\n",
            bind_addr, port);
    rc = kvp_io_wait(lfd, POLLIN, deadline);
    if (rc != 0) {
        kvp_err("no client within %.0f s on port %u", timeout_s, port);
        close(lfd);
        return -1;
    }
    fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    close(lfd);
    if (fd < 0) {
        kvp_err("accept: %s", strerror(errno));
        return -1;
    }
    *c_p = kvp_sock_new(fd, 1);
    if (*c_p == NULL) {
        return -1;
    }
    kvp_local_ip(fd, (*c_p)->local_ip, sizeof((*c_p)->local_ip));
    return 0;
}

int kvp_comm_client(const char *host, uint16_t port, double timeout_s,
                    kvp_comm_t **c_p)
{
    struct addrinfo hints, *ai = NULL, *a;
    char            ports[16];
    double          deadline = kvp_now_us() + timeout_s * 1e6;
    int             rc, fd = -1, err = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(ports, sizeof(ports), "%u", port);
    rc = getaddrinfo(host, ports, &hints, &ai);
    if (rc != 0) {
        kvp_err("server %s: %s", host, gai_strerror(rc));
        return -1;
    }
    /* The server may still be starting: retry until the deadline. */
    while (fd < 0 && kvp_now_us() < deadline) {
        for (a = ai; a != NULL; a = a->ai_next) {
            fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                break;
            }
            err = errno;
            if (fd >= 0) {
                close(fd);
            }
            fd = -1;
        }
        if (fd < 0) {
            kvp_sleep_us(100000);
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        kvp_err("connect to %s:%u: %s", host, port, strerror(err));
        return -1;
    }
    *c_p = kvp_sock_new(fd, 0);
    if (*c_p == NULL) {
        return -1;
    }
    kvp_local_ip(fd, (*c_p)->local_ip, sizeof((*c_p)->local_ip));
    return 0;
}

int kvp_comm_pair(kvp_comm_t **p, kvp_comm_t **d)
{
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        kvp_err("socketpair: %s", strerror(errno));
        return -1;
    }
    *p = kvp_sock_new(sv[0], 1);
    *d = kvp_sock_new(sv[1], 0);
    if (*p == NULL || *d == NULL) {
        kvp_sock_close(*p);
        kvp_sock_close(*d);
        return -1;
    }
    snprintf((*p)->local_ip, sizeof((*p)->local_ip), "127.0.0.1");
    snprintf((*d)->local_ip, sizeof((*d)->local_ip), "127.0.0.1");
    return 0;
}
