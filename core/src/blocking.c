/*
 * The blocking client of ops: runs an op's rounds on the nodes' pools, for
 * the decisions and resets of a cluster or a Sentinel service and for every
 * health check (a single Redis' decisions go through redis.c directly).
 */
#include <stdlib.h>

#include "limiter.h"

/* Runs op's rounds on the nodes' pools: every leg's request is sent first, so
 * that the nodes work at once, then each leg's replies are read. */
void hirate__op_run(hirate_limiter *l, hirate_op *op)
{
    int64_t deadline = hirate_monotonic_us() + (int64_t)l->node0.link.timeout_ms * 1000;
    do {
        size_t n = hirate_op_legs(op);
        hirate_redis_conn *one, **conns = n == 1 ? &one : calloc(n, sizeof *conns);
        if (!conns) {
            hirate_op_fail(op, HIRATE_ENOMEM, "out of memory for a round");
            return;
        }
        for (size_t i = 0; i < n; i++) {
            char err[HIRATE_ERRMSG_SIZE];
            size_t len = 0;
            hirate_node *nd = node_of(l, hirate_op_leg_node(op, i));
            conns[i] = NULL;
            int rc = hirate_redis_lease(nd->redis, &conns[i], err, sizeof err);
            /* Taken once the connection is ready: a check's round trip starts here. */
            const char *req = rc == 0 ? hirate_op_leg_request(op, i, &len) : NULL;
            if (rc == 0 && (rc = hirate_redis_send(nd->redis, conns[i], req, len, deadline, err,
                                                   sizeof err)) < 0) {
                hirate_redis_unlease(nd->redis, conns[i], 0);
                conns[i] = NULL;
            }
            if (rc < 0)
                hirate_op_leg_fail(op, i, rc, err);
        }
        for (size_t i = 0; i < n; i++) {
            hirate_node *nd = node_of(l, hirate_op_leg_node(op, i));
            char err[HIRATE_ERRMSG_SIZE];
            int state = HIRATE_IO_MORE;
            while (conns[i] && state == HIRATE_IO_MORE) {
                const char *data;
                size_t len, used;
                int rc = hirate_redis_read(nd->redis, conns[i], deadline, &data, &len, err,
                                           sizeof err);
                if (rc < 0) {
                    hirate_op_leg_fail(op, i, rc, err);
                    break;
                }
                state = hirate_op_leg_feed(op, i, data, len, &used);
                hirate_redis_consumed(conns[i], used);
            }
            if (conns[i])
                hirate_redis_unlease(nd->redis, conns[i], !hirate_op_leg_drop(op, i));
        }
        if (conns != &one)
            free(conns);
    } while (hirate_op_next(op) == HIRATE_IO_SEND);
}
