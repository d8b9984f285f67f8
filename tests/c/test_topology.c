/*
 * A Redis Cluster's rules without a server: key slots (the values Redis'
 * own CLUSTER KEYSLOT gives, and its hash tag rules), the MOVED and ASK
 * parser, and the CLUSTER SLOTS parser, each case exact.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "cluster.h"
#include "reply.h"
#include "slot.h"

static void slots_are_redis_slots(void)
{
    static const struct { const char *key; unsigned slot; } cases[] = {
        {"123456789", 12739},          /* CRC16/XMODEM's check value, 0x31C3 */
        {"foo", 12182},
        {"bar", 5061},
        {"rl:alice", 13752},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_EQ_I64(hirate_keyslot(cases[i].key, strlen(cases[i].key)), cases[i].slot);
}

static void hash_tags_choose_the_slot(void)
{
    /* The first '{' and the first '}' after it; an empty tag counts not. */
    static const struct { const char *a, *b; } same[] = {
        {"{user1000}.following", "{user1000}.followers"},
        {"rl:{alice}|10/1", "alice"},
        {"foo{bar}{zap}", "bar"},
        {"foo{{bar}}zap", "{bar"},
        {"{}{bar}", "{}{bar}"},
        {"x{a}", "y{a}z"},
        {"{a", "{a"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        CHECK_EQ_I64(hirate_keyslot(same[i].a, strlen(same[i].a)),
                     hirate_keyslot(same[i].b, strlen(same[i].b)));
    CHECK(hirate_keyslot("foo{}{bar}", 10) != hirate_keyslot("bar", 3));
    CHECK_EQ_I64(hirate_keyslot("{a", 2) == hirate_keyslot("a", 1), 0);
}

/* The prefix and the key are hashed as one string, whichever holds the tag. */
static void a_prefix_and_a_key_hash_as_one(void)
{
    static const char *const keys[] = {"alice", "{alice}x", "a{b", "}c", "{}", "x}y{z}"};
    static const char *const prefixes[] = {"", "rl:", "rl:{", "{t}", "p}", "{"};
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            char whole[64];
            int n = snprintf(whole, sizeof whole, "%s%s", prefixes[p], keys[k]);
            CHECK_EQ_I64(hirate_keyslot2(prefixes[p], strlen(prefixes[p]), keys[k], strlen(keys[k])),
                         hirate_keyslot(whole, (size_t)n));
        }
    }
}

static void redirections_parse_exactly(void)
{
    static const struct {
        const char *msg;
        int ok, ask;
        unsigned slot;
        const char *host;
        int port;
    } cases[] = {
        {"MOVED 3999 127.0.0.1:6381", 1, 0, 3999, "127.0.0.1", 6381},
        {"ASK 3999 127.0.0.1:6381", 1, 1, 3999, "127.0.0.1", 6381},
        {"MOVED 0 cache-1.example:7000", 1, 0, 0, "cache-1.example", 7000},
        {"MOVED 16383 :7002", 1, 0, 16383, "", 7002},          /* the same host */
        {"MOVED 12 ::1:7000", 1, 0, 12, "::1", 7000},          /* the last ':' */
        {"MOVED 12 [::1]:7000", 1, 0, 12, "::1", 7000},
        {"MOVED 16384 h:1", 0, 0, 0, "", 0},
        {"MOVED -1 h:1", 0, 0, 0, "", 0},
        {"MOVED 1 h:0", 0, 0, 0, "", 0},
        {"MOVED 1 h:65536", 0, 0, 0, "", 0},
        {"MOVED 1 h", 0, 0, 0, "", 0},
        {"MOVED 1", 0, 0, 0, "", 0},
        {"MOVED  1 h:1", 0, 0, 0, "", 0},
        {"MOVED 1 h:1x", 0, 0, 0, "", 0},
        {"MOVED 1 a b:1", 0, 0, 0, "", 0},
        {"ASKING 1 h:1", 0, 0, 0, "", 0},
        {"NOSCRIPT No matching script", 0, 0, 0, "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ask = -1, port = -1;
        unsigned slot = 99999;
        char host[256] = "";
        int ok = hirate_redirect_parse(cases[i].msg, strlen(cases[i].msg), &ask, &slot, host, &port);
        CHECK_EQ_I64(ok, cases[i].ok);
        if (!ok || !cases[i].ok)
            continue;
        CHECK_EQ_I64(ask, cases[i].ask);
        CHECK_EQ_I64(slot, cases[i].slot);
        CHECK_EQ_STR(host, cases[i].host);
        CHECK_EQ_I64(port, cases[i].port);
    }
}

typedef struct seen {
    unsigned lo[8], hi[8];
    char host[8][64];
    int port[8];
    int n;
} seen;

static int take(void *ctx, unsigned lo, unsigned hi, const char *host, int port)
{
    seen *s = ctx;
    if (s->n < 8) {
        s->lo[s->n] = lo;
        s->hi[s->n] = hi;
        snprintf(s->host[s->n], sizeof s->host[0], "%s", host);
        s->port[s->n++] = port;
    }
    return 0;
}

static int parse_map(const char *bytes, seen *s, const char **why)
{
    hirate_rreader *r = hirate_rreader_new(HIRATE_CLUSTER_MAP_BYTES, HIRATE_CLUSTER_MAP_ELEMS,
                                           HIRATE_CLUSTER_MAP_STR);
    hirate_rnode *n = NULL;
    CHECK_EQ_I64(hirate_rreader_feed(r, bytes, strlen(bytes), why), 0);
    CHECK_EQ_I64(hirate_rreader_next(r, &n, why), 1);
    memset(s, 0, sizeof *s);
    int rc = n ? hirate_cluster_parse_slots(n, "seed.example", take, s, why) : -1;
    hirate_rnode_free(n);
    hirate_rreader_free(r);
    return rc;
}

static void cluster_slots_replies_parse_exactly(void)
{
    /* redis-server 7.0.15's shape: [first, last, [ip, port, id], replicas...];
     * an empty endpoint is the node that replied. */
    const char *map =
        "*3\r\n"
        "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7100\r\n$2\r\nid\r\n"
        "*3\r\n$9\r\n127.0.0.1\r\n:7103\r\n$2\r\nid\r\n"
        "*3\r\n:5461\r\n:10922\r\n*4\r\n$10\r\nnode-2.dev\r\n:7101\r\n$2\r\nid\r\n*0\r\n"
        "*3\r\n:10923\r\n:16383\r\n*3\r\n$0\r\n\r\n:7102\r\n$2\r\nid\r\n";
    seen s;
    const char *why = NULL;
    CHECK_EQ_I64(parse_map(map, &s, &why), 0);
    CHECK_EQ_I64(s.n, 3);
    CHECK_EQ_I64(s.lo[0], 0);
    CHECK_EQ_I64(s.hi[0], 5460);
    CHECK_EQ_STR(s.host[0], "127.0.0.1");
    CHECK_EQ_I64(s.port[0], 7100);
    CHECK_EQ_STR(s.host[1], "node-2.dev");
    CHECK_EQ_I64(s.lo[2], 10923);
    CHECK_EQ_I64(s.hi[2], 16383);
    CHECK_EQ_STR(s.host[2], "seed.example");
    CHECK_EQ_I64(s.port[2], 7102);

    static const char *const bad[] = {
        "+OK\r\n",
        "*1\r\n:1\r\n",
        "*1\r\n*2\r\n:0\r\n:1\r\n",
        "*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n",          /* first > last */
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",      /* past the last slot */
        "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n:1\r\n:1\r\n",               /* a host that is not a string */
        "*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\nh\r\n:70000\r\n",      /* no such port */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why = NULL;
        CHECK_EQ_I64(parse_map(bad[i], &s, &why), HIRATE_EPROTO);
        CHECK(why != NULL);
    }
    CHECK_EQ_I64(parse_map("-ERR This instance has cluster support disabled\r\n", &s, &why),
                 HIRATE_EREPLY);
}

int main(void)
{
    slots_are_redis_slots();
    hash_tags_choose_the_slot();
    a_prefix_and_a_key_hash_as_one();
    redirections_parse_exactly();
    cluster_slots_replies_parse_exactly();
    return check_summary("test_topology");
}
