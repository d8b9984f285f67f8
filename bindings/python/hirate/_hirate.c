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
 * The low-level hooks (Limiter._endpoint, _handshake_start and the
 * Handshake type, _op_start, _op_start_reset and the Op type) wrap the
 * public no-I/O API of hirate_io.h, so that hirate.AsyncLimiter does its own
 * socket I/O on the event loop while the core keeps every rule: the bytes,
 * what the replies mean, the reconnect backoff, the breaker, the deny cache
 * and the policy. For a Redis Cluster or a Sentinel service the same hooks
 * take a node (_endpoint(node), _handshake_start(node)), and an Op's rounds
 * of legs are there (legs, leg_node, leg_request, leg_feed, leg_fail,
 * leg_drop, next): which node, what a redirection means, where the master is
 * and when to ask the sentinels again stay the core's. Only hirate.h and
 * hirate_io.h are included here.
 *
 * The core's log events (hirate_options.log) go to the standard logger
 * "hirate"; see log_to_python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "client.h"
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

/* "ETIMEDOUT" for HIRATE_ETIMEDOUT: the core's name. */
static const char *short_name(int code)
{
    return hirate_err_name(code);
}

/* The exception hirate raises for code, with message msg (a str, whose
 * reference is taken), its .code and .name set. */
static PyObject *make_exc(hstate *st, int code, PyObject *msg)
{
    if (!msg)
        return NULL;
    int i = -code;
    PyObject *cls = code == HIRATE_ENOMEM ? PyExc_MemoryError
                    : i > 0 && i < NCODES && st->exc[i] ? st->exc[i] : st->cls[C_ERROR];
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

/* The exception for code with the core's message msg (NULL or empty: the
 * code's own words); bytes from Redis may not be UTF-8. */
static PyObject *error_obj(hstate *st, int code, const char *msg)
{
    if (!msg || !msg[0])
        msg = hirate_strerror(code);
    return make_exc(st, code, PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"));
}

/* Raises code with the core's message. */
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

static DecisionObject *decision_alloc(hstate *st, size_t extra)
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

static PyObject *decision_new_from(hstate *st, const hirate_decision *d)
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
static PyObject *decision_new_bands(hstate *st, const hirate_decision *d,
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

static void decision_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_XDECREF(((DecisionObject *)self)->bandtuple);
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

/* The name of code e ("ETIMEDOUT"): the module's interned one. */
static PyObject *code_name(hstate *st, int e)
{
    if (-e > 0 && -e < NCODES && st->errname[-e])
        return Py_NewRef(st->errname[-e]);
    return PyUnicode_FromString(short_name(e));
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
    return code_name(st, e);
}

static PyObject *decision_band(PyObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(D(self).band);
}

/* (self,) for one band; each band's own Decision for several; () for a
 * Decision made in Python of several bands without theirs. */
static PyObject *decision_bands(PyObject *self, void *c)
{
    (void)c;
    DecisionObject *o = (DecisionObject *)self;
    if (o->nbands == 0)
        return PyTuple_Pack(1, self);
    if (o->nbands == NO_BANDS)
        return PyTuple_New(0);
    if (!o->bandtuple) {
        hstate *st = decision_state(self);
        if (!st)
            return NULL;
        PyObject *t = PyTuple_New(o->nbands);
        for (int i = 0; t && i < o->nbands; i++) {
            PyObject *b = decision_new_from(st, &o->bands[i]);
            if (!b)
                Py_CLEAR(t);
            else
                PyTuple_SET_ITEM(t, i, b);
        }
        if (!t)
            return NULL;
        o->bandtuple = t;
    }
    return Py_NewRef(o->bandtuple);
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

/* "allowed remaining=4 limit=5 retry_after=0.0 reset_after=0.2": a band's
 * own figures in the repr of a decision of several. */
static PyObject *band_text(const hirate_decision *b)
{
    PyObject *retry = float_text(us_to_s(b->retry_after_us));
    PyObject *reset = float_text(us_to_s(b->reset_after_us));
    PyObject *r = NULL;
    if (retry && reset)
        r = PyUnicode_FromFormat("%s remaining=%lld limit=%lld retry_after=%U reset_after=%U",
                                 b->allowed ? "allowed" : "refused", (long long)b->remaining,
                                 (long long)b->limit, retry, reset);
    Py_XDECREF(retry);
    Py_XDECREF(reset);
    return r;
}

/* The repr's tail for several bands: " band=1 bands=(...; ...)", or
 * " band=1 bands=()" when the call gave no band figures; "" for one band. */
static PyObject *bands_text(DecisionObject *o)
{
    if (o->nbands == 0)
        return PyUnicode_FromString("");
    if (o->nbands == NO_BANDS)
        return PyUnicode_FromFormat(" band=%d bands=()", o->d.band);
    PyObject *parts = PyList_New(o->nbands);
    for (int i = 0; parts && i < o->nbands; i++) {
        PyObject *t = band_text(&o->bands[i]);
        if (!t)
            Py_CLEAR(parts);
        else
            PyList_SET_ITEM(parts, i, t);
    }
    PyObject *sep = parts ? PyUnicode_FromString("; ") : NULL;
    PyObject *joined = sep ? PyUnicode_Join(sep, parts) : NULL;
    PyObject *r = joined ? PyUnicode_FromFormat(" band=%d bands=(%U)", o->d.band, joined) : NULL;
    Py_XDECREF(joined);
    Py_XDECREF(sep);
    Py_XDECREF(parts);
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
    PyObject *bands = bands_text((DecisionObject *)self);
    PyObject *r = NULL;
    if (retry && reset && source && bands) {
        if (d->error)
            r = PyUnicode_FromFormat("<Decision %s remaining=%lld limit=%lld retry_after=%U "
                                     "reset_after=%U source=%R error='%s'%U>",
                                     d->allowed ? "allowed" : "refused",
                                     (long long)d->remaining, (long long)d->limit, retry, reset,
                                     source, short_name(d->error), bands);
        else
            r = PyUnicode_FromFormat("<Decision %s remaining=%lld limit=%lld retry_after=%U "
                                     "reset_after=%U source=%R%U>",
                                     d->allowed ? "allowed" : "refused",
                                     (long long)d->remaining, (long long)d->limit, retry, reset,
                                     source, bands);
    }
    Py_XDECREF(retry);
    Py_XDECREF(reset);
    Py_XDECREF(source);
    Py_XDECREF(bands);
    return r;
}

static int decision_same(const hirate_decision *a, const hirate_decision *b)
{
    return !a->allowed == !b->allowed && a->source == b->source && a->error == b->error &&
           a->band == b->band && a->limit == b->limit && a->remaining == b->remaining &&
           a->retry_after_us == b->retry_after_us && a->reset_after_us == b->reset_after_us &&
           a->time_us == b->time_us;
}

/* Equal: the same figures, the same band, and the same figures of each band. */
static PyObject *decision_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b))
        Py_RETURN_NOTIMPLEMENTED;
    const DecisionObject *x = (DecisionObject *)a, *y = (DecisionObject *)b;
    int same = decision_same(&x->d, &y->d) && x->nbands == y->nbands;
    for (int i = 0; same && i < x->nbands; i++)
        same = decision_same(&x->bands[i], &y->bands[i]);
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static uint64_t hash_parts(uint64_t h, const hirate_decision *d)
{
    const int64_t parts[9] = {!!d->allowed, d->source, d->error, d->band, d->limit,
                              d->remaining, d->retry_after_us, d->reset_after_us, d->time_us};
    for (int i = 0; i < 9; i++)
        h = (h ^ (uint64_t)parts[i]) * 1099511628211ull;
    return h;
}

static Py_hash_t decision_hash(PyObject *self)
{
    const DecisionObject *o = (DecisionObject *)self;
    uint64_t h = hash_parts(1469598103934665603ull, &o->d);
    if (o->nbands)
        h = (h ^ (uint64_t)(int64_t)o->nbands) * 1099511628211ull;
    for (int i = 0; i < o->nbands; i++)
        h = hash_parts(h, &o->bands[i]);
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
 * error=None, time=0.0, band=0, bands=None): for tests and for code that
 * makes decisions of its own (e.g. to render headers). bands: a sequence of
 * Decisions, each band's; one (or None) is the decision itself, () says
 * that the figures are not known, as .bands gives them. */
static PyObject *decision_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"allowed", "remaining", "limit", "retry_after", "reset_after",
                             "source", "error", "time", "band", "bands", NULL};
    PyObject *retry, *reset, *source, *error = Py_None, *time = NULL, *bands = Py_None;
    int allowed, band = 0;
    long long remaining, limit;
    hstate *st = state_of_type(tp);
    if (!st || !PyArg_ParseTupleAndKeywords(args, kw, "pLLOOU|OOiO:Decision", kwlist, &allowed,
                                            &remaining, &limit, &retry, &reset, &source, &error,
                                            &time, &band, &bands))
        return NULL;
    hirate_decision d;
    memset(&d, 0, sizeof d);
    d.allowed = allowed;
    d.band = band;
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
    if (bands == Py_None) {
        if (band != 0)
            return raise_codef(st, HIRATE_EINVAL, "band must be 0 without bands, got %d", band);
        return decision_new_from(st, &d);
    }
    PyObject *seq = PySequence_Fast(bands, "bands must be None or a sequence of Decisions");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    hirate_decision bv[HIRATE_BANDS_MAX];
    PyObject *r = NULL;
    if (n > HIRATE_BANDS_MAX) {
        raise_codef(st, HIRATE_EINVAL, "bands holds %zd Decisions; the most is %d", n,
                    HIRATE_BANDS_MAX);
        goto done;
    }
    if (band < 0 || (n == 1 && band != 0) || (n > 1 && band >= n)) {
        raise_codef(st, HIRATE_EINVAL, "band must be from 0 to %zd, got %d",
                    n > 1 ? n - 1 : 0, band);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, i);
        if (Py_TYPE(b) != tp) {
            PyErr_Format(PyExc_TypeError, "bands[%zd] must be a Decision, not %.200s", i,
                         Py_TYPE(b)->tp_name);
            goto done;
        }
        bv[i] = D(b);
    }
    r = decision_new_bands(st, &d, bv, n == 0 ? NO_BANDS : (int)n);
done:
    Py_DECREF(seq);
    return r;
}

static PyGetSetDef decision_getset[] = {
    {"allowed", decision_allowed, NULL, "True when the cost passed (and was spent).", NULL},
    {"remaining", decision_remaining, NULL, "Whole tokens left after this decision.", NULL},
    {"limit", decision_limit, NULL, "The capacity (of the band `band`).", NULL},
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
    {"band", decision_band, NULL,
     "The band behind limit, from 0 (always 0 with one band): when refused, the refusing "
     "band that waits longest; when allowed, the band with the fewest tokens left.", NULL},
    {"bands", decision_bands, NULL,
     "Each band's own Decision, in the limiter's order: (self,) with one band; () when the "
     "call gave the whole's figures only (allow_many of a Limiter with a URL).", NULL},
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

/* Frees self->lim (set to NULL first, so that nothing finds it half gone),
 * its last metrics kept in self->last. With the GIL held; the freeing
 * itself, which may close connections, releases it when release is 1. */
static void limiter_free_core(LimiterObject *self, int release)
{
    hirate_limiter *lim = self->lim;
    if (!lim)
        return;
    self->lim = NULL;
    if (hirate_stats_get(lim, &self->last, sizeof self->last) < 0)
        memset(&self->last, 0, sizeof self->last);
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        hirate_limiter_free(lim);
        Py_END_ALLOW_THREADS
    } else {
        hirate_limiter_free(lim);
    }
}

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

/* One decision of the limiter, as a Decision. */
static PyObject *decide(LimiterObject *self, PyObject *key, PyObject *cost_obj, int spend,
                        int64_t now_us)
{
    hstate *st = self->st;
    int64_t cost = 1;
    keybuf k;
    hirate_decision d, bv[HIRATE_BANDS_MAX];
    size_t nb = (size_t)self->nbands;
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
        rc = decide_one(self->lim, &k, cost, spend, now_us, &d, bv, nb);
        if (rc < 0)
            hirate_limiter_errmsg(self->lim, msg, sizeof msg);
    } else {
        if (enter(self) < 0) {
            key_release(&k);
            return NULL;
        }
        hirate_limiter *lim = self->lim;
        Py_BEGIN_ALLOW_THREADS
        rc = decide_one(lim, &k, cost, spend, now_us, &d, bv, nb);
        if (rc < 0)
            hirate_limiter_errmsg(lim, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    key_release(&k);
    if (rc < 0)
        return raise_code(st, rc, msg);
    return nb > 1 ? decision_new_bands(st, &d, bv, (int)nb) : decision_new_from(st, &d);
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
    if (!PyArg_ParseTuple(args, "OOiL:_decide_at", &key, &cost, &spend, &now_us))
        return NULL;
    if (now_us < 0)
        return raise_code(self->st, HIRATE_EINVAL, "the injected time must not be negative");
    return decide(self, key, cost, spend, now_us);
}

/* refund(key, tokens=1) -> Decision: the core's hirate_refund. */
static PyObject *limiter_refund(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "tokens", NULL};
    PyObject *key, *tokens = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:refund", kwlist, &key, &tokens))
        return NULL;
    return decide((LimiterObject *)op, key, tokens, HIRATE_OP_REFUND, -1);
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

/* ---- batches: allow_many and the Op of _op_start ------------------------ */

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
    PyMem_Free(b->bandv);
    PyMem_Free(b->msgs);
    memset(b, 0, sizeof *b);
}

/* Raises the core's error for a key or cost that the core refuses, as
 * allow() would raise it (hirate_validate: its rule and its words); 0 when
 * the core finds nothing wrong. */
static int value_check(hstate *st, const void *key, size_t keylen, int64_t cost)
{
    char msg[HIRATE_ERRMSG_SIZE];
    int rc = hirate_validate(key, keylen, cost, msg, sizeof msg);
    if (rc == 0)
        return 0;
    raise_code(st, rc, msg);
    return -1;
}

/* Reads an iterable of (key, cost) pairs. A wrong type (TypeError) or a bad
 * value (ConfigError, the core's words) raises for the whole batch before
 * any item is decided: an argument error is the caller's bug, and raising
 * it after the other items were spent would lose their decisions. */
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
    for (Py_ssize_t i = 0; i < n; i++)
        if (value_check(st, b->items[i].key, b->items[i].keylen, b->items[i].cost) < 0) {
            batch_clear(b);
            return -1;
        }
    return 0;
fail:
    Py_DECREF(seq);
    batch_clear(b);
    return -1;
}

/* Room for nbands band figures per item of b (several bands only). */
static int batch_bands(batch *b, int nbands)
{
    if (nbands <= 1)
        return 0;
    size_t m = b->n > 0 ? (size_t)b->n : 1;
    b->bandv = PyMem_Calloc(m * (size_t)nbands, sizeof *b->bandv);
    if (!b->bandv) {
        PyErr_NoMemory();
        return -1;
    }
    b->nbands = nbands;
    return 0;
}

/* Room for each item's message (see batch.msgs). */
static int batch_msgs(batch *b)
{
    size_t m = b->n > 0 ? (size_t)b->n : 1;
    if (!(b->msgs = PyMem_Calloc(m, HIRATE_ERRMSG_SIZE))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Item i's message, or NULL (then the code's words serve). */
static const char *batch_msg(const batch *b, Py_ssize_t i)
{
    return b->msgs ? b->msgs + (size_t)i * HIRATE_ERRMSG_SIZE : NULL;
}

/* Decides every item of b in memory (no URL), as allow_many and the Op of a
 * limiter without Redis do: one by one, in order, with band figures when b
 * has room for them, and each failed item's message when it has room for
 * them. */
static void batch_decide_here(hirate_limiter *lim, batch *b, int spend, int64_t now_us)
{
    for (Py_ssize_t i = 0; i < b->n; i++) {
        hirate_item *it = &b->items[i];
        keybuf k = {.p = it->key, .n = (Py_ssize_t)it->keylen};
        it->rc = decide_one(lim, &k, it->cost, spend, now_us, &it->decision,
                            b->bandv ? b->bandv + (size_t)i * (size_t)b->nbands : NULL,
                            (size_t)b->nbands);
        if (it->rc < 0 && b->msgs)
            hirate_limiter_errmsg(lim, b->msgs + (size_t)i * HIRATE_ERRMSG_SIZE,
                                  HIRATE_ERRMSG_SIZE);
    }
}

/* An item's outcome as Python sees it: its Decision (with the nb band
 * figures at bv: see decision_new_bands), or in its place the exception of
 * its code, with msg (that item's words; NULL: the code's). */
static PyObject *item_result(hstate *st, const hirate_item *it, const char *msg,
                             const hirate_decision *bv, int nb)
{
    if (it->rc == 0)
        return decision_new_bands(st, &it->decision, bv, nb);
    return error_obj(st, it->rc, msg);
}

static PyObject *limiter_allow_many(PyObject *op, PyObject *pairs)
{
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    batch b;

    if (batch_from(st, "allow_many", pairs, &b) < 0)
        return NULL;
    if (batch_bands(&b, self->nbands) < 0 || batch_msgs(&b) < 0) {
        batch_clear(&b);
        return NULL;
    }
    /* Each failed item gets its own message (hirate_allow_many_msgs). */
    if (!self->redis) {
        if (self->closed) {
            batch_clear(&b);
            return raise_closed(st);
        }
        hirate_allow_many_msgs(self->lim, b.items, (size_t)b.n, b.bandv, b.msgs,
                               HIRATE_ERRMSG_SIZE);
    } else {
        if (enter(self) < 0) {
            batch_clear(&b);
            return NULL;
        }
        hirate_limiter *lim = self->lim;
        Py_BEGIN_ALLOW_THREADS
        hirate_allow_many_msgs(lim, b.items, (size_t)b.n, b.bandv, b.msgs, HIRATE_ERRMSG_SIZE);
        Py_END_ALLOW_THREADS
        leave(self);
    }
    int nb = b.nbands;
    PyObject *list = PyList_New(b.n);
    for (Py_ssize_t i = 0; list && i < b.n; i++) {
        const hirate_item *it = &b.items[i];
        PyObject *r = item_result(st, it, batch_msg(&b, i),
                                  b.bandv ? b.bandv + (size_t)i * (size_t)b.nbands : NULL, nb);
        if (!r)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, r);
    }
    batch_clear(&b);
    return list;
}

/* The core objects of Op and Handshake belong to the limiter: they keep it
 * from being freed, and the last of them frees a closed one. */
static void live_take(LimiterObject *self)
{
    self->live++;
}

static void live_drop(LimiterObject *self)
{
    if (self->live > 0 && --self->live == 0 && self->closed)
        limiter_free_core(self, 0);
}

/* The Op: one batch (or a reset) decided with the caller doing the I/O. */
typedef struct {
    PyObject_HEAD
    LimiterObject *owner;   /* strong: the limiter outlives its ops */
    hirate_op *op;          /* NULL when nothing needed Redis */
    batch b;
    int done;               /* every item has its rc and decision */
    int reset;              /* made by _op_start_reset */
    int check;              /* made by _op_start_check */
    PyObject *key;          /* a reset's key, and its bytes */
    keybuf kb;
} OpObject;

static OpObject *op_new(LimiterObject *self)
{
    OpObject *o = PyObject_New(OpObject, self->st->op_type);
    if (!o)
        return NULL;
    o->owner = self;
    Py_INCREF(self);
    o->op = NULL;
    memset(&o->b, 0, sizeof o->b);
    o->done = 0;
    o->reset = 0;
    o->check = 0;
    o->key = NULL;
    o->kb.has_view = 0;
    return o;
}

static PyObject *limiter_op_start(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pairs", "spend", "now_us", NULL};
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    PyObject *pairs;
    int spend;
    long long now_us = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|L:_op_start", kwlist, &pairs, &spend,
                                     &now_us))
        return NULL;
    if (self->closed)
        return raise_closed(st);
    OpObject *o = op_new(self);
    if (!o)
        return NULL;
    if (batch_from(st, "_op_start", pairs, &o->b) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    /* Several bands: room for each item's band figures, which the core
     * writes as each item is decided (the op writes them later). */
    if (batch_bands(&o->b, self->nbands) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    if (!self->redis) {
        /* Nothing to send: decided here, as allow_many or peek would. */
        if (batch_msgs(&o->b) < 0) {
            Py_DECREF(o);
            return NULL;
        }
        batch_decide_here(self->lim, &o->b, spend, now_us);
        o->done = 1;
        return (PyObject *)o;
    }
    /* No I/O happens here, so the GIL stays: the core only looks at its
     * deny cache, breaker and (while Redis is failing) local buckets. */
    int r = o->b.bandv ? hirate_op_start_bands(self->lim, o->b.items, (size_t)o->b.n, spend,
                                               now_us, o->b.bandv, &o->op)
                       : hirate_op_start(self->lim, o->b.items, (size_t)o->b.n, spend, now_us,
                                         &o->op);
    if (r < 0) {
        Py_DECREF(o);
        return raise_code(st, r, NULL);
    }
    if (o->op)
        live_take(self);
    o->done = r == 0;
    return (PyObject *)o;
}

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

/* _op_start_reset(key) -> Op: reset() with the caller doing the I/O (one
 * DEL, which the core encodes: the prefix is its business). */
static PyObject *limiter_op_start_reset(PyObject *op, PyObject *key)
{
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    if (need_redis(self) < 0)
        return NULL;
    OpObject *o = op_new(self);
    if (!o)
        return NULL;
    o->reset = 1;
    if (key_get(key, &o->kb) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    o->key = Py_NewRef(key);
    if (value_check(st, o->kb.p, (size_t)o->kb.n, 0) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    int r = hirate_op_start_reset(self->lim, o->kb.p, (size_t)o->kb.n, &o->op);
    if (r < 0) {
        Py_DECREF(o);
        return raise_code(st, r, NULL);
    }
    if (o->op)
        live_take(self);
    o->done = r == 0;
    return (PyObject *)o;
}

static int op_check_code(long code)
{
    if (code >= 0 || -code >= NCODES) {
        PyErr_Format(PyExc_ValueError, "fail() needs a hirate error code such as ETIMEDOUT, "
                                       "got %ld", code);
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
    const char *req = hirate_op_request(self->op, &len);
    return PyBytes_FromStringAndSize(req, (Py_ssize_t)len);
}

static PyObject *op_drop(PyObject *op, void *c)
{
    (void)c;
    OpObject *self = (OpObject *)op;
    return PyBool_FromLong(self->op ? hirate_op_drop(self->op) : 0);
}

static PyObject *op_done(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((OpObject *)op)->done);
}

static PyObject *op_feed(PyObject *op, PyObject *data)
{
    OpObject *self = (OpObject *)op;
    if (self->owner->closed)
        return raise_closed(self->owner->st);
    if (self->done || !self->op) {
        PyErr_SetString(PyExc_ValueError, "feed() on an Op that is already decided");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t used = 0;
    int state = hirate_op_feed(self->op, view.buf, (size_t)view.len, &used);
    PyBuffer_Release(&view);
    if (state == HIRATE_IO_DONE)
        self->done = 1;
    return Py_BuildValue("(in)", state, (Py_ssize_t)used);
}

static PyObject *op_fail(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"code", "why", NULL};
    OpObject *self = (OpObject *)op;
    long code;
    const char *why = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "l|z:fail", kwlist, &code, &why) ||
        op_check_code(code) < 0)
        return NULL;
    /* After the outcome is known there is nothing left to fail. */
    if (self->done || !self->op)
        Py_RETURN_NONE;
    /* Cut off by close(): what still waited for Redis is ClosedError, and
     * nothing is learnt about Redis. */
    if (self->owner->closed) {
        code = HIRATE_ECLOSED;
        why = NULL;
    }
    hirate_op_fail(self->op, (int)code, why);
    self->done = 1;
    Py_RETURN_NONE;
}

/* ---- the legs of a round (hirate_op_legs and the rest) ---------------------- */

/* A leg's number from o: an int from 0. The core answers a number past the
 * round's legs with its own defaults (no node, no request). */
static int leg_index(PyObject *o, size_t *out)
{
    Py_ssize_t i = PyLong_AsSsize_t(o);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0) {
        PyErr_Format(PyExc_IndexError, "no leg %zd: legs count from 0", i);
        return -1;
    }
    *out = (size_t)i;
    return 0;
}

static PyObject *op_legs(PyObject *op, void *c)
{
    (void)c;
    OpObject *self = (OpObject *)op;
    return PyLong_FromSize_t(self->op && !self->done ? hirate_op_legs(self->op) : 0);
}

static PyObject *op_leg_node(PyObject *op, PyObject *arg)
{
    OpObject *self = (OpObject *)op;
    size_t leg;
    if (leg_index(arg, &leg) < 0)
        return NULL;
    int node = self->op && !self->done ? hirate_op_leg_node(self->op, leg) : -1;
    if (node < 0) {
        PyErr_Format(PyExc_IndexError, "no leg %zu in this round", leg);
        return NULL;
    }
    return PyLong_FromLong(node);
}

static PyObject *op_leg_request(PyObject *op, PyObject *arg)
{
    OpObject *self = (OpObject *)op;
    size_t leg;
    if (leg_index(arg, &leg) < 0)
        return NULL;
    if (!self->op || self->done)
        Py_RETURN_NONE;
    size_t len;
    const char *req = hirate_op_leg_request(self->op, leg, &len);
    if (!req)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(req, (Py_ssize_t)len);
}

/* leg_feed(leg, data): METH_FASTCALL, since it runs for every reply. */
static PyObject *op_leg_feed(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    OpObject *self = (OpObject *)op;
    size_t leg;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "leg_feed() takes 2 arguments (leg, data), got %zd",
                     nargs);
        return NULL;
    }
    if (leg_index(args[0], &leg) < 0)
        return NULL;
    if (self->owner->closed)
        return raise_closed(self->owner->st);
    if (self->done || !self->op) {
        PyErr_SetString(PyExc_ValueError, "leg_feed() on an Op that is already decided");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t used = 0;
    int state = hirate_op_leg_feed(self->op, leg, view.buf, (size_t)view.len, &used);
    PyBuffer_Release(&view);
    return Py_BuildValue("(in)", state, (Py_ssize_t)used);
}

static PyObject *op_leg_fail(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"leg", "code", "why", NULL};
    OpObject *self = (OpObject *)op;
    PyObject *leg_obj;
    size_t leg;
    long code;
    const char *why = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ol|z:leg_fail", kwlist, &leg_obj, &code, &why) ||
        leg_index(leg_obj, &leg) < 0 || op_check_code(code) < 0)
        return NULL;
    if (self->done || !self->op)
        Py_RETURN_NONE;
    /* As fail(): cut off by close(), the leg's calls are ClosedError. */
    if (self->owner->closed) {
        code = HIRATE_ECLOSED;
        why = NULL;
    }
    hirate_op_leg_fail(self->op, leg, (int)code, why);
    Py_RETURN_NONE;
}

static PyObject *op_leg_drop(PyObject *op, PyObject *arg)
{
    OpObject *self = (OpObject *)op;
    size_t leg;
    if (leg_index(arg, &leg) < 0)
        return NULL;
    /* Readable once the op is done too: the last round's legs are kept. */
    return PyBool_FromLong(self->op ? hirate_op_leg_drop(self->op, leg) : 0);
}

static PyObject *op_next(PyObject *op, PyObject *unused)
{
    (void)unused;
    OpObject *self = (OpObject *)op;
    if (self->done || !self->op)
        return PyLong_FromLong(HIRATE_IO_DONE);
    if (self->owner->closed) {
        /* No new round after close(): what still waits is ClosedError. */
        hirate_op_fail(self->op, HIRATE_ECLOSED, NULL);
        self->done = 1;
        return PyLong_FromLong(HIRATE_IO_DONE);
    }
    int state = hirate_op_next(self->op);
    if (state == HIRATE_IO_DONE)
        self->done = 1;
    return PyLong_FromLong(state);
}

static int op_decided(OpObject *self, const char *what)
{
    if (!self->done) {
        PyErr_Format(PyExc_ValueError,
                     "%s() before the Op is decided: feed() its replies or fail() it", what);
        return -1;
    }
    return 0;
}

static PyObject *op_results(PyObject *op, PyObject *unused)
{
    (void)unused;
    OpObject *self = (OpObject *)op;
    hstate *st = self->owner->st;
    if (op_decided(self, "results") < 0)
        return NULL;
    /* Several bands: each item's band figures, written by the core into
     * the batch's room for them (hirate_op_start_bands). */
    const batch *b = &self->b;
    PyObject *list = PyList_New(b->n);
    for (Py_ssize_t i = 0; list && i < b->n; i++) {
        const hirate_item *it = &b->items[i];
        const char *msg = it->rc >= 0 ? NULL
                          : self->op ? hirate_op_errmsg(self->op, (size_t)i) : batch_msg(b, i);
        PyObject *r = item_result(st, it, msg,
                                  b->bandv ? b->bandv + (size_t)i * (size_t)b->nbands : NULL,
                                  b->nbands);
        if (!r)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, r);
    }
    return list;
}

static PyObject *op_result(PyObject *op, PyObject *unused)
{
    (void)unused;
    OpObject *self = (OpObject *)op;
    if (!self->reset) {
        PyErr_SetString(PyExc_TypeError, "result() is a reset's outcome: a batch has results()");
        return NULL;
    }
    if (op_decided(self, "result") < 0)
        return NULL;
    int rc = self->op ? hirate_op_result(self->op) : 0;
    if (rc < 0)
        return raise_code(self->owner->st, rc, hirate_op_errmsg(self->op, 0));
    Py_RETURN_NONE;
}

static void op_dealloc(PyObject *op)
{
    OpObject *self = (OpObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->op) {
        /* An Op dropped before its outcome is known (a cancelled task) must
         * still settle: a probe that never reports would keep the breaker
         * waiting for it. Given up, it teaches the breaker nothing. */
        if (!self->done)
            hirate_op_fail(self->op, HIRATE_ECLOSED, NULL);
        hirate_op_free(self->op);
        live_drop(self->owner);
    }
    batch_clear(&self->b);
    if (self->key) {
        key_release(&self->kb);
        Py_DECREF(self->key);
    }
    Py_XDECREF(self->owner);
    PyObject_Free(op);
    Py_DECREF(tp);
}

static PyObject *no_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    PyErr_Format(PyExc_TypeError, "cannot create '%s' instances: a Limiter makes them",
                 tp->tp_name);
    return NULL;
}

static PyGetSetDef op_getset[] = {
    {"request", op_request, NULL,
     "The bytes to send now, or None when nothing (more) needs Redis.", NULL},
    {"drop", op_drop, NULL, "True when the connection must be closed, not reused.", NULL},
    {"done", op_done, NULL, "True once every item is decided.", NULL},
    {"legs", op_legs, NULL, "The number of legs of the current round (0 once decided).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *op_health(PyObject *op, PyObject *unused);

static PyMethodDef op_methods[] = {
    {"feed", op_feed, METH_O,
     "feed(data) -> (state, used): reads replies from data; state is IO_MORE (read more), "
     "IO_SEND (send .request) or IO_DONE; used is how many bytes the replies took."},
    {"fail", (PyCFunction)(void (*)(void))op_fail, METH_VARARGS | METH_KEYWORDS,
     "fail(code, why=None): the I/O failed with code (ECONNECT, ETIMEDOUT, EIO, ETLS, or "
     "ECLOSED when the caller gave up), why in the I/O library's words; the core decides "
     "whatever is still waiting."},
    {"leg_node", op_leg_node, METH_O,
     "leg_node(leg) -> int: the node that leg of the current round goes to."},
    {"leg_request", op_leg_request, METH_O,
     "leg_request(leg) -> bytes: what to send to that leg's node (None once decided)."},
    {"leg_feed", (PyCFunction)(void (*)(void))op_leg_feed, METH_FASTCALL,
     "leg_feed(leg, data) -> (state, used): reads that leg's replies from data; state is "
     "IO_MORE (read more) or IO_DONE (the leg has all its replies); used is how many bytes "
     "they took."},
    {"leg_fail", (PyCFunction)(void (*)(void))op_leg_fail, METH_VARARGS | METH_KEYWORDS,
     "leg_fail(leg, code, why=None): that leg's I/O failed with code (as fail()); its calls "
     "not yet answered go to the core."},
    {"leg_drop", op_leg_drop, METH_O,
     "leg_drop(leg) -> bool: True when that leg's connection must be closed, not reused."},
    {"next", op_next, METH_NOARGS,
     "next() -> state, once every leg of the round is done or failed: IO_SEND (a new "
     "round: its legs are there) or IO_DONE (every item is decided)."},
    {"health", op_health, METH_NOARGS,
     "health() -> hirate.Health: a check's outcome (the Op of _op_start_check)."},
    {"results", op_results, METH_NOARGS,
     "results() -> list: per item its Decision, or the exception of its error in its place."},
    {"result", op_result, METH_NOARGS,
     "result() -> None: a reset's outcome; raises its error."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot op_slots[] = {
    {Py_tp_doc, (void *)"One batch (or a reset) decided with the caller doing the network I/O."},
    {Py_tp_new, (void *)no_tp_new},
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

/* ---- the handshake of a new connection ------------------------------------ */

typedef struct {
    PyObject_HEAD
    LimiterObject *owner;   /* strong */
    hirate_handshake *hs;
    int state;              /* the last state: 0 (started), IO_MORE, IO_PROBE, IO_DONE */
    int have_rc;            /* result() has been asked: */
    int rc;
    char msg[HIRATE_ERRMSG_SIZE];
} HandshakeObject;

/* A node's number (the core's: 0 is the URL's, an op's legs name the rest),
 * from the optional argument of _endpoint and _handshake_start. */
static int node_arg(PyObject *args, PyObject *kw, const char *fmt, int *node)
{
    static char *kwlist[] = {"node", NULL};
    *node = 0;
    return PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, node) ? 0 : -1;
}

static PyObject *limiter_handshake_start(PyObject *op, PyObject *args, PyObject *kw)
{
    LimiterObject *self = (LimiterObject *)op;
    hstate *st = self->st;
    int node;
    if (node_arg(args, kw, "|i:_handshake_start", &node) < 0 || need_redis(self) < 0)
        return NULL;
    hirate_handshake *hs = NULL;
    char err[HIRATE_ERRMSG_SIZE] = "";
    /* Node 0 through the node-less call, as before nodes existed. */
    int rc = node == 0 ? hirate_handshake_start(self->lim, &hs, err, sizeof err)
                       : hirate_node_handshake_start(self->lim, node, &hs, err, sizeof err);
    if (rc < 0)
        return raise_code(st, rc, err);   /* not now: the backoff, with the failure's code */
    HandshakeObject *h = PyObject_New(HandshakeObject, st->handshake_type);
    if (!h) {
        hirate_handshake_free(hs);
        return NULL;
    }
    h->owner = self;
    Py_INCREF(self);
    h->hs = hs;
    h->state = 0;
    h->have_rc = 0;
    h->rc = 0;
    h->msg[0] = '\0';
    live_take(self);
    return (PyObject *)h;
}

#define HS(o) ((HandshakeObject *)(o))

static PyObject *hs_request(PyObject *op, void *c)
{
    (void)c;
    if (HS(op)->state == HIRATE_IO_DONE)
        Py_RETURN_NONE;
    size_t len;
    const char *req = hirate_handshake_request(HS(op)->hs, &len);
    return PyBytes_FromStringAndSize(req, (Py_ssize_t)len);
}

static PyObject *hs_probe_tls(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(hirate_handshake_probe_tls(HS(op)->hs));
}

static PyObject *hs_state(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromLong(HS(op)->state);
}

static PyObject *hs_feed(PyObject *op, PyObject *data)
{
    HandshakeObject *self = HS(op);
    if (self->owner->closed)
        return raise_closed(self->owner->st);
    if (self->state == HIRATE_IO_DONE) {
        PyErr_SetString(PyExc_ValueError, "feed() on a Handshake that is done");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    size_t used = 0;
    self->state = hirate_handshake_feed(self->hs, view.buf, (size_t)view.len, &used);
    PyBuffer_Release(&view);
    return Py_BuildValue("(in)", self->state, (Py_ssize_t)used);
}

static PyObject *hs_fail(PyObject *op, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"code", "why", NULL};
    HandshakeObject *self = HS(op);
    long code;
    const char *why = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "l|z:fail", kwlist, &code, &why) ||
        op_check_code(code) < 0)
        return NULL;
    if (self->state != HIRATE_IO_DONE)
        self->state = hirate_handshake_fail(self->hs, (int)code, why);
    return PyLong_FromLong(self->state);
}

static PyObject *hs_result(PyObject *op, PyObject *unused)
{
    (void)unused;
    HandshakeObject *self = HS(op);
    if (self->state != HIRATE_IO_DONE) {
        PyErr_SetString(PyExc_ValueError,
                        "result() before the Handshake is done: feed() its replies or fail() it");
        return NULL;
    }
    if (!self->have_rc) {
        self->rc = hirate_handshake_result(self->hs, self->msg, sizeof self->msg);
        self->have_rc = 1;
    }
    if (self->rc < 0)
        return raise_code(self->owner->st, self->rc, self->msg);
    Py_RETURN_NONE;
}

static void hs_dealloc(PyObject *op)
{
    HandshakeObject *self = HS(op);
    PyTypeObject *tp = Py_TYPE(op);
    hirate_handshake_free(self->hs);
    live_drop(self->owner);
    Py_DECREF(self->owner);
    PyObject_Free(op);
    Py_DECREF(tp);
}

static PyGetSetDef hs_getset[] = {
    {"request", hs_request, NULL,
     "The bytes to send now (AUTH, SELECT and PING; during a probe, the probe's), or None "
     "once done. Taking them is sending them (the core tells a failure before the first "
     "command from one after it): read it only to send it.", NULL},
    {"probe_tls", hs_probe_tls, NULL,
     "In state IO_PROBE: True when the probe connection is TLS without verification, False "
     "when it is plain.", NULL},
    {"state", hs_state, NULL, "The last state: 0 at the start, IO_MORE, IO_PROBE or IO_DONE.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef hs_methods[] = {
    {"feed", hs_feed, METH_O,
     "feed(data) -> (state, used): reads the replies; state is IO_MORE (read more) or "
     "IO_DONE; used is how many bytes they took."},
    {"fail", (PyCFunction)(void (*)(void))hs_fail, METH_VARARGS | METH_KEYWORDS,
     "fail(code, why=None) -> state: the I/O failed (ECONNECT, ETIMEDOUT, EIO, ETLS); "
     "IO_PROBE (open the probe connection) or IO_DONE."},
    {"result", hs_result, METH_NOARGS,
     "result() -> None once done: the connection is ready; else raises the reason."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot hs_slots[] = {
    {Py_tp_doc, (void *)"The opening of one Redis connection, the caller doing the I/O."},
    {Py_tp_new, (void *)no_tp_new},
    {Py_tp_dealloc, (void *)hs_dealloc},
    {Py_tp_getset, hs_getset},
    {Py_tp_methods, hs_methods},
    {0, NULL},
};

static PyType_Spec hs_spec = {
    .name = "hirate._hirate.Handshake",
    .basicsize = sizeof(HandshakeObject),
    .flags = Py_TPFLAGS_DEFAULT | HR_IMMUTABLE,
    .slots = hs_slots,
};

/* ---- endpoint, counters ---------------------------------------------------- */

/* A path of the endpoint (a socket, a TLS file) as str, or None. */
static PyObject *path_or_none(const char *p)
{
    return p ? PyUnicode_DecodeFSDefault(p) : Py_NewRef(Py_None);
}

static PyObject *limiter_endpoint(PyObject *op, PyObject *args, PyObject *kw)
{
    LimiterObject *self = (LimiterObject *)op;
    hirate_endpoint ep;
    int node;
    if (node_arg(args, kw, "|i:_endpoint", &node) < 0 || need_redis(self) < 0)
        return NULL;
    int rc = node == 0 ? hirate_endpoint_get(self->lim, &ep)
                       : hirate_node_endpoint(self->lim, node, &ep);
    if (rc < 0)
        return raise_code(self->st, rc, NULL);
    return Py_BuildValue(
        "{sNsisNsNsdsdsdsNsNsNsNsNsNsN}",
        "host", ep.is_unix ? Py_NewRef(Py_None) : PyUnicode_FromString(ep.host),
        "port", ep.port,
        "path", ep.is_unix ? PyUnicode_DecodeFSDefault(ep.path) : Py_NewRef(Py_None),
        "where", PyUnicode_DecodeUTF8(ep.where, (Py_ssize_t)strlen(ep.where), "replace"),
        "connect_timeout", ep.connect_timeout_ms / 1000.0,
        "timeout", ep.timeout_ms / 1000.0,
        "probe_timeout", ep.probe_timeout_ms / 1000.0,
        "tls", PyBool_FromLong(ep.tls),
        "tls_verify", PyBool_FromLong(ep.tls_verify),
        "tls_ca_file", path_or_none(ep.tls_ca_file),
        "tls_ca_dir", path_or_none(ep.tls_ca_dir),
        "tls_cert_file", path_or_none(ep.tls_cert_file),
        "tls_key_file", path_or_none(ep.tls_key_file),
        "tls_server_name", ep.tls_server_name ? PyUnicode_FromString(ep.tls_server_name)
                                              : Py_NewRef(Py_None));
}

static PyObject *limiter_stats(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    hirate_counters s;
    if (self->closed)
        return raise_closed(self->st);
    hirate_counters_get(self->lim, &s);
    return Py_BuildValue("{sKsKsKsKsKsKsKsnsnsnsKsKsKsK}", "connects",
                         (unsigned long long)s.connects, "evalsha",
                         (unsigned long long)s.evalsha, "eval", (unsigned long long)s.eval,
                         "conns_dropped", (unsigned long long)s.conns_dropped, "cache_hits",
                         (unsigned long long)s.cache_hits, "policy", (unsigned long long)s.policy,
                         "breaker_opens", (unsigned long long)s.breaker_opens, "memory_keys",
                         (Py_ssize_t)s.memory_keys, "local_keys", (Py_ssize_t)s.local_keys,
                         "cache_keys", (Py_ssize_t)s.cache_keys, "fcall",
                         (unsigned long long)s.fcall, "function_loads",
                         (unsigned long long)s.function_loads, "sentinel_queries",
                         (unsigned long long)s.sentinel_queries, "master_changes",
                         (unsigned long long)s.master_changes);
}

/* The figures of s as hirate.Stats' fields: the core's names for sources
 * and codes, its latency bounds in seconds, the buckets made cumulative
 * (Prometheus' "le"): the count up to each bound, the last (inf) all. */
static PyObject *stats_fields(hstate *st, const hirate_stats *s)
{
    size_t nb = 0;
    const int64_t *bounds = hirate_latency_bounds(&nb);
    if (nb + 1 != HIRATE_LATENCY_BUCKETS) {
        PyErr_SetString(PyExc_SystemError, "hirate_latency_bounds disagrees with hirate.h");
        return NULL;
    }
    PyObject *decisions = PyDict_New(), *errors = PyDict_New();
    PyObject *buckets = PyTuple_New(HIRATE_LATENCY_BUCKETS);
    PyObject *fields = NULL;
    if (!decisions || !errors || !buckets)
        goto done;
    for (int i = HIRATE_SOURCE_REDIS; i < NSOURCES; i++) {
        PyObject *n = PyLong_FromUnsignedLongLong(s->decisions[i]);
        if (!n || PyDict_SetItem(decisions, st->source[i], n) < 0) {
            Py_XDECREF(n);
            goto done;
        }
        Py_DECREF(n);
    }
    for (int i = 1; i <= HIRATE_ERRNO_MAX; i++) {
        PyObject *n = PyLong_FromUnsignedLongLong(s->errors[i]);
        if (!n || PyDict_SetItem(errors, st->errname[i], n) < 0) {
            Py_XDECREF(n);
            goto done;
        }
        Py_DECREF(n);
    }
    unsigned long long count = 0;
    for (size_t i = 0; i < HIRATE_LATENCY_BUCKETS; i++) {
        count += s->latency[i];
        PyObject *b = Py_BuildValue("(dK)", i < nb ? (double)bounds[i] / 1e6 : INFINITY, count);
        if (!b)
            goto done;
        PyTuple_SET_ITEM(buckets, (Py_ssize_t)i, b);
    }
    fields = Py_BuildValue(
        "{sOsKsKsOsKsKsKsKsOsdsK}", "decisions", decisions, "refused",
        (unsigned long long)s->refused, "peeks", (unsigned long long)s->peeks, "errors", errors,
        "breaker_opens", (unsigned long long)s->breaker_opens, "breaker_closes",
        (unsigned long long)s->breaker_closes, "connects", (unsigned long long)s->connects,
        "conns_dropped", (unsigned long long)s->conns_dropped, "latency_buckets", buckets,
        "latency_sum", (double)s->latency_sum_us / 1e6, "latency_count", count);
done:
    Py_XDECREF(decisions);
    Py_XDECREF(errors);
    Py_XDECREF(buckets);
    return fields;
}

/* hirate.Stats(**fields of s). The class is Python's (hirate/_stats.py),
 * found at the first use: the package has imported it by then. */
static PyObject *stats_object(hstate *st, const hirate_stats *s)
{
    if (!st->stats_cls) {
        PyObject *m = PyImport_ImportModule("hirate._stats");
        if (!m)
            return NULL;
        st->stats_cls = PyObject_GetAttrString(m, "Stats");
        Py_DECREF(m);
        if (!st->stats_cls)
            return NULL;
    }
    PyObject *fields = stats_fields(st, s);
    if (!fields)
        return NULL;
    PyObject *noargs = PyTuple_New(0);
    PyObject *r = noargs ? PyObject_Call(st->stats_cls, noargs, fields) : NULL;
    Py_XDECREF(noargs);
    Py_DECREF(fields);
    return r;
}

/* stats(): the core's metrics (hirate_stats_get) now, or after close() as
 * they were when the limiter was freed; a figure never goes back. */
static PyObject *limiter_public_stats(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    if (!self->lim)
        return stats_object(self->st, &self->last);
    hirate_stats s;
    if (hirate_stats_get(self->lim, &s, sizeof s) < 0) {
        PyErr_SetString(PyExc_SystemError, "hirate_stats_get failed");
        return NULL;
    }
    return stats_object(self->st, &s);
}

/* _hirate._empty_stats(): a Stats of zeros (the sum of no limiter). */
static PyObject *mod_empty_stats(PyObject *m, PyObject *unused)
{
    (void)unused;
    hirate_stats s;
    memset(&s, 0, sizeof s);
    return stats_object(state_of_module(m), &s);
}

/* ---- the health check ------------------------------------------------------- */

/* hirate.Health from the core's check: Health._of(error, nodes), error the
 * code's name or None, each node (addr, error, message, role, functions,
 * loaded, latency_us) as the core gave it. The class is Python's
 * (hirate/_health.py), found at its first use. */
static PyObject *health_object(hstate *st, int rc, const hirate_check_node *nodes, size_t n)
{
    if (!st->health_cls) {
        PyObject *m = PyImport_ImportModule("hirate._health");
        if (!m)
            return NULL;
        st->health_cls = PyObject_GetAttrString(m, "Health");
        Py_DECREF(m);
        if (!st->health_cls)
            return NULL;
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const hirate_check_node *c = &nodes[i];
        PyObject *err = c->rc < 0 ? code_name(st, c->rc) : Py_NewRef(Py_None);
        PyObject *t = err ? Py_BuildValue("(sOssiiL)", c->addr, err, c->message, c->role,
                                          c->functions, c->loaded, (long long)c->latency_us)
                          : NULL;
        Py_XDECREF(err);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    PyObject *err = rc < 0 ? code_name(st, rc) : Py_NewRef(Py_None);
    PyObject *r = err ? PyObject_CallMethod(st->health_cls, "_of", "OO", err, list) : NULL;
    Py_XDECREF(err);
    Py_DECREF(list);
    return r;
}

/* check() -> hirate.Health: hirate_check(), without the GIL. */
static PyObject *limiter_check(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    if (self->closed)
        return raise_closed(self->st);
    if (!self->redis)
        return health_object(self->st, 0, NULL, 0);
    hirate_check_node *nodes = PyMem_RawMalloc(HIRATE_IO_NODES_MAX * sizeof *nodes);
    if (!nodes)
        return PyErr_NoMemory();
    if (enter(self) < 0) {
        PyMem_RawFree(nodes);
        return NULL;
    }
    hirate_limiter *lim = self->lim;
    size_t n = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hirate_check(lim, nodes, HIRATE_IO_NODES_MAX, &n);
    Py_END_ALLOW_THREADS
    leave(self);
    PyObject *r = rc == HIRATE_EINVAL || rc == HIRATE_ENOMEM
                      ? raise_code(self->st, rc, NULL)
                      : health_object(self->st, rc, nodes, n < HIRATE_IO_NODES_MAX
                                                               ? n : HIRATE_IO_NODES_MAX);
    PyMem_RawFree(nodes);
    return r;
}

/* _op_start_check() -> Op: check() with the caller doing the I/O. */
static PyObject *limiter_op_start_check(PyObject *op, PyObject *unused)
{
    (void)unused;
    LimiterObject *self = (LimiterObject *)op;
    if (need_redis(self) < 0)
        return NULL;
    OpObject *o = op_new(self);
    if (!o)
        return NULL;
    o->check = 1;
    int r = hirate_op_start_check(self->lim, &o->op);
    if (r < 0) {
        Py_DECREF(o);
        return raise_code(self->st, r, NULL);
    }
    live_take(self);
    o->done = hirate_op_legs(o->op) == 0;   /* no node to ask: its entry says why */
    return (PyObject *)o;
}

/* Op.health() -> hirate.Health, once a check's Op is decided. */
static PyObject *op_health(PyObject *op, PyObject *unused)
{
    (void)unused;
    OpObject *self = (OpObject *)op;
    if (!self->check) {
        PyErr_SetString(PyExc_TypeError, "health() is a check's outcome");
        return NULL;
    }
    if (op_decided(self, "health") < 0)
        return NULL;
    size_t n = 0;
    hirate_op_check(self->op, NULL, 0, &n);
    hirate_check_node *nodes = PyMem_Malloc((n ? n : 1) * sizeof *nodes);
    if (!nodes)
        return PyErr_NoMemory();
    int rc = hirate_op_check(self->op, nodes, n, &n);
    PyObject *r = health_object(self->owner->st, rc, nodes, n);
    PyMem_Free(nodes);
    return r;
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
    if (self->live > 0)
        Py_RETURN_NONE;   /* the last Op or Handshake frees the limiter */
    limiter_free_core(self, 1);
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
    Py_RETURN_NONE; /* an exception goes on: the stubs say -> None */
}

/* ---- construction ------------------------------------------------------------ */

/* The core's log callback: each event becomes a record of the standard
 * logger "hirate" (HIRATE_LOG_WARNING as logging.WARNING, HIRATE_LOG_INFO as
 * logging.INFO). The core calls it from whichever thread learnt the event: a
 * call of Limiter running without the GIL, a thread Python never saw, or an
 * AsyncLimiter's feed with the GIL held; PyGILState_Ensure serves all three.
 * The core never calls it per call, so looking the logger up each time
 * costs nothing that matters and holds no object past an interpreter's
 * life. Nothing may escape into the core: an exception pending before is
 * kept, and one raised here is dropped (logging reports its handlers' own
 * failures through Handler.handleError already). */
static void log_to_python(void *arg, int level, const char *msg)
{
    (void)arg;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing())
        return;
#else
    if (_Py_IsFinalizing())
        return;
#endif
    PyGILState_STATE g = PyGILState_Ensure();
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *pending = PyErr_GetRaisedException();
#else
    PyObject *ptype, *pvalue, *ptb;
    PyErr_Fetch(&ptype, &pvalue, &ptb);
#endif
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "hirate") : NULL;
    PyObject *text = logger ? PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace")
                            : NULL;
    if (text) {
        /* No args: logging takes the message as it is, '%' and all. */
        PyObject *r = PyObject_CallMethod(logger, "log", "iO",
                                          level == HIRATE_LOG_WARNING ? 30 : 20, text);
        Py_XDECREF(r);
    }
    Py_XDECREF(text);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
    PyErr_Clear();
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(ptype, pvalue, ptb);
#endif
    PyGILState_Release(g);
}

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

/* A duration option (timeout, connect_timeout, deny_cache_max): a str the
 * core reads ("100ms", "0.25s", "0.25"), or a number of seconds; the core
 * checks the range and words it in the unit given. */
static int duration_option(hstate *st, PyObject *o, const char *name, hirate_options *opts)
{
    char why[HIRATE_ERRMSG_SIZE];
    int rc;
    if (PyUnicode_Check(o)) {
        const char *text = c_string(st, o, name, HIRATE_EOPTION);
        if (!text)
            return -1;
        rc = hirate_options_set_duration(opts, name, text, why, sizeof why);
    } else if (!PyBool_Check(o) && (PyFloat_Check(o) || PyLong_Check(o))) {
        double s = PyFloat_AsDouble(o);
        if (s == -1.0 && PyErr_Occurred()) { /* an int no double holds */
            PyErr_Clear();
            s = Py_HUGE_VAL;
        }
        rc = hirate_options_set_seconds(opts, name, s, why, sizeof why);
    } else {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a number of seconds or a str with a unit ('100ms'), not %.200s",
                     name, Py_TYPE(o)->tp_name);
        return -1;
    }
    if (rc < 0) {
        raise_code(st, rc, why);
        return -1;
    }
    return 0;
}

/* A file option: str, bytes or os.PathLike, as the file system's bytes in
 * *keep (a new reference, or NULL for None); *out points into it. */
static int path_option(hstate *st, PyObject *o, const char *what, PyObject **keep,
                       const char **out)
{
    *keep = NULL;
    if (o == Py_None)
        return 0;
    PyObject *p = PyOS_FSPath(o);
    if (!p) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a str or os.PathLike, not %.200s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *b = PyUnicode_Check(p) ? PyUnicode_EncodeFSDefault(p) : Py_NewRef(p);
    Py_DECREF(p);
    if (!b)
        return -1;
    if (strlen(PyBytes_AS_STRING(b)) != (size_t)PyBytes_GET_SIZE(b)) {
        Py_DECREF(b);
        raise_codef(st, HIRATE_EOPTION, "%s must not contain a NUL character", what);
        return -1;
    }
    *keep = b;
    *out = PyBytes_AS_STRING(b);
    return 0;
}

/* A capacity as C holds it: 0, -1 with TypeError, or 1 for a value C
 * cannot hold (a fraction, NaN, an infinity, beyond 64 bits), which the
 * core would refuse. A float that is a whole number is accepted
 * (capacity = rate * 60). */
static int capacity_value(PyObject *o, const char *what, int64_t *out)
{
    if (PyFloat_Check(o)) {
        double v = PyFloat_AS_DOUBLE(o);
        if (v == floor(v) && fabs(v) <= (double)HIRATE_EXACT_MAX + 1) {
            *out = (int64_t)v;
            return 0;
        }
        return 1;
    }
    long long v;
    int r = int_value(o, what, &v);
    if (r == 0)
        *out = v;
    return r;
}

static int capacity_option(hstate *st, PyObject *o, int64_t *out)
{
    int r = capacity_value(o, "capacity", out);
    if (r > 0)
        raise_codef(st, HIRATE_ECAPACITY,
                    "capacity must be a whole number from 1 to 2^53-1, got %R", o);
    return r ? -1 : 0;
}

/* A rate as a double; what names it in a TypeError ("rate"). */
static int rate_option(PyObject *o, const char *what, double *out)
{
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s must be a number, not %.200s", what,
                     Py_TYPE(o)->tp_name);
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

/* The bands of limits= given as a sequence, for hirate_options.bands. */
typedef struct {
    PyObject *seq;          /* the sequence, holding the items (and their names) */
    hirate_band *v;
    Py_ssize_t n;
} band_list;

static void band_list_clear(band_list *bl)
{
    Py_CLEAR(bl->seq);
    PyMem_Free(bl->v);
    bl->v = NULL;
    bl->n = 0;
}

/* Item i of limits=: a hirate.Band or a (capacity, rate[, name]) tuple, or
 * a limit string of one limit ("10/second"). The numbers are the core's to
 * judge (its message names bands[i]); only what C cannot hold is refused
 * here, in the core's words. */
static int band_item(hstate *st, PyObject *item, Py_ssize_t i, hirate_band *out)
{
    out->name = NULL;
    if (PyUnicode_Check(item)) {
        const char *text = c_string(st, item, "a limit string", HIRATE_EOPTION);
        if (!text)
            return -1;
        hirate_limit lim[HIRATE_LIMITS_MAX];
        size_t n;
        char err[HIRATE_ERRMSG_SIZE];
        int rc = hirate_limits_parse(text, lim, HIRATE_LIMITS_MAX, &n, err, sizeof err);
        if (rc < 0) {
            raise_code(st, rc, err);
            return -1;
        }
        if (n != 1) {
            /* A sequence's item is one band; a str limits= holds several. */
            raise_codef(st, HIRATE_EOPTION,
                        "limits[%zd] holds %zu limits, %R: an item of a sequence is one", i, n,
                        item);
            return -1;
        }
        out->capacity = lim[0].capacity;
        out->rate = lim[0].rate;
        return 0;
    }
    Py_ssize_t len = PyTuple_Check(item) ? PyTuple_GET_SIZE(item) : 0;
    if (len != 2 && len != 3) {
        PyErr_Format(PyExc_TypeError,
                     "limits[%zd] must be a hirate.Band, a (capacity, rate[, name]) tuple or a "
                     "limit string, not %.200s%s", i, Py_TYPE(item)->tp_name,
                     PyTuple_Check(item) ? " of that length" : "");
        return -1;
    }
    PyObject *cap = PyTuple_GET_ITEM(item, 0), *rate = PyTuple_GET_ITEM(item, 1);
    PyObject *name = len == 3 ? PyTuple_GET_ITEM(item, 2) : Py_None;
    /* A wrong type names the argument's item; a bad value is said as the
     * core says it, of bands[i]. */
    char what[48];
    snprintf(what, sizeof what, "limits[%zd]: capacity", i);
    int r = capacity_value(cap, what, &out->capacity);
    if (r < 0)
        return -1;
    if (r) {
        raise_codef(st, HIRATE_ECAPACITY,
                    "bands[%zd]: capacity must be a whole number from 1 to 2^53-1, got %R", i,
                    cap);
        return -1;
    }
    snprintf(what, sizeof what, "limits[%zd]: rate", i);
    if (rate_option(rate, what, &out->rate) < 0)
        return -1;
    if (name == Py_None)
        return 0;
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "limits[%zd]: name must be a str, not %.200s", i,
                     Py_TYPE(name)->tp_name);
        return -1;
    }
    snprintf(what, sizeof what, "bands[%zd]: a band's name", i);
    return (out->name = c_string(st, name, what, HIRATE_EOPTION)) ? 0 : -1;
}

/* limits=: a str for hirate_options.limits (the core parses it), or a
 * sequence of bands for hirate_options.bands. */
static int limits_option(hstate *st, PyObject *o, hirate_options *opts, band_list *bl)
{
    if (PyUnicode_Check(o))
        return (opts->limits = c_string(st, o, "limits", HIRATE_EOPTION)) ? 0 : -1;
    if (PyBytes_Check(o) || PyByteArray_Check(o) || !PySequence_Check(o)) {
        PyErr_Format(PyExc_TypeError,
                     "limits must be a limit string or a sequence of bands, not %.200s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    bl->seq = PySequence_Fast(o, "limits must be a limit string or a sequence of bands");
    if (!bl->seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bl->seq);
    bl->v = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *bl->v);
    if (!bl->v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (band_item(st, PySequence_Fast_GET_ITEM(bl->seq, i), i, &bl->v[i]) < 0)
            return -1;
    bl->n = n;
    opts->bands = bl->v;
    opts->nbands = (size_t)n;
    return 0;
}

/* The limiter's bands as the core holds them (names defaulted), kept as
 * ((capacity, rate, name), ...): they outlive close(), as capacity does. */
static PyObject *band_info(hirate_limiter *lim)
{
    size_t n = hirate_limiter_nbands(lim);
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        hirate_band b;
        PyObject *one = hirate_limiter_band(lim, i, &b) < 0
                            ? NULL
                            : Py_BuildValue("(Lds)", (long long)b.capacity, b.rate, b.name);
        if (!one) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_SystemError, "hirate_limiter_band failed");
            Py_CLEAR(t);
        } else {
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, one);
        }
    }
    return t;
}

static PyObject *limiter_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"url", "capacity", "rate", "prefix", "on_error", "instances",
                             "connect_timeout", "timeout", "deny_cache", "max_keys",
                             "pool_size", "tls_ca_file", "tls_ca_dir", "tls_cert_file",
                             "tls_key_file", "tls_server_name", "tls_verify",
                             "sentinel_username", "sentinel_password", "functions", "limits",
                             "deny_cache_max", NULL};
    PyObject *url = Py_None, *capacity = NULL, *rate = NULL, *prefix = NULL, *on_error = NULL;
    PyObject *limits = NULL;
    PyObject *instances = NULL, *connect_timeout = NULL, *timeout = NULL, *deny_cache = NULL;
    PyObject *max_keys = NULL, *pool_size = NULL, *server_name = Py_None, *verify = NULL;
    PyObject *files[4] = {Py_None, Py_None, Py_None, Py_None};
    PyObject *sentinel_username = Py_None, *sentinel_password = Py_None, *functions = NULL;
    PyObject *deny_cache_max = NULL;
    hstate *st = state_of_type(tp);
    if (!st)
        return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOOOOOOOOOOOOOOOOOOOO:Limiter", kwlist,
                                     &url, &capacity, &rate, &prefix, &on_error, &instances,
                                     &connect_timeout, &timeout, &deny_cache, &max_keys,
                                     &pool_size, &files[0], &files[1], &files[2], &files[3],
                                     &server_name, &verify, &sentinel_username,
                                     &sentinel_password, &functions, &limits,
                                     &deny_cache_max))
        return NULL;
    /* Without limits (None is not given), capacity and rate are required;
     * with limits, whatever is given goes to the core, which says when two
     * limits are set. */
    limits = limits == Py_None ? NULL : limits;
    if (!limits && (!capacity || !rate)) {
        PyErr_Format(PyExc_TypeError, "Limiter() missing required keyword argument '%s' "
                     "(or limits)", capacity ? "rate" : "capacity");
        return NULL;
    }

    hirate_options o;
    hirate_options_init(&o);
    band_list bl = {NULL, NULL, 0};
    PyObject *kept[4] = {NULL, NULL, NULL, NULL};
    LimiterObject *self = NULL;
    if (url != Py_None && !(o.url = c_string(st, url, "url", HIRATE_EURL)))
        goto done;
    if ((capacity && capacity_option(st, capacity, &o.capacity) < 0) ||
        (rate && rate_option(rate, "rate", &o.rate) < 0) ||
        (limits && limits_option(st, limits, &o, &bl) < 0))
        goto done;
    if (prefix && !(o.prefix = c_string(st, prefix, "prefix", HIRATE_EOPTION)))
        goto done;
    if (on_error) {
        const char *name = c_string(st, on_error, "on_error", HIRATE_EOPTION);
        if (!name)
            goto done;
        if ((o.on_error = hirate_on_error_from_name(name)) < 0) {
            raise_codef(st, HIRATE_EOPTION,
                        "on_error must be 'local', 'open' or 'closed', got %R", on_error);
            goto done;
        }
    }
    if ((instances && int_option(st, instances, "instances", &o.instances) < 0) ||
        (pool_size && int_option(st, pool_size, "pool_size", &o.pool_size) < 0) ||
        (connect_timeout && duration_option(st, connect_timeout, "connect_timeout", &o) < 0) ||
        (timeout && duration_option(st, timeout, "timeout", &o) < 0))
        goto done;
    if (deny_cache) {
        int v = PyObject_IsTrue(deny_cache);
        if (v < 0)
            goto done;
        o.deny_cache = v;
    }
    if (deny_cache_max && duration_option(st, deny_cache_max, "deny_cache_max", &o) < 0)
        goto done;
    if (max_keys) {
        long long v;
        int r = int_value(max_keys, "max_keys", &v);
        if (r < 0)
            goto done;
        if (r || v < 1 || (unsigned long long)v > SIZE_MAX) {
            raise_codef(st, HIRATE_EOPTION, "max_keys must be from 1 to 4000000000, got %S",
                        max_keys);
            goto done;
        }
        o.max_keys = (size_t)v;
    }
    if (server_name != Py_None &&
        !(o.tls_server_name = c_string(st, server_name, "tls_server_name", HIRATE_EOPTION)))
        goto done;
    if (verify) {
        int v = PyObject_IsTrue(verify);
        if (v < 0)
            goto done;
        o.tls_verify = v;
    }
    /* The sentinels' credentials: the core copies them, checks that the URL
     * is a Sentinel's, and never puts the password in a message. */
    if (sentinel_username != Py_None &&
        !(o.sentinel_username =
              c_string(st, sentinel_username, "sentinel_username", HIRATE_EOPTION)))
        goto done;
    if (sentinel_password != Py_None &&
        !(o.sentinel_password =
              c_string(st, sentinel_password, "sentinel_password", HIRATE_EOPTION)))
        goto done;
    if (functions) {
        int v = PyObject_IsTrue(functions);
        if (v < 0)
            goto done;
        o.functions = v;
    }
    /* Events for the "hirate" logger; the callback needs no argument. */
    o.log = log_to_python;
    o.log_arg = NULL;
    /* The file names as bytes, kept until the core has copied them. */
    static const char *const file_names[4] = {"tls_ca_file", "tls_ca_dir", "tls_cert_file",
                                              "tls_key_file"};
    const char **file_opts[4] = {&o.tls_ca_file, &o.tls_ca_dir, &o.tls_cert_file,
                                 &o.tls_key_file};
    for (int i = 0; i < 4; i++)
        if (path_option(st, files[i], file_names[i], &kept[i], file_opts[i]) < 0)
            goto done;

    self = (LimiterObject *)tp->tp_alloc(tp, 0);
    if (!self)
        goto done;
    self->st = st;
    self->fork_gen = g_fork_gen;
    self->redis = o.url != NULL;
    self->on_error = o.on_error;
    self->prefix = PyUnicode_FromString(o.prefix);
    self->url = o.url ? redact_url(o.url) : Py_NewRef(Py_None);
    if (!self->prefix || !self->url) {
        Py_CLEAR(self);
        goto done;
    }
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limiter_new(&self->lim, &o, why, sizeof why);
    if (rc < 0) {
        self->closed = 1;
        Py_CLEAR(self);
        raise_code(st, rc, why);
    } else {
        self->cluster = hirate_is_cluster(self->lim);   /* kept: close() frees lim */
        self->sentinel = hirate_is_sentinel(self->lim);
        self->nbands = (int)hirate_limiter_nbands(self->lim);
        self->bandinfo = self->nbands > 0 ? band_info(self->lim) : NULL;
        if (!self->bandinfo) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_SystemError, "a limiter without a band");
            Py_CLEAR(self);
            goto done;
        }
        PyObject *first = PyTuple_GET_ITEM(self->bandinfo, 0);
        self->capacity = PyLong_AsLongLong(PyTuple_GET_ITEM(first, 0));
        self->rate = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(first, 1));
    }
done:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(kept[i]);
    band_list_clear(&bl);
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
    Py_CLEAR(self->bandinfo);
    Py_CLEAR(self->bandobjs);
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

/* The names of the bands, as a tuple, for repr(). */
static PyObject *band_names(PyObject *bandinfo)
{
    Py_ssize_t n = PyTuple_GET_SIZE(bandinfo);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(PyTuple_GET_ITEM(PyTuple_GET_ITEM(bandinfo, i), 2)));
    return t;
}

static PyObject *limiter_repr(PyObject *op)
{
    LimiterObject *self = (LimiterObject *)op;
    if (self->nbands > 1) {
        PyObject *names = band_names(self->bandinfo);
        if (!names)
            return NULL;
        PyObject *r = PyUnicode_FromFormat("<%s url=%R bands=%R on_error='%s'%s>",
                                           Py_TYPE(op)->tp_name, self->url, names,
                                           hirate_on_error_name(self->on_error),
                                           self->closed ? " closed" : "");
        Py_DECREF(names);
        return r;
    }
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

/* .bands: (hirate.Band, ...), made from bandinfo when first asked (the
 * class is hirate's, a NamedTuple, defined in Python). */
static PyObject *limiter_bands(PyObject *op, void *c)
{
    (void)c;
    LimiterObject *self = (LimiterObject *)op;
    if (self->bandobjs)
        return Py_NewRef(self->bandobjs);
    PyObject *mod = PyImport_ImportModule("hirate");
    PyObject *band = mod ? PyObject_GetAttrString(mod, "Band") : NULL;
    Py_XDECREF(mod);
    if (!band)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(self->bandinfo);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *b = PyObject_Call(band, PyTuple_GET_ITEM(self->bandinfo, i), NULL);
        if (!b)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, b);
    }
    Py_DECREF(band);
    if (!t)
        return NULL;
    self->bandobjs = t;
    return Py_NewRef(t);
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

static PyObject *limiter_is_cluster(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((LimiterObject *)op)->cluster);
}

static PyObject *limiter_is_sentinel(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((LimiterObject *)op)->sentinel);
}

static PyGetSetDef limiter_getset[] = {
    {"capacity", limiter_capacity, NULL,
     "Bucket size in whole tokens (the first band's, with several).", NULL},
    {"rate", limiter_rate, NULL, "Tokens added per second (the first band's, with several).",
     NULL},
    {"bands", limiter_bands, NULL,
     "(hirate.Band(capacity, rate, name), ...): every band, in order; one for capacity and "
     "rate. Names not given are the core's: '<capacity>-per-<w>s'.", NULL},
    {"prefix", limiter_prefix, NULL, "Prepended to every key in Redis.", NULL},
    {"url", limiter_url, NULL, "The Redis URL with its password as ***, or None.", NULL},
    {"on_error", limiter_on_error, NULL, "'local', 'open' or 'closed'.", NULL},
    {"closed", limiter_closed, NULL, "True after close().", NULL},
    {"is_cluster", limiter_is_cluster, NULL,
     "True for a Redis Cluster URL (redis+cluster://, rediss+cluster://).", NULL},
    {"is_sentinel", limiter_is_sentinel, NULL,
     "True for a Redis Sentinel URL (redis+sentinel://, rediss+sentinel://).", NULL},
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
    {"refund", (PyCFunction)(void (*)(void))limiter_refund, METH_VARARGS | METH_KEYWORDS,
     "refund(key, tokens=1) -> Decision: gives tokens back to every band of key's bucket, "
     "each capped at its capacity; the bucket after."},
    {"allow_many", limiter_allow_many, METH_O,
     "allow_many(pairs) -> list: allow() for each (key, cost), in one round trip; per item "
     "its Decision, or the exception of its error in its place."},
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
    {"_op_start_reset", limiter_op_start_reset, METH_O,
     "_op_start_reset(key) -> Op: reset(key), the caller doing the I/O."},
    {"check", limiter_check, METH_NOARGS,
     "check() -> hirate.Health: one round trip to every Redis node decisions go to (ROLE, "
     "and whether the library or script is loaded), for a readiness probe; a limiter "
     "without Redis has no node and is healthy."},
    {"_op_start_check", limiter_op_start_check, METH_NOARGS,
     "_op_start_check() -> Op: check(), the caller doing the I/O."},
    {"_endpoint", (PyCFunction)(void (*)(void))limiter_endpoint, METH_VARARGS | METH_KEYWORDS,
     "_endpoint(node=0) -> dict: where to connect to that node (host, port, path, where), "
     "the timeouts in seconds (connect_timeout, timeout, probe_timeout) and the TLS "
     "settings. A node's endpoint never changes."},
    {"_handshake_start", (PyCFunction)(void (*)(void))limiter_handshake_start,
     METH_VARARGS | METH_KEYWORDS,
     "_handshake_start(node=0) -> Handshake for a new connection to that node; raises the "
     "failure's error during the node's reconnect backoff."},
    {"stats", limiter_public_stats, METH_NOARGS,
     "stats() -> hirate.Stats: the core's metrics of this limiter since it was made "
     "(decisions by source, refusals, peeks, errors by code, breaker transitions, "
     "connections, the Redis round-trip latency histogram); after close(), as they were "
     "when it closed."},
    {"_stats", limiter_stats, METH_NOARGS, "_stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot limiter_slots[] = {
    {Py_tp_doc, (void *)"Limiter(url=None, *, capacity, rate, prefix='rl:', on_error='local', "
                        "instances=1, connect_timeout=0.25, timeout=0.1, deny_cache=True, "
                        "max_keys=1000000, pool_size=16, tls_ca_file=None, tls_ca_dir=None, "
                        "tls_cert_file=None, tls_key_file=None, tls_server_name=None, "
                        "tls_verify=True, sentinel_username=None, sentinel_password=None, "
                        "functions=True, deny_cache_max=1.0)\n"
                        "Limiter(url=None, *, limits, ...)\n\n"
                        "A token-bucket rate limiter: in Redis when url is given, else in "
                        "memory. The limit is capacity and rate, or limits: a limit string "
                        "('10/second; 1000/day') or a sequence of bands (hirate.Band, "
                        "(capacity, rate[, name]) tuples, strings of one limit), one decision "
                        "spending in every band or in none. url: "
                        "redis://[user:password@]host[:port][/db], rediss://... "
                        "(TLS), unix:///path[?db=N], or a Redis Cluster: "
                        "redis+cluster://[user:password@]host:port[,host:port...] (any "
                        "nodes as seeds, a replica too; pool_size is per node) and "
                        "rediss+cluster://... (TLS), or a Redis Sentinel service: "
                        "redis+sentinel://[[user]:password@]host[:port][,host[:port]...]"
                        "/service[/db] (the sentinels; user and password are the master's, "
                        "sentinel_username and sentinel_password the sentinels' own) and "
                        "rediss+sentinel://... (TLS). functions=False: EVALSHA always, "
                        "never FCALL. Durations (connect_timeout, timeout, deny_cache_max) "
                        "are seconds, or a str with a unit ('250ms', '2s'). deny_cache_max: "
                        "how long a refusal is foretold from one reply at most, then Redis is "
                        "asked again (so a reset made by another process is seen within it). "
                        "Events worth a log line go to the logger "
                        "'hirate'; stats() gives the metrics."},
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

static PyObject *mod_function_library(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    size_t len;
    const char *s = hirate_function_library(&len);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "strict");
}

static PyObject *mod_function_name(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(hirate_function_name());
}

/* _error(code, message) -> the exception hirate raises for code, with .code
 * and .name set (for the Python modules that check values of their own). */
static PyObject *mod_error(PyObject *m, PyObject *args)
{
    int code;
    PyObject *msg;
    if (!PyArg_ParseTuple(args, "iU:_error", &code, &msg))
        return NULL;
    Py_INCREF(msg);
    return make_exc(state_of_module(m), code, msg);
}

/* parse_limits(text) -> [(capacity, rate, count, window_s), ...]: the core
 * parses (hirate_limits_parse), so every front end reads the same grammar
 * and gives the same message; hirate.parse_limits names each tuple's fields.
 * A NUL is refused here: the core would stop reading at it. */
static PyObject *mod_parse_limits(PyObject *m, PyObject *text)
{
    hstate *st = state_of_module(m);
    const char *s = c_string(st, text, "text", HIRATE_EOPTION);
    if (!s)
        return NULL;
    hirate_limit lim[HIRATE_LIMITS_MAX];
    size_t n;
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_limits_parse(s, lim, HIRATE_LIMITS_MAX, &n, err, sizeof err);
    if (rc < 0)
        return raise_code(st, rc, err);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(LdLL)", (long long)lim[i].capacity, lim[i].rate,
                                    (long long)lim[i].count, (long long)lim[i].window_s);
        if (!t)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

/* refill_seconds(capacity, rate) -> int: hirate_refill_seconds, the "w" of
 * RateLimit-Policy and of a band's default name (0 for a capacity or rate
 * that no limiter takes). */
static PyObject *mod_refill_seconds(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *cap, *rate_obj;
    int64_t capacity;
    double rate;
    if (!PyArg_ParseTuple(args, "OO:refill_seconds", &cap, &rate_obj))
        return NULL;
    int r = capacity_value(cap, "capacity", &capacity);
    if (r < 0 || rate_option(rate_obj, "rate", &rate) < 0)
        return NULL;
    return PyLong_FromLongLong(r ? 0 : hirate_refill_seconds(capacity, rate));
}

/* response(limits, flags) -> (status, retry_after, headers, problem_type,
 * title, detail): hirate_response_format of [(name, capacity, rate,
 * Decision)], headers a list of (name, value) in the order the core gives
 * them; retry_after None when allowed or never; the last three None when
 * allowed. */
static PyObject *mod_response(PyObject *m, PyObject *args)
{
    hstate *st = state_of_module(m);
    PyObject *seq_obj;
    int flags;
    if (!PyArg_ParseTuple(args, "Oi:response", &seq_obj, &flags))
        return NULL;
    PyObject *seq = PySequence_Fast(seq_obj, "response: limits must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    hirate_response_limit small[8], *lim = small;
    char sbuf[HIRATE_RESPONSE_SIZE(8)], *buf = sbuf;
    size_t len = sizeof sbuf;
    if (n > 8) {
        lim = PyMem_Malloc((size_t)n * sizeof *lim);
        len = HIRATE_RESPONSE_SIZE(n);
        buf = PyMem_Malloc(len);
        if (!lim || !buf) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *name, *dec;
        long long capacity;
        double rate;
        if (!PyArg_ParseTuple(item, "ULdO:response", &name, &capacity, &rate, &dec))
            goto done;
        if (!PyObject_TypeCheck(dec, st->decision_type)) {
            PyErr_Format(PyExc_TypeError, "response: limits[%zd]: a Decision, got %s", i,
                         Py_TYPE(dec)->tp_name);
            goto done;
        }
        lim[i].name = PyUnicode_AsUTF8(name);
        if (!lim[i].name)
            goto done;
        lim[i].capacity = capacity;
        lim[i].rate = rate;
        lim[i].decision = &((DecisionObject *)dec)->d;
    }
    hirate_response r;
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_response_format(lim, (size_t)n, flags, &r, buf, len, err, sizeof err);
    if (rc < 0) {
        raise_code(st, rc, err);
        goto done;
    }
    static const char *names[6] = {"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit",
                                   "X-RateLimit-Remaining", "X-RateLimit-Reset",
                                   "Retry-After"};
    const char *values[6] = {r.ratelimit_policy, r.ratelimit, r.x_ratelimit_limit,
                             r.x_ratelimit_remaining, r.x_ratelimit_reset, r.retry_after};
    PyObject *headers = PyList_New(0);
    if (!headers)
        goto done;
    for (int i = 0; i < 6; i++) {
        if (!values[i])
            continue;
        PyObject *pair = Py_BuildValue("(ss)", names[i], values[i]);
        if (!pair || PyList_Append(headers, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(headers);
            goto done;
        }
        Py_DECREF(pair);
    }
    PyObject *retry = r.allowed || r.retry_after_s < 0 ? Py_NewRef(Py_None)
                                                      : PyLong_FromLongLong(r.retry_after_s);
    if (!retry) {
        Py_DECREF(headers);
        goto done;
    }
    result = Py_BuildValue("(iNNzzz)", r.status, retry, headers, r.problem_type, r.title,
                           r.detail);
done:
    if (lim != small)
        PyMem_Free(lim);
    if (buf != sbuf)
        PyMem_Free(buf);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef module_methods[] = {
    {"script_source", mod_script_source, METH_NOARGS,
     "script_source() -> str: the Lua script hirate runs in Redis."},
    {"script_sha1", mod_script_sha1, METH_NOARGS,
     "script_sha1() -> str: its SHA1, as EVALSHA names it."},
    {"function_library", mod_function_library, METH_NOARGS,
     "function_library() -> str: the same script as a Redis Functions library, as FUNCTION "
     "LOAD takes it."},
    {"function_name", mod_function_name, METH_NOARGS,
     "function_name() -> str: the name of its one function (and of the library), as FCALL "
     "names it."},
    {"parse_limits", mod_parse_limits, METH_O,
     "parse_limits(text) -> list of (capacity, rate, count, window_s) tuples: the limits of a "
     "limit string such as '10/second; 1000/day' (hirate.parse_limits names the fields)."},
    {"refill_seconds", mod_refill_seconds, METH_VARARGS,
     "refill_seconds(capacity, rate) -> int: whole seconds an empty bucket takes to fill, "
     "rounded up (the core's hirate_refill_seconds: the w of RateLimit-Policy and of a "
     "band's default name); 0 for a capacity or rate no limiter takes."},
    {"response", mod_response, METH_VARARGS,
     "response(limits, flags) -> (status, retry_after, headers, problem_type, title, detail): "
     "the core's response of [(name, capacity, rate, Decision)] (hirate_response_format)."},
    {"_empty_stats", mod_empty_stats, METH_NOARGS,
     "_empty_stats() -> hirate.Stats of zeros, the figures of no limiter."},
    {"_error", mod_error, METH_VARARGS,
     "_error(code, message) -> the exception hirate raises for code."},
    {NULL, NULL, 0, NULL},
};

/* Errors are false, so that `if d:` over a batch's results admits only the
 * allowed items (a Decision is true when allowed). */
static PyObject *error_bool(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_FALSE;
}

static PyMethodDef error_bool_def = {"__bool__", error_bool, METH_NOARGS,
                                     "False: an error admits nothing."};

/* Exceptions: name, doc, first base (a class of the table), second
 * (builtin) base or NULL. A misconfiguration that Redis or the network
 * reveals (a password, a permission, TLS, a refusal, a server that is not
 * Redis) is a BackendError, raised under every policy; ConfigError is for
 * the values of the arguments, known before any I/O. */
static int add_exceptions(PyObject *m, hstate *st)
{
    PyObject *attrs = Py_BuildValue("{sOsO}", "code", Py_None, "name", Py_None);
    if (!attrs)
        return -1;
    st->cls[C_ERROR] = PyErr_NewExceptionWithDoc(
        "hirate.Error", "Every hirate error. .code is the core's negative code, .name its name. "
        "An error is false: bool(e) is False, as a refused Decision is.",
        PyExc_Exception, attrs);
    Py_DECREF(attrs);
    if (!st->cls[C_ERROR])
        return -1;
    PyObject *falsy = PyDescr_NewMethod((PyTypeObject *)st->cls[C_ERROR], &error_bool_def);
    if (!falsy || PyObject_SetAttrString(st->cls[C_ERROR], "__bool__", falsy) < 0) {
        Py_XDECREF(falsy);
        return -1;
    }
    Py_DECREF(falsy);
    const struct {
        int slot;
        const char *name, *doc;
        int base;
        PyObject *builtin;
    } table[] = {
        {C_CONFIG, "hirate.ConfigError", "A bad argument value or option (EINVAL ECAPACITY ERATE "
                                         "ECOST EKEY ERANGE EURL EOPTION).",
         C_ERROR, PyExc_ValueError},
        {C_BACKEND, "hirate.BackendError", "Redis refused or failed a call the policy does not "
                                           "cover (ECONNECT EIO EPROTO ESERVER EREPLY).",
         C_ERROR, PyExc_ConnectionError},
        {C_TIMEOUT, "hirate.TimeoutError", "Redis did not answer in time (ETIMEDOUT).", C_BACKEND,
         PyExc_TimeoutError},
        {C_AUTH, "hirate.AuthError", "Redis refused the password or the user lacks a permission "
                                     "(EAUTH ENOPERM).",
         C_BACKEND, PyExc_PermissionError},
        {C_CLOSED, "hirate.ClosedError", "The limiter is closed (ECLOSED).", C_ERROR,
         PyExc_ValueError},
        {C_TLS, "hirate.TLSError", "A TLS handshake or certificate check failed, or the server "
                                   "speaks TLS where plain was asked, or the reverse (ETLS).",
         C_BACKEND, NULL},
        {C_REFUSED, "hirate.RefusedError", "Redis refused the connection: maxclients reached, "
                                           "or protected mode (EREFUSED).",
         C_BACKEND, PyExc_ConnectionRefusedError},
        {C_NOTREDIS, "hirate.NotRedisError", "The server does not speak the Redis protocol "
                                             "(ENOTREDIS).",
         C_BACKEND, NULL},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        PyObject *bases = table[i].builtin
                              ? PyTuple_Pack(2, st->cls[table[i].base], table[i].builtin)
                              : PyTuple_Pack(1, st->cls[table[i].base]);
        if (!bases)
            return -1;
        st->cls[table[i].slot] = PyErr_NewExceptionWithDoc(table[i].name, table[i].doc, bases,
                                                           NULL);
        Py_DECREF(bases);
        if (!st->cls[table[i].slot])
            return -1;
    }
    /* Which class each code raises (ENOMEM raises MemoryError; a code
     * missing here raises hirate.Error itself). */
    static const struct { int code; int cls; } codes[] = {
        {HIRATE_EINVAL, C_CONFIG}, {HIRATE_ECAPACITY, C_CONFIG}, {HIRATE_ERATE, C_CONFIG},
        {HIRATE_ECOST, C_CONFIG}, {HIRATE_EKEY, C_CONFIG}, {HIRATE_ERANGE, C_CONFIG},
        {HIRATE_EURL, C_CONFIG}, {HIRATE_EOPTION, C_CONFIG}, {HIRATE_ECONNECT, C_BACKEND},
        {HIRATE_EIO, C_BACKEND}, {HIRATE_EPROTO, C_BACKEND}, {HIRATE_ESERVER, C_BACKEND},
        {HIRATE_EREPLY, C_BACKEND}, {HIRATE_ETIMEDOUT, C_TIMEOUT}, {HIRATE_EAUTH, C_AUTH},
        {HIRATE_ENOPERM, C_AUTH}, {HIRATE_ECLOSED, C_CLOSED}, {HIRATE_ETLS, C_TLS},
        {HIRATE_EREFUSED, C_REFUSED}, {HIRATE_ENOTREDIS, C_NOTREDIS},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        st->exc[-codes[i].code] = st->cls[codes[i].cls];
    for (int i = 0; i < NCLASSES; i++) {
        const char *name = ((PyTypeObject *)st->cls[i])->tp_name;
        const char *dot = strrchr(name, '.');
        if (PyModule_AddObject(m, dot ? dot + 1 : name, Py_NewRef(st->cls[i])) < 0) {
            Py_DECREF(st->cls[i]);
            return -1;
        }
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
        add_type(m, &op_spec, &st->op_type, "Op") < 0 ||
        add_type(m, &hs_spec, &st->handshake_type, "Handshake") < 0 ||
        add_exceptions(m, st) < 0 || hirate_py_client_add(m) < 0)
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

    if (PyModule_AddIntConstant(m, "IO_MORE", HIRATE_IO_MORE) < 0 ||
        PyModule_AddIntConstant(m, "IO_SEND", HIRATE_IO_SEND) < 0 ||
        PyModule_AddIntConstant(m, "IO_DONE", HIRATE_IO_DONE) < 0 ||
        PyModule_AddIntConstant(m, "IO_PROBE", HIRATE_IO_PROBE) < 0 ||
        PyModule_AddIntConstant(m, "OP_REFUND", HIRATE_OP_REFUND) < 0 ||
        PyModule_AddIntConstant(m, "IO_REPLY_MAX", HIRATE_IO_REPLY_MAX) < 0 ||
        PyModule_AddIntConstant(m, "ERRMSG_SIZE", HIRATE_ERRMSG_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", HIRATE_KEY_MAX) < 0 ||
        PyModule_AddIntConstant(m, "HEADERS_RATELIMIT", HIRATE_HEADERS_RATELIMIT) < 0 ||
        PyModule_AddIntConstant(m, "HEADERS_LEGACY", HIRATE_HEADERS_LEGACY) < 0 ||
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
    Py_VISIT(st->handshake_type);
    for (int i = 0; i < NCLASSES; i++)
        Py_VISIT(st->cls[i]);
    Py_VISIT(st->stats_cls);
    Py_VISIT(st->health_cls);
    return 0;
}

static int module_clear(PyObject *m)
{
    hstate *st = state_of_module(m);
    Py_CLEAR(st->limiter_type);
    Py_CLEAR(st->decision_type);
    Py_CLEAR(st->op_type);
    Py_CLEAR(st->handshake_type);
    for (int i = 0; i < NCLASSES; i++)
        Py_CLEAR(st->cls[i]);
    for (int i = 0; i < NCODES; i++) {
        st->exc[i] = NULL;   /* borrowed */
        Py_CLEAR(st->errname[i]);
    }
    for (int i = 0; i < NSOURCES; i++)
        Py_CLEAR(st->source[i]);
    Py_CLEAR(st->str_key);
    Py_CLEAR(st->str_cost);
    Py_CLEAR(st->stats_cls);
    Py_CLEAR(st->health_cls);
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
