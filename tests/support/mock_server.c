/*
 * A scripted RESP server in a thread (see mock_server.h).
 *
 * One poll() loop serves the listening socket, a wake-up pipe and every
 * connection. Each connection has a fixed input buffer; a command that does
 * not fit (the longest hirate sends is an EVAL with the script) closes the
 * connection. Writes block, bounded by a send timeout, so that a client that
 * stopped reading (it met an error and closed) cannot stall the server.
 * Statistics are behind a mutex: the server is clean under ThreadSanitizer.
 */
#define _GNU_SOURCE /* accept4, pipe2: close-on-exec, so redis-server never inherits them */
#include "mock_server.h"

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
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MOCK_MAX_CONNS 32
#define MOCK_INBUF (64 * 1024)

typedef struct mconn {
    int fd;                /* -1 when the slot is free */
    uint64_t id;
    size_t len;
    char in[MOCK_INBUF];
} mconn;

struct mock_server {
    pthread_t thread;
    int started;
    int lfd, wake[2], port;
    char url[64];
    mock_handler handler;
    void *arg;
    pthread_mutex_t lock;  /* guards stop and stats */
    int stop;
    mock_stats stats;
    mconn conns[MOCK_MAX_CONNS];   /* the thread's own */
};

void mock_send(mock_reply *r, const void *bytes, size_t len)
{
    if (r->n < MOCK_MAX_STEPS)
        r->steps[r->n++] = (struct mock_step){MOCK_SEND, bytes, len, 0};
}

void mock_send_str(mock_reply *r, const char *s)
{
    mock_send(r, s, strlen(s));
}

void mock_pause(mock_reply *r, int ms)
{
    if (r->n < MOCK_MAX_STEPS)
        r->steps[r->n++] = (struct mock_step){MOCK_PAUSE, NULL, 0, ms};
}

void mock_close(mock_reply *r)
{
    if (r->n < MOCK_MAX_STEPS)
        r->steps[r->n++] = (struct mock_step){MOCK_CLOSE, NULL, 0, 0};
}

static void stat_add(mock_server *m, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&m->lock);
    *field += n;
    pthread_mutex_unlock(&m->lock);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static void close_conn(mock_server *m, mconn *c, int by_client)
{
    close(c->fd);
    c->fd = -1;
    c->len = 0;
    pthread_mutex_lock(&m->lock);
    m->stats.open--;
    if (by_client) m->stats.client_closes++;
    else m->stats.server_closes++;
    pthread_mutex_unlock(&m->lock);
}

/* Reads "<type><digits>\r\n" at *pos; the number, or -2 when incomplete,
 * or -3 when it is not such a line. */
static long long header(const char *buf, size_t len, size_t *pos, char type)
{
    size_t i = *pos;
    if (i >= len) return -2;
    if (buf[i] != type) return -3;
    long long v = 0;
    for (i++; i < len && buf[i] >= '0' && buf[i] <= '9'; i++) {
        v = v * 10 + (buf[i] - '0');
        if (v > MOCK_INBUF) return -3;
    }
    if (i + 1 >= len) return -2;
    if (buf[i] != '\r' || buf[i + 1] != '\n') return -3;
    *pos = i + 2;
    return v;
}

/* One whole command from the start of buf: its length, 0 when incomplete,
 * -1 when it is not a command. */
static long parse_command(const char *buf, size_t len, mock_cmd *cmd)
{
    size_t pos = 0;
    long long argc = header(buf, len, &pos, '*');
    if (argc < 0) return argc == -2 ? 0 : -1;
    cmd->argc = (int)argc;
    for (long long i = 0; i < argc; i++) {
        long long n = header(buf, len, &pos, '$');
        if (n < 0) return n == -2 ? 0 : -1;
        if (pos + (size_t)n + 2 > len) return 0;
        if (buf[pos + n] != '\r' || buf[pos + n + 1] != '\n') return -1;
        if (i < MOCK_MAX_ARGS) {
            cmd->argv[i] = buf + pos;
            cmd->lens[i] = (size_t)n;
        }
        pos += (size_t)n + 2;
    }
    return (long)pos;
}

/* Runs the reply's steps. 0, or -1 when the connection is over. */
static int run_steps(mock_server *m, mconn *c, const mock_reply *r)
{
    for (int i = 0; i < r->n; i++) {
        const struct mock_step *s = &r->steps[i];
        if (s->kind == MOCK_PAUSE) {
            sleep_ms(s->ms);
        } else if (s->kind == MOCK_CLOSE) {
            close_conn(m, c, 0);
            return -1;
        } else {
            for (size_t off = 0; off < s->len;) {
                ssize_t n = send(c->fd, s->bytes + off, s->len - off, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {   /* the client left, or stopped reading */
                    close_conn(m, c, 1);
                    return -1;
                }
                off += (size_t)n;
            }
        }
    }
    return 0;
}

static void read_from(mock_server *m, mconn *c)
{
    ssize_t n = recv(c->fd, c->in + c->len, sizeof c->in - c->len, 0);
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
        close_conn(m, c, 1);
        return;
    }
    c->len += (size_t)n;
    stat_add(m, &m->stats.bytes_in, (uint64_t)n);
    for (;;) {
        mock_cmd cmd;
        memset(&cmd, 0, sizeof cmd);
        long used = parse_command(c->in, c->len, &cmd);
        if (used < 0 || (used == 0 && c->len == sizeof c->in)) {
            close_conn(m, c, 0);   /* not a client this server understands */
            return;
        }
        if (used == 0) return;
        cmd.conn = c->id;
        stat_add(m, &m->stats.commands, 1);
        mock_reply reply;
        reply.n = 0;
        m->handler(m->arg, &cmd, &reply);
        /* The command's bytes are read; keep what follows it. */
        if (run_steps(m, c, &reply) < 0) return;
        memmove(c->in, c->in + used, c->len - (size_t)used);
        c->len -= (size_t)used;
    }
}

static void accept_one(mock_server *m)
{
    int fd = accept4(m->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    mconn *slot = NULL;
    for (int i = 0; i < MOCK_MAX_CONNS && !slot; i++)
        if (m->conns[i].fd < 0) slot = &m->conns[i];
    if (!slot) {
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    pthread_mutex_lock(&m->lock);
    slot->id = ++m->stats.accepted;
    m->stats.open++;
    pthread_mutex_unlock(&m->lock);
    slot->fd = fd;
    slot->len = 0;
}

static void *mock_main(void *arg)
{
    mock_server *m = arg;
    struct pollfd fds[2 + MOCK_MAX_CONNS];
    int owner[2 + MOCK_MAX_CONNS];
    for (;;) {
        int nfds = 0;
        fds[nfds] = (struct pollfd){m->wake[0], POLLIN, 0};
        owner[nfds++] = -1;
        fds[nfds] = (struct pollfd){m->lfd, POLLIN, 0};
        owner[nfds++] = -1;
        for (int i = 0; i < MOCK_MAX_CONNS; i++) {
            if (m->conns[i].fd < 0) continue;
            fds[nfds] = (struct pollfd){m->conns[i].fd, POLLIN, 0};
            owner[nfds++] = i;
        }
        if (poll(fds, (nfds_t)nfds, -1) < 0 && errno != EINTR) break;
        if (fds[0].revents) {
            char b[64];
            ssize_t n = read(m->wake[0], b, sizeof b);
            (void)n;
            pthread_mutex_lock(&m->lock);
            int stop = m->stop;
            pthread_mutex_unlock(&m->lock);
            if (stop) break;
        }
        if (fds[1].revents & POLLIN) accept_one(m);
        for (int k = 2; k < nfds; k++) {
            mconn *c = &m->conns[owner[k]];
            if (fds[k].revents && c->fd == fds[k].fd) read_from(m, c);
        }
    }
    for (int i = 0; i < MOCK_MAX_CONNS; i++)
        if (m->conns[i].fd >= 0) close_conn(m, &m->conns[i], 0);
    return NULL;
}

int mock_start(mock_server **out, mock_handler handler, void *arg)
{
    *out = NULL;
    mock_server *m = calloc(1, sizeof *m);
    if (!m) return -1;
    m->handler = handler;
    m->arg = arg;
    m->lfd = m->wake[0] = m->wake[1] = -1;
    for (int i = 0; i < MOCK_MAX_CONNS; i++) m->conns[i].fd = -1;
    pthread_mutex_init(&m->lock, NULL);

    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    m->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (m->lfd < 0 || bind(m->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(m->lfd, 64) != 0 || getsockname(m->lfd, (struct sockaddr *)&a, &alen) != 0 ||
        pipe2(m->wake, O_CLOEXEC) != 0) {
        perror("mock_server: listen/pipe");
        mock_stop(m);
        return -1;
    }
    m->port = ntohs(a.sin_port);
    snprintf(m->url, sizeof m->url, "redis://127.0.0.1:%d", m->port);
    if (pthread_create(&m->thread, NULL, mock_main, m) != 0) {
        fprintf(stderr, "mock_server: cannot start its thread\n");
        mock_stop(m);
        return -1;
    }
    m->started = 1;
    *out = m;
    return 0;
}

int mock_port(const mock_server *m)
{
    return m->port;
}

const char *mock_url(const mock_server *m)
{
    return m->url;
}

void mock_get_stats(mock_server *m, mock_stats *out)
{
    pthread_mutex_lock(&m->lock);
    *out = m->stats;
    pthread_mutex_unlock(&m->lock);
}

void mock_stop(mock_server *m)
{
    if (!m) return;
    if (m->started) {
        pthread_mutex_lock(&m->lock);
        m->stop = 1;
        pthread_mutex_unlock(&m->lock);
        ssize_t n = write(m->wake[1], "x", 1);
        (void)n;
        pthread_join(m->thread, NULL);
    }
    if (m->lfd >= 0) close(m->lfd);
    if (m->wake[0] >= 0) close(m->wake[0]);
    if (m->wake[1] >= 0) close(m->wake[1]);
    pthread_mutex_destroy(&m->lock);
    free(m);
}
