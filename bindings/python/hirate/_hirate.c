/*
 * hirate._hirate: the CPython extension around the hirate core.
 *
 * Written against the C API directly, in the modern style: heap types made
 * with PyType_FromModuleAndSpec, everything per-interpreter in module state,
 * multi-phase initialisation, and exceptions built from a table that maps
 * each HIRATE_E* code to a class (the instance carries .code and .name).
 *
 * Threads: a limiter with a Redis URL releases the GIL around every call,
 * since a call may wait on the network for up to its timeouts. The
 * in-memory limiter keeps the GIL: a decision takes a fraction of a
 * microsecond, far less than releasing and taking back the GIL.
 * close() waits until the calls running without the GIL have left, so no
 * call ever meets a freed limiter.
 *
 * The low-level hooks (Limiter._op_start and the Op type, _endpoint,
 * _handshake) let hirate.AsyncLimiter do its own socket I/O on the event
 * loop with the core's bytes, reply checks, breaker, deny cache and policy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "hirate.h"
#include "hirate_internal.h"

#define NCODES 19   /* -HIRATE_ECLOSED + 1: the table is indexed by -code */
#define NSOURCES 6  /* HIRATE_SOURCE_FAIL_CLOSED + 1 */

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

typedef struct {
    PyTypeObject *limiter_type;
    PyTypeObject *decision_type;
    PyTypeObject *op_type;
    PyObject *error;              /* hirate.Error, the base */
    PyObject *config_error;
    PyObject *backend_error;
    PyObject *timeout_error;
    PyObject *auth_error;
    PyObject *closed_error;
    PyObject *exc[NCODES];        /* the class for -code (borrowed from above) */
    PyObject *errname[NCODES];    /* "ETIMEDOUT" ... for -code, interned */
    PyObject *source[NSOURCES];   /* "redis" ... by hirate_source, interned */
    PyObject *str_key, *str_cost; /* keyword names, interned */
} hstate;

static struct PyModuleDef hirate_module;

static hstate *state_of_module(PyObject *m)
{
    return (hstate *)PyModule_GetState(m);
}

/* The state of the module that defined tp or one of its bases: Limiter may
 * be subclassed in Python, and a subclass has no module of its own. */
static hstate *state_of_type(PyTypeObject *tp)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *m = PyType_GetModuleByDef(tp, &hirate_module);
    return m ? state_of_module(m) : NULL;
#else
    PyObject *mro = tp->tp_mro;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (!(b->tp_flags & Py_TPFLAGS_HEAPTYPE))
            continue;
        PyObject *m = ((PyHeapTypeObject *)b)->ht_module;
        if (m && PyModule_GetDef(m) == &hirate_module)
            return state_of_module(m);
    }
    PyErr_Format(PyExc_TypeError, "%s is not a hirate type", tp->tp_name);
    return NULL;
#endif
}

/* ----------------------------------------------------------------- errors */

/* "ETIMEDOUT" for HIRATE_ETIMEDOUT: the core's name without its prefix. */
static const char *short_name(int code)
{
    const char *n = hirate_err_name(code);
    return strncmp(n, "HIRATE_", 7) == 0 ? n + 7 : n;
}

/* The exception hirate raises for code, with message msg (a str, whose
 * reference is taken), its .code and .name set. */
static PyObject *make_exc(hstate *st, int code, PyObject *msg)
{
    if (!msg)
        return NULL;
    int i = -code;
    PyObject *cls = code == HIRATE_ENOMEM ? PyExc_MemoryError
                    : i > 0 && i < NCODES && st->exc[i] ? st->exc[i] : st->error;
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (!exc || code == HIRATE_ENOMEM)
        return exc;
    PyObject *pycode = PyLong_FromLong(code);
    PyObject *name = i > 0 && i < NCODES ? st->errname[i] : NULL;
    if (!pycode || PyObject_SetAttrString(exc, "code", pycode) < 0 ||
        PyObject_SetAttrString(exc, "name", name ? name : Py_None) < 0) {
        Py_XDECREF(pycode);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(pycode);
    return exc;
}

static PyObject *raise_obj(hstate *st, int code, PyObject *msg)
{
    PyObject *exc = make_exc(st, code, msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raises code with the core's message (bytes from Redis may not be UTF-8). */
static PyObject *raise_code(hstate *st, int code, const char *msg)
{
    if (!msg || !msg[0])
        msg = hirate_strerror(code);
    return raise_obj(st, code, PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"));
}

static PyObject *raise_codef(hstate *st, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    return raise_obj(st, code, msg);
}

/* -------------------------------------------------------------- Decision */

typedef struct {
    PyObject_HEAD
    hirate_decision d;
} DecisionObject;

static PyObject *decision_new_from(hstate *st, const hirate_decision *d)
{
    /* PyObject_Init rather than tp_alloc: no zeroing, no GC bookkeeping
     * (a Decision holds no references), and it takes the type's reference. */
    DecisionObject *o = (DecisionObject *)PyObject_Malloc(sizeof(DecisionObject));
    if (!o)
        return PyErr_NoMemory();
    PyObject_Init((PyObject *)o, st->decision_type);
    o->d = *d;
    return (PyObject *)o;
}

static void decision_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static double us_to_s(int64_t us)
{
    return us == HIRATE_NEVER ? INFINITY : (double)us / 1e6;
}

static hstate *decision_state(PyObject *self)
{
    return (hstate *)PyType_GetModuleState(Py_TYPE(self));
}

#define D(self) (((DecisionObject *)(self))->d)

static PyObject *decision_allowed(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(D(self).allowed);
}

static PyObject *decision_remaining(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(D(self).remaining);
}

static PyObject *decision_limit(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(D(self).limit);
}

static PyObject *decision_retry_after(PyObject *self, void *c)
{
    (void)c;
    return PyFloat_FromDouble(us_to_s(D(self).retry_after_us));
}

static PyObject *decision_reset_after(PyObject *self, void *c)
{
    (void)c;
    return PyFloat_FromDouble(us_to_s(D(self).reset_after_us));
}

static PyObject *decision_retry_after_us(PyObject *self, void *c)
{
    (void)c;
    if (D(self).retry_after_us == HIRATE_NEVER)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(D(self).retry_after_us);
}

static PyObject *decision_reset_after_us(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(D(self).reset_after_us);
}

static PyObject *decision_time(PyObject *self, void *c)
{
    (void)c;
    return PyFloat_FromDouble((double)D(self).time_us / 1e6);
}

static PyObject *decision_time_us(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(D(self).time_us);
}

static PyObject *source_str(hstate *st, int source)
{
    PyObject *s = source > 0 && source < NSOURCES ? st->source[source] : NULL;
    if (!s)
        return PyUnicode_FromString(hirate_source_name(source));
    Py_INCREF(s);
    return s;
}

static PyObject *decision_source(PyObject *self, void *c)
{
    (void)c;
    hstate *st = decision_state(self);
    return st ? source_str(st, D(self).source) : NULL;
}

static PyObject *decision_error(PyObject *self, void *c)
{
    (void)c;
    int e = D(self).error;
    if (e == 0)
        Py_RETURN_NONE;
    hstate *st = decision_state(self);
    if (!st)
        return NULL;
    if (-e > 0 && -e < NCODES && st->errname[-e]) {
        Py_INCREF(st->errname[-e]);
        return st->errname[-e];
    }
    return PyUnicode_FromString(short_name(e));
}

static int decision_bool(PyObject *self)
{
    return D(self).allowed != 0;
}

/* Python's repr of a float: 0.5, 0.0, inf. */
static PyObject *float_text(double x)
{
    char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s)
        return PyErr_NoMemory();
    PyObject *r = PyUnicode_FromString(s);
    PyMem_Free(s);
    return r;
}

static PyObject *decision_repr(PyObject *self)
{
    hstate *st = decision_state(self);
    if (!st)
        return NULL;
    const hirate_decision *d = &D(self);
    PyObject *retry = float_text(us_to_s(d->retry_after_us));
    PyObject *reset = float_text(us_to_s(d->reset_after_us));
    PyObject *source = source_str(st, d->source);
    PyObject *r = NULL;
    if (retry && reset && source) {
        if (d->error)
            r = PyUnicode_FromFormat("<Decision %s remaining=%lld limit=%lld retry_after=%U "
                                     "reset_after=%U source=%R error='%s'>",
                                     d->allowed ? "allowed" : "refused",
                                     (long long)d->remaining, (long long)d->limit, retry, reset,
                                     source, short_name(d->error));
        else
            r = PyUnicode_FromFormat("<Decision %s remaining=%lld limit=%lld retry_after=%U "
                                     "reset_after=%U source=%R>",
                                     d->allowed ? "allowed" : "refused",
                                     (long long)d->remaining, (long long)d->limit, retry, reset,
                                     source);
    }
    Py_XDECREF(retry);
    Py_XDECREF(reset);
    Py_XDECREF(source);
    return r;
}

static int decision_same(const hirate_decision *a, const hirate_decision *b)
{
    return !a->allowed == !b->allowed && a->source == b->source && a->error == b->error &&
           a->limit == b->limit && a->remaining == b->remaining &&
           a->retry_after_us == b->retry_after_us && a->reset_after_us == b->reset_after_us &&
           a->time_us == b->time_us;
}

static PyObject *decision_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b))
        Py_RETURN_NOTIMPLEMENTED;
    int same = decision_same(&D(a), &D(b));
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t decision_hash(PyObject *self)
{
    const hirate_decision *d = &D(self);
    uint64_t h = 1469598103934665603ull;
    const int64_t parts[8] = {!!d->allowed, d->source, d->error, d->limit, d->remaining,
                              d->retry_after_us, d->reset_after_us, d->time_us};
    for (int i = 0; i < 8; i++)
        h = (h ^ (uint64_t)parts[i]) * 1099511628211ull;
    Py_hash_t r = (Py_hash_t)h;
    return r == -1 ? -2 : r;
}

/* Seconds (a float, inf for never) to whole microseconds. */
static int seconds_to_us(hstate *st, PyObject *o, const char *what, int never_ok, int64_t *out)
{
    double s = PyFloat_AsDouble(o);
    if (s == -1.0 && PyErr_Occurred())
        return -1;
    if (never_ok && isinf(s) && s > 0) {
        *out = HIRATE_NEVER;
        return 0;
    }
    if (!(s >= 0) || s * 1e6 > (double)HIRATE_EXACT_MAX) {
        raise_codef(st, HIRATE_EINVAL, "%s must be a number of seconds from 0 up, got %R", what, o);
        return -1;
    }
    *out = (int64_t)llround(s * 1e6);
    return 0;
}

/* Decision(allowed, remaining, limit, retry_after, reset_after, source,
 * error=None, time=0.0): for tests and for code that makes decisions of
 * its own (e.g. to render headers). */
static PyObject *decision_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"allowed", "remaining", "limit", "retry_after", "reset_after",
                             "source", "error", "time", NULL};
    PyObject *retry, *reset, *source, *error = Py_None, *time = NULL;
    int allowed;
    long long remaining, limit;
    hstate *st = state_of_type(tp);
    if (!st || !PyArg_ParseTupleAndKeywords(args, kw, "pLLOOU|OO:Decision", kwlist, &allowed,
                                            &remaining, &limit, &retry, &reset, &source, &error,
                                            &time))
        return NULL;
    hirate_decision d;
    memset(&d, 0, sizeof d);
    d.allowed = allowed;
    d.remaining = remaining;
    d.limit = limit;
    if (seconds_to_us(st, retry, "retry_after", 1, &d.retry_after_us) < 0 ||
        seconds_to_us(st, reset, "reset_after", 0, &d.reset_after_us) < 0 ||
        (time && seconds_to_us(st, time, "time", 0, &d.time_us) < 0))
        return NULL;
    for (int i = 1; i < NSOURCES; i++)
        if (PyUnicode_Compare(source, st->source[i]) == 0)
            d.source = i;
    if (!d.source)
        return raise_codef(st, HIRATE_EINVAL,
                           "source must be 'redis', 'local', 'cache', 'fail_open' or "
                           "'fail_closed', got %R", source);
    if (error != Py_None) {
        for (int i = 1; i < NCODES && PyUnicode_Check(error); i++)
            if (PyUnicode_Compare(error, st->errname[i]) == 0)
                d.error = -i;
        if (!d.error)
            return raise_codef(st, HIRATE_EINVAL,
                               "error must be None or an error name such as 'ETIMEDOUT', got %R",
                               error);
    }
    return decision_new_from(st, &d);
}

static PyGetSetDef decision_getset[] = {
    {"allowed", decision_allowed, NULL, "True when the cost passed (and was spent).", NULL},
    {"remaining", decision_remaining, NULL, "Whole tokens left after this decision.", NULL},
    {"limit", decision_limit, NULL, "The capacity.", NULL},
    {"retry_after", decision_retry_after, NULL,
     "Seconds until the same cost can pass: 0.0 when allowed, math.inf when the cost "
     "exceeds the capacity.", NULL},
    {"reset_after", decision_reset_after, NULL, "Seconds until the bucket is full again.", NULL},
    {"retry_after_us", decision_retry_after_us, NULL,
     "retry_after in whole microseconds, exactly as the core computed it; None for never.",
     NULL},
    {"reset_after_us", decision_reset_after_us, NULL, "reset_after in whole microseconds.", NULL},
    {"source", decision_source, NULL,
     "Who decided: 'redis', 'local', 'cache', 'fail_open' or 'fail_closed'.", NULL},
    {"error", decision_error, NULL,
     "None, or the name of the Redis failure the policy answered for, e.g. 'ETIMEDOUT'.", NULL},
    {"time", decision_time, NULL,
     "When it was decided, in seconds: Redis' clock (since the epoch) or this process' "
     "monotonic clock.", NULL},
    {"time_us", decision_time_us, NULL, "time in whole microseconds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot decision_slots[] = {
    {Py_tp_doc, (void *)"A rate-limit decision: immutable, true when allowed."},
    {Py_tp_new, (void *)decision_tp_new},
    {Py_tp_dealloc, (void *)decision_dealloc},
    {Py_tp_free, (void *)PyObject_Free},
    {Py_tp_getset, decision_getset},
    {Py_tp_repr, (void *)decision_repr},
    {Py_tp_richcompare, (void *)decision_richcompare},
    {Py_tp_hash, (void *)decision_hash},
    {Py_nb_bool, (void *)decision_bool},
    {0, NULL},
};

static PyType_Spec decision_spec = {
    .name = "hirate.Decision",
    .basicsize = sizeof(DecisionObject),
    .flags = Py_TPFLAGS_DEFAULT | HR_IMMUTABLE,
    .slots = decision_slots,
};

/* --------------------------------------------------------------- Limiter */

/* Bumped in the child after fork(): calls that were running without the
 * GIL in the parent have no thread in the child, so their count is void. */
static unsigned long g_fork_gen;

static void after_fork_child(void)
{
    g_fork_gen++;
}

typedef struct {
    PyObject_HEAD
    hirate_limiter *lim;    /* NULL once closed */
    hstate *st;             /* the module's state; the type keeps the module alive */
    int redis;              /* 1: a URL, so calls release the GIL */
    int closed;             /* set by close(): no new call starts */
    unsigned long inuse;    /* calls running without the GIL; changed with the GIL held */
    unsigned long fork_gen; /* the g_fork_gen that inuse counts in */
    int64_t capacity;
    double rate;
    int on_error;
    PyObject *url;          /* the URL with its password as ***, or None */
    PyObject *prefix;       /* str */
    PyObject *weakrefs;
} LimiterObject;

static PyObject *raise_closed(hstate *st)
{
    return raise_code(st, HIRATE_ECLOSED, NULL);
}

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

static int key_get(PyObject *o, keybuf *k)
{
    k->has_view = 0;
    if (PyUnicode_Check(o)) {
        k->p = PyUnicode_AsUTF8AndSize(o, &k->n);
        return k->p ? 0 : -1;
    }
    if (PyBytes_Check(o)) {
        k->p = PyBytes_AS_STRING(o);
        k->n = PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &k->view, PyBUF_SIMPLE) < 0)
            return -1;
        k->has_view = 1;
        k->p = k->view.buf;
        k->n = k->view.len;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "key must be str or bytes, not %.200s", Py_TYPE(o)->tp_name);
    return -1;
}

static void key_release(keybuf *k)
{
    if (k->has_view) {
        PyBuffer_Release(&k->view);
        k->has_view = 0;
    }
}

/* An int that is not a bool (True as a cost or a capacity is a mistake).
 * Returns 0, -1 with an exception, or 1 when it does not fit in 64 bits. */
static int int_value(PyObject *o, const char *what, long long *out)
{
    if (PyBool_Check(o) || PyFloat_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.200s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(o);
    if (!i)
        return -1;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return overflow != 0;
}

static int cost_value(hstate *st, PyObject *o, int64_t *out)
{
    long long v;
    if (PyLong_CheckExact(o)) {   /* the common case, without the detours */
        int overflow;
        v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow) {
            *out = v;
            return 0;
        }
    } else {
        int r = int_value(o, "cost", &v);
        if (r < 0)
            return -1;
        if (r == 0) {
            *out = v;
            return 0;
        }
    }
    raise_codef(st, HIRATE_ECOST, "cost must be a whole number from 0 to 2^53-1, got %S", o);
    return -1;
}

/* (key, cost=1) from a vectorcall, positional or by keyword. */
static int parse_key_cost(hstate *st, const char *fname, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames, PyObject **key, PyObject **cost)
{
    *key = nargs > 0 ? args[0] : NULL;
    *cost = nargs > 1 ? args[1] : NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", fname, nargs);
        return -1;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        PyObject **slot = NULL;
        if (name == st->str_key || PyUnicode_Compare(name, st->str_key) == 0)
            slot = key;
        else if (name == st->str_cost || PyUnicode_Compare(name, st->str_cost) == 0)
            slot = cost;
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname,
                         name);
            return -1;
        }
        if (*slot) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument %R", fname,
                         name);
            return -1;
        }
        *slot = args[nargs + i];
    }
    if (!*key) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument 'key'", fname);
        return -1;
    }
    return 0;
}

/* One decision: allow (spend 1), peek (spend 0), or at an injected time. */
static PyObject *decide(LimiterObject *self, PyObject *key, PyObject *cost_obj, int spend,
                        int64_t now_us)
{
    hstate *st = self->st;
    int64_t cost = 1;
    keybuf k;
    hirate_decision d;
    int rc;
    char msg[HIRATE_ERRMSG_SIZE];

    if (cost_obj && cost_value(st, cost_obj, &cost) < 0)
        return NULL;
    if (key_get(key, &k) < 0)
        return NULL;
    if (!self->redis) {
        if (self->closed) {
            key_release(&k);
            return raise_closed(st);
        }
        if (now_us >= 0)
            rc = hirate__decide_at(self->lim, k.p, (size_t)k.n, cost, spend, now_us, &d);
        else if (spend)
            rc = hirate_allow(self->lim, k.p, (size_t)k.n, cost, &d);
        else
            rc = hirate_peek(self->lim, k.p, (size_t)k.n, cost, &d);
        if (rc < 0)
            hirate_limiter_errmsg(self->lim, msg, sizeof msg);
    } else {
        if (enter(self) < 0) {
            key_release(&k);
            return NULL;
        }
        hirate_limiter *lim = self->lim;
        Py_BEGIN_ALLOW_THREADS
        if (now_us >= 0)
            rc = hirate__decide_at(lim, k.p, (size_t)k.n, cost, spend, now_us, &d);
        else if (spend)
            rc = hirate_allow(lim, k.p, (size_t)k.n, cost, &d);
        else
            rc = hirate_peek(lim, k.p, (size_t)k.n, cost, &d);
        if (rc < 0)
            hirate_limiter_errmsg(lim, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    key_release(&k);
    if (rc < 0)
        return raise_code(st, rc, msg);
    return decision_new_from(st, &d);
}

static PyObject *limiter_allow(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    LimiterObject *self = (LimiterObject *)op;
    PyObject *key, *cost;
    if (parse_key_cost(self->st, "allow", args, nargs, kwnames, &key, &cost) < 0)
        return NULL;
    return decide(self, key, cost, 1, -1);
}

static PyObject *limiter_peek(PyObject *op, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    LimiterObject *self = (LimiterObject *)op;
    PyObject *key, *cost;
    if (parse_key_cost(self->st, "peek", args, nargs, kwnames, &key, &cost) < 0)
        return NULL;
    return decide(self, key, cost, 0, -1);
}

static PyObject *limiter_decide_at(PyObject *op, PyObject *args)
{
    LimiterObject *self = (LimiterObject *)op;
    PyObject *key, *cost;
    int spend;
    long long now_us;
    if (!PyArg_ParseTuple(args, "OOpL:_decide_at", &key, &cost, &spend, &now_us))
        return NULL;
    if (now_us < 0)
        return raise_code(self->st, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(self, key, cost, spend, now_us);
}

static PyObject *limiter_reset(PyObject *op, PyObject *key)
{
    LimiterObject *self = (LimiterObject *)op;
    keybuf k;
    int rc;
    char msg[HIRATE_ERRMSG_SIZE];
    if (key_get(key, &k) < 0)
        return NULL;
    if (!self->redis) {
        if (self->closed) {
            key_release(&k);
            return raise_closed(self->st);
        }
        rc = hirate_reset(self->lim, k.p, (size_t)k.n);
        if (rc < 0)
            hirate_limiter_errmsg(self->lim, msg, sizeof msg);
    } else {
        if (enter(self) < 0) {
            key_release(&k);
            return NULL;
        }
        hirate_limiter *lim = self->lim;
        Py_BEGIN_ALLOW_THREADS
        rc = hirate_reset(lim, k.p, (size_t)k.n);
        if (rc < 0)
            hirate_limiter_errmsg(lim, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    key_release(&k);
    if (rc < 0)
        return raise_code(self->st, rc, msg);
    Py_RETURN_NONE;
}

/* _reset_local(key): what reset() does without I/O (check the key, forget it
 * in the deny cache and the local buckets), for AsyncLimiter, which then
 * sends the DEL itself. */
static PyObject *limiter_reset_local(PyObject *op, PyObject *key)
{
    LimiterObject *self = (LimiterObject *)op;
    keybuf k;
    char msg[HIRATE_ERRMSG_SIZE];
    if (key_get(key, &k) < 0)
        return NULL;
    if (self->closed) {
        key_release(&k);
        return raise_closed(self->st);
    }
    int rc = hirate__reset_local(self->lim, k.p, (size_t)k.n);
    if (rc < 0)
        hirate_limiter_errmsg(self->lim, msg, sizeof msg);
    key_release(&k);
    if (rc < 0)
        return raise_code(self->st, rc, msg);
    Py_RETURN_NONE;
}

/* ---- batches: allow_many and the Op of _op_start ------------------------ */

/* The items of a batch and what keeps their key bytes alive. */
typedef struct {
    Py_ssize_t n;
    hirate_item *items;
    PyObject **keys;    /* a reference to each key object */
    keybuf *bufs;
} batch;

static void batch_clear(batch *b)
{
    for (Py_ssize_t i = 0; i < b->n; i++) {
        if (b->keys && b->keys[i]) {
            key_release(&b->bufs[i]);
            Py_DECREF(b->keys[i]);
        }
    }
    PyMem_Free(b->items);
    PyMem_Free(b->keys);
    PyMem_Free(b->bufs);
    memset(b, 0, sizeof *b);
}

/* Reads an iterable of (key, cost) pairs. Wrong types raise TypeError before
 * anything is decided; values (an empty key, a negative cost) are the
 * core's to judge, item by item. */
static int batch_from(hstate *st, const char *fname, PyObject *pairs, batch *b)
{
    memset(b, 0, sizeof *b);
    if (!Py_TYPE(pairs)->tp_iter && !PySequence_Check(pairs)) {
        PyErr_Format(PyExc_TypeError, "%s() needs an iterable of (key, cost) pairs, not %.200s",
                     fname, Py_TYPE(pairs)->tp_name);
        return -1;
    }
    PyObject *seq = PySequence_Fast(pairs, "an iterable of (key, cost) pairs");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    size_t m = n > 0 ? (size_t)n : 1;
    b->items = PyMem_Calloc(m, sizeof *b->items);
    b->keys = PyMem_Calloc(m, sizeof *b->keys);
    b->bufs = PyMem_Calloc(m, sizeof *b->bufs);
    if (!b->items || !b->keys || !b->bufs) {
        Py_DECREF(seq);
        batch_clear(b);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError,
                         "%s() items must be (key, cost) tuples, item %zd is %.200s", fname, i,
                         Py_TYPE(pair)->tp_name);
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0);
        if (cost_value(st, PyTuple_GET_ITEM(pair, 1), &b->items[i].cost) < 0 ||
            key_get(key, &b->bufs[i]) < 0)
            goto fail;
        Py_INCREF(key);
        b->keys[i] = key;
        b->n = i + 1;
        b->items[i].key = b->bufs[i].p;
        b->items[i].keylen = (size_t)b->bufs[i].n;
    }
    b->n = n;
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    batch_clear(b);
    return -1;
}

/* The message for a failed item. A bad key or cost is checked again alone
 * (no I/O, no change), so that the message is that item's own even when
 * later items failed too; anything else carries the limiter's message. */
static void item_message(hirate_limiter *lim, const hirate_item *it, char *msg, size_t len)
{
    hirate_decision d;
    if (it->rc == HIRATE_EKEY || it->rc == HIRATE_ECOST || it->rc == HIRATE_EINVAL) {
        if (hirate_peek(lim, it->key, it->keylen, it->cost, &d) == it->rc) {
            hirate_limiter_errmsg(lim, msg, len);
            return;
        }
    }
    hirate_limiter_errmsg(lim, msg, len);
}

/* The first failed item: its index, or -1; its message into msg. */
static Py_ssize_t batch_first_error(hirate_limiter *lim, const batch *b, char *msg, size_t len)
{
    for (Py_ssize_t i = 0; i < b->n; i++) {
        if (b->items[i].rc < 0) {
            item_message(lim, &b->items[i], msg, len);
            return i;
        }
    }
    return -1;
}

static PyObject *batch_decisions(hstate *st, const batch *b)
{
    PyObject *list = PyList_New(b->n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *d = decision_new_from(st, &b->items[i].decision);
        if (!d) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, d);
    }
    return list;
}

static PyObject *limiter_allow_many(PyObject *op, PyObject *pairs)
{
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    batch b;
    char msg[HIRATE_ERRMSG_SIZE] = "";
    Py_ssize_t bad;

    if (batch_from(st, "allow_many", pairs, &b) < 0)
        return NULL;
    if (!self->redis) {
        if (self->closed) {
            batch_clear(&b);
            return raise_closed(st);
        }
        hirate_allow_many(self->lim, b.items, (size_t)b.n);
        bad = batch_first_error(self->lim, &b, msg, sizeof msg);
    } else {
        if (enter(self) < 0) {
            batch_clear(&b);
            return NULL;
        }
        hirate_limiter *lim = self->lim;
        Py_BEGIN_ALLOW_THREADS
        hirate_allow_many(lim, b.items, (size_t)b.n);
        bad = batch_first_error(lim, &b, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    PyObject *r = bad >= 0 ? raise_code(st, b.items[bad].rc, msg) : batch_decisions(st, &b);
    batch_clear(&b);
    return r;
}

/* The Op: one batch decided with the caller doing the I/O. */
typedef struct {
    PyObject_HEAD
    LimiterObject *owner;   /* strong: the limiter outlives its ops */
    hirate_op *op;          /* NULL when nothing needed Redis */
    batch b;
    int done;               /* every item has its rc and decision */
    Py_ssize_t bad;         /* the first failed item, or -1 */
    char msg[HIRATE_ERRMSG_SIZE];
} OpObject;

/* Records the outcome once every item is decided. */
static void op_finish(OpObject *self)
{
    self->done = 1;
    self->bad = batch_first_error(self->owner->lim, &self->b, self->msg, sizeof self->msg);
}

/* An Op decided entirely at its start: a failed item raises now, as
 * allow_many would, since there is nothing left to wait for. */
static PyObject *op_started(OpObject *o)
{
    op_finish(o);
    if (o->bad < 0)
        return (PyObject *)o;
    raise_code(o->owner->st, o->b.items[o->bad].rc, o->msg);
    Py_DECREF(o);
    return NULL;
}

static PyObject *limiter_op_start(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pairs", "spend", "now_us", NULL};
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    PyObject *pairs;
    int spend;
    long long now_us = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Op|L:_op_start", kwlist, &pairs, &spend,
                                     &now_us))
        return NULL;
    if (self->closed)
        return raise_closed(st);
    OpObject *o = PyObject_New(OpObject, st->op_type);
    if (!o)
        return NULL;
    o->owner = self;
    Py_INCREF(self);
    o->op = NULL;
    o->done = 0;
    o->bad = -1;
    o->msg[0] = '\0';
    if (batch_from(st, "_op_start", pairs, &o->b) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    if (!self->redis) {
        /* Nothing to send: decided here, as allow_many or peek would. */
        for (Py_ssize_t i = 0; i < o->b.n; i++) {
            hirate_item *it = &o->b.items[i];
            if (now_us >= 0)
                it->rc = hirate__decide_at(self->lim, it->key, it->keylen, it->cost, spend,
                                           now_us, &it->decision);
            else if (spend)
                it->rc = hirate_allow(self->lim, it->key, it->keylen, it->cost, &it->decision);
            else
                it->rc = hirate_peek(self->lim, it->key, it->keylen, it->cost, &it->decision);
        }
        return op_started(o);
    }
    /* No I/O happens here, so the GIL stays: the core only looks at its
     * deny cache, breaker and (while Redis is failing) local buckets. */
    int r = hirate__op_start(self->lim, o->b.items, (size_t)o->b.n, spend, now_us, &o->op);
    if (r < 0) {
        Py_DECREF(o);
        return raise_code(st, r, NULL);
    }
    return r == 0 ? op_started(o) : (PyObject *)o;
}

static int op_usable(OpObject *self)
{
    if (!self->owner) {
        PyErr_SetString(PyExc_TypeError, "this Op was not made by Limiter._op_start()");
        return -1;
    }
    if (self->owner->closed) {
        raise_closed(self->owner->st);
        return -1;
    }
    return 0;
}

static PyObject *op_request(PyObject *op, void *c)
{
    (void)c;
    OpObject *self = (OpObject *)op;
    if (!self->op || self->done)
        Py_RETURN_NONE;
    size_t len;
    const char *req = hirate__op_request(self->op, &len);
    return PyBytes_FromStringAndSize(req, (Py_ssize_t)len);
}

static PyObject *op_drop(PyObject *op, void *c)
{
    (void)c;
    OpObject *self = (OpObject *)op;
    return PyBool_FromLong(self->op ? hirate__op_drop(self->op) : 0);
}

static PyObject *op_done(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((OpObject *)op)->done);
}

static PyObject *op_feed(PyObject *op, PyObject *data)
{
    OpObject *self = (OpObject *)op;
    if (op_usable(self) < 0)
        return NULL;
    if (self->done || !self->op) {
        PyErr_SetString(PyExc_ValueError, "feed() on an Op that is already decided");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t used = 0;
    int state = hirate__op_feed(self->op, view.buf, (size_t)view.len, &used);
    PyBuffer_Release(&view);
    if (state == HIRATE_OP_DONE)
        op_finish(self);
    return Py_BuildValue("(in)", state, (Py_ssize_t)used);
}

static PyObject *op_fail(PyObject *op, PyObject *arg)
{
    OpObject *self = (OpObject *)op;
    if (!self->owner) {
        PyErr_SetString(PyExc_TypeError, "this Op was not made by Limiter._op_start()");
        return NULL;
    }
    if (self->owner->closed && !self->done) {
        /* The limiter is gone: what still waited for Redis is ClosedError. */
        for (Py_ssize_t i = 0; i < self->b.n; i++)
            if (self->b.items[i].rc > 0)
                self->b.items[i].rc = HIRATE_ECLOSED;
        self->done = 1;
        for (self->bad = 0; self->bad < self->b.n && self->b.items[self->bad].rc == 0;)
            self->bad++;
        if (self->bad == self->b.n)
            self->bad = -1;
        Py_RETURN_NONE;
    }
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (code >= 0 || -code >= NCODES) {
        PyErr_Format(PyExc_ValueError, "fail() needs a hirate error code such as ETIMEDOUT, "
                                       "got %ld", code);
        return NULL;
    }
    /* After the outcome is known there is nothing left to fail. */
    if (!self->done && self->op) {
        hirate__op_fail(self->op, (int)code);
        op_finish(self);
    }
    Py_RETURN_NONE;
}

static PyObject *op_results(PyObject *op, PyObject *unused)
{
    (void)unused;
    OpObject *self = (OpObject *)op;
    if (!self->owner) {
        PyErr_SetString(PyExc_TypeError, "this Op was not made by Limiter._op_start()");
        return NULL;
    }
    hstate *st = self->owner->st;
    if (!self->done) {
        PyErr_SetString(PyExc_ValueError,
                        "results() before the Op is decided: feed() its replies or fail() it");
        return NULL;
    }
    if (self->bad >= 0)
        return raise_code(st, self->b.items[self->bad].rc, self->msg);
    return batch_decisions(st, &self->b);
}

static void op_dealloc(PyObject *op)
{
    OpObject *self = (OpObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->op) {
        /* An Op dropped before its outcome is known (a cancelled task) must
         * still settle: a probe that never reports would keep the breaker
         * waiting for it. Given up, it teaches the breaker nothing. */
        if (!self->done && self->owner && !self->owner->closed)
            hirate__op_fail(self->op, HIRATE_ECLOSED);
        hirate__op_free(self->op);
    }
    batch_clear(&self->b);
    Py_XDECREF(self->owner);
    PyObject_Free(op);
    Py_DECREF(tp);
}

static PyObject *op_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances: use Limiter._op_start()",
                 tp->tp_name);
    return NULL;
}

static PyGetSetDef op_getset[] = {
    {"request", op_request, NULL,
     "The bytes to send now, or None when nothing (more) needs Redis.", NULL},
    {"drop", op_drop, NULL, "True when the connection must be closed, not reused.", NULL},
    {"done", op_done, NULL, "True once every item is decided.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef op_methods[] = {
    {"feed", op_feed, METH_O,
     "feed(data) -> (state, used): reads replies from data; state is OP_MORE (read more), "
     "OP_SEND (send .request) or OP_DONE; used is how many bytes the replies took."},
    {"fail", op_fail, METH_O,
     "fail(code): the I/O failed with code (ETIMEDOUT, ECONNECT, EIO, EAUTH); the policy "
     "decides whatever is still waiting."},
    {"results", op_results, METH_NOARGS,
     "results() -> list[Decision]; raises the first failed item's error."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot op_slots[] = {
    {Py_tp_doc, (void *)"One batch decided with the caller doing the network I/O."},
    {Py_tp_new, (void *)op_tp_new},
    {Py_tp_dealloc, (void *)op_dealloc},
    {Py_tp_getset, op_getset},
    {Py_tp_methods, op_methods},
    {0, NULL},
};

static PyType_Spec op_spec = {
    .name = "hirate._hirate.Op",
    .basicsize = sizeof(OpObject),
    .flags = Py_TPFLAGS_DEFAULT | HR_IMMUTABLE,
    .slots = op_slots,
};

/* ---- endpoint, handshake, stats ------------------------------------------ */

static int need_redis(LimiterObject *self)
{
    if (self->closed) {
        raise_closed(self->st);
        return -1;
    }
    if (!self->redis) {
        raise_code(self->st, HIRATE_EINVAL, "the limiter has no Redis URL");
        return -1;
    }
    return 0;
}

static PyObject *limiter_endpoint(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    hirate_endpoint ep;
    if (need_redis(self) < 0)
        return NULL;
    int rc = hirate__endpoint(self->lim, &ep);
    if (rc < 0)
        return raise_code(self->st, rc, NULL);
    return Py_BuildValue("(NiNdd)",
                         ep.is_unix ? Py_NewRef(Py_None) : PyUnicode_FromString(ep.host),
                         ep.port,
                         ep.is_unix ? PyUnicode_DecodeFSDefault(ep.path) : Py_NewRef(Py_None),
                         ep.connect_timeout_ms / 1000.0, ep.timeout_ms / 1000.0);
}

static PyObject *limiter_handshake(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    int replies;
    if (need_redis(self) < 0)
        return NULL;
    size_t len = hirate__handshake(self->lim, NULL, 0, &replies);
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!bytes)
        return NULL;
    if (len)
        hirate__handshake(self->lim, PyBytes_AS_STRING(bytes), len, &replies);
    return Py_BuildValue("(Ni)", bytes, replies);
}

static PyObject *limiter_stats(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    hirate_stats s;
    if (self->closed)
        return raise_closed(self->st);
    hirate__stats(self->lim, &s);
    return Py_BuildValue("{sKsKsKsKsKsKsKsnsnsn}", "connects", (unsigned long long)s.connects,
                         "evalsha", (unsigned long long)s.evalsha, "eval",
                         (unsigned long long)s.eval, "conns_dropped",
                         (unsigned long long)s.conns_dropped, "cache_hits",
                         (unsigned long long)s.cache_hits, "policy", (unsigned long long)s.policy,
                         "breaker_opens", (unsigned long long)s.breaker_opens, "memory_keys",
                         (Py_ssize_t)s.memory_keys, "local_keys", (Py_ssize_t)s.local_keys,
                         "cache_keys", (Py_ssize_t)s.cache_keys);
}

/* ---- close ----------------------------------------------------------------- */

static PyObject *limiter_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    self->closed = 1;
    /* Calls running without the GIL finish within their timeouts; wait for
     * them, a millisecond at a time, without holding the GIL they need. */
    while (self->inuse > 0 && self->fork_gen == g_fork_gen) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
    hirate_limiter *lim = self->lim;
    self->lim = NULL;   /* before the GIL goes: a second close() finds nothing */
    if (lim) {
        Py_BEGIN_ALLOW_THREADS
        hirate_limiter_free(lim);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *limiter_enter(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    if (self->closed)
        return raise_closed(self->st);
    Py_INCREF(op);
    return op;
}

static PyObject *limiter_exit(PyObject *op, PyObject *args)
{
    (void)args;
    PyObject *r = limiter_close(op, NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* ---- construction ------------------------------------------------------------ */

/* The URL with the password (between the user's ':' and the last '@' before
 * the host or path) replaced by ***. */
static PyObject *redact_url(const char *url)
{
    const char *start = strstr(url, "://");
    if (!start)
        return PyUnicode_FromString(url);
    start += 3;
    const char *end = start, *at = NULL;
    for (; *end && *end != '/' && *end != '?'; end++)
        if (*end == '@')
            at = end;
    const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
    if (!colon)
        return PyUnicode_FromString(url);
    size_t head = (size_t)(colon + 1 - url), tail = strlen(at);
    char *buf = PyMem_Malloc(head + 3 + tail + 1);
    if (!buf)
        return PyErr_NoMemory();
    memcpy(buf, url, head);
    memcpy(buf + head, "***", 3);
    memcpy(buf + head + 3, at, tail + 1);
    PyObject *r = PyUnicode_FromString(buf);
    PyMem_Free(buf);
    return r;
}

/* A str option as a C string without NUL bytes. */
static const char *c_string(hstate *st, PyObject *o, const char *what, int code)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.200s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s && strlen(s) != (size_t)n) {
        raise_codef(st, code, "%s must not contain a NUL character", what);
        return NULL;
    }
    return s;
}

/* An int option that must fit in an int; the core checks its range. */
static int int_option(hstate *st, PyObject *o, const char *what, int *out)
{
    long long v;
    int r = int_value(o, what, &v);
    if (r < 0)
        return -1;
    if (r || v < INT32_MIN || v > INT32_MAX) {
        raise_codef(st, HIRATE_EOPTION, "%s is out of range, got %S", what, o);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A timeout in seconds (int or float) as whole milliseconds, 1 ms to 60 s. */
static int timeout_option(hstate *st, PyObject *o, const char *what, int *out_ms)
{
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s must be a number of seconds, not %.200s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    double s = PyFloat_AsDouble(o);
    if (s == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        s = NAN;
    }
    double ms = s * 1000.0;
    if (!(ms >= 0.5 && ms <= 60000.0)) {
        raise_codef(st, HIRATE_EOPTION, "%s must be from 0.001 to 60 seconds, got %R", what, o);
        return -1;
    }
    *out_ms = (int)lround(ms);
    return 0;
}

static int capacity_option(hstate *st, PyObject *o, int64_t *out)
{
    /* A float that is a whole number is accepted (capacity = rate * 60);
     * NaN, infinities and fractions are values the core would refuse. */
    if (PyFloat_Check(o)) {
        double v = PyFloat_AS_DOUBLE(o);
        if (v == floor(v) && fabs(v) <= (double)HIRATE_EXACT_MAX + 1) {
            *out = (int64_t)v;
            return 0;
        }
        raise_codef(st, HIRATE_ECAPACITY,
                    "capacity must be a whole number from 1 to 2^53-1, got %R", o);
        return -1;
    }
    long long v;
    int r = int_value(o, "capacity", &v);
    if (r < 0)
        return -1;
    if (r) {
        raise_codef(st, HIRATE_ECAPACITY,
                    "capacity must be a whole number from 1 to 2^53-1, got %S", o);
        return -1;
    }
    *out = v;
    return 0;
}

static int rate_option(PyObject *o, double *out)
{
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError, "rate must be a number, not %.200s", Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        *out = INFINITY;   /* too large for a double: the core names it */
    }
    return 0;
}

static PyObject *limiter_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"url", "capacity", "rate", "prefix", "on_error", "instances",
                             "connect_timeout", "timeout", "deny_cache", "max_keys",
                             "pool_size", NULL};
    PyObject *url = Py_None, *capacity = NULL, *rate = NULL, *prefix = NULL, *on_error = NULL;
    PyObject *instances = NULL, *connect_timeout = NULL, *timeout = NULL, *deny_cache = NULL;
    PyObject *max_keys = NULL, *pool_size = NULL;
    hstate *st = state_of_type(tp);
    if (!st)
        return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOOOOOOOOO:Limiter", kwlist, &url, &capacity,
                                     &rate, &prefix, &on_error, &instances, &connect_timeout,
                                     &timeout, &deny_cache, &max_keys, &pool_size))
        return NULL;
    if (!capacity || !rate) {
        PyErr_Format(PyExc_TypeError, "Limiter() missing required keyword argument '%s'",
                     capacity ? "rate" : "capacity");
        return NULL;
    }

    hirate_options o;
    hirate_options_init(&o);
    if (url != Py_None && !(o.url = c_string(st, url, "url", HIRATE_EURL)))
        return NULL;
    if (capacity_option(st, capacity, &o.capacity) < 0 || rate_option(rate, &o.rate) < 0)
        return NULL;
    if (prefix && !(o.prefix = c_string(st, prefix, "prefix", HIRATE_EOPTION)))
        return NULL;
    if (on_error) {
        const char *name = c_string(st, on_error, "on_error", HIRATE_EOPTION);
        if (!name)
            return NULL;
        if ((o.on_error = hirate_on_error_from_name(name)) < 0) {
            raise_codef(st, HIRATE_EOPTION,
                        "on_error must be 'local', 'open' or 'closed', got %R", on_error);
            return NULL;
        }
    }
    if ((instances && int_option(st, instances, "instances", &o.instances) < 0) ||
        (pool_size && int_option(st, pool_size, "pool_size", &o.pool_size) < 0) ||
        (connect_timeout &&
         timeout_option(st, connect_timeout, "connect_timeout", &o.connect_timeout_ms) < 0) ||
        (timeout && timeout_option(st, timeout, "timeout", &o.timeout_ms) < 0))
        return NULL;
    if (deny_cache) {
        int v = PyObject_IsTrue(deny_cache);
        if (v < 0)
            return NULL;
        o.deny_cache = v;
    }
    if (max_keys) {
        long long v;
        int r = int_value(max_keys, "max_keys", &v);
        if (r < 0)
            return NULL;
        if (r || v < 1 || (unsigned long long)v > SIZE_MAX) {
            raise_codef(st, HIRATE_EOPTION, "max_keys must be from 1 to 4000000000, got %S",
                        max_keys);
            return NULL;
        }
        o.max_keys = (size_t)v;
    }

    LimiterObject *self = (LimiterObject *)tp->tp_alloc(tp, 0);
    if (!self)
        return NULL;
    self->st = st;
    self->fork_gen = g_fork_gen;
    self->redis = o.url != NULL;
    self->capacity = o.capacity;
    self->rate = o.rate;
    self->on_error = o.on_error;
    self->prefix = PyUnicode_FromString(o.prefix);
    self->url = o.url ? redact_url(o.url) : Py_NewRef(Py_None);
    if (!self->prefix || !self->url) {
        Py_DECREF(self);
        return NULL;
    }
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&self->lim, &o, why, sizeof why);
    if (rc < 0) {
        self->closed = 1;
        Py_DECREF(self);
        return raise_code(st, rc, why);
    }
    return (PyObject *)self;
}

static void limiter_dealloc(PyObject *op)
{
    LimiterObject *self = (LimiterObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->weakrefs)
        PyObject_ClearWeakRefs(op);
    /* Nobody else holds a reference, so no call can be running. */
    hirate_limiter_free(self->lim);
    self->lim = NULL;
    Py_CLEAR(self->url);
    Py_CLEAR(self->prefix);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyObject *limiter_from_env(PyObject *cls, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) > 0) {
        PyErr_SetString(PyExc_TypeError, "from_env() takes keyword arguments only");
        return NULL;
    }
    PyObject *os = PyImport_ImportModule("os");
    if (!os)
        return NULL;
    PyObject *environ = PyObject_GetAttrString(os, "environ");
    Py_DECREF(os);
    if (!environ)
        return NULL;
    PyObject *url = PyObject_CallMethod(environ, "get", "s", "REDIS_URL");
    Py_DECREF(environ);
    if (!url)
        return NULL;
    if (PyUnicode_Check(url) && PyUnicode_GET_LENGTH(url) == 0) {
        Py_DECREF(url);
        url = Py_NewRef(Py_None);   /* REDIS_URL= (empty) means in-memory too */
    }
    PyObject *a = PyTuple_Pack(1, url);
    Py_DECREF(url);
    if (!a)
        return NULL;
    PyObject *r = PyObject_Call(cls, a, kw);
    Py_DECREF(a);
    return r;
}

static PyObject *limiter_repr(PyObject *op)
{
    LimiterObject *self = (LimiterObject *)op;
    PyObject *rate = float_text(self->rate);
    if (!rate)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<%s url=%R capacity=%lld rate=%U on_error='%s'%s>",
                                       Py_TYPE(op)->tp_name, self->url,
                                       (long long)self->capacity, rate,
                                       hirate_on_error_name(self->on_error),
                                       self->closed ? " closed" : "");
    Py_DECREF(rate);
    return r;
}

static PyObject *limiter_capacity(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromLongLong(((LimiterObject *)op)->capacity);
}

static PyObject *limiter_rate(PyObject *op, void *c)
{
    (void)c;
    return PyFloat_FromDouble(((LimiterObject *)op)->rate);
}

static PyObject *limiter_prefix(PyObject *op, void *c)
{
    (void)c;
    return Py_NewRef(((LimiterObject *)op)->prefix);
}

static PyObject *limiter_url(PyObject *op, void *c)
{
    (void)c;
    return Py_NewRef(((LimiterObject *)op)->url);
}

static PyObject *limiter_on_error(PyObject *op, void *c)
{
    (void)c;
    return PyUnicode_FromString(hirate_on_error_name(((LimiterObject *)op)->on_error));
}

static PyObject *limiter_closed(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((LimiterObject *)op)->closed);
}

static PyGetSetDef limiter_getset[] = {
    {"capacity", limiter_capacity, NULL, "Bucket size in whole tokens.", NULL},
    {"rate", limiter_rate, NULL, "Tokens added per second.", NULL},
    {"prefix", limiter_prefix, NULL, "Prepended to every key in Redis.", NULL},
    {"url", limiter_url, NULL, "The Redis URL with its password as ***, or None.", NULL},
    {"on_error", limiter_on_error, NULL, "'local', 'open' or 'closed'.", NULL},
    {"closed", limiter_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef limiter_members[] = {
    {"__weaklistoffset__", HR_T_PYSSIZET, offsetof(LimiterObject, weakrefs), HR_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef limiter_methods[] = {
    {"allow", (PyCFunction)(void (*)(void))limiter_allow, METH_FASTCALL | METH_KEYWORDS,
     "allow(key, cost=1) -> Decision: spends cost tokens from key's bucket if it holds them."},
    {"peek", (PyCFunction)(void (*)(void))limiter_peek, METH_FASTCALL | METH_KEYWORDS,
     "peek(key, cost=1) -> Decision: what allow() would decide now, spending nothing."},
    {"reset", limiter_reset, METH_O, "reset(key): forgets key's bucket; it is full again."},
    {"allow_many", limiter_allow_many, METH_O,
     "allow_many(pairs) -> list[Decision]: allow() for each (key, cost), in one round trip."},
    {"close", limiter_close, METH_NOARGS,
     "close(): closes the connections and frees the limiter; later calls raise ClosedError."},
    {"__enter__", limiter_enter, METH_NOARGS, NULL},
    {"__exit__", limiter_exit, METH_VARARGS, NULL},
    {"from_env", (PyCFunction)(void (*)(void))limiter_from_env,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "from_env(**options) -> Limiter: the URL from REDIS_URL (unset or empty: in memory)."},
    {"_op_start", (PyCFunction)(void (*)(void))limiter_op_start, METH_VARARGS | METH_KEYWORDS,
     "_op_start(pairs, spend, now_us=-1) -> Op: decides a batch, the caller doing the I/O."},
    {"_decide_at", limiter_decide_at, METH_VARARGS,
     "_decide_at(key, cost, spend, now_us) -> Decision at an injected time (tests)."},
    {"_endpoint", limiter_endpoint, METH_NOARGS,
     "_endpoint() -> (host, port, unix_path, connect_timeout, timeout)."},
    {"_handshake", limiter_handshake, METH_NOARGS,
     "_handshake() -> (bytes, replies): AUTH/SELECT for a new connection."},
    {"_stats", limiter_stats, METH_NOARGS, "_stats() -> dict of counters."},
    {"_reset_local", limiter_reset_local, METH_O,
     "_reset_local(key): reset() without the DEL (the deny cache and local buckets)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot limiter_slots[] = {
    {Py_tp_doc, (void *)"Limiter(url=None, *, capacity, rate, prefix='rl:', on_error='local', "
                        "instances=1, connect_timeout=0.25, timeout=0.1, deny_cache=True, "
                        "max_keys=1000000, pool_size=16)\n\n"
                        "A token-bucket rate limiter: in Redis when url is given, else in "
                        "memory."},
    {Py_tp_new, (void *)limiter_tp_new},
    {Py_tp_dealloc, (void *)limiter_dealloc},
    {Py_tp_repr, (void *)limiter_repr},
    {Py_tp_getset, limiter_getset},
    {Py_tp_members, limiter_members},
    {Py_tp_methods, limiter_methods},
    {0, NULL},
};

static PyType_Spec limiter_spec = {
    .name = "hirate.Limiter",
    .basicsize = sizeof(LimiterObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = limiter_slots,
};

/* ----------------------------------------------------------------- module */

static PyObject *mod_script_source(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    size_t len;
    const char *s = hirate_script_source(&len);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "strict");
}

static PyObject *mod_script_sha1(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(hirate_script_sha1());
}

/* _error(code, message) -> the exception hirate raises for code, with .code
 * and .name set (for AsyncLimiter, which meets some errors itself). */
static PyObject *mod_error(PyObject *m, PyObject *args)
{
    int code;
    PyObject *msg;
    if (!PyArg_ParseTuple(args, "iU:_error", &code, &msg))
        return NULL;
    Py_INCREF(msg);
    return make_exc(state_of_module(m), code, msg);
}

static PyMethodDef module_methods[] = {
    {"script_source", mod_script_source, METH_NOARGS,
     "script_source() -> str: the Lua script hirate runs in Redis."},
    {"script_sha1", mod_script_sha1, METH_NOARGS,
     "script_sha1() -> str: its SHA1, as EVALSHA names it."},
    {"_error", mod_error, METH_VARARGS,
     "_error(code, message) -> the exception hirate raises for code."},
    {NULL, NULL, 0, NULL},
};

/* Exceptions: name, doc, first base (index into the list, -1: Error's own
 * base Exception), second (builtin) base. */
static int add_exceptions(PyObject *m, hstate *st)
{
    PyObject *attrs = Py_BuildValue("{sOsO}", "code", Py_None, "name", Py_None);
    if (!attrs)
        return -1;
    st->error = PyErr_NewExceptionWithDoc(
        "hirate.Error", "Every hirate error. .code is the core's negative code, .name its name.",
        PyExc_Exception, attrs);
    Py_DECREF(attrs);
    if (!st->error)
        return -1;
    struct {
        const char *name, *doc;
        PyObject **slot, **base, *builtin;
    } table[] = {
        {"hirate.ConfigError", "A bad argument value or option (EINVAL ECAPACITY ERATE ECOST "
                               "EKEY ERANGE EURL EOPTION).",
         &st->config_error, &st->error, PyExc_ValueError},
        {"hirate.BackendError", "Redis refused or failed a call the policy does not cover "
                                "(ECONNECT EIO EPROTO ESERVER EREPLY).",
         &st->backend_error, &st->error, PyExc_ConnectionError},
        {"hirate.TimeoutError", "Redis did not answer in time (ETIMEDOUT).", &st->timeout_error,
         &st->backend_error, PyExc_TimeoutError},
        {"hirate.AuthError", "Redis refused the password or the user lacks a permission "
                             "(EAUTH ENOPERM).",
         &st->auth_error, &st->backend_error, PyExc_PermissionError},
        {"hirate.ClosedError", "The limiter is closed (ECLOSED).", &st->closed_error, &st->error,
         PyExc_ValueError},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        PyObject *bases = PyTuple_Pack(2, *table[i].base, table[i].builtin);
        if (!bases)
            return -1;
        *table[i].slot = PyErr_NewExceptionWithDoc(table[i].name, table[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (!*table[i].slot)
            return -1;
    }
    /* Which class each code raises (ENOMEM raises MemoryError). */
    static const struct { int code; int cls; } codes[] = {
        {HIRATE_EINVAL, 0}, {HIRATE_ECAPACITY, 0}, {HIRATE_ERATE, 0}, {HIRATE_ECOST, 0},
        {HIRATE_EKEY, 0}, {HIRATE_ERANGE, 0}, {HIRATE_EURL, 0}, {HIRATE_EOPTION, 0},
        {HIRATE_ECONNECT, 1}, {HIRATE_EIO, 1}, {HIRATE_EPROTO, 1}, {HIRATE_ESERVER, 1},
        {HIRATE_EREPLY, 1}, {HIRATE_ETIMEDOUT, 2}, {HIRATE_EAUTH, 3}, {HIRATE_ENOPERM, 3},
        {HIRATE_ECLOSED, 4},
    };
    PyObject *classes[] = {st->config_error, st->backend_error, st->timeout_error,
                           st->auth_error, st->closed_error};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        st->exc[-codes[i].code] = classes[codes[i].cls];
    const char *names[] = {"Error", "ConfigError", "BackendError", "TimeoutError", "AuthError",
                           "ClosedError"};
    PyObject *objs[] = {st->error, st->config_error, st->backend_error, st->timeout_error,
                        st->auth_error, st->closed_error};
    for (size_t i = 0; i < 6; i++)
        if (PyModule_AddObject(m, names[i], Py_NewRef(objs[i])) < 0) {
            Py_DECREF(objs[i]);
            return -1;
        }
    return 0;
}

static int add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot, const char *name)
{
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    if (!*slot)
        return -1;
    if (PyModule_AddObject(m, name, Py_NewRef((PyObject *)*slot)) < 0) {
        Py_DECREF(*slot);
        return -1;
    }
    return 0;
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

static int module_exec(PyObject *m)
{
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    hstate *st = state_of_module(m);

    if (add_type(m, &decision_spec, &st->decision_type, "Decision") < 0 ||
        add_type(m, &limiter_spec, &st->limiter_type, "Limiter") < 0 ||
        add_type(m, &op_spec, &st->op_type, "Op") < 0 || add_exceptions(m, st) < 0)
        return -1;

    for (int i = 1; i < NCODES; i++) {
        const char *n = short_name(-i);
        if (!(st->errname[i] = PyUnicode_InternFromString(n)) ||
            PyModule_AddIntConstant(m, n, -i) < 0)
            return -1;
    }
    for (int i = 1; i < NSOURCES; i++)
        if (!(st->source[i] = PyUnicode_InternFromString(hirate_source_name(i))))
            return -1;
    if (!(st->str_key = PyUnicode_InternFromString("key")) ||
        !(st->str_cost = PyUnicode_InternFromString("cost")))
        return -1;

    if (PyModule_AddIntConstant(m, "OP_MORE", HIRATE_OP_MORE) < 0 ||
        PyModule_AddIntConstant(m, "OP_SEND", HIRATE_OP_SEND) < 0 ||
        PyModule_AddIntConstant(m, "OP_DONE", HIRATE_OP_DONE) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", HIRATE_KEY_MAX) < 0 ||
        PyModule_AddIntConstant(m, "PREFIX_MAX", HIRATE_PREFIX_MAX) < 0 ||
        PyModule_AddObject(m, "EXACT_MAX", PyLong_FromLongLong(HIRATE_EXACT_MAX)) < 0 ||
        PyModule_AddStringConstant(m, "__version__", hirate_version()) < 0)
        return -1;
    pthread_once(&atfork_once, install_atfork);
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    hstate *st = state_of_module(m);
    Py_VISIT(st->limiter_type);
    Py_VISIT(st->decision_type);
    Py_VISIT(st->op_type);
    Py_VISIT(st->error);
    Py_VISIT(st->config_error);
    Py_VISIT(st->backend_error);
    Py_VISIT(st->timeout_error);
    Py_VISIT(st->auth_error);
    Py_VISIT(st->closed_error);
    return 0;
}

static int module_clear(PyObject *m)
{
    hstate *st = state_of_module(m);
    Py_CLEAR(st->limiter_type);
    Py_CLEAR(st->decision_type);
    Py_CLEAR(st->op_type);
    Py_CLEAR(st->error);
    Py_CLEAR(st->config_error);
    Py_CLEAR(st->backend_error);
    Py_CLEAR(st->timeout_error);
    Py_CLEAR(st->auth_error);
    Py_CLEAR(st->closed_error);
    for (int i = 0; i < NCODES; i++) {
        st->exc[i] = NULL;   /* borrowed */
        Py_CLEAR(st->errname[i]);
    }
    for (int i = 0; i < NSOURCES; i++)
        Py_CLEAR(st->source[i]);
    Py_CLEAR(st->str_key);
    Py_CLEAR(st->str_cost);
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

static struct PyModuleDef hirate_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hirate._hirate",
    .m_doc = "The hirate core: Limiter, Decision and the exceptions (import them from hirate).",
    .m_size = sizeof(hstate),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__hirate(void);   /* the one exported symbol */

PyMODINIT_FUNC PyInit__hirate(void)
{
    return PyModuleDef_Init(&hirate_module);
}
