/*
 * The C side of tests/support/redis_cluster.py: see cluster_harness.h.
 */
#define _GNU_SOURCE
#include "cluster_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every running child, for the watchdog (which may only make
 * async-signal-safe calls, so the list is ready beforehand). */
#define CH_CHILDREN_MAX 8
static volatile pid_t children[CH_CHILDREN_MAX];
static char watchdog_message[200];

/* A reply line of the channel can carry one number per key of a batch. */
#define CH_LINE_MAX (1u << 20)

static void script_path(char *out, size_t cap)
{
    const char *src = getenv("HIRATE_SOURCE_DIR");
    if (src && *src) {
        snprintf(out, cap, "%s/tests/support/redis_cluster.py", src);
        return;
    }
    /* This file's own directory (CMake compiles it by its absolute path). */
    const char *here = __FILE__;
    const char *slash = strrchr(here, '/');
    int dirlen = slash ? (int)(slash - here) : 1;
    snprintf(out, cap, "%.*s/redis_cluster.py", dirlen, slash ? here : ".");
}

/* Copies the JSON string value of "name" in line (no escapes: our own
 * paths and URLs have none). */
static int json_str(const char *line, const char *name, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", name);
    const char *p = strstr(line, pat);
    if (!p) return -1;
    p += strlen(pat);
    const char *e = strchr(p, '"');
    if (!e || (size_t)(e - p) >= cap) return -1;
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = '\0';
    return 0;
}

/* Sends one command line, reads the answer's first line into a malloc'ed
 * buffer (*reply, without "ok "/newline). 0 for "ok", -1 otherwise (the
 * message on stderr). Caller holds the lock. */
static int request_locked(ch_cluster *c, char **reply, const char *line)
{
    static char *buf;
    if (reply) *reply = NULL;
    if (!c->pid) return -1;
    if (fputs(line, c->to) == EOF || fputc('\n', c->to) == EOF || fflush(c->to) == EOF) {
        fprintf(stderr, "cluster harness: the cluster process is gone\n");
        return -1;
    }
    if (!buf && !(buf = malloc(CH_LINE_MAX))) return -1;
    if (!fgets(buf, CH_LINE_MAX, c->from)) {
        fprintf(stderr, "cluster harness: no answer to \"%.60s\"\n", line);
        return -1;
    }
    buf[strcspn(buf, "\n")] = '\0';
    if (strncmp(buf, "ok", 2) != 0 || (buf[2] != '\0' && buf[2] != ' ')) {
        fprintf(stderr, "cluster harness: \"%.60s\": %s\n", line, buf);
        return -1;
    }
    if (reply) *reply = buf + (buf[2] ? 3 : 2);
    return 0;
}

static int request(ch_cluster *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->lock);
    int rc = request_locked(c, NULL, line);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int refresh_locked(ch_cluster *c)
{
    char *reply;
    if (request_locked(c, &reply, "nodes") < 0) return -1;
    int n = atoi(reply);
    if (n < 0 || n > CH_NODES_MAX) return -1;
    char line[2048];
    for (int i = 0; i < n; i++) {
        if (!fgets(line, sizeof line, c->from)) return -1;
        ch_node *nd = &c->nodes[i];
        char role[16], master[48], slots[1600], state[16];
        int pid;
        if (sscanf(line, "%d %d %15s %47s %47s %1599s %15s", &nd->port, &pid, role, nd->id,
                   master, slots, state) != 7)
            return -1;
        nd->alive = strcmp(state, "dead") != 0;
        nd->paused = strcmp(state, "paused") == 0;
        nd->pid = (pid_t)pid;
        nd->master = strcmp(role, "master") == 0;
        snprintf(nd->master_id, sizeof nd->master_id, "%s", strcmp(master, "-") ? master : "");
        nd->nranges = 0;
        if (strcmp(slots, "-") != 0) {
            for (char *tok = strtok(slots, ","); tok && nd->nranges < CH_RANGES_MAX;
                 tok = strtok(NULL, ",")) {
                int lo, hi;
                if (sscanf(tok, "%d-%d", &lo, &hi) != 2) return -1;
                nd->ranges[nd->nranges][0] = lo;
                nd->ranges[nd->nranges][1] = hi;
                nd->nranges++;
            }
        }
    }
    c->n = n;
    return 0;
}

int ch_refresh(ch_cluster *c)
{
    pthread_mutex_lock(&c->lock);
    int rc = refresh_locked(c);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int ch_start(ch_cluster *c, int masters, int replicas, const char *tls_dir)
{
    int in[2], out[2];
    char script[1024], m[16], r[16];
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->tls = tls_dir != NULL;
    script_path(script, sizeof script);
    snprintf(m, sizeof m, "%d", masters);
    snprintf(r, sizeof r, "%d", replicas);
    /* Writes to a dead child fail with EPIPE instead of killing the test. */
    signal(SIGPIPE, SIG_IGN);
    if (pipe2(in, O_CLOEXEC) < 0) return -1;
    if (pipe2(out, O_CLOEXEC) < 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("cluster harness: fork");
        return -1;
    }
    if (pid == 0) {
        /* The cluster dies with this program even if it dies by SIGKILL. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
            const char *argv[] = {"python3", script, "start", "--masters", m, "--replicas", r,
                              tls_dir ? "--tls" : NULL, tls_dir, NULL};
        execvp("python3", (char *const *)argv);
        perror("cluster harness: python3");
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->pid = pid;
    for (int i = 0; i < CH_CHILDREN_MAX; i++)
        if (children[i] == 0) {
            children[i] = pid;
            break;
        }
    c->to = fdopen(in[1], "w");
    c->from = fdopen(out[0], "r");
    char *line = malloc(CH_LINE_MAX);
    if (!c->to || !c->from || !line || !fgets(line, CH_LINE_MAX, c->from) ||
        json_str(line, "url", c->url, sizeof c->url) < 0 ||
        json_str(line, "dir", c->dir, sizeof c->dir) < 0) {
        fprintf(stderr, "cluster harness: %s start did not report a cluster\n", script);
        free(line);
        ch_stop(c);
        return -1;
    }
    free(line);
    if (ch_refresh(c) < 0) {
        ch_stop(c);
        return -1;
    }
    return 0;
}

void ch_stop(ch_cluster *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->to) fclose(c->to);   /* end of input: the child stops the cluster */
    c->to = NULL;
    if (c->pid) {
        int st;
        while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {}
        for (int i = 0; i < CH_CHILDREN_MAX; i++)
            if (children[i] == c->pid) children[i] = 0;
        c->pid = 0;
    }
    if (c->from) fclose(c->from);
    c->from = NULL;
    pthread_mutex_unlock(&c->lock);
}

int ch_owns(const ch_node *m, int slot)
{
    for (int i = 0; i < m->nranges; i++)
        if (m->ranges[i][0] <= slot && slot <= m->ranges[i][1]) return 1;
    return 0;
}

ch_node *ch_master_of(ch_cluster *c, int slot)
{
    for (int i = 0; i < c->n; i++)
        if (c->nodes[i].master && ch_owns(&c->nodes[i], slot)) return &c->nodes[i];
    return NULL;
}

ch_node *ch_node_by_port(ch_cluster *c, int port)
{
    for (int i = 0; i < c->n; i++)
        if (c->nodes[i].port == port) return &c->nodes[i];
    return NULL;
}

ch_node *ch_replica_of(ch_cluster *c, const ch_node *m)
{
    for (int i = 0; i < c->n; i++)
        if (!c->nodes[i].master && c->nodes[i].alive &&
            strcmp(c->nodes[i].master_id, m->id) == 0)
            return &c->nodes[i];
    return NULL;
}

int ch_kill(ch_cluster *c, const ch_node *n) { return request(c, "kill %d", n->port); }
int ch_pause(ch_cluster *c, const ch_node *n) { return request(c, "pause %d", n->port); }
int ch_resume(ch_cluster *c, const ch_node *n) { return request(c, "resume %d", n->port); }

/* "<cmd> xHEX xHEX ..." for n keys; the answer's numbers into out. */
static int keyed(ch_cluster *c, const char *cmd, size_t n, const void *const *keys,
                 const size_t *lens, int *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t cap = strlen(cmd) + 2;
    for (size_t i = 0; i < n; i++) cap += 2 * lens[i] + 2;
    char *line = malloc(cap);
    if (!line) return -1;
    char *p = line + sprintf(line, "%s", cmd);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *k = keys[i];
        *p++ = ' ';
        *p++ = 'x';   /* so that the empty key is a word too */
        for (size_t j = 0; j < lens[i]; j++) {
            *p++ = hex[k[j] >> 4];
            *p++ = hex[k[j] & 15];
        }
    }
    *p = '\0';
    if (cap >= CH_LINE_MAX) {
        free(line);
        return -1;
    }
    char *reply;
    pthread_mutex_lock(&c->lock);
    int rc = request_locked(c, &reply, line);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char *end;
        long v = strtol(reply, &end, 10);
        if (end == reply) rc = -1;
        out[i] = (int)v;
        reply = end;
    }
    pthread_mutex_unlock(&c->lock);
    free(line);
    return rc;
}

int ch_keyslots(ch_cluster *c, size_t n, const void *const *keys, const size_t *lens, int *out)
{
    return keyed(c, "keyslot", n, keys, lens, out);
}

int ch_keyslot(ch_cluster *c, const void *key, size_t len)
{
    int slot;
    return ch_keyslots(c, 1, &key, &len, &slot) < 0 ? -1 : slot;
}

int ch_where(ch_cluster *c, size_t n, const void *const *keys, const size_t *lens, int *out)
{
    return keyed(c, "where", n, keys, lens, out);
}

int ch_migrate_begin(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst)
{
    return request(c, "begin %d %d %d", slot, src->port, dst->port);
}

int ch_migrate_keys(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst, int count)
{
    char line[128], *reply;
    if (count < 0) snprintf(line, sizeof line, "move %d %d %d", slot, src->port, dst->port);
    else snprintf(line, sizeof line, "move %d %d %d %d", slot, src->port, dst->port, count);
    pthread_mutex_lock(&c->lock);
    int rc = request_locked(c, &reply, line);
    if (rc == 0) rc = atoi(reply);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int ch_migrate_finish(ch_cluster *c, int slot, const ch_node *dst)
{
    int port = dst->port;
    if (request(c, "finish %d %d", slot, port) < 0) return -1;
    return ch_refresh(c);
}

int ch_migrate_slot(ch_cluster *c, int slot, const ch_node *src, const ch_node *dst)
{
    if (request(c, "migrate %d %d %d", slot, src->port, dst->port) < 0) return -1;
    return ch_refresh(c);
}

ch_node *ch_wait_failover(ch_cluster *c, const ch_node *old, double timeout_s)
{
    char line[128], *reply;
    int port = -1;
    snprintf(line, sizeof line, "failover %d %g", old->port, timeout_s);
    pthread_mutex_lock(&c->lock);
    if (request_locked(c, &reply, line) == 0) port = atoi(reply);
    if (port > 0 && refresh_locked(c) < 0) port = -1;
    pthread_mutex_unlock(&c->lock);
    return port > 0 ? ch_node_by_port(c, port) : NULL;
}

int ch_settle(ch_cluster *c, double timeout_s)
{
    if (request(c, "settle %g", timeout_s) < 0) return -1;
    return ch_refresh(c);
}

int ch_config_set(ch_cluster *c, const char *name, const char *value)
{
    return request(c, "config %s %s", name, value);
}

int ch_stats(ch_cluster *c, long long *calls, long long *rejected)
{
    char *reply;
    pthread_mutex_lock(&c->lock);
    int rc = request_locked(c, &reply, "stats");
    if (rc == 0 && sscanf(reply, "%lld %lld", calls, rejected) != 2) rc = -1;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int ch_reset_stats(ch_cluster *c) { return request(c, "resetstats"); }

const char *ch_node_url(const ch_cluster *c, const ch_node *n, char *out, size_t cap)
{
    snprintf(out, cap, "%s://%s:%d", c->tls ? "rediss+cluster" : "redis+cluster",
             c->tls ? "localhost" : "127.0.0.1", n->port);
    return out;
}

/* ---- watchdog ------------------------------------------------------------------------ */


static void on_alarm(int sig)
{
    (void)sig;
    ssize_t n = write(2, watchdog_message, strlen(watchdog_message));
    (void)n;
    /* SIGTERM: the child stops every node and removes their files (its
     * nodes would die with it anyway). Give it a moment to do so. */
    for (int i = 0; i < CH_CHILDREN_MAX; i++)
        if (children[i] > 0) kill(children[i], SIGTERM);
    for (int i = 0; i < CH_CHILDREN_MAX; i++) {
        for (int t = 0; children[i] > 0 && t < 50; t++) {
            if (waitpid(children[i], NULL, WNOHANG) != 0) break;
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    _exit(2);
}

void ch_watchdog(const char *program, unsigned seconds)
{
    snprintf(watchdog_message, sizeof watchdog_message,
             "%s: FAILED, timed out after %u s (did a call hang?)\n", program, seconds);
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}
