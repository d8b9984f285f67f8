/*
 * hirate.Limiter: allow, peek, refund, reset and allow_many, close and the
 * context manager, repr and the attributes. A limiter with a URL releases
 * the GIL around every call, since a call may wait on the network for up to
 * its timeouts; the in-memory limiter keeps it, a decision taking a fraction
 * of a microsecond, far less than releasing and taking back the GIL. close()
 * waits until the calls running without the GIL have left, so no call ever
 * meets a freed limiter. Construction is options.c's, the no-I/O hooks
 * op.c's, stats() and check() stats.c's.
 */
#include "_hirate.h"

_Atomic unsigned long g_fork_gen;

static void after_fork_child(void)
{
    g_fork_gen++;
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Once a process, whichever interpreter imports the module first. */
void limiter_atfork_init(void)
{
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, install_atfork);
}

/* Frees self->lim (set to NULL first, so that nothing finds it half gone),
 * its last metrics kept in self->last. With the GIL held; the freeing
 * itself, which may close connections, releases it when release is 1. */
void limiter_free_core(LimiterObject *self, int release)
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

int key_get(PyObject *o, keybuf *k)
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

void key_release(keybuf *k)
{
    if (k->has_view) {
        PyBuffer_Release(&k->view);
        k->has_view = 0;
    }
}

/* An int that is not a bool (True as a cost or a capacity is a mistake).
 * Returns 0, -1 with an exception, or 1 when it does not fit in 64 bits. */
int int_value(PyObject *o, const char *what, long long *out)
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

int cost_value(hstate *st, PyObject *o, int64_t *out)
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
    raise_range(st, HIRATE_ECOST, NULL, PyObject_Str(o));
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

PyType_Spec limiter_spec = {
    .name = "hirate.Limiter",
    .basicsize = sizeof(LimiterObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = limiter_slots,
};
