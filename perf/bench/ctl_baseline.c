/*
 * ctl_baseline.c - the floor under kvxfer's control-plane round trips on
 * this machine: blocking request/reply ping-pong between two processes on
 * loopback, over a raw TCP socket and over nng req/rep (what kvxfer's
 * release / write_done use), with messages of a release's size. compare.sh
 * prints kvxfer's measured round trips next to these.
 *
 * Usage: kvxfer_ctl_baseline [-n ITERS] [-p PORT] [-c]   (-c: CSV line)
 * Every receive has a 5 s deadline; the server process is ended at exit.
 */
#define _GNU_SOURCE
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQ_LEN  96 /* ~ {"type":"release","transfer_id":"...",...} */
#define REP_LEN  16 /* ~ {"ok":true} */
#define DEADLINE 5  /* seconds, every receive */

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static void summary(const char *name, double *v, int n, int csv)
{
    double sum = 0;

    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    for (int i = 0; i < n; i++) {
        sum += v[i];
    }
    if (csv) {
        printf("%s,%d,%.1f,%.1f,%.1f\n", name, n, v[n / 2], sum / n,
               v[(n * 99) / 100]);
    } else {
        printf("%-8s round trip over %d: p50 %.1f us, avg %.1f us, p99 %.1f "
               "us\n", name, n, v[n / 2], sum / n, v[(n * 99) / 100]);
    }
}

static int full_io(int fd, char *buf, size_t len, int wr)
{
    size_t done = 0;

    while (done < len) {
        ssize_t r = wr ? write(fd, buf + done, len - done)
                       : read(fd, buf + done, len - done);
        if (r <= 0) {
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

static void set_deadline(int fd)
{
    struct timeval tv = {DEADLINE, 0};
    int            one = 1;

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Server process: raw TCP echo on port, nng REP on port + 1. */
static void server(int port, int lfd)
{
    nng_socket rep;
    char       url[64], buf[REQ_LEN];
    int        fd;

    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port + 1);
    if (nng_rep0_open(&rep) != 0 || nng_listen(rep, url, NULL, 0) != 0) {
        _exit(2);
    }
    nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, DEADLINE * 1000);
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
        _exit(2);
    }
    set_deadline(fd);
    while (full_io(fd, buf, REQ_LEN, 0) == 0 &&
           full_io(fd, buf, REP_LEN, 1) == 0) {
    }
    close(fd);
    for (;;) {
        nng_msg *m;

        if (nng_recvmsg(rep, &m, 0) != 0) {
            _exit(0);
        }
        nng_msg_chop(m, nng_msg_len(m) - REP_LEN);
        if (nng_sendmsg(rep, m, 0) != 0) {
            nng_msg_free(m);
        }
    }
}

int main(int argc, char **argv)
{
    int                n = 2000, port = 14590, csv = 0, lfd, fd, one = 1;
    struct sockaddr_in a;
    char               buf[REQ_LEN], url[64];
    double            *v;
    pid_t              pid;
    nng_socket         req;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            n = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) {
            port = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-c") == 0) {
            csv = 1;
        } else {
            fprintf(stderr, "usage: %s [-n ITERS] [-p PORT] [-c]\n", argv[0]);
            return 2;
        }
    }
    if (n < 10 || port < 1024 || port > 65534) {
        fprintf(stderr, "-n must be >= 10 and -p 1024..65534\n");
        return 2;
    }
    v = calloc((size_t)n, sizeof(*v));
    memset(&a, 0, sizeof(a));
    a.sin_family      = AF_INET;
    a.sin_port        = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (v == NULL || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(lfd, 1) != 0) {
        perror("ctl_baseline: listen");
        return 1;
    }
    pid = fork();
    if (pid == 0) {
        server(port, lfd);
    }
    close(lfd);
    memset(buf, 'x', sizeof(buf));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("ctl_baseline: connect");
        kill(pid, SIGTERM);
        return 1;
    }
    set_deadline(fd);
    for (int i = -n / 10; i < n; i++) { /* first tenth: warm-up */
        double t = now_us();

        if (full_io(fd, buf, REQ_LEN, 1) != 0 ||
            full_io(fd, buf, REP_LEN, 0) != 0) {
            fprintf(stderr, "ctl_baseline: tcp ping-pong failed\n");
            kill(pid, SIGTERM);
            return 1;
        }
        if (i >= 0) {
            v[i] = now_us() - t;
        }
    }
    close(fd);
    summary("tcp", v, n, csv);

    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port + 1);
    if (nng_req0_open(&req) != 0 || nng_dial(req, url, NULL, 0) != 0) {
        fprintf(stderr, "ctl_baseline: nng dial %s failed\n", url);
        kill(pid, SIGTERM);
        return 1;
    }
    nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, DEADLINE * 1000);
    for (int i = -n / 10; i < n; i++) {
        double   t = now_us();
        nng_msg *m;

        if (nng_msg_alloc(&m, 0) != 0 || nng_msg_append(m, buf, REQ_LEN) ||
            nng_sendmsg(req, m, 0) != 0 || nng_recvmsg(req, &m, 0) != 0) {
            fprintf(stderr, "ctl_baseline: nng ping-pong failed\n");
            kill(pid, SIGTERM);
            return 1;
        }
        nng_msg_free(m);
        if (i >= 0) {
            v[i] = now_us() - t;
        }
    }
    summary("nng", v, n, csv);
    nng_close(req);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    free(v);
    return 0;
}
