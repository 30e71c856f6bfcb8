/*
 * ctl_baseline.c - the floor under kvxfer's control-plane round trips on
 * this machine: blocking request/reply ping-pong between two processes on
 * loopback, over a raw TCP socket and over nng req/rep (what kvxfer's
 * release / write_done use), with messages of a release's size. compare.sh
 * prints kvxfer's measured round trips next to these.
 *
 * Usage: kvxfer_ctl_baseline [-n ITERS] [-p PORT] [-c] [-t DIR]
 *   -c      CSV lines
 *   -t DIR  also nng req/rep over mutual TLS (tls+tcp, DIR/ca.crt,
 *           DIR/peer.crt, DIR/peer.key, peer name kvxfer-peer: what
 *           kvxfer_perf --tls-dir uses): the floor under kvxfer's TLS round
 *           trips (row "nng_tls")
 * Every receive has a 5 s deadline; the server processes are ended at
 * exit.
 */
#define _GNU_SOURCE
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

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

static void rep_loop(nng_socket rep, int first_ms);

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
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
        _exit(2);
    }
    set_deadline(fd);
    while (full_io(fd, buf, REQ_LEN, 0) == 0 &&
           full_io(fd, buf, REP_LEN, 1) == 0) {
    }
    close(fd);
    rep_loop(rep, DEADLINE * 1000);
}

/* read_file: the whole file as a string (caller frees), NULL on error. */
static char *read_file(const char *dir, const char *name)
{
    char  path[512], *buf;
    FILE *f;
    long  n;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 ||
        fseek(f, 0, SEEK_SET) != 0 || (buf = malloc((size_t)n + 1)) == NULL) {
        if (f != NULL) {
            fclose(f);
        }
        return NULL;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    } else {
        buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

/* tls_cfg: mutual TLS as kvxfer configures it (transports/nng/kvn.c). */
static nng_tls_config *tls_cfg(const char *dir, int server)
{
    nng_tls_config *cfg  = NULL;
    char           *cert = read_file(dir, "peer.crt");
    char           *key  = read_file(dir, "peer.key");
    char            ca[512];
    int             rv;

    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    rv = cert != NULL && key != NULL ? 0 : NNG_ENOENT;
    rv = rv ? rv : nng_tls_config_alloc(&cfg, server ? NNG_TLS_MODE_SERVER
                                                     : NNG_TLS_MODE_CLIENT);
    rv = rv ? rv : nng_tls_config_own_cert(cfg, cert, key, NULL);
    rv = rv ? rv : nng_tls_config_ca_file(cfg, ca);
    rv = rv ? rv : nng_tls_config_server_name(cfg, "kvxfer-peer");
    rv = rv ? rv : nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
    free(cert);
    free(key);
    if (rv != 0) {
        fprintf(stderr, "ctl_baseline: TLS config from %s: %s\n", dir,
                nng_strerror(rv));
        if (cfg != NULL) {
            nng_tls_config_free(cfg);
        }
        return NULL;
    }
    return cfg;
}

/* rep_loop: echo REP_LEN bytes of every request until a receive times
 * out (first_ms for the first request, DEADLINE s later on). */
static void rep_loop(nng_socket rep, int first_ms)
{
    nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, first_ms);
    for (;;) {
        nng_msg *m;

        if (nng_recvmsg(rep, &m, 0) != 0) {
            _exit(0);
        }
        nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, DEADLINE * 1000);
        nng_msg_chop(m, nng_msg_len(m) - REP_LEN);
        if (nng_sendmsg(rep, m, 0) != 0) {
            nng_msg_free(m);
        }
    }
}

/* tls_server: nng REP over tls+tcp on port (a process of its own). */
static void tls_server(int port, const char *dir)
{
    nng_socket      rep;
    nng_listener    l;
    nng_tls_config *cfg = tls_cfg(dir, 1);
    char            url[64];

    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    if (cfg == NULL || nng_rep0_open(&rep) != 0 ||
        nng_listener_create(&l, rep, url) != 0 ||
        nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg) != 0 ||
        nng_listener_start(l, 0) != 0) {
        _exit(2);
    }
    rep_loop(rep, 120 * 1000); /* the plain rows run first */
}

/* ping_pong: n timed req/rep round trips (after n/10 untimed) into v. */
static int ping_pong(nng_socket req, char *buf, double *v, int n)
{
    nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, DEADLINE * 1000);
    for (int i = -n / 10; i < n; i++) {
        double   t = now_us();
        nng_msg *m;

        if (nng_msg_alloc(&m, 0) != 0 || nng_msg_append(m, buf, REQ_LEN) ||
            nng_sendmsg(req, m, 0) != 0 || nng_recvmsg(req, &m, 0) != 0) {
            return -1;
        }
        nng_msg_free(m);
        if (i >= 0) {
            v[i] = now_us() - t;
        }
    }
    return 0;
}

/* stop: ends the server processes (pid <= 0: none). */
static void stop(pid_t a, pid_t b)
{
    if (a > 0) {
        kill(a, SIGTERM);
    }
    if (b > 0) {
        kill(b, SIGTERM);
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
    const char        *tls_dir = NULL;
    pid_t              tls_pid;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            n = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) {
            port = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-c") == 0) {
            csv = 1;
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            tls_dir = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [-n ITERS] [-p PORT] [-c] [-t DIR]\n",
                    argv[0]);
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
    /* Every server forks before this process touches nng (libnng panics
     * on use after fork). */
    pid = fork();
    if (pid == 0) {
        server(port, lfd);
    }
    close(lfd);
    tls_pid = tls_dir != NULL ? fork() : -1;
    if (tls_pid == 0) {
        tls_server(port + 2, tls_dir);
    }
    memset(buf, 'x', sizeof(buf));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("ctl_baseline: connect");
        stop(pid, tls_pid);
        return 1;
    }
    set_deadline(fd);
    for (int i = -n / 10; i < n; i++) { /* first tenth: warm-up */
        double t = now_us();

        if (full_io(fd, buf, REQ_LEN, 1) != 0 ||
            full_io(fd, buf, REP_LEN, 0) != 0) {
            fprintf(stderr, "ctl_baseline: tcp ping-pong failed\n");
            stop(pid, tls_pid);
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
        stop(pid, tls_pid);
        return 1;
    }
    if (ping_pong(req, buf, v, n) != 0) {
        fprintf(stderr, "ctl_baseline: nng ping-pong failed\n");
        stop(pid, tls_pid);
        return 1;
    }
    summary("nng", v, n, csv);
    nng_close(req);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (tls_dir != NULL) {
        nng_dialer      d;
        nng_tls_config *cfg = tls_cfg(tls_dir, 0);
        int             rc  = 1;

        pid = tls_pid;
        snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port + 2);
        /* The server may not listen yet: the dial retries (blocking dial
         * with nng's reconnect) for at most DEADLINE s. */
        if (pid > 0 && cfg != NULL && nng_req0_open(&req) == 0 &&
            nng_dialer_create(&d, req, url) == 0 &&
            nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg) == 0 &&
            nng_dialer_start(d, NNG_FLAG_NONBLOCK) == 0 &&
            ping_pong(req, buf, v, n) == 0) {
            summary("nng_tls", v, n, csv);
            rc = 0;
        } else {
            fprintf(stderr, "ctl_baseline: nng TLS ping-pong failed\n");
        }
        nng_close(req);
        if (pid > 0) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
        }
        if (rc != 0) {
            free(v);
            return 1;
        }
    }
    free(v);
    return 0;
}
