/*
 * A Redis Cluster's op (hirate_io.h's rounds of legs) fed the input as the
 * nodes' replies: script replies, MOVED and ASK with any slot and address,
 * ASKING's +OK, NOSCRIPT, CLUSTERDOWN, and the map's CLUSTER SLOTS reply of
 * any shape, as a binding feeds what it reads; or, by the settings, a
 * Sentinel service's op: a sentinel's answer of any shape, READONLY, and
 * FUNCTION LOAD's and FCALL's replies. No connection is made.
 *
 * Input: one byte of settings (how many items, 1 to 4; whether they spend;
 * the policy; a cluster or Sentinel; FCALL or EVALSHA first),
 * then the bytes, which each leg of each round takes in pieces drawn from a
 * PRNG seeded by the input; when they run out, the leg "fails" with EIO.
 * Then a health check (hirate_op_start_check) takes what is left of the
 * bytes the same way: the map's or a sentinel's answer, then ROLE's,
 * FUNCTION LIST's and SCRIPT EXISTS' replies of any shape.
 * Also: the redirection parser and the map parser on the input as it is.
 * Whatever the bytes:
 *   - no crash, no leak, no large allocation (run.sh passes -malloc_limit_mb);
 *   - a round has at most one leg per node, each to a node the core knows,
 *     with a request that is not empty; the op ends within a bounded number
 *     of rounds (every call follows at most a few redirections);
 *   - every item ends with rc 0 and a decision, or a code the header
 *     documents with a message; so does every node of the check, whose
 *     fields stay in their documented ranges;
 *   - a redirection the parser accepts has a slot below 16384 and a port
 *     from 1 to 65535; the map parser gives ranges lo <= hi < 16384.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "fuzz_util.h"
#include "hirate_io.h"
#include "reply.h"

static int check_range(void *ctx, unsigned lo, unsigned hi, const char *host, int port)
{
    (void)ctx;
    FUZZ_CHECK(lo <= hi && hi < HIRATE_SLOTS);
    FUZZ_CHECK(host != NULL && port > 0 && port <= 65535);
    return 0;
}

static void parsers(const uint8_t *data, size_t size)
{
    int ask, port;
    unsigned slot;
    char host[256];
    if (hirate_redirect_parse((const char *)data, size, &ask, &slot, host, &port)) {
        FUZZ_CHECK(slot < HIRATE_SLOTS);
        FUZZ_CHECK(port >= 1 && port <= 65535);
        FUZZ_CHECK(strlen(host) < sizeof host);
    }
    hirate_rreader *r = hirate_rreader_new(HIRATE_CLUSTER_MAP_BYTES, HIRATE_CLUSTER_MAP_ELEMS,
                                           HIRATE_CLUSTER_MAP_STR);
    const char *why;
    hirate_rnode *n = NULL;
    if (r && hirate_rreader_feed(r, (const char *)data, size, &why) == 0 &&
        hirate_rreader_next(r, &n, &why) == 1) {
        hirate_cluster_parse_slots(n, "self", check_range, NULL, &why);
        hirate_rnode_free(n);
    }
    hirate_rreader_free(r);
}

static int documented(int rc)
{
    return rc == 0 || rc == HIRATE_EPROTO || rc == HIRATE_ESERVER || rc == HIRATE_EIO ||
           rc == HIRATE_EREPLY || rc == HIRATE_EAUTH || rc == HIRATE_ENOPERM ||
           rc == HIRATE_EREFUSED || rc == HIRATE_ENOMEM || rc == HIRATE_ECLOSED;
}

/* Runs op's rounds (rc 1: there is one to send), each leg taking its
 * replies from in, in pieces drawn from rng. */
static void run_rounds(hirate_limiter *lim, hirate_op *op, int rc, fuzz_reader *in,
                       uint64_t *rng)
{
    int rounds = 0;
    while (rc == 1) {
        size_t legs = hirate_op_legs(op);
        FUZZ_CHECK(legs >= 1 && legs <= HIRATE_IO_NODES_MAX);
        for (size_t i = 0; i < legs; i++) {
            size_t len;
            hirate_endpoint ep;
            FUZZ_CHECK(hirate_op_leg_request(op, i, &len) != NULL && len > 0);
            FUZZ_CHECK_EQ(hirate_node_endpoint(lim, hirate_op_leg_node(op, i), &ep), 0);
            for (size_t k = 0; k < i; k++)
                FUZZ_CHECK(hirate_op_leg_node(op, k) != hirate_op_leg_node(op, i));
            /* Its bytes: a piece of what is left, fed in smaller pieces. */
            char buf[HIRATE_IO_REPLY_MAX];
            size_t have = 0;
            int state = HIRATE_IO_MORE;
            while (state == HIRATE_IO_MORE) {
                size_t want = 1 + (size_t)(fuzz_next(rng) % 512);
                if (want > sizeof buf - have)
                    want = sizeof buf - have;
                if (want > in->left)
                    want = in->left;
                if (!want) {
                    hirate_op_leg_fail(op, i, HIRATE_EIO, "the input ran out");
                    break;
                }
                fuzz_take(in, buf + have, want);
                have += want;
                size_t used;
                state = hirate_op_leg_feed(op, i, buf, have, &used);
                FUZZ_CHECK(used <= have);
                memmove(buf, buf + used, have - used);
                have -= used;
            }
        }
        FUZZ_CHECK(++rounds <= 4 * (HIRATE_CLUSTER_REDIRECTS_MAX + 2));
        rc = hirate_op_next(op) == HIRATE_IO_SEND;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parsers(data, size);

    fuzz_reader in = {data, size};
    uint8_t settings = fuzz_u8(&in);
    size_t nitems = 1 + (settings & 3);
    int spend = (settings >> 2) & 1;
    hirate_options o;
    hirate_options_init(&o);
    o.url = (settings >> 6) & 1 ? "redis+sentinel://127.0.0.1:1,127.0.0.1:2/m"
                                : "redis+cluster://127.0.0.1:1,127.0.0.1:2";
    o.functions = (settings >> 7) & 1;
    o.capacity = 10;
    o.rate = 1;
    o.on_error = ((settings >> 3) & 7) % 3;
    hirate_limiter *lim;
    FUZZ_CHECK_EQ(hirate_limiter_new(&lim, &o, NULL, 0), 0);

    static const char *const keys[] = {"a", "b", "{a}x", "c"};
    hirate_item items[4];
    for (size_t i = 0; i < nitems; i++)
        items[i] = (hirate_item){keys[i], strlen(keys[i]), (int64_t)i, 0, {0}};
    uint64_t rng = fuzz_seed(data, size);
    hirate_op *op;
    int rc = hirate_op_start(lim, items, nitems, spend, 5000000000LL, &op);
    FUZZ_CHECK(rc == 0 || rc == 1);
    run_rounds(lim, op, rc, &in, &rng);
    for (size_t i = 0; i < nitems; i++) {
        FUZZ_CHECK(documented(items[i].rc));
        if (items[i].rc < 0 && op)
            FUZZ_CHECK(hirate_op_errmsg(op, i) != NULL);
    }
    hirate_op_free(op);

    FUZZ_CHECK_EQ(hirate_op_start_check(lim, &op), 1);
    run_rounds(lim, op, hirate_op_legs(op) > 0, &in, &rng);
    hirate_check_node nodes[4];
    size_t n = 0;
    rc = hirate_op_check(op, nodes, 4, &n);
    FUZZ_CHECK(n >= 1 && documented(rc) && rc != HIRATE_ECLOSED);
    for (size_t i = 0; i < n && i < 4; i++) {
        FUZZ_CHECK(documented(nodes[i].rc));
        FUZZ_CHECK(nodes[i].addr[0] != 0 && strlen(nodes[i].role) < sizeof nodes[i].role);
        FUZZ_CHECK((nodes[i].rc == 0) == (nodes[i].message[0] == 0));
        FUZZ_CHECK(nodes[i].functions >= -1 && nodes[i].functions <= 1);
        FUZZ_CHECK(nodes[i].loaded >= -1 && nodes[i].loaded <= 1);
        FUZZ_CHECK(nodes[i].latency_us >= -1);
    }
    hirate_op_free(op);
    hirate_limiter_free(lim);
    return 0;
}

