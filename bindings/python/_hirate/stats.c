/*
 * stats() and check(): the core's metrics as hirate.Stats (and the older
 * _stats() counters as a dict), and its health check as hirate.Health. Both
 * classes are Python's (hirate/_stats.py, hirate/_health.py), looked up at
 * their first use and kept in the module state.
 */
#include "_hirate.h"

PyObject *limiter_stats(PyObject *op, PyObject *unused)
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
PyObject *limiter_public_stats(PyObject *op, PyObject *unused)
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
PyObject *mod_empty_stats(PyObject *m, PyObject *unused)
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
PyObject *health_object(hstate *st, int rc, const hirate_check_node *nodes, size_t n)
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
PyObject *limiter_check(PyObject *op, PyObject *unused)
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
