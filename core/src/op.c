/*
 * An op goes to Redis in rounds of legs, one leg per node (hirate_io.h). Its
 * calls wait as CALL_PENDING until a round sends them; a reply settles a
 * call (a decision, an error, or the policy's answer to an outage), or sends
 * it again in the next round when it provably did not run:
 *   NOSCRIPT  to the same node, as EVAL (once: NOSCRIPT after EVAL is an
 *             error);
 *   MOVED     to the slot's new master, which the map learns;
 *   ASK       to the node named, after ASKING, leaving the map alone;
 *   "Function not found"  to the same node, after FUNCTION LOAD;
 *   NOFUNC    (Redis Functions refused) to the same node, by EVALSHA;
 *   READONLY  from a Sentinel service's master: to the master the
 *             sentinels name now;
 * each call follows at most HIRATE_CLUSTER_REDIRECTS_MAX redirections (and
 * waits as many rounds for a master). A leg's end tells its node's breaker
 * what its calls met, so one dead shard opens its own breaker only. A
 * cluster's map refresh rides in a leg of the round (after its calls) or in
 * a leg of its own; a Sentinel service's question always has its own, to a
 * sentinel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "op.h"
#include "proto.h"
#include "slot.h"

static hirate_call *op_call(hirate_op *op, size_t j)
{
    return &op->b.calls[j];
}

static unsigned call_slot(const hirate_call *c)
{
    return hirate_keyslot2(c->prefix, c->prefixlen, c->key, c->keylen);
}

static void leg_clear(leg *g)
{
    hirate_rreader_free(g->rr);
    free(g->req);
    free(g->load_err);
    memset(g, 0, sizeof *g);
}

void hirate__legs_clear(hirate_op *op)
{
    /* A refresh never answered (the op was dropped, or a request could not
     * be made) is given back, or no other op would ever ask again. */
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].map)
            hirate_cluster_refresh_end(op->l->cluster, op->legs[i].node, NULL, NULL, 0);
    for (size_t i = 0; i < op->nlegs; i++)
        leg_clear(&op->legs[i]);
    op->nlegs = 0;
}

/* A new leg to node (legs are kept in an array big enough for every node). */
leg *hirate__leg_add(hirate_op *op, int node)
{
    if (op->nlegs == op->cap_legs) {
        size_t cap = op->cap_legs ? op->cap_legs * 2 : 4;
        leg *g = realloc(op->legs, cap * sizeof *g);
        if (!g)
            return NULL;
        op->legs = g;
        op->cap_legs = cap;
    }
    leg *g = &op->legs[op->nlegs++];
    memset(g, 0, sizeof *g);
    g->node = node;
    g->verdict = HIRATE_BREAKER_PASS;
    g->started = hirate_monotonic_us();
    return g;
}

static const char asking_cmd[] = "*1\r\n$6\r\nASKING\r\n";
static const char slots_cmd[] = "*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n";

/* The map's request: CLUSTER SLOTS, or a sentinel's question. Its length;
 * written only when it fits. */
static size_t encode_map(const hirate_limiter *l, char *buf, size_t cap)
{
    if (!sentinel_of(l)) {
        if (cap >= sizeof slots_cmd - 1)
            memcpy(buf, slots_cmd, sizeof slots_cmd - 1);
        return sizeof slots_cmd - 1;
    }
    const char *service = l->node0.link.url.service;
    const char *argv[3] = {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", service};
    size_t lens[3] = {8, 23, strlen(service)};
    return hirate_proto_encode_argv(buf, cap, 3, argv, lens);
}

/* A leg's bytes: FUNCTION LOAD when a call needs the code and the node takes
 * functions; each call (after ASKING when asked; by FCALL, or by EVALSHA
 * with the first that needs the code as EVAL); then the map's request when
 * it carries the refresh. */
int hirate__leg_encode(hirate_op *op, leg *g)
{
    hirate_limiter *l = op->l;
    hirate_node *nd = node_of(l, g->node);
    g->fcall = __atomic_load_n(&nd->link.functions, __ATOMIC_RELAXED);
    size_t cap = encode_map(l, NULL, 0);
    for (size_t i = 0; i < g->count; i++) {
        size_t j = op->order[g->first + i];
        g->load |= g->fcall && (op->flags[j] & SEND_EVAL);
        cap += hirate_proto_call_bound(op_call(op, j), HIRATE_FORM_EVAL) + sizeof asking_cmd;
    }
    if (g->load)
        cap += hirate_proto_encode_load(NULL, 0);
    if (g->reset)
        cap += sizeof asking_cmd + op->fulllen + 32;
    if (!(g->req = malloc(cap)))
        return HIRATE_ENOMEM;
    size_t len = 0;
    int eval_sent = 0;
    if (g->reset) {
        const char *argv[2] = {"DEL", op->full};
        size_t lens[2] = {3, op->fulllen};
        if (op->reset_flags & SEND_ASKING) {
            memcpy(g->req, asking_cmd, sizeof asking_cmd - 1);
            len += sizeof asking_cmd - 1;
        }
        len += hirate_proto_encode_argv(g->req + len, cap - len, 2, argv, lens);
    }
    if (g->load) {
        /* First, and not between ASKING and its call. */
        len += hirate_proto_encode_load(g->req + len, cap - len);
        __atomic_fetch_add(&l->op_loads, 1, __ATOMIC_RELAXED);
    }
    for (size_t i = 0; i < g->count; i++) {
        size_t j = op->order[g->first + i];
        if (op->flags[j] & SEND_ASKING) {
            memcpy(g->req + len, asking_cmd, sizeof asking_cmd - 1);
            len += sizeof asking_cmd - 1;
        }
        /* One EVAL loads the script for the calls after it. */
        int form = g->fcall ? HIRATE_FORM_FCALL
                   : (op->flags[j] & SEND_EVAL) && !eval_sent ? HIRATE_FORM_EVAL
                                                              : HIRATE_FORM_EVALSHA;
        eval_sent |= form == HIRATE_FORM_EVAL;
        if (op->flags[j] & SEND_EVAL)
            op->flags[j] |= SENT_EVAL;
        __atomic_fetch_add(form == HIRATE_FORM_FCALL  ? &l->op_fcall
                           : form == HIRATE_FORM_EVAL ? &l->op_eval
                                                      : &l->op_evalsha,
                           1, __ATOMIC_RELAXED);
        len += hirate_proto_encode_call(g->req + len, cap - len, op_call(op, j), form);
    }
    if (g->map) {
        len += encode_map(l, g->req + len, cap - len);
        int sentinel = sentinel_of(l) != NULL;
        /* A sentinel's answer is one short address. */
        if (!(g->rr = sentinel ? hirate_rreader_new(HIRATE_IO_REPLY_MAX, 2, 256)
                               : hirate_rreader_new(HIRATE_CLUSTER_MAP_BYTES,
                                                    HIRATE_CLUSTER_MAP_ELEMS,
                                                    HIRATE_CLUSTER_MAP_STR)))
            return HIRATE_ENOMEM;
    }
    g->reqlen = len;
    return 0;
}

/* Where pending call j goes now. */
static int call_node(hirate_op *op, size_t j)
{
    if (!op->l->cluster)
        return 0;   /* a single Redis */
    if (op->flags[j] & SEND_KEEP_NODE)
        return op->node[j];
    return hirate_cluster_route(op->l->cluster, call_slot(op_call(op, j)));
}

static void leg_settle(hirate_op *op, leg *g);

/* The refresh this op's round carries, if one is due: a leg to the node
 * asked (the one of a call's leg when it is that node). */
void hirate__add_refresh(hirate_op *op)
{
    hirate_cluster *c = op->l->cluster;
    int node = hirate_cluster_refresh_begin(c, hirate_monotonic_us(),
                                            op->nlegs ? op->legs[0].node : -1);
    if (node < 0)
        return;
    leg *g = NULL;
    for (size_t i = 0; i < op->nlegs && !g; i++)
        if (op->legs[i].node == node)
            g = &op->legs[i];
    /* A leg of its own when no call goes there: even when every call met
     * an open breaker, or the map would never learn of the replica that
     * took over. */
    if (!g)
        g = hirate__leg_add(op, node);
    if (g)
        g->map = 1;
    else
        hirate_cluster_refresh_end(c, node, NULL, NULL, 0);
}

static int round_asks(const hirate_op *op)
{
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].map)
            return 1;
    return 0;
}

/* Why a call that waited for a master cannot wait longer: what the
 * sentinels said, or that they said nothing in time. */
int hirate__no_master(hirate_op *op, char *err, size_t errlen)
{
    if (op->route_rc)
        return hirate__fail(err, errlen, op->route_rc, "%s", op->route_err);
    return hirate__fail(err, errlen, HIRATE_ESERVER, "no sentinel named the master of '%s'",
                        op->l->node0.link.url.service);
}

/* May a call (or the reset) that has waited this many rounds for a master
 * wait one more? Not when the sentinels answered with a misconfiguration. */
static int can_wait(const hirate_op *op, int waited)
{
    return waited < HIRATE_CLUSTER_REDIRECTS_MAX && !(op->route_rc && !is_outage(op->route_rc));
}

/* A call (or the reset) with no master to go to waits for the sentinels'
 * answer in this round, unless there is none coming, or it may not wait. */
static int may_wait(hirate_op *op, int *waited)
{
    if (!round_asks(op) || !can_wait(op, *waited))
        return 0;
    ++*waited;
    return 1;
}

/* Makes the next round's legs from the pending calls: 1 when there is one
 * to send, 0 when none is left (every call settled, perhaps by a breaker). */
int hirate__op_round(hirate_op *op)
{
    hirate_limiter *l = op->l;
    if (op->kind == OP_CHECK)
        return hirate__check_round(op);
    /* With nothing left to send, the last round's legs stay readable. */
    int pending = op->kind == OP_RESET && op->reset_pending;
    for (size_t j = 0; op->kind == OP_DECIDE && j < op->b.m && !pending; j++)
        pending = op->b.rcs[j] == CALL_PENDING;
    if (!pending)
        return 0;
    hirate__legs_clear(op);
    if (op->kind == OP_RESET) {
        if (l->cluster && !(op->reset_flags & SEND_KEEP_NODE))
            op->reset_node = hirate_cluster_route(l->cluster, hirate_keyslot(op->full, op->fulllen));
        leg *g = NULL;
        if (op->reset_node >= 0 && (g = hirate__leg_add(op, op->reset_node)))
            g->reset = 1;
        else if (op->reset_node < 0 && can_wait(op, op->reset_redirects))
            hirate__add_refresh(op);   /* no master known yet: ask for one */
        if (op->reset_node < 0 && !may_wait(op, &op->reset_redirects)) {
            op->rc = hirate__no_master(op, op->err, sizeof op->err);
            hirate__remember(l, op->rc, op->err);
            op->reset_pending = 0;
            hirate__legs_clear(op);
            return 0;
        }
        for (size_t i = 0; i < op->nlegs; i++) {
            if (hirate__leg_encode(op, &op->legs[i]) < 0) {
                op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM,
                                      "out of memory for a request");
                op->reset_pending = 0;
                hirate__legs_clear(op);
                return 0;
            }
        }
        if (!op->nlegs) {
            op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM,
                                  "out of memory for a request");
            op->reset_pending = 0;
            return 0;
        }
        return 1;
    }
    /* Group the pending calls by node, in order within each. */
    size_t k = 0;
    int unrouted = 0;
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] == CALL_PENDING) {
            op->node[j] = call_node(op, j);
            unrouted |= op->node[j] < 0;
        }
    }
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] != CALL_PENDING || op->node[j] < 0 || (op->flags[j] & GROUPED))
            continue;
        int node = op->node[j];
        size_t first = k;
        for (size_t i = j; i < op->b.m; i++) {
            if (op->b.rcs[i] == CALL_PENDING && op->node[i] == node) {
                op->order[k++] = i;
                op->flags[i] |= GROUPED;
            }
        }
        hirate_node *nd = node_of(l, node);
        int verdict = hirate__breaker_enter(&op->b, nd, op->order + first, k - first);
        if (verdict == HIRATE_BREAKER_SKIP) {
            k = first;   /* the policy answered them */
            if (l->cluster)
                hirate_cluster_stale(l->cluster);
            continue;
        }
        leg *g = hirate__leg_add(op, node);
        if (!g) {
            for (size_t i = first; i < k; i++)
                op->b.rcs[op->order[i]] = HIRATE_ENOMEM;
            hirate_breaker_release(&nd->breaker, verdict == HIRATE_BREAKER_PROBE);
            k = first;
            continue;
        }
        g->verdict = verdict;
        g->first = first;
        g->count = k - first;
    }
    for (size_t j = 0; j < op->b.m; j++)
        op->flags[j] &= ~GROUPED;
    /* Without a master, the question is for the calls that may still wait
     * for its answer: with none, it is not asked. */
    int waiting = !unrouted;
    for (size_t j = 0; !waiting && j < op->b.m; j++)
        waiting = op->b.rcs[j] == CALL_PENDING && op->node[j] < 0 && can_wait(op, op->redirects[j]);
    if (l->cluster && waiting)
        hirate__add_refresh(op);
    /* Calls with no master to go to wait for the answer in this round. */
    for (size_t j = 0; unrouted && j < op->b.m; j++) {
        int waited = op->redirects[j];
        if (op->b.rcs[j] != CALL_PENDING || op->node[j] >= 0)
            continue;
        if (may_wait(op, &waited)) {
            op->redirects[j] = (unsigned char)waited;
            continue;
        }
        op->b.rcs[j] = hirate__no_master(op, op->err, sizeof op->err);
        if (is_outage(op->b.rcs[j]))   /* the policy decides: its cause is the last error */
            hirate__remember(op->l, op->b.rcs[j], op->err);
        hirate__settle_call(&op->b, j, 0, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
    for (size_t i = 0; i < op->nlegs; i++) {
        if (hirate__leg_encode(op, &op->legs[i]) < 0) {
            hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM, "out of memory for a request");
            hirate_op_leg_fail(op, i, HIRATE_ENOMEM, NULL);
        }
    }
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            return 1;
    /* Every leg failed before it was sent (no memory): settled already. */
    hirate__legs_clear(op);
    for (size_t j = 0; j < op->b.m; j++)
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = HIRATE_ENOMEM;
    return 0;
}

int hirate__op_new(hirate_limiter *l, int kind, hirate_op **out)
{
    hirate_op *op = calloc(1, sizeof *op);
    if (!op)
        return HIRATE_ENOMEM;
    op->kind = kind;
    op->l = l;
    op->b.l = l;
    *out = op;
    return 0;
}

int hirate_op_start(hirate_limiter *l, hirate_item *items, size_t n, int spend, int64_t now_us,
                    hirate_op **out)
{
    return hirate_op_start_bands(l, items, n, spend, now_us, NULL, out);
}

int hirate_op_start_bands(hirate_limiter *l, hirate_item *items, size_t n, int spend,
                          int64_t now_us, hirate_decision *bands, hirate_op **out)
{
    *out = NULL;
    if (!l || (!items && n) || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (hirate__op_new(l, OP_DECIDE, &op) < 0)
        return HIRATE_ENOMEM;
    op->b.keep_msgs = 1;
    /* Without the caller's room, the op keeps the bands for hirate_op_bands. */
    if (!bands && l->nbands > 1 && n) {
        if (!(bands = malloc(n * l->nbands * sizeof *bands))) {
            hirate_op_free(op);
            return HIRATE_ENOMEM;
        }
        op->b.own_per = 1;
    }
    if (!hirate__batch_begin(&op->b, l, items, n, spend, now_us, bands)) {
        count_items(l, items, n, spend);
        hirate_op_free(op);   /* decided without Redis */
        return 0;
    }
    size_t m = op->b.m;
    op->node = malloc(m * sizeof *op->node);
    op->order = malloc(m * sizeof *op->order);
    op->flags = calloc(m, 2);
    if (!op->node || !op->order || !op->flags) {
        for (size_t j = 0; j < m; j++)
            op->b.rcs[j] = HIRATE_ENOMEM;
        hirate__fail(op->err, sizeof op->err, HIRATE_ENOMEM, "out of memory for a request");
        hirate__op_finish(op);
        hirate_op_free(op);
        return 0;
    }
    op->redirects = op->flags + m;
    for (size_t j = 0; j < m; j++)
        op->b.rcs[j] = CALL_PENDING;
    if (!hirate__op_round(op)) {
        hirate__op_finish(op);
        hirate_op_free(op);
        return 0;
    }
    *out = op;
    return 1;
}

int hirate_op_start_reset(hirate_limiter *l, const void *key, size_t keylen, hirate_op **out)
{
    *out = NULL;
    if (!l || !l->node0.redis)
        return HIRATE_EINVAL;
    hirate_op *op;
    if (hirate__op_new(l, OP_RESET, &op) < 0)
        return HIRATE_ENOMEM;
    int rc = hirate__reset_local(l, key, keylen, op->err, sizeof op->err);
    if (rc < 0) {
        free(op);
        return rc;
    }
    memcpy(op->full, l->prefix, l->prefixlen);
    memcpy(op->full + l->prefixlen, key, keylen);
    op->fulllen = l->prefixlen + keylen;
    op->reset_pending = 1;
    if (l->cluster)
        op->reset_node = hirate_cluster_route(l->cluster, hirate_keyslot(op->full, op->fulllen));
    if (!hirate__op_round(op)) {
        rc = op->rc;
        hirate_op_free(op);
        return rc < 0 ? rc : HIRATE_ENOMEM;
    }
    *out = op;
    return 1;
}

size_t hirate_op_legs(const hirate_op *op)
{
    return op && !op->done ? op->nlegs : 0;
}

static leg *leg_at(const hirate_op *op, size_t i)
{
    return op && !op->done && i < op->nlegs ? &op->legs[i] : NULL;
}

/* The last round's legs stay readable once the op is done. */
static leg *leg_kept(const hirate_op *op, size_t i)
{
    return op && i < op->nlegs ? &op->legs[i] : NULL;
}

int hirate_op_leg_node(const hirate_op *op, size_t i)
{
    leg *g = leg_at(op, i);
    return g ? g->node : -1;
}

const char *hirate_op_leg_request(const hirate_op *op, size_t i, size_t *len)
{
    leg *g = leg_kept(op, i);
    *len = g ? g->reqlen : 0;
    /* A check's latency is its request's round trip alone: the caller takes
     * the bytes when it sends them, after any connect and handshake. */
    if (g && g->check && g->state == LEG_BUSY && !g->taken) {
        g->started = hirate_monotonic_us();
        g->taken = 1;
    }
    return g ? g->req : NULL;
}

int hirate_op_leg_drop(const hirate_op *op, size_t i)
{
    leg *g = leg_kept(op, i);
    return g ? g->drop : op ? op->drop : 0;
}

const char *hirate_op_request(const hirate_op *op, size_t *len)
{
    return hirate_op_leg_request(op, 0, len);
}

int hirate_op_drop(const hirate_op *op)
{
    return op->drop;
}

/* A redirection of call j (or of the reset when j is (size_t)-1), from the
 * node of leg g: 1 when it will be sent again, 0 when it cannot be (its rc
 * set with the message). */
static int follow(hirate_op *op, leg *g, size_t j, const hirate_reply *rep)
{
    hirate_cluster *c = op->l->cluster;
    int ask;
    unsigned slot;
    char host[256];
    int port, *redirects, *flags, *node;
    int rdummy, fdummy, ndummy;
    if (j == (size_t)-1) {
        redirects = &op->reset_redirects;
        flags = &op->reset_flags;
        node = &op->reset_node;
    } else {
        rdummy = op->redirects[j];
        fdummy = op->flags[j];
        ndummy = op->node[j];
        redirects = &rdummy;
        flags = &fdummy;
        node = &ndummy;
    }
    int rc = 0;
    if (!hirate_redirect_parse(rep->top.str, rep->top.len, &ask, &slot, host, &port)) {
        rc = hirate__fail_quoting(op->err, sizeof op->err, HIRATE_EPROTO,
                                  "malformed reply from Redis: a redirection without a slot "
                                  "and an address: ", rep->top.str, rep->top.len);
        g->drop = 1;
    } else if (++*redirects > HIRATE_CLUSTER_REDIRECTS_MAX) {
        rc = hirate__fail(op->err, sizeof op->err, HIRATE_ESERVER,
                          "slot %u moved %d times during one call (last: %s:%d)", slot,
                          HIRATE_CLUSTER_REDIRECTS_MAX, host, port);
    } else {
        hirate_node *from = node_of(op->l, g->node);
        int id = hirate_cluster_find(c, host[0] ? host : from->link.url.host, port);
        if (id < 0) {
            rc = hirate__fail(op->err, sizeof op->err, HIRATE_ESERVER,
                              "the cluster has more than %d nodes", HIRATE_IO_NODES_MAX);
        } else if (ask) {
            __atomic_fetch_add(&c->asked, 1, __ATOMIC_RELAXED);
            *node = id;
            *flags = (*flags & ~SEND_EVAL & ~SENT_EVAL) | SEND_ASKING | SEND_KEEP_NODE;
        } else {
            hirate_cluster_moved(c, slot, id);
            *flags &= ~(SEND_EVAL | SENT_EVAL | SEND_ASKING | SEND_KEEP_NODE);
        }
    }
    if (j != (size_t)-1) {
        op->redirects[j] = (unsigned char)(*redirects > 255 ? 255 : *redirects);
        op->flags[j] = (unsigned char)*flags;
        op->node[j] = *node;
    }
    return rc;
}

/* The DEL's one reply: an integer is success. */
static int feed_reset(hirate_op *op, leg *g, const hirate_reply *rep)
{
    op->reset_pending = 0;
    if (rep->top.type == ':')
        return op->rc = 0;
    if (rep->top.type == '-' && slots_of(op->l)) {
        int cls = hirate_proto_error_class(rep->top.str, rep->top.len);
        if (cls == HIRATE_PROTO_MOVED || cls == HIRATE_PROTO_ASK) {
            if ((op->rc = follow(op, g, (size_t)-1, rep)) == 0) {
                op->reset_pending = 1;
                if (cls == HIRATE_PROTO_MOVED)
                    op->reset_flags = 0;
                return 0;
            }
            hirate__remember(op->l, op->rc, op->err);
            return op->rc;
        }
    }
    if (rep->top.type == '-' && sentinel_of(op->l) &&
        hirate_proto_error_readonly(rep->top.str, rep->top.len) &&
        op->reset_redirects++ < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* A demoted master: to the one the sentinels name now. */
        hirate_cluster_master_lost(op->l->cluster, g->node);
        g->drop = 1;
        op->reset_pending = 1;
        op->reset_flags = 0;
        return 0;
    }
    op->reset_flags = 0;
    if (rep->top.type == '-')
        op->rc = hirate_proto_error_reply(rep, &g->drop, op->err, sizeof op->err);
    else
        op->rc = hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                              "malformed reply from Redis: DEL gave no integer");
    if (op->rc == HIRATE_EPROTO)
        g->drop = 1;
    hirate__remember(op->l, op->rc, op->err);
    return op->rc;
}

/* FUNCTION LOAD met an outage (READONLY, OOM, LOADING, ...): nothing is
 * learnt of Redis Functions; the calls that needed the library meet it. */
static void load_failed(hirate_op *op, leg *g, const hirate_reply *rep)
{
    char err[HIRATE_ERRMSG_SIZE];
    g->load_rc = hirate_proto_error_reply(rep, &g->drop, err, sizeof err);
    free(g->load_err);
    g->load_err = strdup(err);
    g->load_readonly = hirate_proto_error_readonly(rep->top.str, rep->top.len);
    if (g->load_readonly && sentinel_of(op->l))
        hirate_cluster_master_lost(op->l->cluster, g->node);
}

/* Call j goes again to the node of leg g, with its flags: it did not run. */
static void again_here(hirate_op *op, const leg *g, size_t j, int set, int clear)
{
    op->b.rcs[j] = CALL_PENDING;
    op->flags[j] = (unsigned char)((op->flags[j] & ~clear) | set | SEND_KEEP_NODE);
    op->node[j] = g->node;
}

/* Call j's reply: settled, or pending again for the next round. */
static void feed_call(hirate_op *op, leg *g, size_t j, const hirate_reply *rep)
{
    hirate_limiter *l = op->l;
    int *rc = &op->b.rcs[j];
    int ask = op->flags[j] & SEND_ASKING;
    op->flags[j] &= ~SEND_ASKING;   /* one ASKING, one call */
    if (ask)
        op->flags[j] &= ~SEND_KEEP_NODE;
    if (rep->top.type == '-' && slots_of(l)) {
        int cls = hirate_proto_error_class(rep->top.str, rep->top.len);
        if (cls == HIRATE_PROTO_MOVED || cls == HIRATE_PROTO_ASK) {
            *rc = follow(op, g, j, rep);
            if (*rc == 0)
                *rc = CALL_PENDING;   /* it did not run: again, elsewhere */
            else
                hirate__batch_note(&op->b, op->b.index[j], op->err);
            return;
        }
        if (cls == HIRATE_ESERVER)   /* CLUSTERDOWN, TRYAGAIN: the map may be behind */
            hirate_cluster_stale(l->cluster);
    }
    if (rep->top.type == '-' && sentinel_of(l) &&
        hirate_proto_error_readonly(rep->top.str, rep->top.len) &&
        op->redirects[j] < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* A master demoted by a failover refused the write before the
         * script ran: to the master the sentinels name now. */
        hirate_cluster_master_lost(l->cluster, g->node);
        g->drop = 1;
        op->redirects[j]++;
        *rc = CALL_PENDING;
        op->flags[j] &= ~(SEND_KEEP_NODE | SEND_EVAL | SENT_EVAL);
        return;
    }
    int missing = g->fcall && (op->flags[j] & SENT_EVAL) && !g->loaded;
    if (missing && g->load_readonly && rep->top.type == '-' && sentinel_of(l) &&
        op->redirects[j] < HIRATE_CLUSTER_REDIRECTS_MAX) {
        /* FUNCTION LOAD met READONLY, so this FCALL found nothing to run:
         * to the master the sentinels name now, as after READONLY. */
        op->redirects[j]++;
        *rc = CALL_PENDING;
        op->flags[j] &= ~(SEND_KEEP_NODE | SEND_EVAL | SENT_EVAL);
        return;
    }
    /* The code went with it, unless the library was refused. */
    int with_code = (op->flags[j] & SENT_EVAL) && (!g->fcall || g->loaded);
    size_t nb = l->nbands;
    *rc = hirate_proto_outcome(rep, op_call(op, j), l->cfg, with_code, &op->b.ds[j],
                               op->b.cper ? op->b.cper + j * nb : NULL, &op->b.states[j * nb],
                               &g->drop, op->err, sizeof op->err);
    if (*rc == HIRATE_PROTO_NOSCRIPT && missing && g->load_rc) {
        /* Its FUNCTION LOAD met an outage: so does the call. */
        *rc = hirate__fail(op->err, sizeof op->err, g->load_rc, "%s",
                           g->load_err ? g->load_err : hirate_strerror(g->load_rc));
        hirate__batch_note(&op->b, op->b.index[j], op->err);
        return;
    }
    if (*rc == HIRATE_PROTO_NOSCRIPT && missing)
        *rc = HIRATE_PROTO_NOFUNC;   /* its FUNCTION LOAD was refused */
    if (*rc == HIRATE_PROTO_NOFUNC && g->fcall) {
        /* FCALL or FUNCTION refused (an older Redis, an ACL, a proxy): the
         * call did not run. By EVALSHA from now on. */
        hirate_link_no_functions(&node_of(l, g->node)->link, rep->top.str, rep->top.len);
        again_here(op, g, j, 0, SEND_EVAL | SENT_EVAL);
    } else if (*rc == HIRATE_PROTO_NOFUNC) {
        *rc = hirate_proto_error_reply(rep, &g->drop, op->err, sizeof op->err);
        hirate__batch_note(&op->b, op->b.index[j], op->err);
    } else if (*rc == HIRATE_PROTO_NOSCRIPT) {
        /* The node does not know the script (a restart, SCRIPT FLUSH, a
         * promoted replica): the call did not run. With the code, there. */
        again_here(op, g, j, SEND_EVAL, 0);
    } else if (*rc < 0) {
        hirate__batch_note(&op->b, op->b.index[j], op->err);   /* its own words */
    }
}

/* The map's reply, taken as it comes (it may be long): 1 when it is whole. */
static int feed_map(hirate_op *op, leg *g, const char *buf, size_t len, size_t *used)
{
    const char *why = NULL;
    hirate_rnode *map = NULL;
    *used = len;
    int got = hirate_rreader_feed(g->rr, buf, len, &why) < 0 ? -1
                                                             : hirate_rreader_next(g->rr, &map, &why);
    if (got == 0)
        return 0;
    int rc;
    char err[HIRATE_ERRMSG_SIZE];
    if (got > 0)   /* bytes after it are the next replies on the connection */
        *used = len - hirate_rreader_pending(g->rr);
    if (got < 0) {
        /* Not RESP, or too long: the stream is lost. */
        g->drop = 1;
        hirate_cluster_refresh_end(op->l->cluster, g->node, NULL, NULL, 0);
        rc = hirate__fail(err, sizeof err, HIRATE_EPROTO, "malformed reply from Redis: %s", why);
    } else {
        /* A cluster's error reply (a node not in cluster mode, or one that
         * cannot say now) teaches nothing: another node is asked later, and
         * the calls' own replies say the rest. A sentinel's is what the
         * calls waiting for a master get. */
        rc = hirate_cluster_refresh_end(op->l->cluster, g->node, map, err, sizeof err);
        if (rc == HIRATE_EPROTO)
            g->drop = 1;
    }
    if (rc < 0 && (sentinel_of(op->l) || op->kind == OP_CHECK)) {
        op->route_rc = rc;
        snprintf(op->route_err, sizeof op->route_err, "%s", err);
    }
    hirate_rnode_free(map);
    g->map = 0;
    return 1;
}

int hirate_op_leg_feed(hirate_op *op, size_t i, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    leg *g = leg_at(op, i);
    if (!g || g->state != LEG_BUSY)
        return HIRATE_IO_DONE;
    if (g->check)
        return hirate__check_feed(op, i, g, buf, len, used);
    size_t calls = g->reset ? 1 : g->count;
    while (g->next < calls || g->load) {
        hirate_reply rep;
        long r = hirate_proto_parse(buf + *used, len - *used, &rep);
        if (r == 0 && len - *used <= HIRATE_PROTO_MAX_REPLY)
            return HIRATE_IO_MORE;
        /* A reply over HIRATE_PROTO_MAX_REPLY bytes is refused even when it
         * arrives whole: in pieces it would have been, and so it is by the
         * C client, whose buffer holds no more. */
        if (r <= 0 || r > HIRATE_PROTO_MAX_REPLY) {
            hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO, "malformed reply from Redis: %s",
                         r < 0 ? rep.why : "longer than the longest reply");
            hirate_op_leg_fail(op, i, HIRATE_EPROTO, NULL);
            return HIRATE_IO_DONE;
        }
        *used += (size_t)r;
        if (g->load) {
            /* FUNCTION LOAD's reply comes first. A refusal turns Redis
             * Functions off for the node; the calls' own replies ("Function
             * not found") then send them again by EVALSHA. */
            g->load = 0;
            int lo = hirate_proto_load_outcome(&rep);
            g->loaded = lo == 0;
            if (lo == HIRATE_PROTO_NOFUNC)
                hirate_link_no_functions(&node_of(op->l, g->node)->link, rep.top.str,
                                         rep.top.len);
            else if (lo == HIRATE_ESERVER)
                load_failed(op, g, &rep);
            continue;
        }
        size_t j = g->reset ? 0 : op->order[g->first + g->next];
        int asked = g->reset ? (op->reset_flags & SEND_ASKING) : (op->flags[j] & SEND_ASKING);
        if (asked && !g->ok_due) {
            g->ok_due = 1;   /* this was ASKING's reply */
            if (rep.top.type != '+') {
                hirate__fail(op->err, sizeof op->err, HIRATE_EPROTO,
                             "malformed reply from Redis: ASKING was not answered +OK");
                hirate_op_leg_fail(op, i, HIRATE_EPROTO, NULL);
                return HIRATE_IO_DONE;
            }
            continue;
        }
        g->ok_due = 0;
        if (g->reset) {
            op->reset_flags &= ~SEND_ASKING;
            feed_reset(op, g, &rep);
        } else {
            feed_call(op, g, j, &rep);
        }
        g->next++;
    }
    if (g->map) {
        size_t took;
        int whole = feed_map(op, g, buf + *used, len - *used, &took);
        *used += took;
        if (!whole)
            return HIRATE_IO_MORE;
    }
    leg_settle(op, g);
    g->state = LEG_DONE;
    op->drop |= g->drop;
    if (op->kind != OP_CHECK)   /* a check is not a decision's round trip */
        hirate_latency_add(&op->l->op_latency, hirate_monotonic_us() - g->started);
    return HIRATE_IO_DONE;
}

/* Call j of leg g, which could not connect (so nothing was sent), went to
 * g's node on a guess: no map named that node for its slot (a seed, before
 * the map is known). Then it may go to another node, a bounded number of
 * times: the node now fails, and the next guess is another one. */
static int unrouted(hirate_op *op, const leg *g, size_t j)
{
    hirate_cluster *c = slots_of(op->l);
    if (!c || (op->flags[j] & SEND_KEEP_NODE) || op->redirects[j] >= HIRATE_CLUSTER_REDIRECTS_MAX)
        return 0;
    unsigned slot = call_slot(op_call(op, j));
    if (__atomic_load_n(&c->owner[slot], __ATOMIC_RELAXED) == g->node + 1)
        return 0;
    op->redirects[j]++;
    return 1;
}

/* A leg's end: its node's breaker learns what its calls met, and each call
 * that has its answer gives it to its item. */
static void leg_settle(hirate_op *op, leg *g)
{
    if (op->kind == OP_RESET || !g->count)
        return;
    hirate_node *nd = node_of(op->l, g->node);
    size_t *sel = op->order + g->first;
    /* Calls that go again (NOSCRIPT, MOVED, ASK) reached a live server. */
    int64_t wait_us = hirate__breaker_outcome(&op->b, nd, g->verdict, sel, g->count, op->err);
    for (size_t i = 0; i < g->count; i++) {
        size_t j = sel[i];
        if (op->b.rcs[j] == HIRATE_ECONNECT && unrouted(op, g, j))
            op->b.rcs[j] = CALL_PENDING;
        if (op->b.rcs[j] == CALL_PENDING || op->b.rcs[j] == CALL_SETTLED)
            continue;
        if (is_outage(op->b.rcs[j]) && op->l->cluster)
            hirate_cluster_stale(op->l->cluster);
        hirate__settle_call(&op->b, j, wait_us, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
}

void hirate_op_leg_fail(hirate_op *op, size_t i, int code, const char *why)
{
    leg *g = leg_at(op, i);
    if (!g || g->state != LEG_BUSY)
        return;
    hirate_cluster *sentinel = sentinel_of(op->l);
    if (g->check) {
        hirate__check_fail(&op->checks[g->check - 1], code, why && *why ? why : NULL);
    } else if ((sentinel || op->kind == OP_CHECK) && g->map) {
        /* A sentinel's question failed: for the calls waiting on it, and
         * for nobody else. The next round asks the next sentinel. */
        op->route_rc = code;
        hirate__fail(op->route_err, sizeof op->route_err, code, "%s",
                     why && *why ? why : hirate_strerror(code));
    } else if (why && *why) {
        hirate__fail(op->err, sizeof op->err, code, "%s", why);
    } else if (!op->err[0] || code != HIRATE_EPROTO) {
        hirate__fail(op->err, sizeof op->err, code, "%s", hirate_strerror(code));
    }
    g->drop = 1;
    op->drop = 1;
    g->state = LEG_FAILED;
    if (g->reset) {
        op->reset_pending = 0;
        op->rc = code;
        if (code != HIRATE_ECLOSED)
            hirate__remember(op->l, code, op->err);
    }
    /* Every call not yet answered may have run: the failure is theirs. */
    for (size_t k = g->next; op->kind == OP_DECIDE && k < g->count; k++)
        op->b.rcs[op->order[g->first + k]] = code;
    if (g->map)
        hirate_cluster_refresh_end(op->l->cluster, g->node, NULL, NULL, 0);
    g->map = 0;
    if (sentinel && code != HIRATE_ECLOSED && g->node >= sentinel->nsentinels)
        hirate_cluster_master_lost(sentinel, g->node);   /* ask where it is now */
    else if (op->l->cluster && code != HIRATE_ECLOSED)
        hirate_cluster_stale(op->l->cluster);   /* a failover? ask another node */
    leg_settle(op, g);
}

/* Every item has its answer: calls never sent get the op's last failure. */
void hirate__op_finish(hirate_op *op)
{
    if (op->done)
        return;
    op->done = 1;
    if (op->kind == OP_CHECK) {
        for (size_t i = 0; i < op->nchecks && !op->rc; i++)
            op->rc = op->checks[i].rc;
        return;   /* changes no metric: it is not a decision */
    }
    if (op->kind != OP_DECIDE) {
        hirate_count_error(op->l->counts, op->rc);
        return;
    }
    for (size_t j = 0; j < op->b.m; j++) {
        if (op->b.rcs[j] == CALL_SETTLED)
            continue;
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = HIRATE_ECLOSED;
        hirate__settle_call(&op->b, j, 0, op->err);
        op->b.rcs[j] = CALL_SETTLED;
    }
    count_items(op->l, op->b.items, op->b.n, op->b.spend);
}

int hirate_op_next(hirate_op *op)
{
    if (!op || op->done)
        return HIRATE_IO_DONE;
    for (size_t i = 0; i < op->nlegs; i++)
        if (op->legs[i].state == LEG_BUSY)
            hirate_op_leg_fail(op, i, HIRATE_ECLOSED, "the caller left a leg unfinished");
    if (hirate__op_round(op))
        return HIRATE_IO_SEND;
    hirate__op_finish(op);
    return HIRATE_IO_DONE;
}

int hirate_op_feed(hirate_op *op, const char *buf, size_t len, size_t *used)
{
    *used = 0;
    if (op->done)
        return HIRATE_IO_DONE;
    int state = hirate_op_leg_feed(op, 0, buf, len, used);
    return state == HIRATE_IO_MORE ? state : hirate_op_next(op);
}

void hirate_op_fail(hirate_op *op, int code, const char *why)
{
    if (op->done)
        return;
    for (size_t i = 0; i < op->nlegs; i++)
        hirate_op_leg_fail(op, i, code, why);
    /* Calls that were to go again (after NOSCRIPT or a redirection) will
     * not be sent: the failure is theirs too. */
    for (size_t j = 0; op->kind == OP_DECIDE && j < op->b.m; j++)
        if (op->b.rcs[j] == CALL_PENDING)
            op->b.rcs[j] = code;
    if (op->kind == OP_RESET && op->reset_pending) {
        op->rc = code;
        op->reset_pending = 0;
    }
    hirate__op_finish(op);
}

const char *hirate_op_errmsg(const hirate_op *op, size_t i)
{
    if (!op)
        return NULL;
    if (op->kind == OP_RESET)
        return i == 0 && op->rc < 0 ? op->err : NULL;
    if (op->kind == OP_CHECK)
        return i < op->nchecks && op->checks[i].rc < 0 ? op->checks[i].message : NULL;
    if (i >= op->b.n || op->b.items[i].rc >= 0)
        return NULL;
    if (op->b.msgs && op->b.msgs[i])
        return op->b.msgs[i];
    return hirate_strerror(op->b.items[i].rc);
}

int hirate_op_bands(const hirate_op *op, size_t i, hirate_decision *bands, size_t nbands)
{
    if (!op || op->kind != OP_DECIDE || i >= op->b.n || op->b.items[i].rc != 0 ||
        (!bands && nbands))
        return HIRATE_EINVAL;
    size_t nb = op->l->nbands, k = nbands < nb ? nbands : nb;
    if (nb == 1 && k)
        bands[0] = op->b.items[i].decision;
    else if (k)
        memcpy(bands, op->b.per + i * nb, k * sizeof *bands);
    return (int)k;
}

int hirate_op_result(const hirate_op *op)
{
    return op->kind == OP_DECIDE ? 0 : op->rc;
}

void hirate_op_free(hirate_op *op)
{
    if (!op)
        return;
    hirate__legs_clear(op);
    free(op->legs);
    if (op->kind == OP_DECIDE)
        hirate__batch_free(&op->b);
    free(op->node);
    free(op->order);
    free(op->flags);
    free(op->checks);
    free(op);
}
