/*
 * Decisions: every key and cost checked, then decided by the in-memory
 * buckets, or by Redis through a batch (the deny cache first, the breaker,
 * the failure policy for an outage, the deny cache taught from the replies);
 * resets; and the message of the calling thread's last error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "limiter.h"

/* The calling thread's last error (hirate_limiter_errmsg): its message, and
 * the serial number of the limiter it met it on (an address may be reused by
 * a limiter made after another is freed; a number is not). Per thread, so
 * threads sharing a limiter each read their own. */
static _Thread_local struct {
    uint64_t serial;
    char msg[HIRATE_ERRMSG_SIZE];
} last_error;

/* The local buckets (no URL, or the LOCAL fallback's): this process' own
 * table, or the one shared with the processes forked since. */
static int local_decide(hirate_limiter *l, const hirate_bucket_cfg *cfg, const void *key,
                        size_t keylen, int64_t now, int64_t cost, int spend, hirate_decision *d,
                        hirate_decision *per)
{
    if (l->shm) {
        hirate_shm_decide(l->shm, cfg, key, keylen, now, cost, spend, d, per);
        return 0;
    }
    return hirate_memory_decide(l->memory, cfg, key, keylen, now, cost, spend, d, per);
}

int hirate__remember(hirate_limiter *l, int rc, const char *msg)
{
    last_error.serial = l->serial;
    snprintf(last_error.msg, sizeof last_error.msg, "%s", msg);
    return rc;
}

int hirate_check_key(size_t keylen, const char *what, char *err, size_t errlen)
{
    if (!what)
        what = "key";
    if (keylen == 0)
        return hirate__fail(err, errlen, HIRATE_EKEY, "%s is empty", what);
    if (keylen > HIRATE_KEY_MAX)
        return hirate__fail(err, errlen, HIRATE_EKEY, "%s is %zu bytes; the most is %d", what,
                            keylen, HIRATE_KEY_MAX);
    return 0;
}

static int check_key(const void *key, size_t keylen, char *err, size_t errlen)
{
    int rc = hirate_check_key(keylen, NULL, err, errlen);
    if (rc < 0)
        return rc;
    if (!key)
        return hirate__fail(err, errlen, HIRATE_EINVAL, "key is NULL");
    return 0;
}

/* The failure policy decides item in Redis' place; wait_us is the time until
 * the breaker lets a call through again. */
static void apply_policy(hirate_limiter *l, hirate_item *it, hirate_decision *per, int spend,
                         int64_t now, int error, int64_t wait_us)
{
    hirate_decision *d = &it->decision;
    size_t n = l->nbands;
    __atomic_fetch_add(&l->policy, 1, __ATOMIC_RELAXED);
    it->rc = 0;
    if (spend == HIRATE_OP_REFUND && l->on_error != HIRATE_ON_ERROR_LOCAL) {
        /* Open and closed keep no bucket to give the tokens to: saying they
         * were given back would hide that they were not. */
        char msg[HIRATE_ERRMSG_SIZE];
        snprintf(msg, sizeof msg, "the refund was not made: Redis failed (%s) and on_error is '%s'",
                 hirate_strerror(error), hirate_on_error_name(l->on_error));
        it->rc = hirate__remember(l, error, msg);
        return;
    }
    if (l->on_error == HIRATE_ON_ERROR_LOCAL) {
        it->rc = local_decide(l, l->local_cfg, it->key, it->keylen, now, it->cost, spend, d,
                              per);
    } else {
        hirate_decision own[HIRATE_BANDS_MAX], *bd = n == 1 ? d : per ? per : own;
        int open = l->on_error == HIRATE_ON_ERROR_OPEN;
        int pass = it->cost <= l->cap_min && (open || it->cost == 0);
        int64_t back = wait_us > 0 ? wait_us : 1;   /* until Redis is asked again */
        /* Open: as if every bucket were full. Closed: nothing passes but a
         * cost of 0 (which spends nothing), until Redis can be asked again. */
        for (size_t i = 0; i < n; i++) {
            int64_t capacity = l->cfg[i].capacity;
            int never = it->cost > capacity;
            bd[i].allowed = !never && (open || it->cost == 0);
            bd[i].source = open ? HIRATE_SOURCE_FAIL_OPEN : HIRATE_SOURCE_FAIL_CLOSED;
            bd[i].band = (int)i;
            bd[i].limit = capacity;
            bd[i].remaining = open && !never ? capacity - (pass ? it->cost : 0) : 0;
            bd[i].retry_after_us = never ? HIRATE_NEVER : bd[i].allowed ? 0 : back;
            bd[i].reset_after_us = open ? 0 : back;
            bd[i].time_us = now;
        }
        if (n > 1)
            hirate_bands_combine(bd, n, d);
        else if (per)
            per[0] = *d;
    }
    d->error = error;
    for (size_t i = 0; per && i < n; i++)
        per[i].error = error;
}

/* How far Redis' clock is ahead of ours, at most. A call sent at our time
 * `sent` ran at Redis time S, later: S - sent bounds the offset from above,
 * and so does the least such difference seen, which is the tightest. Windows
 * of OFFSET_WINDOW_US let old observations go, so that a drift or a step of
 * either clock is forgotten within two windows. */
#define OFFSET_WINDOW_US 10000000

static int64_t redis_ahead(hirate_limiter *l, int64_t observed, int64_t now)
{
    int64_t began = __atomic_load_n(&l->offset_window, __ATOMIC_RELAXED);
    if (now - began >= OFFSET_WINDOW_US &&
        __atomic_compare_exchange_n(&l->offset_window, &began, now, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        int64_t last = __atomic_exchange_n(&l->offset_min[0], INT64_MAX, __ATOMIC_RELAXED);
        __atomic_store_n(&l->offset_min[1], last, __ATOMIC_RELAXED);
    }
    int64_t cur = __atomic_load_n(&l->offset_min[0], __ATOMIC_RELAXED);
    while (observed < cur &&
           !__atomic_compare_exchange_n(&l->offset_min[0], &cur, observed, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    int64_t best = observed < cur ? observed : cur;
    int64_t last = __atomic_load_n(&l->offset_min[1], __ATOMIC_RELAXED);
    return last < best ? last : best;
}

/* Remembers, from a Redis decision, a bucket that would refuse the same cost
 * now: the stored state moved from Redis' clock to ours by the most Redis
 * can be ahead, which can only overstate the tokens. */
static inline __attribute__((always_inline)) void
learn_n(hirate_limiter *l, const hirate_item *it, const hirate_bucket *state, int64_t sent,
        int known, uint64_t epoch, size_t n)
{
    int64_t ahead = redis_ahead(l, it->decision.time_us - sent, sent);
    hirate_bucket local[HIRATE_BANDS_MAX];
    int short_of_cost = 0;
    for (size_t i = 0; i < n; i++) {
        local[i] = (hirate_bucket){state[i].tokens, state[i].ts - ahead};
        /* tokens is NAN when the reply showed every band kept the cost. */
        short_of_cost |= !isnan(local[i].tokens) &&
                         hirate_bucket_level(&l->cfg[i], &local[i], sent) < (double)it->cost;
    }
    if (short_of_cost) {
        /* A reset since the call was sent makes its reply stale. */
        if (__atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE) == epoch)
            hirate_memory_put(l->cache, l->cfg, it->key, it->keylen, local, sent);
    } else if (known) {
        hirate_memory_reset(l->cache, it->key, it->keylen);
    }
}

static __attribute__((noinline)) void learn_bands(hirate_limiter *l, const hirate_item *it,
                                                  const hirate_bucket *state, int64_t sent,
                                                  int known, uint64_t epoch)
{
    learn_n(l, it, state, sent, known, epoch, l->nbands);
}

/* One band, the common case, inlined with its loop unrolled away. */
static inline void learn(hirate_limiter *l, const hirate_item *it, const hirate_bucket *state,
                         int64_t sent, int known, uint64_t epoch)
{
    if (__builtin_expect(l->nbands == 1, 1))
        learn_n(l, it, state, sent, known, epoch, 1);
    else
        learn_bands(l, it, state, sent, known, epoch);
}

/* The code and message for a bad key or cost, kept out of the hot path. */
static int input_error(const void *key, size_t keylen, int64_t cost, int spend, char *err,
                       size_t errlen)
{
    int rc = check_key(key, keylen, err, errlen);
    if (rc < 0)
        return rc;
    if (spend == HIRATE_OP_REFUND && (cost < 0 || cost > HIRATE_EXACT_MAX))
        return hirate__fail(err, errlen, HIRATE_ECOST,
                            "refund cost must be a whole number of tokens from 0 to 2^53-1, got %lld",
                            (long long)cost);
    return hirate_check_cost(cost, NULL, err, errlen);
}

__attribute__((noinline, cold)) static int bad_input(hirate_limiter *l, const void *key,
                                                     size_t keylen, int64_t cost, int spend)
{
    char err[HIRATE_ERRMSG_SIZE];
    return hirate__remember(l, input_error(key, keylen, cost, spend, err, sizeof err), err);
}

/* Checks a key and a cost: 0, or the code with its message remembered. */
static inline int check_input(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                              int spend)
{
    if (key && keylen - 1 < HIRATE_KEY_MAX && cost >= 0 && cost <= HIRATE_EXACT_MAX)
        return 0;
    return bad_input(l, key, keylen, cost, spend);
}

/* A decision of the in-memory backend (no URL). */
static int decide_in_memory(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                            int spend, int64_t now, hirate_decision *out, hirate_decision *per)
{
    int rc = check_input(l, key, keylen, cost, spend);
    if (rc < 0)
        return rc;
    rc = local_decide(l, l->cfg, key, keylen, now, cost, spend, out, per);
    return rc < 0 ? hirate__remember(l, rc, "out of memory for a new bucket") : 0;
}

/* Item i's band figures in the batch's caller's memory, or NULL. */
static inline hirate_decision *item_bands(const batch *b, size_t i)
{
    return b->per ? b->per + i * b->l->nbands : NULL;
}

static int batch_alloc(batch *b, size_t n)
{
    size_t nb = b->l->nbands, nper = nb > 1 ? nb : 0;
    if (n <= 1) {
        b->index = &b->one.index;
        b->calls = &b->one.call;
        b->ds = &b->one.d;
        b->cper = nper ? b->one.per : NULL;
        b->states = b->one.state;
        b->rcs = &b->one.rc;
        b->known = &b->one.known;
        return 0;
    }
    /* One block, largest alignment first. */
    char *m = malloc(n * (sizeof(hirate_call) + (1 + nper) * sizeof(hirate_decision) +
                          nb * sizeof(hirate_bucket) + sizeof(size_t) + sizeof(int) + 1));
    if (!m)
        return HIRATE_ENOMEM;
    b->calls = (hirate_call *)m;
    b->ds = (hirate_decision *)(b->calls + n);
    b->cper = nper ? b->ds + n : NULL;
    b->states = (hirate_bucket *)(b->ds + n * (1 + nper));
    b->index = (size_t *)(b->states + n * nb);
    b->rcs = (int *)(b->index + n);
    b->known = (unsigned char *)(b->rcs + n);
    return 0;
}

void hirate__batch_free(batch *b)
{
    if (b->calls && b->calls != &b->one.call)
        free(b->calls);
    if (b->own_per)
        free(b->per);
    for (size_t i = 0; b->msgs && i < b->n; i++)
        free(b->msgs[i]);
    free(b->msgs);
}

/* Keeps item i's message, for hirate_op_errmsg (only an op keeps them). */
void hirate__batch_note(batch *b, size_t i, const char *msg)
{
    if (b->out_msgs)
        snprintf(b->out_msgs + i * b->out_len, b->out_len, "%s", msg);
    if (!b->keep_msgs || (!b->msgs && !(b->msgs = calloc(b->n, sizeof *b->msgs))))
        return;
    free(b->msgs[i]);
    b->msgs[i] = strdup(msg);
}

/* A refund makes any refusal foretold for key stale: forget it, and let no
 * reply of a call made before now teach it again (the reset epoch). Done
 * when the refund is sent and again when its reply comes, so that a call
 * that ran in Redis before the refund cannot leave its refusal behind. */
static void forget_refusal(hirate_limiter *l, const void *key, size_t keylen)
{
    if (!l->cache)
        return;
    __atomic_fetch_add(&l->reset_epoch, 1, __ATOMIC_ACQ_REL);
    hirate_memory_reset(l->cache, key, keylen);
}

/* Returns the number of calls left for Redis (0: every item is decided). */
size_t hirate__batch_begin(batch *b, hirate_limiter *l, hirate_item *items, size_t n, int spend,
                           int64_t now_us, hirate_decision *per)
{
    b->l = l;
    b->per = per;
    b->items = items;
    b->n = n;
    b->msgs = NULL;
    b->spend = spend;
    b->now_us = now_us;
    b->now = now_us >= 0 ? now_us : hirate_monotonic_us();
    b->m = 0;
    b->calls = NULL;

    size_t npending = 0;
    for (size_t i = 0; i < n; i++) {
        hirate_item *it = &items[i];
        if (!l->node0.redis) {
            it->rc = decide_in_memory(l, it->key, it->keylen, it->cost, spend, b->now,
                                      &it->decision, item_bands(b, i));
            if (it->rc < 0 && b->out_msgs)
                hirate__batch_note(b, i, last_error.msg);   /* what decide_in_memory said */
        } else if ((it->rc = check_input(l, it->key, it->keylen, it->cost, spend)) == 0) {
            it->rc = 1;   /* for Redis */
            npending++;
        } else if (b->keep_msgs || b->out_msgs) {
            char err[HIRATE_ERRMSG_SIZE];
            input_error(it->key, it->keylen, it->cost, spend, err, sizeof err);
            hirate__batch_note(b, i, err);
        }
    }
    if (!npending)
        return 0;
    if (batch_alloc(b, npending) < 0) {
        for (size_t i = 0; i < n; i++) {
            if (items[i].rc == 1) {
                items[i].rc = hirate__remember(l, HIRATE_ENOMEM, "out of memory for a batch");
                hirate__batch_note(b, i, "out of memory for a batch");
            }
        }
        return 0;
    }

    for (size_t i = 0; i < n; i++) {
        hirate_item *it = &items[i];
        if (it->rc != 1)
            continue;
        int known = 0;
        if (spend == HIRATE_OP_REFUND) {
            forget_refusal(l, it->key, it->keylen);
        } else if (l->cache && it->cost > 0 && it->cost <= l->cap_min) {
            hirate_decision *bd = item_bands(b, i);
            known = hirate_memory_lookup(l->cache, l->cfg, it->key, it->keylen, b->now,
                                         b->now - l->deny_cache_max_us, it->cost,
                                         &it->decision, bd);
            if (known && !it->decision.allowed) {
                it->decision.source = HIRATE_SOURCE_CACHE;
                for (size_t k = 0; bd && k < l->nbands; k++)
                    bd[k].source = HIRATE_SOURCE_CACHE;
                it->rc = 0;
                __atomic_fetch_add(&l->cache_hits, 1, __ATOMIC_RELAXED);
                continue;
            }
        }
        b->index[b->m] = i;
        b->known[b->m] = (unsigned char)known;
        b->calls[b->m] = (hirate_call){l->prefix, l->prefixlen, it->key, it->keylen, l->args,
                                       l->argslen, (int)l->nbands, it->cost, spend, now_us};
        b->m++;
    }
    b->epoch = __atomic_load_n(&l->reset_epoch, __ATOMIC_ACQUIRE);
    return b->m;
}

/* The breaker keeps real time, even when a test injects the time. */
static int64_t breaker_now(const batch *b)
{
    return b->now_us >= 0 ? hirate_monotonic_us() : b->now;
}

/* Asks node's breaker about calls sel[0..k) (all m calls when sel is NULL):
 * its verdict, after which SKIP has let the policy decide them. */
int hirate__breaker_enter(batch *b, hirate_node *node, const size_t *sel, size_t k)
{
    int error = 0;
    int64_t wait_us = 0;
    int verdict = hirate_breaker_enter(&node->breaker, breaker_now(b), &error, &wait_us);
    if (verdict == HIRATE_BREAKER_SKIP) {
        for (size_t i = 0; i < k; i++) {
            size_t j = sel ? sel[i] : i;
            b->rcs[j] = CALL_SETTLED;
            apply_policy(b->l, &b->items[b->index[j]], item_bands(b, b->index[j]), b->spend,
                         b->now, error, wait_us);
            if (b->items[b->index[j]].rc < 0)   /* a refund the policy cannot make */
                hirate__batch_note(b, b->index[j], last_error.msg);
        }
    }
    return verdict;
}

/* Tells node's breaker what calls sel[0..k) (all m when sel is NULL) met,
 * from their rcs; returns the time until it lets calls through again, for
 * the policy. err holds the message of the last error. */
int64_t hirate__breaker_outcome(batch *b, hirate_node *node, int verdict, const size_t *sel,
                                size_t k, const char *err)
{
    hirate_limiter *l = b->l;
    int outage = 0, answered = 0;
    for (size_t i = 0; i < k; i++) {
        int rc = b->rcs[sel ? sel[i] : i];
        if (is_outage(rc))
            outage = rc;
        answered |= rc != HIRATE_ECLOSED;
    }
    int probe = verdict == HIRATE_BREAKER_PROBE;
    if (!outage && !answered) {
        /* Abandoned before Redis answered anything: nothing was learnt. */
        hirate_breaker_release(&node->breaker, probe);
        return 0;
    }
    if (!outage) {
        /* Only a probe can close the breaker: the clock is read for it alone. */
        int64_t gone = probe ? hirate_breaker_success(&node->breaker, 1, hirate_monotonic_us())
                             : -1;
        if (gone >= 0) {
            hirate_endpoint ep;
            hirate_link_endpoint(&node->link, &ep);
            hirate_link_log(&l->node0.link, HIRATE_LOG_INFO, "Redis at %s answers again, after %.1f s",
                            ep.where, (double)gone / 1e6);
        }
        return 0;
    }
    hirate__remember(l, outage, err);
    /* The backoff runs from when the failure was known, not from when the
     * call began (a timeout is as long as a backoff). */
    int opened;
    int64_t wait_us = hirate_breaker_failure(&node->breaker, probe, outage, hirate_monotonic_us(),
                                             &opened);
    if (opened) {
        hirate_endpoint ep;
        hirate_link_endpoint(&node->link, &ep);
        hirate_link_log(&l->node0.link, HIRATE_LOG_WARNING,
                        "Redis at %s failed (%s): the '%s' policy decides until it answers again",
                        ep.where, err && *err ? err : hirate_strerror(outage),
                        hirate_on_error_name(l->on_error));
    }
    return wait_us;
}

/* Call j's answer (its rcs[j]) becomes its item's: a decision that teaches
 * the deny cache, the policy's for an outage, or the error with its words. */
void hirate__settle_call(batch *b, size_t j, int64_t wait_us, const char *err)
{
    hirate_limiter *l = b->l;
    hirate_item *it = &b->items[b->index[j]];
    hirate_decision *bd = item_bands(b, b->index[j]);
    size_t nb = l->nbands;
    it->rc = b->rcs[j];
    if (it->rc == 0) {
        it->decision = b->ds[j];
        if (bd)
            memcpy(bd, nb > 1 ? b->cper + j * nb : &b->ds[j], nb * sizeof *bd);
        if (b->spend == HIRATE_OP_REFUND)
            forget_refusal(l, it->key, it->keylen);
        else if (l->cache && it->cost > 0 && it->cost <= l->cap_min)
            learn(l, it, &b->states[j * nb], b->now, b->known[j], b->epoch);
    } else if (is_outage(it->rc)) {
        apply_policy(l, it, bd, b->spend, b->now, it->rc, wait_us);
        if (it->rc < 0)
            hirate__batch_note(b, b->index[j], last_error.msg);
    } else {
        if (b->call_msgs && b->call_msgs[j * HIRATE_ERRMSG_SIZE])
            err = b->call_msgs + j * HIRATE_ERRMSG_SIZE;   /* its own words */
        hirate__remember(l, it->rc, err);
        if (!b->msgs || !b->msgs[b->index[j]])
            hirate__batch_note(b, b->index[j], err);
    }
}

/* After the blocking client answered every call of a single Redis. */
static void batch_settle(batch *b, int verdict, const char *err)
{
    int64_t wait_us = hirate__breaker_outcome(b, &b->l->node0, verdict, NULL, b->m, err);
    for (size_t j = 0; j < b->m; j++)
        hirate__settle_call(b, j, wait_us, err);
}

/* Decides items in order: each gets its rc and, when 0, its decision; with
 * msgs, each failed item its message in msgs[i * msglen ..). */
static void decide_items(hirate_limiter *l, hirate_item *items, size_t n, int spend,
                         int64_t now_us, hirate_decision *per, char *msgs, size_t msglen)
{
    for (size_t i = 0; msgs && i < n; i++)
        msgs[i * msglen] = '\0';
    if (l->cluster) {
        hirate_op *op;
        int rc = hirate_op_start_bands(l, items, n, spend, now_us, per, &op);
        if (rc == 1)
            hirate__op_run(l, op);
        for (size_t i = 0; msgs && i < n; i++)
            if (items[i].rc < 0) {
                const char *m = op ? hirate_op_errmsg(op, i) : NULL;
                snprintf(msgs + i * msglen, msglen, "%s",
                         m && *m ? m : rc < 0 ? "out of memory for a batch"
                                              : hirate_strerror(items[i].rc));
            }
        hirate_op_free(op);
        return;
    }
    batch b;
    b.keep_msgs = 0;
    b.msgs = NULL;
    b.out_msgs = msgs;
    b.out_len = msglen;
    b.call_msgs = NULL;
    b.own_per = 0;
    b.calls = NULL;
    if (hirate__batch_begin(&b, l, items, n, spend, now_us, per)) {
        int verdict = hirate__breaker_enter(&b, &l->node0, NULL, b.m);
        if (verdict != HIRATE_BREAKER_SKIP) {
            char err[HIRATE_ERRMSG_SIZE];
            /* Without memory for them, items share the round trip's message. */
            if (msgs)
                b.call_msgs = malloc(b.m * HIRATE_ERRMSG_SIZE);
            hirate_redis_decide_many(l->node0.redis, b.calls, b.m, l->cfg, b.ds, b.cper,
                                     b.states, b.rcs, b.call_msgs, err, sizeof err);
            batch_settle(&b, verdict, err);
            free(b.call_msgs);
        }
    }
    count_items(l, items, n, spend);
    hirate__batch_free(&b);
}

/* A decision whose bands the caller wants in bands[0 .. nbands): they go
 * there when it has room for all, else through room of ours; with one band
 * they are the decision. */
static __attribute__((noinline)) int decide_bands(hirate_limiter *l, const void *key,
                                                  size_t keylen, int64_t cost, int spend,
                                                  int64_t now_us, hirate_decision *out,
                                                  hirate_decision *bands, size_t nbands)
{
    hirate_decision room[HIRATE_BANDS_MAX];
    hirate_decision *per = l->nbands == 1 ? NULL : nbands >= l->nbands ? bands : room;
    int rc;
    if (!l->node0.redis) {
        rc = decide_in_memory(l, key, keylen, cost, spend, now_us, out, per);
        if (rc == 0)
            hirate_count_decision(l->counts, out, spend);
        else
            hirate_count_error(l->counts, rc);
    } else {
        hirate_item it = {key, keylen, cost, 0, {0}};
        decide_items(l, &it, 1, spend, now_us, per, NULL, 0);
        if ((rc = it.rc) == 0)
            *out = it.decision;
    }
    if (rc == 0 && nbands) {
        if (l->nbands == 1)
            bands[0] = *out;
        else if (per == room)
            memcpy(bands, room, nbands * sizeof *bands);
    }
    return rc;
}

static inline __attribute__((always_inline)) int
decide(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
       int64_t now_us, hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    if (!l)
        return HIRATE_EINVAL;
    if (!out)
        return hirate__remember(l, HIRATE_EINVAL, "the decision pointer is NULL");
    if (bands)
        return decide_bands(l, key, keylen, cost, spend, now_us, out, bands, nbands);
    if (!l->node0.redis) {   /* the in-memory hot path: no batch bookkeeping */
        int rc = decide_in_memory(l, key, keylen, cost, spend, now_us, out, NULL);
        if (__builtin_expect(rc == 0, 1))
            hirate_count_decision(l->counts, out, spend);
        else
            hirate_count_error(l->counts, rc);
        return rc;
    }
    hirate_item it = {key, keylen, cost, 0, {0}};
    decide_items(l, &it, 1, spend, now_us, NULL, NULL, 0);
    if (it.rc == 0)
        *out = it.decision;
    return it.rc;
}

int hirate_allow(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                 hirate_decision *out)
{
    return decide(l, key, keylen, cost, 1, -1, out, NULL, 0);
}

int hirate_peek(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                hirate_decision *out)
{
    return decide(l, key, keylen, cost, 0, -1, out, NULL, 0);
}

int hirate_allow_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                       hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, cost, 1, -1, out, bands, nbands);
}

int hirate_peek_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                      hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, cost, 0, -1, out, bands, nbands);
}

int hirate_refund(hirate_limiter *l, const void *key, size_t keylen, int64_t tokens,
                  hirate_decision *out)
{
    return decide(l, key, keylen, tokens, HIRATE_OP_REFUND, -1, out, NULL, 0);
}

int hirate_refund_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t tokens,
                        hirate_decision *out, hirate_decision *bands, size_t nbands)
{
    return decide(l, key, keylen, tokens, HIRATE_OP_REFUND, -1, out, bands, nbands);
}

int hirate_allow_many(hirate_limiter *l, hirate_item *items, size_t n)
{
    if (!l || (!items && n))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, NULL, NULL, 0);
    return 0;
}

int hirate_allow_many_bands(hirate_limiter *l, hirate_item *items, size_t n,
                            hirate_decision *bands)
{
    if (!l || (!items && n) || (!bands && n))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, bands, NULL, 0);
    return 0;
}

int hirate_allow_many_msgs(hirate_limiter *l, hirate_item *items, size_t n,
                           hirate_decision *bands, char *msgs, size_t msglen)
{
    if (!l || (!items && n) || (msgs && !msglen))
        return HIRATE_EINVAL;
    if (n)
        decide_items(l, items, n, 1, -1, bands, msgs, msgs ? msglen : 0);
    return 0;
}

int hirate_validate(const void *key, size_t keylen, int64_t cost, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    return input_error(key, keylen, cost, HIRATE_OP_SPEND, err, errlen);
}

int hirate_decide_at_bands(hirate_limiter *l, const void *key, size_t keylen, int64_t cost,
                           int spend, int64_t now_us, hirate_decision *out,
                           hirate_decision *bands, size_t nbands)
{
    if (l && now_us < 0)
        return hirate__remember(l, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(l, key, keylen, cost, spend, now_us, out, bands, nbands);
}

int hirate_decide_at(hirate_limiter *l, const void *key, size_t keylen, int64_t cost, int spend,
                     int64_t now_us, hirate_decision *out)
{
    return hirate_decide_at_bands(l, key, keylen, cost, spend, now_us, out, NULL, 0);
}

/* The part of a reset that needs no I/O: checks the key, then forgets it in
 * the deny cache and the local buckets. */
int hirate__reset_local(hirate_limiter *l, const void *key, size_t keylen, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_key(key, keylen, err, errlen)) < 0)
        return hirate__remember(l, rc, err);
    if (l->cache) {
        __atomic_fetch_add(&l->reset_epoch, 1, __ATOMIC_ACQ_REL);
        hirate_memory_reset(l->cache, key, keylen);
    }
    if (l->memory)
        hirate_memory_reset(l->memory, key, keylen);
    if (l->shm)
        hirate_shm_reset(l->shm, key, keylen);
    return 0;
}

static int reset_key(hirate_limiter *l, const void *key, size_t keylen)
{
    char err[HIRATE_ERRMSG_SIZE];
    if (l->cluster) {   /* the op forgets it locally, then asks its node */
        hirate_op *op;
        int rc = hirate_op_start_reset(l, key, keylen, &op);
        if (rc == 1) {
            hirate__op_run(l, op);
            rc = hirate_op_result(op);
        }
        hirate_op_free(op);
        return rc;
    }
    int rc = hirate__reset_local(l, key, keylen, err, sizeof err);
    if (rc == 0 && l->node0.redis) {
        rc = hirate_redis_reset(l->node0.redis, l->prefix, l->prefixlen, key, keylen, err, sizeof err);
        return rc < 0 ? hirate__remember(l, rc, err) : 0;
    }
    return rc;
}

int hirate_reset(hirate_limiter *l, const void *key, size_t keylen)
{
    if (!l)
        return HIRATE_EINVAL;
    int rc = reset_key(l, key, keylen);
    if (rc < 0 && !l->cluster)   /* a cluster's op counted its own */
        hirate_count_error(l->counts, rc);
    return rc;
}

const char *hirate_limiter_errmsg(hirate_limiter *l, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    if (!l) {
        snprintf(buf, len, "%s", "no limiter");
        return buf;
    }
    snprintf(buf, len, "%s", last_error.serial == l->serial ? last_error.msg : "");
    return buf;
}
