/*
 * hirate.Decision: immutable, true when allowed, with each band's own
 * Decision when the limiter has several. Decisions are made by
 * decision_new_from and decision_new_bands (_hirate.h), on every call's path.
 */
#include "_hirate.h"

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
PyObject *code_name(hstate *st, int e)
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
PyObject *float_text(double x)
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

PyType_Spec decision_spec = {
    .name = "hirate.Decision",
    .basicsize = sizeof(DecisionObject),
    .flags = Py_TPFLAGS_DEFAULT | HR_IMMUTABLE,
    .slots = decision_slots,
};
