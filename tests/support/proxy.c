/*
 * A delaying TCP proxy in a thread (see proxy.h).
 *
 * One poll() loop serves the listening socket, a wake-up pipe and every
 * connection pair. Server bytes are queued per pair with the time they may
 * leave; the poll timeout is the earliest such time, so a delay is kept to
 * about a millisecond without a timer thread. Everything the test reads or
 * sets is behind one mutex, so the proxy is clean under ThreadSanitizer.
 */
#define _GNU_SOURCE /* accept4, pipe2: close-on-exec, so redis-server never inherits them */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PROXY_MAX_PAIRS 32

typedef struct chunk {
    struct chunk *next;
    int64_t due_us;        /* when it may be sent to the client */
    size_t len, off;       /* off: bytes of it already sent */
    char data[];
} chunk;

typedef struct pair {
    int cfd, sfd;          /* -1 when the slot is free */
    chunk *head, *tail;    /* server bytes not yet sent to the client */
    int server_gone;       /* the server closed: close the client once the queue is sent */
} pair;

struct proxy {
    pthread_t thread;
    int started;
    int lfd, wake[2];
    int port, upstream;
    char url[64];
    pthread_mutex_t lock;  /* guards mode, delay_ms, stop, stats and upstream after the start */
    int mode, delay_ms, stop;
    proxy_stats stats;
    pair pairs[PROXY_MAX_PAIRS];   /* the thread's own */
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#define STAT_ADD(p, field, n) do {           \
    pthread_mutex_lock(&(p)->lock);          \
    (p)->stats.field += (uint64_t)(n);       \
    pthread_mutex_unlock(&(p)->lock);        \
} while (0)

/* A socket bound to a free loopback port and listening. */
static int listen_loopback(int *port)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int connect_loopback(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Sends all of buf on a blocking socket; -1 when the peer is gone. */
static int send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static void close_pair(proxy *p, pair *pr, int by_client)
{
    uint64_t held = 0;
    for (chunk *c = pr->head, *next; c; c = next) {
        next = c->next;
        held += c->len - c->off;
        free(c);
    }
    close(pr->cfd);
    close(pr->sfd);
    pr->cfd = pr->sfd = -1;
    pr->head = pr->tail = NULL;
    pr->server_gone = 0;
    pthread_mutex_lock(&p->lock);
    p->stats.open--;
    if (by_client) {
        p->stats.client_closes++;
        p->stats.undelivered += held;
    } else {
        p->stats.server_closes++;
    }
    pthread_mutex_unlock(&p->lock);
}

static void accept_one(proxy *p)
{
    int cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0) return;
    int one = 1;
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pair *slot = NULL;
    for (int i = 0; i < PROXY_MAX_PAIRS && !slot; i++)
        if (p->pairs[i].cfd < 0) slot = &p->pairs[i];
    pthread_mutex_lock(&p->lock);
    int upstream = p->upstream;
    pthread_mutex_unlock(&p->lock);
    int sfd = slot ? connect_loopback(upstream) : -1;
    if (sfd < 0) {   /* no room, or the server is down: the client sees a close */
        close(cfd);
        return;
    }
    slot->cfd = cfd;
    slot->sfd = sfd;
    pthread_mutex_lock(&p->lock);
    p->stats.accepted++;
    p->stats.open++;
    pthread_mutex_unlock(&p->lock);
}

/* Client bytes go to the server at once. 0, or -1 when the pair is over. */
static int from_client(proxy *p, pair *pr)
{
    char buf[16384];
    ssize_t n = recv(pr->cfd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) return 0;
    if (n <= 0 || send_all(pr->sfd, buf, (size_t)n) < 0) {
        close_pair(p, pr, 1);
        return -1;
    }
    STAT_ADD(p, to_server, n);
    return 0;
}

/* Server bytes are queued with the time they may leave, or discarded. */
static void from_server(proxy *p, pair *pr)
{
    char buf[16384];
    ssize_t n = recv(pr->sfd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
        pr->server_gone = 1;   /* the queue is still sent, then the client closed */
        return;
    }
    pthread_mutex_lock(&p->lock);
    int mode = p->mode, delay_ms = p->delay_ms;
    if (mode == PROXY_DROP) p->stats.dropped += (uint64_t)n;
    pthread_mutex_unlock(&p->lock);
    if (mode == PROXY_DROP) return;
    /* A trickle is one chunk a byte, each delay_ms after the one before it
     * (or after now, when nothing is queued). */
    size_t pieces = mode == PROXY_TRICKLE ? (size_t)n : 1;
    int64_t due = now_us() + (mode == PROXY_DELAY ? (int64_t)delay_ms * 1000 : 0);
    for (size_t i = 0; i < pieces; i++) {
        size_t len = mode == PROXY_TRICKLE ? 1 : (size_t)n;
        chunk *c = malloc(sizeof *c + len);
        if (!c) return;
        c->next = NULL;
        if (mode == PROXY_TRICKLE) {
            int64_t after = pr->tail && pr->tail->due_us > now_us() ? pr->tail->due_us : now_us();
            due = after + (int64_t)delay_ms * 1000;
        }
        c->due_us = due;
        c->len = len;
        c->off = 0;
        memcpy(c->data, buf + i * len, len);
        if (pr->tail) pr->tail->next = c;
        else pr->head = c;
        pr->tail = c;
    }
}

/* Sends what is due, in order. Returns the earliest time still waited for,
 * or INT64_MAX. */
static int64_t flush_due(proxy *p, pair *pr)
{
    int64_t now = now_us();
    while (pr->head && pr->head->due_us <= now) {
        chunk *c = pr->head;
        if (send_all(pr->cfd, c->data + c->off, c->len - c->off) < 0) {
            close_pair(p, pr, 1);
            return INT64_MAX;
        }
        STAT_ADD(p, to_client, c->len - c->off);
        pr->head = c->next;
        if (!pr->head) pr->tail = NULL;
        free(c);
    }
    if (!pr->head && pr->server_gone) {
        close_pair(p, pr, 0);
        return INT64_MAX;
    }
    return pr->head ? pr->head->due_us : INT64_MAX;
}

static void *proxy_main(void *arg)
{
    proxy *p = arg;
    struct pollfd fds[2 + 2 * PROXY_MAX_PAIRS];
    int owner[2 + 2 * PROXY_MAX_PAIRS];   /* pair index of fds[i], or -1 */
    for (;;) {
        int64_t next = INT64_MAX;
        for (int i = 0; i < PROXY_MAX_PAIRS; i++) {
            if (p->pairs[i].cfd < 0) continue;
            int64_t due = flush_due(p, &p->pairs[i]);
            if (due < next) next = due;
        }
        int nfds = 0;
        fds[nfds] = (struct pollfd){p->wake[0], POLLIN, 0};
        owner[nfds++] = -1;
        fds[nfds] = (struct pollfd){p->lfd, POLLIN, 0};
        owner[nfds++] = -1;
        for (int i = 0; i < PROXY_MAX_PAIRS; i++) {
            if (p->pairs[i].cfd < 0) continue;
            fds[nfds] = (struct pollfd){p->pairs[i].cfd, POLLIN, 0};
            owner[nfds++] = i;
            /* A server that closed has nothing more to say. */
            fds[nfds] = (struct pollfd){p->pairs[i].server_gone ? -1 : p->pairs[i].sfd, POLLIN, 0};
            owner[nfds++] = i;
        }
        int timeout = -1;
        if (next != INT64_MAX) {
            int64_t left = next - now_us();
            timeout = left <= 0 ? 0 : (int)((left + 999) / 1000);
        }
        if (poll(fds, (nfds_t)nfds, timeout) < 0 && errno != EINTR) break;

        if (fds[0].revents) {
            char b[64];
            ssize_t n = read(p->wake[0], b, sizeof b);
            (void)n;
            pthread_mutex_lock(&p->lock);
            int stop = p->stop;
            pthread_mutex_unlock(&p->lock);
            if (stop) break;
        }
        if (fds[1].revents & POLLIN) accept_one(p);
        for (int k = 2; k < nfds; k += 2) {
            pair *pr = &p->pairs[owner[k]];
            /* The slot may have been closed (and even reused) meanwhile. */
            if (pr->cfd != fds[k].fd) continue;
            if (fds[k].revents && from_client(p, pr) < 0) continue;
            if (fds[k + 1].revents && pr->sfd == fds[k + 1].fd) from_server(p, pr);
        }
    }
    for (int i = 0; i < PROXY_MAX_PAIRS; i++)
        if (p->pairs[i].cfd >= 0) close_pair(p, &p->pairs[i], 0);
    return NULL;
}

int proxy_start(proxy **out, int upstream_port)
{
    *out = NULL;
    proxy *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->wake[0] = p->wake[1] = -1;
    for (int i = 0; i < PROXY_MAX_PAIRS; i++) p->pairs[i].cfd = p->pairs[i].sfd = -1;
    p->upstream = upstream_port;
    pthread_mutex_init(&p->lock, NULL);
    p->lfd = listen_loopback(&p->port);
    if (p->lfd < 0 || pipe2(p->wake, O_CLOEXEC) != 0) {
        perror("proxy: listen/pipe");
        proxy_stop(p);
        return -1;
    }
    snprintf(p->url, sizeof p->url, "redis://127.0.0.1:%d", p->port);
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
        fprintf(stderr, "proxy: cannot start its thread\n");
        proxy_stop(p);
        return -1;
    }
    p->started = 1;
    *out = p;
    return 0;
}

int proxy_port(const proxy *p)
{
    return p->port;
}

const char *proxy_url(const proxy *p)
{
    return p->url;
}

void proxy_set(proxy *p, int mode, int delay_ms)
{
    pthread_mutex_lock(&p->lock);
    p->mode = mode;
    p->delay_ms = delay_ms;
    pthread_mutex_unlock(&p->lock);
}

void proxy_set_upstream(proxy *p, int upstream_port)
{
    pthread_mutex_lock(&p->lock);
    p->upstream = upstream_port;
    pthread_mutex_unlock(&p->lock);
}

void proxy_get_stats(proxy *p, proxy_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    pthread_mutex_unlock(&p->lock);
}

void proxy_stop(proxy *p)
{
    if (!p) return;
    if (p->started) {
        pthread_mutex_lock(&p->lock);
        p->stop = 1;
        pthread_mutex_unlock(&p->lock);
        ssize_t n = write(p->wake[1], "x", 1);
        (void)n;
        pthread_join(p->thread, NULL);
    }
    if (p->lfd >= 0) close(p->lfd);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
