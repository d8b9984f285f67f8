/*
 * hirate._hirate's private header: what the extension's files share. The
 * module state (one per interpreter that imports the module), the object
 * layouts that more than one file reads, the few helpers of the hot path
 * that every file inlines, and the functions one file defines for another.
 *
 *   module.c    the module: its state, exec and slots, the exceptions and
 *               the raising of them, the module functions, the log bridge
 *   decision.c  hirate.Decision
 *   limiter.c   hirate.Limiter: its calls, close, repr and attributes
 *   options.c   Limiter() and Limiter.from_env(): the keyword options into
 *               hirate_options, and the new limiter
 *   batch.c     the items of a batch (allow_many and the Op)
 *   op.c        the no-I/O binding of AsyncLimiter: Op, Handshake, endpoints
 *   stats.c     stats(), check() and their hirate.Stats and hirate.Health
 *   client.c    ClientRules, identities and bucket keys (the core's rules)
 */
#ifndef HIRATE_PY_HIRATE_H
#define HIRATE_PY_HIRATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "hirate.h"
#include "hirate_io.h"

/* The table of classes and names is indexed by -code: one slot more than
 * there are codes (they run from -1 down without a gap). */
#define HR_COUNT_(name, code, msg) +1
#define NCODES (1 HIRATE_ERRNO_MAP(HR_COUNT_))
#define NSOURCES 6  /* HIRATE_SOURCE_FAIL_CLOSED + 1 */
_Static_assert(NCODES == HIRATE_ERRNO_MAX + 1, "HIRATE_ERRNO_MAX is the number of codes");

#if PY_VERSION_HEX >= 0x030C0000
#  define HR_T_PYSSIZET Py_T_PYSSIZET
#  define HR_READONLY Py_READONLY
#else
#  include <structmember.h>
#  define HR_T_PYSSIZET T_PYSSIZET
#  define HR_READONLY READONLY
#endif

#if PY_VERSION_HEX >= 0x030A0000
#  define HR_IMMUTABLE Py_TPFLAGS_IMMUTABLETYPE
#else
#  define HR_IMMUTABLE 0
static inline PyObject *Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

/* ------------------------------------------------------------ module state */

/* The exception classes, in the order of add_exceptions' table. */
enum { C_ERROR, C_CONFIG, C_BACKEND, C_TIMEOUT, C_AUTH, C_CLOSED, C_TLS, C_REFUSED, C_NOTREDIS,
       NCLASSES };

typedef struct {
    PyTypeObject *limiter_type;
    PyTypeObject *decision_type;
    PyTypeObject *op_type;
    PyTypeObject *handshake_type;
    PyObject *cls[NCLASSES];      /* hirate.Error and its subclasses */
    PyObject *exc[NCODES];        /* the class for -code (borrowed from cls) */
    PyObject *errname[NCODES];    /* "ETIMEDOUT" ... for -code, interned */
    PyObject *source[NSOURCES];   /* "redis" ... by hirate_source, interned */
    PyObject *str_key, *str_cost; /* keyword names, interned */
    PyObject *stats_cls;          /* hirate.Stats, looked up at its first use */
    PyObject *health_cls;         /* hirate.Health, likewise */
} hstate;

extern struct PyModuleDef hirate_module;

static inline hstate *state_of_module(PyObject *m)
{
    return (hstate *)PyModule_GetState(m);
}

hstate *state_of_type(PyTypeObject *tp);

/* ---- errors (module.c) */

const char *short_name(int code);
PyObject *error_obj(hstate *st, int code, const char *msg);
PyObject *raise_code(hstate *st, int code, const char *msg);
PyObject *raise_codef(hstate *st, int code, const char *fmt, ...);
/* The core's message of a capacity or cost out of range (code
 * HIRATE_ECAPACITY or HIRATE_ECOST; what as hirate_range_errmsg takes it),
 * for a value shown as Python shows it (shown: a new reference, which it
 * takes; NULL: the exception already set stands). Returns NULL. */
PyObject *raise_range(hstate *st, int code, const char *what, PyObject *shown);
void log_to_python(void *arg, int level, const char *msg);

static inline PyObject *raise_closed(hstate *st)
{
    return raise_code(st, HIRATE_ECLOSED, NULL);
}

/* ---- Decision (decision.c; made here, inline, on every call's path) */

/* A decision of a limiter of several bands carries each band's figures
 * (hirate_allow_bands) after its own, in the same allocation: nbands of them
 * at bands. nbands is 0 for one band (the decision is its band's), and
 * NO_BANDS when the call could not give them (see decision_bands). The
 * Decisions of .bands are made when first asked for, and kept: they hold no
 * reference back, so a Decision is never part of a cycle. */
#define NO_BANDS (-1)

typedef struct {
    PyObject_HEAD
    hirate_decision d;
    int nbands;
    hirate_decision *bands; /* nbands of them, right after this struct, or NULL */
    PyObject *bandtuple;    /* the tuple .bands gave, or NULL */
} DecisionObject;

static inline DecisionObject *decision_alloc(hstate *st, size_t extra)
{
    /* PyObject_Init rather than tp_alloc: no zeroing, no GC bookkeeping
     * (see above), and it takes the type's reference. */
    DecisionObject *o = (DecisionObject *)PyObject_Malloc(sizeof(DecisionObject) + extra);
    if (!o)
        return (DecisionObject *)PyErr_NoMemory();
    PyObject_Init((PyObject *)o, st->decision_type);
    o->nbands = 0;
    o->bands = NULL;
    o->bandtuple = NULL;
    return o;
}

static inline PyObject *decision_new_from(hstate *st, const hirate_decision *d)
{
    DecisionObject *o = decision_alloc(st, 0);
    if (!o)
        return NULL;
    o->d = *d;
    return (PyObject *)o;
}

/* A decision with n band figures: n of 0 or 1 is the one-band decision,
 * NO_BANDS one of several bands whose figures the call did not give. Band
 * i's own Decision says band i. */
static inline PyObject *decision_new_bands(hstate *st, const hirate_decision *d,
                                    const hirate_decision *bands, int n)
{
    if (n == 0 || n == 1)
        return decision_new_from(st, d);
    size_t extra = n > 1 ? (size_t)n * sizeof(hirate_decision) : 0;   /* NO_BANDS: none */
    DecisionObject *o = decision_alloc(st, extra);
    if (!o)
        return NULL;
    o->d = *d;
    o->nbands = n;
    if (extra) {
        o->bands = (hirate_decision *)(o + 1);
        memcpy(o->bands, bands, extra);
        for (int i = 0; i < n; i++)
            o->bands[i].band = i;
    }
    return (PyObject *)o;
}

PyObject *code_name(hstate *st, int e);
PyObject *float_text(double x);
extern PyType_Spec decision_spec;

/* ---- Limiter (limiter.c) */

/* Bumped in the child after fork(): calls that were running without the
 * GIL in the parent have no thread in the child, so their count is void.
 * One for the process, since a fork takes every interpreter's threads:
 * atomic, as the interpreters that read it hold GILs of their own. */
extern _Atomic unsigned long g_fork_gen;

typedef struct {
    PyObject_HEAD
    hirate_limiter *lim;    /* NULL once closed */
    hstate *st;             /* the module's state; the type keeps the module alive */
    int redis;              /* 1: a URL, so calls release the GIL */
    int cluster;            /* 1: a Redis Cluster URL (hirate_is_cluster) */
    int sentinel;           /* 1: a Sentinel URL (hirate_is_sentinel) */
    int closed;             /* set by close(): no new call starts */
    unsigned long inuse;    /* calls running without the GIL; changed with the GIL held */
    unsigned long fork_gen; /* the g_fork_gen that inuse counts in */
    /* Op and Handshake objects that hold a core object of this limiter:
     * close() leaves the freeing of lim to the last of them, since the core
     * objects belong to the limiter (changed with the GIL held). */
    unsigned long live;
    int64_t capacity;       /* band 0's */
    double rate;            /* band 0's */
    int nbands;             /* hirate_limiter_nbands */
    PyObject *bandinfo;     /* ((capacity, rate, name), ...), one a band */
    PyObject *bandobjs;     /* the same as hirate.Band, made when first asked */
    int on_error;
    PyObject *url;          /* the URL with its password as ***, or None */
    PyObject *prefix;       /* str */
    PyObject *weakrefs;
    /* The metrics as they were when lim was freed, for stats() after
     * close(). */
    hirate_stats last;
} LimiterObject;

/* Enters a call that will run without the GIL. */
static inline int enter(LimiterObject *self)
{
    if (self->closed) {
        raise_closed(self->st);
        return -1;
    }
    if (self->fork_gen != g_fork_gen) {
        self->fork_gen = g_fork_gen;
        self->inuse = 0;
    }
    self->inuse++;
    return 0;
}

static inline void leave(LimiterObject *self)
{
    if (self->fork_gen == g_fork_gen && self->inuse > 0)
        self->inuse--;
}

/* The key as bytes: str (UTF-8), bytes, or any contiguous buffer. A buffer
 * is held until key_release(), which also keeps a bytearray from being
 * resized while a call runs without the GIL. */
typedef struct {
    const char *p;
    Py_ssize_t n;
    int has_view;
    Py_buffer view;
} keybuf;

/* One decision by the core: allow (spend 1), peek (spend 0), refund
 * (HIRATE_OP_REFUND), or at an
 * injected time; with several bands (nbands > 1), each band's figures in
 * bv[0 .. nbands). One band takes the calls without band figures, the path
 * of every limiter before bands existed. */
static inline int decide_one(hirate_limiter *lim, const keybuf *k, int64_t cost, int spend,
                             int64_t now_us, hirate_decision *d, hirate_decision *bv,
                             size_t nbands)
{
    const char *p = k->p;
    size_t n = (size_t)k->n;
    if (spend == HIRATE_OP_REFUND && now_us < 0)
        return nbands > 1 ? hirate_refund_bands(lim, p, n, cost, d, bv, nbands)
                          : hirate_refund(lim, p, n, cost, d);
    if (nbands > 1) {
        if (now_us >= 0)
            return hirate_decide_at_bands(lim, p, n, cost, spend, now_us, d, bv, nbands);
        if (spend)
            return hirate_allow_bands(lim, p, n, cost, d, bv, nbands);
        return hirate_peek_bands(lim, p, n, cost, d, bv, nbands);
    }
    if (now_us >= 0)
        return hirate_decide_at(lim, p, n, cost, spend, now_us, d);
    if (spend)
        return hirate_allow(lim, p, n, cost, d);
    return hirate_peek(lim, p, n, cost, d);
}

int key_get(PyObject *o, keybuf *k);
void key_release(keybuf *k);
int int_value(PyObject *o, const char *what, long long *out);
int cost_value(hstate *st, PyObject *o, int64_t *out);
void limiter_free_core(LimiterObject *self, int release);
void limiter_atfork_init(void);
extern PyType_Spec limiter_spec;

/* ---- Limiter() and from_env (options.c) */

PyObject *limiter_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw);
PyObject *limiter_from_env(PyObject *cls, PyObject *args, PyObject *kw);
const char *c_string(hstate *st, PyObject *o, const char *what, int code);
int capacity_value(PyObject *o, const char *what, int64_t *out);
int rate_option(PyObject *o, const char *what, double *out);

/* ---- batches (batch.c) */

/* The items of a batch and what keeps their key bytes alive. */
typedef struct {
    Py_ssize_t n;
    hirate_item *items;
    PyObject **keys;    /* a reference to each key object */
    keybuf *bufs;
    int nbands;         /* band figures kept per item in bandv (else 0) */
    hirate_decision *bandv; /* item i's at bandv[i * nbands] */
    char *msgs;         /* item i's message at msgs[i * HIRATE_ERRMSG_SIZE] ("" when
                           it was decided), or NULL */
} batch;

void batch_clear(batch *b);
int value_check(hstate *st, const void *key, size_t keylen, int64_t cost);
int batch_from(hstate *st, const char *fname, PyObject *pairs, batch *b);
int batch_bands(batch *b, int nbands);
int batch_msgs(batch *b);
const char *batch_msg(const batch *b, Py_ssize_t i);
void batch_decide_here(hirate_limiter *lim, batch *b, int spend, int64_t now_us);
PyObject *item_result(hstate *st, const hirate_item *it, const char *msg,
                      const hirate_decision *bv, int nb);

/* ---- the no-I/O binding (op.c) */

PyObject *limiter_op_start(PyObject *op, PyObject *args, PyObject *kw);
PyObject *limiter_op_start_reset(PyObject *op, PyObject *key);
PyObject *limiter_op_start_check(PyObject *op, PyObject *unused);
PyObject *limiter_handshake_start(PyObject *op, PyObject *args, PyObject *kw);
PyObject *limiter_endpoint(PyObject *op, PyObject *args, PyObject *kw);
extern PyType_Spec op_spec, hs_spec;

/* ---- stats and health (stats.c) */

PyObject *limiter_stats(PyObject *op, PyObject *unused);
PyObject *limiter_public_stats(PyObject *op, PyObject *unused);
PyObject *limiter_check(PyObject *op, PyObject *unused);
PyObject *mod_empty_stats(PyObject *m, PyObject *unused);
PyObject *health_object(hstate *st, int rc, const hirate_check_node *nodes, size_t n);

/* ---- client identity (client.c): ClientRules and the identity and
 * bucket-key functions, added to the module by module_exec */

int hirate_py_client_add(PyObject *module);

#endif
