/*
 * The health check, hirate_check(), against real servers: a live Redis
 * before and after its first decision (by FCALL and by EVALSHA), one that
 * was stopped, one that wants another password, a replica, an ACL user that
 * may not run ROLE or FUNCTION, a 3-master cluster and a Sentinel service;
 * the check changes no metric but connections, and a limiter without Redis
 * has no node.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cluster_harness.h"
#include "hirate.h"
#include "redis_harness.h"
#include "sentinel_harness.h"

#define PASSWORD "check-secret-9f2c"

static rh_server S;

static hirate_limiter *make(const char *url, int functions)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 5;
    o.rate = 1;
    o.prefix = "chk:";
    o.functions = functions;
    o.backoff_min_ms = 10;
    o.backoff_max_ms = 10;
    o.timeout_ms = 2000;
    o.connect_timeout_ms = 1000;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    if (rc)
        fprintf(stderr, "  hirate_limiter_new: %s\n", why);
    CHECK_EQ_I64(rc, 0);
    return lim;
}

static int check(hirate_limiter *lim, hirate_check_node *nodes, size_t max, size_t *n)
{
    memset(nodes, 0x5a, max * sizeof *nodes);
    int rc = hirate_check(lim, nodes, max, n);
    for (size_t i = 0; i < *n && i < max; i++)
        printf("  %s: rc %s role '%s' functions %d loaded %d latency %lld us%s%s\n",
               nodes[i].addr, hirate_err_name(nodes[i].rc), nodes[i].role, nodes[i].functions,
               nodes[i].loaded, (long long)nodes[i].latency_us, nodes[i].rc ? ": " : "",
               nodes[i].message);
    return rc;
}

static void allow_once(hirate_limiter *lim)
{
    hirate_decision d;
    int rc = hirate_allow(lim, "k", 1, 1, &d);
    CHECK_EQ_I64(rc, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_REDIS);
    if (rc || d.source != HIRATE_SOURCE_REDIS) {
        char msg[HIRATE_ERRMSG_SIZE];
        fprintf(stderr, "  allow: %s (%s)\n", hirate_err_name(rc ? rc : d.error),
                hirate_limiter_errmsg(lim, msg, sizeof msg));
    }
}

static void test_memory_has_no_node(void)
{
    hirate_limiter *lim = make(NULL, 1);
    hirate_check_node nodes[2];
    size_t n = 99;
    CHECK_EQ_I64(hirate_check(lim, nodes, 2, &n), 0);
    CHECK_EQ_I64(n, 0);
    CHECK_EQ_I64(hirate_check(NULL, nodes, 2, &n), HIRATE_EINVAL);
    CHECK_EQ_I64(hirate_check(lim, NULL, 2, &n), HIRATE_EINVAL);
    hirate_limiter_free(lim);
}

static void test_live(int functions)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", S.port);
    freeReplyObject(rh_command(&S, "FLUSHALL"));
    freeReplyObject(rh_command(&S, "SCRIPT FLUSH"));
    freeReplyObject(rh_command(&S, "FUNCTION FLUSH"));
    hirate_limiter *lim = make(S.url, functions);
    hirate_check_node nodes[4];
    size_t n = 0;
    /* Before any decision: healthy, nothing loaded yet. */
    CHECK_EQ_I64(check(lim, nodes, 4, &n), 0);
    CHECK_EQ_I64(n, 1);
    CHECK_EQ_STR(nodes[0].addr, addr);
    CHECK_EQ_I64(nodes[0].rc, 0);
    CHECK_EQ_STR(nodes[0].role, "master");
    CHECK_EQ_STR(nodes[0].message, "");
    CHECK_EQ_I64(nodes[0].functions, functions);
    CHECK_EQ_I64(nodes[0].loaded, 0);
    CHECK(nodes[0].latency_us >= 0 && nodes[0].latency_us < 2000000);
    /* The first decision loads the library (or the script). */
    allow_once(lim);
    hirate_stats before, after;
    CHECK_EQ_I64(hirate_stats_get(lim, &before, sizeof before), 0);
    CHECK_EQ_I64(check(lim, nodes, 4, &n), 0);
    CHECK_EQ_I64(nodes[0].functions, functions);
    CHECK_EQ_I64(nodes[0].loaded, 1);
    /* Checks are not decisions, nor decisions' round trips; they use the
     * pool's connection. */
    CHECK_EQ_I64(hirate_stats_get(lim, &after, sizeof after), 0);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    CHECK_EQ_I64(after.decisions[HIRATE_SOURCE_REDIS], 1);
    CHECK_EQ_I64(after.connects, 1);
    /* max 0: only the count. */
    CHECK_EQ_I64(hirate_check(lim, NULL, 0, &n), 0);
    CHECK_EQ_I64(n, 1);
    hirate_limiter_free(lim);
}

static void test_stopped(void)
{
    rh_server t = {0};
    CHECK_EQ_I64(rh_start(&t), 0);
    hirate_limiter *lim = make(t.url, 1);
    hirate_check_node nodes[1];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 1, &n), 0);
    rh_kill(&t);
    CHECK_EQ_I64(check(lim, nodes, 1, &n), HIRATE_ECONNECT);
    CHECK_EQ_I64(n, 1);
    CHECK_EQ_I64(nodes[0].rc, HIRATE_ECONNECT);
    CHECK_EQ_STR(nodes[0].role, "");
    CHECK_EQ_I64(nodes[0].functions, -1);
    CHECK_EQ_I64(nodes[0].loaded, -1);
    CHECK_EQ_I64(nodes[0].latency_us, -1);
    char want[80];
    snprintf(want, sizeof want, "127.0.0.1:%d", t.port);
    CHECK(strstr(nodes[0].message, want) != NULL);
    /* And again, once it is back (the backoff is 10 ms). */
    CHECK_EQ_I64(rh_restart(&t), 0);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    CHECK_EQ_I64(check(lim, nodes, 1, &n), 0);
    CHECK_EQ_STR(nodes[0].role, "master");
    hirate_limiter_free(lim);
    rh_stop(&t);
}

static void test_wrong_password(void)
{
    rh_server t = {0};
    t.extra = "--requirepass " PASSWORD;
    CHECK_EQ_I64(rh_start(&t), 0);
    char url[160];
    snprintf(url, sizeof url, "redis://:not-%s@127.0.0.1:%d", PASSWORD, t.port);
    hirate_limiter *lim = make(url, 1);
    hirate_check_node nodes[1];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 1, &n), HIRATE_EAUTH);
    CHECK_EQ_I64(n, 1);
    CHECK_EQ_I64(nodes[0].rc, HIRATE_EAUTH);
    CHECK(strstr(nodes[0].message, PASSWORD) == NULL);
    CHECK(strstr(nodes[0].message, "WRONGPASS") != NULL);
    hirate_limiter_free(lim);
    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d", PASSWORD, t.port);
    lim = make(url, 1);
    CHECK_EQ_I64(check(lim, nodes, 1, &n), 0);
    hirate_limiter_free(lim);
    rh_stop(&t);
}

static void test_replica(void)
{
    rh_server t = {0};
    char extra[64];
    snprintf(extra, sizeof extra, "--replicaof 127.0.0.1 %d", S.port);
    t.extra = extra;
    CHECK_EQ_I64(rh_start(&t), 0);
    hirate_limiter *lim = make(t.url, 1);
    hirate_check_node nodes[1];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 1, &n), HIRATE_ESERVER);
    CHECK_EQ_STR(nodes[0].role, "slave");
    char want[120];
    snprintf(want, sizeof want, "Redis at 127.0.0.1:%d is not a master (ROLE: slave)", t.port);
    CHECK(strstr(nodes[0].message, want) != NULL);
    CHECK(nodes[0].latency_us >= 0);
    hirate_limiter_free(lim);
    rh_stop(&t);
}

/* A user kept to the limiter's own commands: healthy, what it cannot see
 * unknown. */
static void test_acl_user(void)
{
    freeReplyObject(rh_command(&S, "ACL SETUSER lean on >lean-pw ~chk:* +@all -role "
                                   "-function|list -script|exists"));
    char url[128];
    snprintf(url, sizeof url, "redis://lean:lean-pw@127.0.0.1:%d", S.port);
    hirate_limiter *lim = make(url, 1);
    hirate_check_node nodes[1];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 1, &n), 0);
    CHECK_EQ_I64(nodes[0].rc, 0);
    CHECK_EQ_STR(nodes[0].role, "");
    CHECK_EQ_I64(nodes[0].functions, 1);
    CHECK_EQ_I64(nodes[0].loaded, -1);
    allow_once(lim);
    hirate_limiter_free(lim);
    freeReplyObject(rh_command(&S, "ACL DELUSER lean"));
}

static void test_cluster(void)
{
    static ch_cluster C;
    if (ch_start(&C, 3, 1, NULL) < 0) {
        CHECK(!"the cluster started");
        return;
    }
    hirate_limiter *lim = make(C.url, 1);
    hirate_check_node nodes[8];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 8, &n), 0);
    CHECK_EQ_I64(n, 3);
    int masters = 0;
    for (size_t i = 0; i < n && i < 8; i++) {
        CHECK_EQ_STR(nodes[i].role, "master");
        CHECK_EQ_I64(nodes[i].rc, 0);
        for (int k = 0; k < C.n; k++) {
            char addr[64];
            snprintf(addr, sizeof addr, "127.0.0.1:%d", C.nodes[k].port);
            masters += C.nodes[k].master && strcmp(addr, nodes[i].addr) == 0;
        }
    }
    CHECK_EQ_I64(masters, 3);
    /* Fewer rooms than nodes: the count is still every node's. */
    CHECK_EQ_I64(check(lim, nodes, 1, &n), 0);
    CHECK_EQ_I64(n, 3);
    hirate_limiter_free(lim);
    ch_stop(&C);
}

static void test_sentinel(void)
{
    static sh_group G;
    sh_config gc = {.replicas = 1, .sentinels = 1};
    if (sh_start(&G, &gc) < 0) {
        CHECK(!"the Sentinel group started");
        return;
    }
    hirate_limiter *lim = make(G.url, 1);
    hirate_check_node nodes[2];
    size_t n = 0;
    CHECK_EQ_I64(check(lim, nodes, 2, &n), 0);
    CHECK_EQ_I64(n, 1);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", G.master.port);
    CHECK_EQ_STR(nodes[0].addr, want);
    CHECK_EQ_STR(nodes[0].role, "master");
    allow_once(lim);
    CHECK_EQ_I64(check(lim, nodes, 2, &n), 0);
    CHECK_EQ_I64(nodes[0].loaded, 1);
    hirate_limiter_free(lim);
    /* No sentinel answers: one entry, a sentinel's, saying so. */
    sh_stop(&G);
    lim = make(G.url, 1);
    CHECK_EQ_I64(check(lim, nodes, 2, &n), HIRATE_ECONNECT);
    CHECK_EQ_I64(n, 1);
    hirate_limiter_free(lim);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rh_start(&S) != 0) {
        CHECK(!"redis-server must start (is it installed and on PATH?)");
        return check_summary("test_check");
    }
    rh_watchdog(&S, "test_check", 120);
    test_memory_has_no_node();
    test_live(1);
    test_live(0);
    test_stopped();
    test_wrong_password();
    test_replica();
    test_acl_user();
    test_cluster();
    test_sentinel();
    rh_stop(&S);
    return check_summary("test_check");
}
