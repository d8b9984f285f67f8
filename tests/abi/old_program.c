/*
 * A program of hirate 0.1: built against 0.1.0's hirate.h (a copy), linked
 * against a library with 0.1's unversioned symbols (stub_0_1.c), run with
 * today's libhirate.so.0. Its options, decisions, batches and messages are
 * exact, in memory and in a real redis-server: the layout of 0.1's structs
 * reaches the new library intact.
 *
 *     old_program <expected version>
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hirate-0.1.0.h"

#include "check.h"
#include "redis_harness.h"

static hirate_limiter *make(const char *url, int deny_cache)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 3;
    o.rate = 0.001;          /* no refill within the test */
    o.prefix = "abi01:";
    o.deny_cache = deny_cache;
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&lim, &o, why, sizeof why);
    CHECK_EQ_I64(rc, 0);
    if (rc < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", why);
    return lim;
}

static void decisions_are_exact(const char *url, int source)
{
    hirate_limiter *lim = make(url, 0);
    if (!lim)
        return;
    hirate_decision d;
    for (int i = 0; i < 4; i++) {
        memset(&d, 0x5A, sizeof d);
        CHECK_EQ_I64(hirate_allow(lim, "alice", 5, 1, &d), 0);
        CHECK_EQ_I64(d.allowed, i < 3);
        CHECK_EQ_I64(d.source, source);   /* deny_cache 0: never HIRATE_SOURCE_CACHE */
        CHECK_EQ_I64(d.error, 0);
        CHECK_EQ_I64(d.limit, 3);
        CHECK_EQ_I64(d.remaining, i < 3 ? 2 - i : 0);
        CHECK(i < 3 ? d.retry_after_us == 0 : d.retry_after_us > 0);
    }
    CHECK_EQ_I64(hirate_peek(lim, "alice", 5, 4, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.retry_after_us, HIRATE_NEVER);
    CHECK_EQ_I64(hirate_reset(lim, "alice", 5), 0);
    CHECK_EQ_I64(hirate_peek(lim, "alice", 5, 1, &d), 0);
    CHECK_EQ_I64(d.remaining, 3);

    /* A batch: 0.1's hirate_item, each at 0.1's stride. */
    hirate_item items[3] = {{"bob", 3, 2, 0, {0}}, {"", 0, 1, 0, {0}}, {"carol", 5, 3, 0, {0}}};
    CHECK_EQ_I64(hirate_allow_many(lim, items, 3), 0);
    CHECK_EQ_I64(items[0].rc, 0);
    CHECK_EQ_I64(items[0].decision.remaining, 1);
    CHECK_EQ_I64(items[1].rc, HIRATE_EKEY);
    CHECK_EQ_I64(items[2].rc, 0);
    CHECK_EQ_I64(items[2].decision.allowed, 1);
    CHECK_EQ_I64(items[2].decision.remaining, 0);
    CHECK_EQ_I64(items[2].decision.limit, 3);
    CHECK_EQ_I64(items[2].decision.source, source);

    char msg[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_allow(lim, "", 0, 1, &d), HIRATE_EKEY);
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg), "key is empty");
    hirate_limiter_free(lim);
}

/* Fields after the ones 0.2 inserted land where 0.1 put them. */
static void options_keep_their_places(void)
{
    hirate_options o;
    memset(&o, 0x5A, sizeof o);
    hirate_options_init(&o);
    CHECK(o.url == NULL);
    CHECK_EQ_I64(o.capacity, 0);
    CHECK_EQ_STR(o.prefix, "rl:");
    CHECK_EQ_I64(o.connect_timeout_ms, 250);
    CHECK_EQ_I64(o.timeout_ms, 100);
    CHECK_EQ_I64(o.pool_size, 16);
    CHECK_EQ_I64(o.max_keys, 1000000);
    CHECK_EQ_I64(o.on_error, HIRATE_ON_ERROR_LOCAL);
    CHECK_EQ_I64(o.instances, 1);
    CHECK_EQ_I64(o.backoff_min_ms, 100);
    CHECK_EQ_I64(o.backoff_max_ms, 5000);
    CHECK_EQ_I64(o.deny_cache, 1);
    CHECK_EQ_I64(o.deny_cache_keys, 65536);

    char why[HIRATE_ERRMSG_SIZE];
    hirate_limiter *lim;
    o.capacity = 1;
    o.rate = 1;
    o.deny_cache_keys = 0;   /* the last field of 0.1's layout */
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "deny_cache_keys must be from 1 to 4000000000, got 0");
    o.deny_cache_keys = 10;
    o.backoff_max_ms = 50;   /* below backoff_min_ms */
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, why, sizeof why), HIRATE_EOPTION);
    CHECK_EQ_STR(why, "backoff_max_ms must be from 100 to 600000, got 50");
}

/* The policy fields: Redis down, on_error closed. */
static void the_policy_is_read(void)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = "redis://127.0.0.1:1";
    o.capacity = 5;
    o.rate = 1;
    o.on_error = HIRATE_ON_ERROR_CLOSED;
    o.connect_timeout_ms = 200;
    hirate_limiter *lim;
    CHECK_EQ_I64(hirate_limiter_new(&lim, &o, NULL, 0), 0);
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 1, &d), 0);
    CHECK_EQ_I64(d.allowed, 0);
    CHECK_EQ_I64(d.source, HIRATE_SOURCE_FAIL_CLOSED);
    CHECK_EQ_I64(d.error, HIRATE_ECONNECT);
    hirate_limiter_free(lim);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: old_program <expected version>\n");
        return 2;
    }
    /* The library this runs with is the new one, not the stub. */
    CHECK_EQ_STR(hirate_version(), argv[1]);
    options_keep_their_places();
    decisions_are_exact(NULL, HIRATE_SOURCE_LOCAL);
    the_policy_is_read();

    rh_server s;
    memset(&s, 0, sizeof s);
    if (rh_start(&s) < 0)
        return 1;
    rh_watchdog(&s, "old_program", 60);
    decisions_are_exact(s.url, HIRATE_SOURCE_REDIS);
    /* The prefix, a field that moved, named the keys. */
    redisReply *r = rh_command(&s, "EXISTS abi01:bob");
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);
    rh_stop(&s);
    return check_summary("old_program");
}
