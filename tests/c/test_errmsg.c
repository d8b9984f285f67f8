/*
 * Error messages are per call: hirate_limiter_errmsg gives the calling
 * thread's own last error, so two threads failing at once on one limiter in
 * two different ways each read their own; hirate_allow_many_msgs gives each
 * item of a batch its own message; hirate_validate gives a key's and cost's
 * without a limiter. Under ThreadSanitizer too (make test-tsan).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "hirate.h"
#include "redis_harness.h"

#define ROUNDS 20000

static const char EMPTY[] = "key is empty";
static const char NEGATIVE[] = "cost must be a whole number from 0 to 2^53-1, got -1";
static char key513[513];
static char long_key[64];

typedef struct worker {
    hirate_limiter *lim;
    pthread_barrier_t *start;
    int bad_cost;           /* 1: fails on the cost, 0: on the key */
    int wrong;              /* messages that were not this thread's */
    int codes;              /* codes that were not */
} worker;

static void *fail_again_and_again(void *arg)
{
    worker *w = arg;
    const char *want = w->bad_cost ? NEGATIVE : EMPTY;
    char msg[HIRATE_ERRMSG_SIZE];
    hirate_decision d;
    pthread_barrier_wait(w->start);
    for (int i = 0; i < ROUNDS; i++) {
        int rc = w->bad_cost ? hirate_allow(w->lim, "k", 1, -1, &d)
                             : hirate_allow(w->lim, "", 0, 1, &d);
        w->codes += rc != (w->bad_cost ? HIRATE_ECOST : HIRATE_EKEY);
        w->wrong += strcmp(hirate_limiter_errmsg(w->lim, msg, sizeof msg), want) != 0;
    }
    return NULL;
}

static void two_threads_read_their_own_messages(hirate_limiter *lim)
{
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    worker w[2] = {{lim, &start, 0, 0, 0}, {lim, &start, 1, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, fail_again_and_again, &w[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    CHECK_EQ_I64(w[0].codes + w[1].codes, 0);
    CHECK_EQ_I64(w[0].wrong, 0);
    CHECK_EQ_I64(w[1].wrong, 0);
}

static void a_message_is_its_limiters(hirate_limiter *lim, hirate_limiter *other)
{
    char msg[HIRATE_ERRMSG_SIZE];
    hirate_decision d;
    CHECK_EQ_I64(hirate_allow(lim, "", 0, 1, &d), HIRATE_EKEY);
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg), EMPTY);
    CHECK_EQ_STR(hirate_limiter_errmsg(other, msg, sizeof msg), "");
    /* A call that succeeds leaves it. */
    CHECK_EQ_I64(hirate_allow(lim, "k", 1, 0, &d), 0);
    CHECK_EQ_STR(hirate_limiter_errmsg(lim, msg, sizeof msg), EMPTY);
}

/* Each item its own words; "" for the decided ones. */
static void a_batch_gives_each_item_its_message(hirate_limiter *lim, const char *what)
{
    hirate_item items[5] = {
        {"a", 1, 1, 0, {0}},
        {"", 0, 1, 0, {0}},
        {"b", 1, -1, 0, {0}},
        {key513, sizeof key513, 1, 0, {0}},
        {long_key, sizeof long_key, 2, 0, {0}},
    };
    char msgs[5][HIRATE_ERRMSG_SIZE];
    memset(msgs, 'x', sizeof msgs);
    CHECK_EQ_I64(hirate_allow_many_msgs(lim, items, 5, NULL, msgs[0], sizeof msgs[0]), 0);
    int ok = 1;
    ok &= items[0].rc == 0 && items[0].decision.allowed == 1;
    ok &= items[1].rc == HIRATE_EKEY && items[2].rc == HIRATE_ECOST;
    ok &= items[3].rc == HIRATE_EKEY && items[4].rc == 0;
    CHECK(ok);
    CHECK_EQ_STR(msgs[0], "");
    CHECK_EQ_STR(msgs[1], EMPTY);
    CHECK_EQ_STR(msgs[2], NEGATIVE);
    CHECK_EQ_STR(msgs[3], "key is 513 bytes; the most is 512");
    CHECK_EQ_STR(msgs[4], "");
    /* A message cut to the room given, and terminated. */
    char small[5][8];
    CHECK_EQ_I64(hirate_allow_many_msgs(lim, items, 5, NULL, small[0], sizeof small[0]), 0);
    CHECK_EQ_STR(small[1], "key is ");
    CHECK_EQ_STR(small[3], "key is ");
    if (!ok)
        fprintf(stderr, "  (%s)\n", what);
}

static void validate_needs_no_limiter(void)
{
    char msg[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_validate("k", 1, 1, msg, sizeof msg), 0);
    CHECK_EQ_STR(msg, "");
    CHECK_EQ_I64(hirate_validate("", 0, 1, msg, sizeof msg), HIRATE_EKEY);
    CHECK_EQ_STR(msg, EMPTY);
    CHECK_EQ_I64(hirate_validate("k", 1, -1, msg, sizeof msg), HIRATE_ECOST);
    CHECK_EQ_STR(msg, NEGATIVE);
    CHECK_EQ_I64(hirate_validate(NULL, 1, 1, msg, sizeof msg), HIRATE_EINVAL);
    CHECK_EQ_STR(msg, "key is NULL");
    CHECK_EQ_I64(hirate_validate(key513, sizeof key513, 1, NULL, 0), HIRATE_EKEY);
}

/* Two calls of one round trip that Redis refuses in two ways: each item gets
 * its reply's own words, not the last reply's. */
static void redis_refusals_keep_their_words(rh_server *s, hirate_limiter *lim)
{
    freeReplyObject(rh_command(s, "RPUSH errmsg:list x"));
    freeReplyObject(rh_command(s, "SET errmsg:junk %s", "1 x"));
    hirate_item items[3] = {
        {"list", 4, 1, 0, {0}},
        {"junk", 4, 1, 0, {0}},
        {"fine", 4, 1, 0, {0}},
    };
    char msgs[3][HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_allow_many_msgs(lim, items, 3, NULL, msgs[0], sizeof msgs[0]), 0);
    CHECK_EQ_I64(items[0].rc, HIRATE_EREPLY);
    CHECK_EQ_I64(items[1].rc, HIRATE_EREPLY);
    CHECK_EQ_I64(items[2].rc, 0);
    CHECK(strncmp(msgs[0], "Redis replied: WRONGTYPE", 24) == 0);
    CHECK_EQ_STR(msgs[1], "Redis replied: ERR hirate: bucket state is corrupt");
    CHECK_EQ_STR(msgs[2], "");
    if (strncmp(msgs[0], "Redis replied: WRONGTYPE", 24) != 0)
        fprintf(stderr, "  item 0: %s\n", msgs[0]);
}

static hirate_limiter *make(const char *url)
{
    hirate_options o;
    hirate_options_init(&o);
    o.url = url;
    o.capacity = 10;
    o.rate = 1;
    o.prefix = "errmsg:";
    hirate_limiter *lim = NULL;
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_limiter_new(&lim, &o, why, sizeof why) < 0)
        fprintf(stderr, "hirate_limiter_new: %s\n", why);
    CHECK(lim != NULL);
    return lim;
}

int main(void)
{
    memset(key513, 'k', sizeof key513);
    memset(long_key, 'l', sizeof long_key);
    validate_needs_no_limiter();

    hirate_limiter *mem = make(NULL), *other = make(NULL);
    if (mem && other) {
        two_threads_read_their_own_messages(mem);
        a_message_is_its_limiters(mem, other);
        a_batch_gives_each_item_its_message(mem, "memory");
    }
    hirate_limiter_free(other);

    rh_server s;
    memset(&s, 0, sizeof s);
    if (rh_start(&s) == 0) {
        rh_watchdog(&s, "test_errmsg", 120);
        hirate_limiter *red = make(s.url);
        if (red) {
            two_threads_read_their_own_messages(red);
            a_message_is_its_limiters(red, mem);
            a_batch_gives_each_item_its_message(red, "redis");
            redis_refusals_keep_their_words(&s, red);
        }
        hirate_limiter_free(red);
        rh_stop(&s);
    } else {
        CHECK(0);
    }
    hirate_limiter_free(mem);
    return check_summary("test_errmsg");
}
