/*
 * A throwaway redis-server for one test program (see redis_harness.h).
 *
 * The server is our own child (fork + exec, no --daemonize), so its pid is
 * known without a pidfile and SIGKILL/SIGSTOP reach exactly it. Nothing here
 * registers a handler, an atexit hook or a global connection: test programs
 * fork() and must not inherit anything that acts on exit.
 */
#include "redis_harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RH_START_TRIES 5
#define RH_START_WAIT_MS 5000
#define RH_MAX_ARGS 64

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A port the kernel considers free right now. Another process may take it
 * before redis binds it; rh_start then retries with a new one. */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Child side of the fork: never returns. Only async-signal-safe calls until
 * exec, since the test program may have other threads. */
static void exec_server(char **argv, pid_t parent)
{
    /* Die with the test program, so a crashed test leaves no server behind. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    /* Do not let redis hold copies of the test's sockets: a client socket
     * kept open by the server would survive the test closing it. */
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
#endif
    {
        struct rlimit rl;
        int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536
                      ? (int)rl.rlim_cur : 65536;
        for (int fd = 3; fd < max; fd++) close(fd);
    }
    execvp("redis-server", argv);
    _exit(127);
}

/* A PONG (or NOAUTH from a --requirepass server) on a short-lived connection. */
static int answers_ping(const rh_server *s)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    int ok = 0;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        redisReply *r = redisCommand(c, "PING");
        ok = r && ((r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0) ||
                   (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0));
        if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
}

/* Starts redis on s->port and waits for PING. 0, or -1 with the child reaped
 * (typically because the port was taken meanwhile). */
static int spawn(rh_server *s)
{
    char port[16], sock[320], log[320], extra[1024];
    char *argv[RH_MAX_ARGS];
    int n = 0;

    char tls_port[16], cert[340], key[340], ca[340];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(sock, sizeof sock, "%s", s->unixsock);
    snprintf(log, sizeof log, "%s/redis.log", s->dir);
    argv[n++] = "redis-server";
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    /* A TLS URL names localhost, which may resolve to ::1 too: listen there
     * as well when the host has IPv6 ("-": skipped if it cannot be bound). */
    if (s->tls) argv[n++] = "-::1";
    const char *fixed[] = {"--port", port, "--unixsocket", sock, "--unixsocketperm", "700",
                           "--save", "", "--appendonly", "no", "--dir", s->dir,
                           "--enable-debug-command", "local", "--logfile", log};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) argv[n++] = (char *)fixed[i];
    if (s->tls) {
        const char *name = s->tls_cert ? s->tls_cert : "server";
        snprintf(tls_port, sizeof tls_port, "%d", s->tls_port);
        snprintf(cert, sizeof cert, "%s/%s.crt", s->certs, name);
        snprintf(key, sizeof key, "%s/%s.key", s->certs, name);
        snprintf(ca, sizeof ca, "%s/ca.crt", s->certs);
        const char *tls[] = {"--tls-port", tls_port, "--tls-cert-file", cert,
                             "--tls-key-file", key, "--tls-ca-cert-file", ca,
                             "--tls-auth-clients", s->tls_auth_clients ? "yes" : "no"};
        for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++) argv[n++] = (char *)tls[i];
    }
    if (s->extra) {
        snprintf(extra, sizeof extra, "%s", s->extra);
        for (char *save = NULL, *t = strtok_r(extra, " ", &save); t && n < RH_MAX_ARGS - 1;
             t = strtok_r(NULL, " ", &save))
            argv[n++] = t;
    }
    argv[n] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("rh: fork");
        return -1;
    }
    if (pid == 0) exec_server(argv, parent);

    long long deadline = mono_ms() + RH_START_WAIT_MS;
    while (mono_ms() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "rh: redis-server on port %d exited (status %d); see %s\n",
                    s->port, status, log);
            return -1;
        }
        if (answers_ping(s)) {
            s->pid = pid;
            return 0;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "rh: redis-server on port %d did not answer PING in %d ms\n",
            s->port, RH_START_WAIT_MS);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Removes the directory redis wrote into (log, socket; no dump), and the
 * certificates' directory inside it, if any. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        char path[600];
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0 && errno == EISDIR) remove_dir(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* ---- TLS material ------------------------------------------------------------------- */

/* tests/support/make_certs.sh: next to this file (CMake compiles it by its
 * absolute path), unless $HIRATE_SOURCE_DIR says where the checkout is. */
static void make_certs_path(char *out, size_t cap)
{
    const char *src = getenv("HIRATE_SOURCE_DIR");
    if (src && *src) {
        snprintf(out, cap, "%s/tests/support/make_certs.sh", src);
        return;
    }
    const char *slash = strrchr(__FILE__, '/');
    snprintf(out, cap, "%.*smake_certs.sh", slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
}

int rh_certs_make(const char *dir)
{
    char script[4096];
    make_certs_path(script, sizeof script);
    pid_t pid = fork();
    if (pid < 0) {
        perror("rh: fork");
        return -1;
    }
    if (pid == 0) {
        execlp("sh", "sh", script, dir, (char *)NULL);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "rh: %s %s failed (status %d)\n", script, dir, status);
        return -1;
    }
    return 0;
}

int rh_certs_new(char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    if ((size_t)snprintf(out, cap, "%s/hirate-certs-XXXXXX", tmp) >= cap || !mkdtemp(out)) {
        perror("rh: mkdtemp");
        out[0] = '\0';
        return -1;
    }
    if (rh_certs_make(out) < 0) {
        rh_certs_remove(out);
        return -1;
    }
    return 0;
}

void rh_certs_remove(const char *dir)
{
    if (dir && dir[0]) remove_dir(dir);
}

const char *rh_cert_path(const rh_server *s, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", s->certs, name);
    return out;
}

int rh_start(rh_server *s)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    s->pid = 0;
    /* A unix socket path must fit in sun_path (108 bytes). */
    if (snprintf(s->dir, sizeof s->dir, "%s/hirate-redis-XXXXXX", tmp) >= 80) {
        fprintf(stderr, "rh: TMPDIR is too long for a unix socket path: %s\n", tmp);
        return -1;
    }
    if (!mkdtemp(s->dir)) {
        perror("rh: mkdtemp");
        return -1;
    }
    snprintf(s->unixsock, sizeof s->unixsock, "%s/redis.sock", s->dir);
    s->tls_port = 0;
    s->certs[0] = s->ca_file[0] = '\0';
    if (s->tls) {
        if (s->certs_dir) snprintf(s->certs, sizeof s->certs, "%s", s->certs_dir);
        else snprintf(s->certs, sizeof s->certs, "%s/certs", s->dir);
        snprintf(s->ca_file, sizeof s->ca_file, "%s/ca.crt", s->certs);
        if (rh_certs_make(s->certs) < 0) {
            remove_dir(s->dir);
            return -1;
        }
    }

    for (int i = 0; i < RH_START_TRIES; i++) {
        s->port = free_port();
        if (s->port <= 0) continue;
        snprintf(s->url, sizeof s->url, "redis://127.0.0.1:%d", s->port);
        snprintf(s->plain_url, sizeof s->plain_url, "%s", s->url);
        if (s->tls) {
            /* Two free ports at once: the second is asked while the first is
             * not bound any more, so they may coincide. */
            do s->tls_port = free_port();
            while (s->tls_port == s->port);
            if (s->tls_port <= 0) continue;
            snprintf(s->url, sizeof s->url, "rediss://localhost:%d", s->tls_port);
        }
        if (spawn(s) == 0) return 0;
    }
    fprintf(stderr, "rh: could not start redis-server (is it on PATH?)\n");
    remove_dir(s->dir);
    return -1;
}

int rh_restart(rh_server *s)
{
    if (s->pid) rh_kill(s);
    /* Same port: clients must find it where it was. */
    return spawn(s);
}

void rh_kill(rh_server *s)
{
    if (!s->pid) return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

void rh_pause(rh_server *s)
{
    if (s->pid) kill(s->pid, SIGSTOP);
}

void rh_resume(rh_server *s)
{
    if (s->pid) kill(s->pid, SIGCONT);
}

void rh_stop(rh_server *s)
{
    if (s->pid) {
        kill(s->pid, SIGCONT); /* a stopped process would not act on SIGTERM */
        kill(s->pid, SIGTERM);
        long long deadline = mono_ms() + 2000;
        while (waitpid(s->pid, NULL, WNOHANG) == 0) {
            if (mono_ms() > deadline) {
                kill(s->pid, SIGKILL);
                waitpid(s->pid, NULL, 0);
                break;
            }
            sleep_ms(5);
        }
        s->pid = 0;
    }
    if (s->dir[0]) remove_dir(s->dir);
    s->dir[0] = '\0';
}

redisReply *rh_command(rh_server *s, const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    redisReply *r = NULL;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        va_list ap;
        va_start(ap, fmt);
        r = redisvCommand(c, fmt, ap);
        va_end(ap);
    }
    if (c) redisFree(c);
    return r;
}

long long rh_info_int(rh_server *s, const char *field)
{
    redisReply *r = rh_command(s, "INFO");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        size_t flen = strlen(field);
        /* Lines are "name:value\r\n"; match whole names only. */
        for (const char *line = r->str; line && *line;) {
            if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
                char *end;
                errno = 0;
                long long x = strtoll(line + flen + 1, &end, 10);
                if (errno == 0 && end != line + flen + 1 && (*end == '\r' || *end == '\0'))
                    v = x;
                break;
            }
            line = strchr(line, '\n');
            if (line) line++;
        }
    }
    if (r) freeReplyObject(r);
    return v;
}

long long rh_error_count(rh_server *s, const char *code)
{
    redisReply *r = rh_command(s, "INFO errorstats");
    long long v = 0;
    char name[64];
    snprintf(name, sizeof name, "errorstat_%s:count=", code);
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *at = strstr(r->str, name);
        if (at)
            v = strtoll(at + strlen(name), NULL, 10);
    }
    if (r) freeReplyObject(r);
    return v;
}

/* ---- watchdog ---------------------------------------------------------------------- */

/* What the SIGALRM handler needs, prepared beforehand: it may only make
 * async-signal-safe calls. */
/* make_certs.sh's files, for a watchdog that must remove a certificates'
 * directory inside the server's. */
static const char *const cert_files[] = {
    "ca.crt", "ca.key", "ca.srl", "other-ca.crt", "server.crt", "server.key", "wronghost.crt",
    "wronghost.key", "expired.crt", "expired.key", "selfsigned.crt", "selfsigned.key",
    "client.crt", "client.key", "done",
};
#define RH_CERT_FILES (sizeof cert_files / sizeof cert_files[0])

static struct {
    const rh_server *server;
    char message[160], log[300], sock[300];
    char certs[300], cert_paths[RH_CERT_FILES][340];   /* certs[0] == 0: none to remove */
} watchdog;

static void on_alarm(int sig)
{
    (void)sig;
    ssize_t n = write(2, watchdog.message, strlen(watchdog.message));
    (void)n;
    const rh_server *s = watchdog.server;
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);   /* a stopped server cannot die of SIGKILL until resumed */
        kill(s->pid, SIGKILL);
    }
    unlink(watchdog.log);
    unlink(watchdog.sock);
    if (watchdog.certs[0]) {
        for (size_t i = 0; i < RH_CERT_FILES; i++) unlink(watchdog.cert_paths[i]);
        rmdir(watchdog.certs);
    }
    rmdir(s->dir);
    _exit(2);
}

void rh_watchdog(const rh_server *s, const char *program, unsigned seconds)
{
    watchdog.server = s;
    snprintf(watchdog.message, sizeof watchdog.message,
             "%s: FAILED, timed out after %u s (did a call hang?)\n", program, seconds);
    snprintf(watchdog.log, sizeof watchdog.log, "%s/redis.log", s->dir);
    snprintf(watchdog.sock, sizeof watchdog.sock, "%s", s->unixsock);
    /* Certificates made inside the server's directory go with it; a shared
     * directory (certs_dir) is the program's to remove. */
    watchdog.certs[0] = '\0';
    if (s->tls && !s->certs_dir) {
        snprintf(watchdog.certs, sizeof watchdog.certs, "%s", s->certs);
        for (size_t i = 0; i < RH_CERT_FILES; i++)
            snprintf(watchdog.cert_paths[i], sizeof watchdog.cert_paths[i], "%s/%s", s->certs,
                     cert_files[i]);
    }
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}
