/*
 * The C side of tests/support/redis_sentinel.py: see sentinel_harness.h.
 */
#define _GNU_SOURCE
#include "sentinel_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

/* Every running child, for the watchdog (which may only make
 * async-signal-safe calls, so the list is ready beforehand). */
#define SH_CHILDREN_MAX 8
static volatile pid_t children[SH_CHILDREN_MAX];
static char watchdog_message[200];

/* An answer of the channel carries redis-cli's whole output at most. */
#define SH_LINE_MAX (1u << 20)

static void script_path(char *out, size_t cap)
{
    const char *src = getenv("HIRATE_SOURCE_DIR");
    if (src && *src) {
        snprintf(out, cap, "%s/tests/support/redis_sentinel.py", src);
        return;
    }
    /* This file's own directory (CMake compiles it by its absolute path). */
    const char *here = __FILE__;
    const char *slash = strrchr(here, '/');
    int dirlen = slash ? (int)(slash - here) : 1;
    snprintf(out, cap, "%.*s/redis_sentinel.py", dirlen, slash ? here : ".");
}

/* Reads one JSON line from the child; NULL (and a message) if there is none,
 * it is not JSON, or it is {"error": ...}. */
static cJSON *read_answer(sh_group *g, const char *what)
{
    static char *buf;
    if (!buf && !(buf = malloc(SH_LINE_MAX))) return NULL;
    if (!g->from || !fgets(buf, SH_LINE_MAX, g->from)) {
        fprintf(stderr, "sentinel harness: no answer to \"%.60s\"\n", what);
        return NULL;
    }
    cJSON *j = cJSON_Parse(buf);
    if (!j) {
        fprintf(stderr, "sentinel harness: \"%.60s\": not JSON: %.200s\n", what, buf);
        return NULL;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(err)) {
        fprintf(stderr, "sentinel harness: \"%.60s\": %s\n", what, err->valuestring);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* Sends one command line and reads its answer. Caller holds the lock. */
static cJSON *request_locked(sh_group *g, const char *line)
{
    if (!g->pid || !g->to) return NULL;
    if (fputs(line, g->to) == EOF || fputc('\n', g->to) == EOF || fflush(g->to) == EOF) {
        fprintf(stderr, "sentinel harness: the group's process is gone\n");
        return NULL;
    }
    return read_answer(g, line);
}

static cJSON *request(sh_group *g, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g->lock);
    cJSON *j = request_locked(g, line);
    pthread_mutex_unlock(&g->lock);
    return j;
}

static int get_node(const cJSON *obj, sh_node *out)
{
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(obj, "port");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(obj, "pid");
    if (!cJSON_IsNumber(port) || !cJSON_IsNumber(pid)) return -1;
    out->port = port->valueint;
    out->pid = (pid_t)pid->valueint;
    return 0;
}

static int get_nodes(const cJSON *arr, sh_node *out, int *n)
{
    const cJSON *e;
    *n = 0;
    if (!cJSON_IsArray(arr)) return -1;
    cJSON_ArrayForEach(e, arr) {
        if (*n >= SH_NODES_MAX || get_node(e, &out[*n]) < 0) return -1;
        (*n)++;
    }
    return 0;
}

static int get_str(const cJSON *obj, const char *name, char *out, size_t cap)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsString(s) || strlen(s->valuestring) >= cap) return -1;
    memcpy(out, s->valuestring, strlen(s->valuestring) + 1);
    return 0;
}

/* The answer of a command that names one node, into *out. */
static int node_request(sh_group *g, sh_node *out, const char *line)
{
    pthread_mutex_lock(&g->lock);
    cJSON *j = request_locked(g, line);
    int rc = j && get_node(j, out) == 0 ? 0 : -1;
    pthread_mutex_unlock(&g->lock);
    cJSON_Delete(j);
    return rc;
}

int sh_start(sh_group *g, const sh_config *cfg)
{
    static const sh_config defaults = {.replicas = 1};
    int in[2], out[2];
    char script[1024], replicas[16], sentinels[16], down[16];
    const char *argv[32];
    int argc = 0;
    if (!cfg) cfg = &defaults;
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->lock, NULL);
    g->tls = cfg->tls_dir != NULL;
    snprintf(g->password, sizeof g->password, "%s", cfg->password ? cfg->password : "");
    snprintf(g->sentinel_password, sizeof g->sentinel_password, "%s",
             cfg->sentinel_password ? cfg->sentinel_password : "");
    script_path(script, sizeof script);
    snprintf(replicas, sizeof replicas, "%d", cfg->replicas);
    snprintf(sentinels, sizeof sentinels, "%d", cfg->sentinels ? cfg->sentinels : 3);
    snprintf(down, sizeof down, "%d", cfg->down_after_ms ? cfg->down_after_ms : 1000);
    argv[argc++] = "python3";
    argv[argc++] = script;
    argv[argc++] = "start";
    argv[argc++] = "--replicas";
    argv[argc++] = replicas;
    argv[argc++] = "--sentinels";
    argv[argc++] = sentinels;
    argv[argc++] = "--down-after-ms";
    argv[argc++] = down;
    if (cfg->tls_dir) {
        argv[argc++] = "--tls";
        argv[argc++] = cfg->tls_dir;
    }
    if (cfg->password) {
        argv[argc++] = "--password";
        argv[argc++] = cfg->password;
    }
    if (cfg->sentinel_password) {
        argv[argc++] = "--sentinel-password";
        argv[argc++] = cfg->sentinel_password;
    }
    for (int i = 0; i < SH_ACL_MAX && cfg->acl[i]; i++) {
        argv[argc++] = "--acl";
        argv[argc++] = cfg->acl[i];
    }
    argv[argc] = NULL;

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
        perror("sentinel harness: fork");
        return -1;
    }
    if (pid == 0) {
        /* The group dies with this program even if it dies by SIGKILL. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        execvp("python3", (char *const *)argv);
        perror("sentinel harness: python3");
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    g->pid = pid;
    for (int i = 0; i < SH_CHILDREN_MAX; i++)
        if (children[i] == 0) {
            children[i] = pid;
            break;
        }
    g->to = fdopen(in[1], "w");
    g->from = fdopen(out[0], "r");
    cJSON *j = g->to && g->from ? read_answer(g, "start") : NULL;
    if (!j || get_str(j, "url", g->url, sizeof g->url) < 0 ||
        get_str(j, "service", g->service, sizeof g->service) < 0 ||
        get_str(j, "dir", g->dir, sizeof g->dir) < 0 ||
        get_node(cJSON_GetObjectItemCaseSensitive(j, "master"), &g->master) < 0 ||
        get_nodes(cJSON_GetObjectItemCaseSensitive(j, "replicas"), g->replicas,
                  &g->nreplicas) < 0 ||
        get_nodes(cJSON_GetObjectItemCaseSensitive(j, "sentinels"), g->sentinels,
                  &g->nsentinels) < 0) {
        fprintf(stderr, "sentinel harness: %s start did not report a group\n", script);
        cJSON_Delete(j);
        sh_stop(g);
        return -1;
    }
    cJSON_Delete(j);
    return 0;
}

void sh_stop(sh_group *g)
{
    pthread_mutex_lock(&g->lock);
    if (g->to) fclose(g->to);   /* end of input: the child stops the group */
    g->to = NULL;
    if (g->pid) {
        int st;
        while (waitpid(g->pid, &st, 0) < 0 && errno == EINTR) {}
        for (int i = 0; i < SH_CHILDREN_MAX; i++)
            if (children[i] == g->pid) children[i] = 0;
        g->pid = 0;
    }
    if (g->from) fclose(g->from);
    g->from = NULL;
    pthread_mutex_unlock(&g->lock);
}

int sh_master(sh_group *g, sh_node *out)
{
    sh_node m;
    if (node_request(g, &m, "master") < 0) return -1;
    g->master = m;
    if (out) *out = m;
    return 0;
}

int sh_failover(sh_group *g, sh_node *old)
{
    sh_node m;
    if (node_request(g, &m, "failover") < 0) return -1;
    if (old) *old = m;
    return 0;
}

int sh_kill_master(sh_group *g, sh_node *old)
{
    sh_node m;
    if (node_request(g, &m, "kill-master") < 0) return -1;
    if (old) *old = m;
    return 0;
}

int sh_kill(sh_group *g, int port)
{
    char line[64];
    sh_node n;
    snprintf(line, sizeof line, "kill %d", port);
    return node_request(g, &n, line);
}

int sh_wait_switch(sh_group *g, int old_port, double timeout_s, sh_node *out, int64_t *seen_us)
{
    char line[128];
    sh_node m;
    snprintf(line, sizeof line, "wait-switch %d %g", old_port, timeout_s);
    pthread_mutex_lock(&g->lock);
    cJSON *j = request_locked(g, line);
    const cJSON *seconds = j ? cJSON_GetObjectItemCaseSensitive(j, "seconds") : NULL;
    int rc = j && get_node(j, &m) == 0 && cJSON_IsNumber(seconds) ? 0 : -1;
    if (rc == 0) {
        g->master = m;
        if (out) *out = m;
        /* Python's time.monotonic() is CLOCK_MONOTONIC on Linux. */
        if (seen_us) *seen_us = (int64_t)(seconds->valuedouble * 1e6);
    }
    pthread_mutex_unlock(&g->lock);
    cJSON_Delete(j);
    return rc;
}

int sh_settle(sh_group *g, double timeout_s)
{
    cJSON *j = request(g, "settle %g", timeout_s);
    cJSON_Delete(j);
    return j ? 0 : -1;
}

char *sh_cli(sh_group *g, int port, const char *args)
{
    cJSON *j = request(g, "cli %d %s", port, args);
    const cJSON *o = j ? cJSON_GetObjectItemCaseSensitive(j, "out") : NULL;
    char *out = cJSON_IsString(o) ? strdup(o->valuestring) : NULL;
    cJSON_Delete(j);
    return out;
}

int sh_is_sentinel(const sh_group *g, int port)
{
    for (int i = 0; i < g->nsentinels; i++)
        if (g->sentinels[i].port == port) return 1;
    return 0;
}

redisReply *sh_command(sh_group *g, int port, const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    const char *pw = sh_is_sentinel(g, port) ? g->sentinel_password : g->password;
    if (*pw) {
        redisReply *a = redisCommand(c, "AUTH %s", pw);
        int ok = a && a->type == REDIS_REPLY_STATUS;
        if (a) freeReplyObject(a);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

/* ---- watchdog ------------------------------------------------------------------------ */

static void on_alarm(int sig)
{
    (void)sig;
    ssize_t n = write(2, watchdog_message, strlen(watchdog_message));
    (void)n;
    /* SIGTERM: the child stops every node and removes their files (its
     * nodes would die with it anyway). Give it a moment to do so. */
    for (int i = 0; i < SH_CHILDREN_MAX; i++)
        if (children[i] > 0) kill(children[i], SIGTERM);
    for (int i = 0; i < SH_CHILDREN_MAX; i++) {
        for (int t = 0; children[i] > 0 && t < 50; t++) {
            if (waitpid(children[i], NULL, WNOHANG) != 0) break;
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    _exit(2);
}

void sh_watchdog(const char *program, unsigned seconds)
{
    snprintf(watchdog_message, sizeof watchdog_message,
             "%s: FAILED, timed out after %u s (did a call hang?)\n", program, seconds);
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}
