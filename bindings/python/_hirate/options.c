/*
 * Limiter(...) and Limiter.from_env(...): the keyword options converted into
 * hirate_options (the core checks every value and words every refusal), and
 * the new limiter. The URL kept for repr() and .url has its password as ***.
 */
#include "_hirate.h"

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
const char *c_string(hstate *st, PyObject *o, const char *what, int code)
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
int capacity_value(PyObject *o, const char *what, int64_t *out)
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
        raise_range(st, HIRATE_ECAPACITY, NULL, PyObject_Repr(o));
    return r ? -1 : 0;
}

/* A rate as a double; what names it in a TypeError ("rate"). */
int rate_option(PyObject *o, const char *what, double *out)
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
        snprintf(what, sizeof what, "bands[%zd]: capacity", i);
        raise_range(st, HIRATE_ECAPACITY, what, PyObject_Repr(cap));
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

PyObject *limiter_tp_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
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
        char why[HIRATE_ERRMSG_SIZE];
        int rc = hirate_options_set_on_error(&o, name, why, sizeof why);
        if (rc < 0) {
            raise_code(st, rc, why);
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
        /* The core checks the range (a size_t, which -1 would not fit). */
        long long v;
        char why[HIRATE_ERRMSG_SIZE];
        int r = int_value(max_keys, "max_keys", &v), rc;
        if (r < 0)
            goto done;
        if (r) {
            raise_codef(st, HIRATE_EOPTION, "max_keys is out of range, got %S", max_keys);
            goto done;
        }
        if ((rc = hirate_options_set_max_keys(&o, v, why, sizeof why)) < 0) {
            raise_code(st, rc, why);
            goto done;
        }
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
    /* Events for the "hirate" logger of the interpreter making the limiter. */
    o.log = log_to_python;
    o.log_arg = PyInterpreterState_Get();
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

PyObject *limiter_from_env(PyObject *cls, PyObject *args, PyObject *kw)
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
