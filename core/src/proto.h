/*
 * The wire, without I/O: encode a script call into caller memory, parse one
 * RESP2 reply in place, turn a reply into a decision. The C client, asyncio
 * and OpenResty all send these bytes and read replies through this code.
 *
 * Parsing contract (as picohttpparser's): hirate_proto_parse() looks at
 * [buf, buf+len) and returns the number of bytes one whole reply takes, 0 when
 * the reply is not complete yet (call again with more bytes, from the same
 * start), or HIRATE_EPROTO when the bytes cannot be a reply this library
 * accepts. It never allocates: strings in the result point into buf. Only
 * scalars and one level of array (at most HIRATE_REPLY_MAX_ELEMS) are
 * accepted, and no element may claim more than HIRATE_PROTO_MAX_REPLY bytes,
 * so a hostile server cannot make it allocate or recurse.
 */
#ifndef HIRATE_PROTO_H
#define HIRATE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "bucket.h"
#include "hirate.h"

/* The script's reply: 8 elements, and 5 more a band after the first. */
#define HIRATE_REPLY_MAX_ELEMS (8 + 5 * (HIRATE_BANDS_MAX - 1))
#define HIRATE_PROTO_MAX_REPLY 4096
/* An EVALSHA call without its key, prefix and limits never needs more. */
#define HIRATE_PROTO_CALL_OVERHEAD 320

typedef struct hirate_reply_elem {
    char type;              /* '+' status, '-' error, ':' integer, '$' bulk, 0 nil */
    const char *str;        /* status, error and bulk text (not NUL-terminated) */
    size_t len;
    int64_t integer;
} hirate_reply_elem;

typedef struct hirate_reply {
    hirate_reply_elem top;  /* type '*' for an array */
    size_t nelem;
    hirate_reply_elem elem[HIRATE_REPLY_MAX_ELEMS];
    const char *why;        /* after HIRATE_EPROTO: what was wrong */
} hirate_reply;

long hirate_proto_parse(const char *buf, size_t len, hirate_reply *r);

/* One script call. args is each band's capacity and rate already encoded as
 * RESP bulk strings (hirate_proto_encode_limits), 2 * nbands of them, since
 * they are the same every call. */
typedef struct hirate_call {
    const char *prefix;
    size_t prefixlen;
    const void *key;
    size_t keylen;
    const char *args;
    size_t argslen;
    int nbands;             /* 1..HIRATE_BANDS_MAX */
    int64_t cost;
    int spend;
    int64_t now_us;         /* < 0: Redis' clock (every production call) */
} hirate_call;

/* How a call names the script: by its SHA1, whole, or as a function. */
enum { HIRATE_FORM_EVALSHA = 0, HIRATE_FORM_EVAL = 1, HIRATE_FORM_FCALL = 2 };

/* A quick upper bound of the length of a call in form. */
size_t hirate_proto_call_bound(const hirate_call *c, int form);

/* Encodes the call as EVALSHA, EVAL or FCALL (a HIRATE_FORM_*). Returns the
 * length it takes; writes it only when that is at most cap. */
size_t hirate_proto_encode_call(char *buf, size_t cap, const hirate_call *c, int form);

/* FUNCTION LOAD of the library: its length; written only when it fits. */
size_t hirate_proto_encode_load(char *buf, size_t cap);

/* A batch: the calls whose rcs[i] is `select` (all of them when select is
 * 0), by FCALL when fcall, else by EVALSHA; with load, the code goes first
 * (FUNCTION LOAD before them, or the first as EVAL). batch_bound is a quick
 * upper bound of its length; encode_batch writes it into buf (cap at least
 * the bound) and returns the exact length. */
size_t hirate_proto_batch_bound(const hirate_call *calls, size_t n, const int *rcs, int select,
                                int fcall, int load);
size_t hirate_proto_encode_batch(char *buf, size_t cap, const hirate_call *calls, size_t n,
                                 const int *rcs, int select, int fcall, int load);

/* Encodes capacity and rate as the two bulk strings of hirate_call.args; the
 * rate in the fewest digits that read back as the same double. */
size_t hirate_proto_encode_limits(char *buf, size_t cap, int64_t capacity, double rate);

/* Encodes any command from argc byte strings. Returns the length it takes;
 * writes only when that is at most cap. */
size_t hirate_proto_encode_argv(char *buf, size_t cap, int argc, const char *const *argv,
                                const size_t *lens);

/* What an error reply means: HIRATE_ESERVER (the server cannot serve now:
 * OOM, BUSY, READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, MISCONF,
 * NOREPLICAS), HIRATE_EAUTH (WRONGPASS, NOAUTH), HIRATE_ENOPERM (NOPERM, or a
 * script's command the ACL refuses), HIRATE_EREFUSED (max number of clients,
 * DENIED), or HIRATE_EREPLY; HIRATE_PROTO_NOSCRIPT for NOSCRIPT or "Function
 * not found", after which a call is sent again with the code (EVAL, or
 * FUNCTION LOAD first); HIRATE_PROTO_NOFUNC when the server will not run
 * FCALL or FUNCTION (an older Redis, an ACL, a proxy), after which it is sent
 * again by EVALSHA. In each of these the call did not run. */
#define HIRATE_PROTO_NOSCRIPT 1
#define HIRATE_PROTO_NOFUNC 4
/* MOVED and ASK (a cluster's redirections; the call did not run). Only the
 * cluster's op reads them as such; to everything else (hirate_proto_outcome,
 * hirate_proto_error_reply) they are HIRATE_EREPLY, a URL that should have
 * been redis+cluster://. */
#define HIRATE_PROTO_MOVED 2
#define HIRATE_PROTO_ASK 3
int hirate_proto_error_class(const char *msg, size_t len);

/* True when the error says this server is the wrong one to talk to now
 * (READONLY, LOADING, MASTERDOWN): drop the connection, reconnect later. */
int hirate_proto_error_drops_connection(const char *msg, size_t len);
/* READONLY: the server is a replica now (a master demoted by a failover). */
int hirate_proto_error_readonly(const char *msg, size_t len);

/* Checks the script's reply to call c, whose bands are cfg[0 .. c->nbands),
 * and fills *d (the whole's decision, source HIRATE_SOURCE_REDIS), per[0 ..
 * nbands) (each band's, when per is not NULL) and state[0 .. nbands), the
 * buckets as Redis stores them after the decision, from which every later
 * decision can be foretold exactly. Every state's tokens is NAN when each
 * band kept at least the call's cost (the levels are then not read). The
 * reply must echo the full key (prefix + key), so that it can never be taken
 * for another call's. Returns 0, HIRATE_EPROTO with *why set, or the class of
 * an error reply. */
int hirate_proto_decision(const hirate_reply *r, const hirate_call *c,
                          const hirate_bucket_cfg *cfg, hirate_decision *d, hirate_decision *per,
                          hirate_bucket *state, const char **why);

/* An error reply: its class (NOSCRIPT counts as HIRATE_EREPLY here), with
 * "Redis replied: <its words>" in err; sets *drop as hirate_proto_outcome. */
int hirate_proto_error_reply(const hirate_reply *rep, int *drop, char *err, size_t errlen);

/* FUNCTION LOAD's reply: 0 when the library is there now (loaded, or
 * "already exists": another client loaded it first); HIRATE_ESERVER when the
 * server cannot take it now (READONLY, OOM, LOADING, ...: an outage, which
 * teaches nothing about Redis Functions); HIRATE_PROTO_NOFUNC when it
 * refused it (then Redis Functions are not for this server). */
int hirate_proto_load_outcome(const hirate_reply *rep);

/* What one reply to call c means: 0 with *d, per and state filled (as
 * hirate_proto_decision),
 * HIRATE_PROTO_NOSCRIPT (unless after_eval: the code was already sent with
 * it, so it is HIRATE_EREPLY), HIRATE_PROTO_NOFUNC, or an error code with its
 * message in err.
 * Sets *drop when the connection must not be used again (a malformed reply,
 * READONLY, LOADING, MASTERDOWN). */
int hirate_proto_outcome(const hirate_reply *rep, const hirate_call *c,
                         const hirate_bucket_cfg *cfg, int after_eval, hirate_decision *d,
                         hirate_decision *per, hirate_bucket *state, int *drop, char *err,
                         size_t errlen);

#endif
