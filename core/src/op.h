/*
 * An op's private parts, shared by op.c (its state machine) and check.c
 * (the health check, an op of its own kind).
 */
#ifndef HIRATE_OP_H
#define HIRATE_OP_H

#include "limiter.h"
#include "reply.h"

enum { OP_DECIDE, OP_RESET, OP_CHECK };
enum { LEG_BUSY, LEG_DONE, LEG_FAILED };

/* A call's state for its next send. */
#define SEND_EVAL 1         /* with the code (EVAL, or after FUNCTION LOAD):
                               the node lacked it */
#define SEND_ASKING 2       /* after ASKING: the node is importing its slot */
#define SEND_KEEP_NODE 4    /* to node[j] (NOSCRIPT, ASK), not to its slot's master */
#define SENT_EVAL 8         /* it was sent with the code: NOSCRIPT now is an
                               error (unless the load was refused) */
#define GROUPED 16          /* (while a round is made: in a leg already) */

typedef struct leg {
    int node;
    int verdict;            /* the node's breaker, for the leg's calls */
    size_t first, count;    /* its calls: op->order[first .. first + count) */
    size_t next;            /* the next of them whose reply is due */
    int ok_due;             /* ASKING's +OK comes before that reply */
    int fcall;              /* its calls go by FCALL, not EVALSHA */
    int load;               /* FUNCTION LOAD goes first; its reply is due */
    int loaded;             /* and the library is there */
    int load_rc;            /* or why the server could not take it now */
    int load_readonly;      /* (READONLY: a demoted master) */
    int reset;              /* it carries the reset's DEL */
    int check;              /* it carries a check: op->checks[check - 1] */
    int fl, se;             /* the check's FUNCTION LIST and SCRIPT EXISTS:
                               CHECK_* */
    char *load_err;         /* load_rc's words (heap; set only with it) */
    int map;                /* CLUSTER SLOTS follows the calls (or, to a
                               sentinel, GET-MASTER-ADDR-BY-NAME) */
    hirate_rreader *rr;     /* which reads the map's reply */
    int state;
    int drop;
    char *req;
    size_t reqlen;
    int64_t started;        /* the round trip's start: when its request was
                               made; a check's, when it was first taken to
                               be sent (the connection ready) */
    int taken;              /* (a check's request was taken) */
} leg;

struct hirate_op {
    int kind;
    hirate_limiter *l;
    batch b;                /* OP_DECIDE */
    int *node;              /* per call: where it goes next */
    unsigned char *flags;   /* SEND_* and SENT_EVAL */
    unsigned char *redirects;
    size_t *order;          /* the calls of the round, leg by leg */
    leg *legs;
    size_t nlegs, cap_legs;
    int drop;               /* some leg's connection must be closed */
    int done;
    int rc;                 /* OP_RESET: the outcome */
    /* OP_RESET: one DEL, with its own redirections */
    char full[HIRATE_PREFIX_MAX + HIRATE_KEY_MAX];
    size_t fulllen;
    int reset_node, reset_flags, reset_redirects, reset_pending;
    /* OP_CHECK: a node's answers, once the nodes are known */
    hirate_check_node *checks;
    size_t nchecks;
    int check_sent;         /* the checks' round was made */
    int check_rounds;       /* rounds spent finding the nodes */
    int check_asked;        /* the node asked for them last, or -1 */
    int route_rc;           /* why the sentinels named no master, or 0 */
    char route_err[HIRATE_ERRMSG_SIZE];
    char err[HIRATE_ERRMSG_SIZE];
};

/* The limiter's Redis Cluster, or NULL (a single Redis, or Sentinel). */
static inline hirate_cluster *slots_of(const hirate_limiter *l)
{
    return l->cluster && !l->cluster->sentinel ? l->cluster : NULL;
}

/* The limiter's Sentinel service (its node table), or NULL. */
static inline hirate_cluster *sentinel_of(const hirate_limiter *l)
{
    return l->cluster && l->cluster->sentinel ? l->cluster : NULL;
}

/* op.c */
int hirate__op_new(hirate_limiter *l, int kind, hirate_op **out);
/* Makes the next round's legs: 1 when there is one to send, 0 when none is left. */
int hirate__op_round(hirate_op *op);
/* Every item has its answer: calls never sent get the op's last failure. */
void hirate__op_finish(hirate_op *op);
void hirate__legs_clear(hirate_op *op);
/* A new leg to node (legs are kept in an array big enough for every node). */
leg *hirate__leg_add(hirate_op *op, int node);
int hirate__leg_encode(hirate_op *op, leg *g);
/* The refresh this op's round carries, if one is due. */
void hirate__add_refresh(hirate_op *op);
/* Why a call that waited for a master cannot wait longer. */
int hirate__no_master(hirate_op *op, char *err, size_t errlen);

/* check.c */
/* The checks' round: the nodes, or a round to find them first. */
int hirate__check_round(hirate_op *op);
void hirate__check_fail(hirate_check_node *cn, int code, const char *why);
/* A check leg's replies, as hirate_op_leg_feed takes them. */
int hirate__check_feed(hirate_op *op, size_t i, leg *g, const char *buf, size_t len, size_t *used);

#endif
