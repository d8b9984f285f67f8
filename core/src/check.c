/*
 * The health check (hirate_check, hirate_op_start_check): one round trip to
 * each node decisions go to now, for ROLE and whether hirate's library or
 * script is there; an op of its own kind, run by op.c's rounds and legs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "op.h"
#include "proto.h"
#include "script.h"

/* What a check learnt of the library or script on its node. */
enum { CHECK_UNKNOWN, CHECK_ABSENT, CHECK_LOADED, CHECK_NOFUNC };
#define CHECK_REPLIES 3     /* ROLE, FUNCTION LIST, SCRIPT EXISTS */

/* The nodes decisions go to now: the server; a cluster's masters (the
 * nodes its map names for some slot); a Sentinel service's master. */
static size_t check_targets(hirate_limiter *l, int *out)
{
    hirate_cluster *c = l->cluster;
    if (!c) {
        out[0] = 0;
        return 1;
    }
    if (c->sentinel) {
        int m = hirate_cluster_route(c, 0);
        out[0] = m;
        return m >= 0;
    }
    if (!__atomic_load_n(&c->have_map, __ATOMIC_ACQUIRE))
        return 0;
    unsigned char seen[HIRATE_IO_NODES_MAX] = {0};
    for (unsigned s = 0; s < HIRATE_SLOTS; s++) {
        int owner = __atomic_load_n(&c->owner[s], __ATOMIC_RELAXED);
        if (owner)
            seen[owner - 1] = 1;
    }
    size_t n = 0;
    for (int i = 0; i < HIRATE_IO_NODES_MAX; i++)
        if (seen[i])
            out[n++] = i;
    return n;
}

static void check_init(hirate_op *op, hirate_check_node *cn, int node)
{
    hirate_endpoint ep;
    memset(cn, 0, sizeof *cn);
    hirate_link_endpoint(&node_of(op->l, node)->link, &ep);
    snprintf(cn->addr, sizeof cn->addr, "%s", ep.where);
    cn->functions = cn->loaded = -1;
    cn->latency_us = -1;
}

void hirate__check_fail(hirate_check_node *cn, int code, const char *why)
{
    cn->rc = hirate__fail(cn->message, sizeof cn->message, code, "%s",
                          why && *why ? why : hirate_strerror(code));
}

/* The nodes could not be found: one entry, for the node asked last (or the
 * limiter's first), with what stopped it. */
static void check_unfound(hirate_op *op)
{
    hirate_check_node *cn = calloc(1, sizeof *cn);
    if (!cn) {
        op->rc = HIRATE_ENOMEM;
        return;
    }
    check_init(op, cn, op->check_asked >= 0 ? op->check_asked : 0);
    if (op->route_rc)
        hirate__check_fail(cn, op->route_rc, op->route_err);
    else if (sentinel_of(op->l))
        cn->rc = hirate__no_master(op, cn->message, sizeof cn->message);
    else
        hirate__check_fail(cn, HIRATE_ESERVER, "the cluster's slot map is not known yet");
    op->checks = cn;
    op->nchecks = 1;
}

static int check_encode(leg *g)
{
    const char *argv[4] = {"FUNCTION", "LIST", "LIBRARYNAME", hirate__function_name};
    size_t lens[4] = {8, 4, 11, strlen(hirate__function_name)};
    const char *sargv[3] = {"SCRIPT", "EXISTS", hirate__script_sha1};
    size_t slens[3] = {6, 6, 40};
    static const char role_cmd[] = "*1\r\n$4\r\nROLE\r\n";
    size_t cap = sizeof role_cmd - 1 + hirate_proto_encode_argv(NULL, 0, 4, argv, lens) +
                 hirate_proto_encode_argv(NULL, 0, 3, sargv, slens);
    if (!(g->req = malloc(cap)) ||
        !(g->rr = hirate_rreader_new(64u << 10, 1024, HIRATE_IO_REPLY_MAX)))
        return HIRATE_ENOMEM;
    memcpy(g->req, role_cmd, sizeof role_cmd - 1);
    size_t len = sizeof role_cmd - 1;
    len += hirate_proto_encode_argv(g->req + len, cap - len, 4, argv, lens);
    len += hirate_proto_encode_argv(g->req + len, cap - len, 3, sargv, slens);
    g->reqlen = len;
    return 0;
}

/* The checks' round: the nodes, or a round to find them first. */
int hirate__check_round(hirate_op *op)
{
    hirate_limiter *l = op->l;
    if (op->check_sent || op->rc)
        return 0;
    hirate__legs_clear(op);
    int nodes[HIRATE_IO_NODES_MAX];
    size_t n = check_targets(l, nodes);
    if (!n) {
        if (op->check_rounds++ < HIRATE_CLUSTER_REDIRECTS_MAX)
            hirate__add_refresh(op);
        if (op->nlegs && hirate__leg_encode(op, &op->legs[0]) == 0) {
            op->check_asked = op->legs[0].node;
            return 1;
        }
        hirate__legs_clear(op);
        check_unfound(op);
        return 0;
    }
    if (!(op->checks = calloc(n, sizeof *op->checks))) {
        op->rc = HIRATE_ENOMEM;
        return 0;
    }
    op->nchecks = n;
    op->check_sent = 1;
    for (size_t k = 0; k < n; k++) {
        check_init(op, &op->checks[k], nodes[k]);
        leg *g = hirate__leg_add(op, nodes[k]);
        if (!g || check_encode(g) < 0) {
            hirate__check_fail(&op->checks[k], HIRATE_ENOMEM, "out of memory for a request");
            if (g)
                g->state = LEG_FAILED;
            continue;
        }
        g->check = (int)k + 1;
    }
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            return 1;
    return 0;
}

/* One of the check's replies, in the order sent. */
static void check_reply(hirate_op *op, leg *g, const hirate_rnode *r)
{
    hirate_check_node *cn = &op->checks[g->check - 1];
    size_t k = g->next++;
    if (r->type == '-') {
        int cls = hirate_proto_error_class(r->str, r->len);
        int denied = strncmp(r->str, "NOPERM", 6) == 0;
        if (cls == HIRATE_ESERVER || cls == HIRATE_EAUTH || cls == HIRATE_EREFUSED) {
            if (hirate_proto_error_drops_connection(r->str, r->len))
                g->drop = 1;
            if (!cn->rc)
                cn->rc = hirate__fail_quoting(cn->message, sizeof cn->message, cls,
                                              "Redis replied: ", r->str, r->len);
        } else if (k == 1) {
            g->fl = denied ? CHECK_UNKNOWN : cls == HIRATE_PROTO_NOFUNC ? CHECK_NOFUNC
                                                                        : CHECK_UNKNOWN;
        }
        return;   /* ROLE refused (an ACL), say: Redis still answered */
    }
    if (k == 0) {
        if (r->type == '*' && r->len && (r->elem[0]->type == '$' || r->elem[0]->type == '+'))
            snprintf(cn->role, sizeof cn->role, "%s", r->elem[0]->str);
    } else if (k == 1) {
        if (r->type == '*')
            g->fl = r->len ? CHECK_LOADED : CHECK_ABSENT;
    } else if (r->type == '*' && r->len == 1 && r->elem[0]->type == ':') {
        g->se = r->elem[0]->integer ? CHECK_LOADED : CHECK_ABSENT;
    }
}

/* The node's entry from the replies: what a decision would meet there. */
static void check_judge(hirate_op *op, leg *g, int64_t took_us)
{
    hirate_check_node *cn = &op->checks[g->check - 1];
    hirate_node *nd = node_of(op->l, g->node);
    cn->latency_us = took_us;
    /* FCALL, unless the option or the server said no (FUNCTION LIST is
     * unknown to a Redis before 7; an ACL that denies it hides the truth). */
    int fcall = __atomic_load_n(&nd->link.functions, __ATOMIC_RELAXED) && g->fl != CHECK_NOFUNC;
    int seen = fcall ? g->fl : g->se;
    cn->functions = fcall;
    cn->loaded = seen == CHECK_LOADED ? 1 : seen == CHECK_ABSENT ? 0 : -1;
    if (!cn->rc && cn->role[0] && strcmp(cn->role, "master") != 0) {
        cn->rc = hirate__fail(cn->message, sizeof cn->message, HIRATE_ESERVER,
                              "Redis at %s is not a master (ROLE: %s): it cannot take decisions",
                              cn->addr, cn->role);
        if (sentinel_of(op->l))
            hirate_cluster_master_lost(op->l->cluster, g->node);
        else if (op->l->cluster)
            hirate_cluster_stale(op->l->cluster);
    }
}

int hirate__check_feed(hirate_op *op, size_t i, leg *g, const char *buf, size_t len, size_t *used)
{
    const char *why = NULL;
    *used = len;
    if (hirate_rreader_feed(g->rr, buf, len, &why) < 0)
        goto malformed;
    while (g->next < CHECK_REPLIES) {
        hirate_rnode *r = NULL;
        int got = hirate_rreader_next(g->rr, &r, &why);
        if (got < 0)
            goto malformed;
        if (got == 0)
            return HIRATE_IO_MORE;
        check_reply(op, g, r);
        hirate_rnode_free(r);
    }
    *used = len - hirate_rreader_pending(g->rr);   /* the rest: the next replies */
    check_judge(op, g, hirate_monotonic_us() - g->started);
    g->state = LEG_DONE;
    op->drop |= g->drop;
    return HIRATE_IO_DONE;
malformed: {
        char err[HIRATE_ERRMSG_SIZE];
        hirate__fail(err, sizeof err, HIRATE_EPROTO, "malformed reply from Redis: %s", why);
        hirate_op_leg_fail(op, i, HIRATE_EPROTO, err);
        return HIRATE_IO_DONE;
    }
}

int hirate_op_start_check(hirate_limiter *l, hirate_op **out)
{
    *out = NULL;
    if (!l || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (hirate__op_new(l, OP_CHECK, &op) < 0)
        return HIRATE_ENOMEM;
    op->check_asked = -1;
    if (!hirate__op_round(op)) {
        hirate__op_finish(op);   /* no node to ask: done, its one entry says why */
        if (!op->nchecks) {
            hirate_op_free(op);
            return HIRATE_ENOMEM;
        }
    }
    *out = op;
    return 1;
}

int hirate_op_check(const hirate_op *op, hirate_check_node *nodes, size_t max, size_t *n)
{
    if (!op || op->kind != OP_CHECK || (!nodes && max))
        return HIRATE_EINVAL;
    for (size_t i = 0; i < op->nchecks && i < max; i++)
        nodes[i] = op->checks[i];
    if (n)
        *n = op->nchecks;
    return hirate_op_result(op);
}

int hirate_check(hirate_limiter *l, hirate_check_node *nodes, size_t max, size_t *n)
{
    if (n)
        *n = 0;
    if (!l || (!nodes && max))
        return HIRATE_EINVAL;
    if (!l->node0.redis)
        return 0;
    hirate_op *op;
    int rc = hirate_op_start_check(l, &op);
    if (rc < 0)
        return rc;
    if (!op->done)
        hirate__op_run(l, op);
    rc = hirate_op_check(op, nodes, max, n);
    hirate_op_free(op);
    return rc;
}
