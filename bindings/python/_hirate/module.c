/*
 * hirate._hirate: the CPython extension around the hirate core.
 *
 * Written against the C API directly, in the modern style: heap types made
 * with PyType_FromModuleAndSpec, everything per-interpreter in module state,
 * multi-phase initialisation, and exceptions built from a table that maps
 * each HIRATE_E* code to a class (the instance carries .code and .name).
 *
 * The files (see _hirate.h): this one is the module (its state, slots
 * and exec, the exceptions and the raising of them, the module functions,
 * the bridge from the core's log events to Python's logging); decision.c,
 * limiter.c, options.c, batch.c, op.c and stats.c are the types and their
 * parts. Only hirate.h and hirate_io.h of the core are included.
 *
 * The core's log events (hirate_options.log) go to the standard logger
 * "hirate"; see log_to_python.
 */
#include "_hirate.h"

/* The state of the module that defined tp or one of its bases: Limiter may
 * be subclassed in Python, and a subclass has no module of its own. */
hstate *state_of_type(PyTypeObject *tp)
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
const char *short_name(int code)
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
PyObject *error_obj(hstate *st, int code, const char *msg)
{
    if (!msg || !msg[0])
        msg = hirate_strerror(code);
    return make_exc(st, code, PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"));
}

/* Raises code with the core's message. */
PyObject *raise_code(hstate *st, int code, const char *msg)
{
    if (!msg || !msg[0])
        msg = hirate_strerror(code);
    return raise_obj(st, code, PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"));
}

PyObject *raise_codef(hstate *st, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    return raise_obj(st, code, msg);
}

PyObject *raise_range(hstate *st, int code, const char *what, PyObject *shown)
{
    const char *text = shown ? PyUnicode_AsUTF8(shown) : NULL;
    if (text) {
        char why[HIRATE_ERRMSG_SIZE];
        raise_code(st, hirate_range_errmsg(code, what, text, why, sizeof why), why);
    }
    Py_XDECREF(shown);
    return NULL;
}

/* ---------------------------------------------------------- the core's log */

/* The core's log callback: each event becomes a record of the standard
 * logger "hirate" of the interpreter that made the limiter (arg), with
 * HIRATE_LOG_WARNING as logging.WARNING and HIRATE_LOG_INFO as logging.INFO.
 * The core calls it from whichever thread learnt the event: a call of
 * Limiter running without the GIL, or an AsyncLimiter's feed with the GIL
 * held. Either way the thread's own thread state is of that interpreter,
 * and PyGILState_Ensure takes it back (or finds it holding the GIL); a
 * thread whose thread state is another interpreter's, or that has none, is
 * given one of arg's for the call, so a record never goes to another
 * interpreter's logging. The core never calls it per call, so looking the
 * logger up each time costs nothing that matters and holds no object past
 * an interpreter's life. Nothing may escape into the core: an exception
 * pending before is kept, and one raised here is dropped (logging reports
 * its handlers' own failures through Handler.handleError already). */
void log_to_python(void *arg, int level, const char *msg)
{
    PyInterpreterState *interp = arg;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing())
        return;
#else
    if (_Py_IsFinalizing())
        return;
#endif
    PyThreadState *own = PyGILState_GetThisThreadState(), *temp = NULL;
    PyGILState_STATE g = PyGILState_UNLOCKED;
    if (own && PyThreadState_GetInterpreter(own) == interp) {
        g = PyGILState_Ensure();
    } else {
        if (!(temp = PyThreadState_New(interp)))
            return;
        PyEval_RestoreThread(temp);
    }
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
    if (temp) {
        PyThreadState_Clear(temp);
        PyThreadState_DeleteCurrent();
    } else {
        PyGILState_Release(g);
    }
}

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

/* check_cost(cost) -> int: cost as a decision takes it, or the ECOST error
 * in the core's words (hirate_check_cost), for the integrations that check
 * a declared cost before any decision is made. */
static PyObject *mod_check_cost(PyObject *m, PyObject *cost)
{
    hstate *st = state_of_module(m);
    int64_t v;
    if (cost_value(st, cost, &v) < 0)
        return NULL;
    char why[HIRATE_ERRMSG_SIZE];
    int rc = hirate_check_cost(v, NULL, why, sizeof why);
    if (rc < 0)
        return raise_code(st, rc, why);
    return PyLong_FromLongLong(v);
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
    {"check_cost", mod_check_cost, METH_O,
     "check_cost(cost) -> int: cost as a decision takes it, or the ConfigError (ECOST) a "
     "decision would raise."},
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

/* DEFAULTS: what a Limiter is made with when an argument is not given, as
 * hirate_options_init sets it (seconds for durations), and the client
 * address rules' ipv6_subnet and header: the signatures and settings of hirate's Python
 * classes show these, and restate none of them. */
static int add_defaults(PyObject *m)
{
    hirate_options o;
    hirate_options_init(&o);
    PyObject *d = Py_BuildValue(
        "{s:s,s:s,s:i,s:d,s:d,s:O,s:d,s:n,s:i,s:O,s:O,s:i,s:s}", "prefix", o.prefix, "on_error",
        hirate_on_error_name(o.on_error), "instances", o.instances, "connect_timeout",
        o.connect_timeout_ms / 1000.0, "timeout", o.timeout_ms / 1000.0, "deny_cache",
        o.deny_cache ? Py_True : Py_False, "deny_cache_max", o.deny_cache_max_ms / 1000.0,
        "max_keys", (Py_ssize_t)o.max_keys, "pool_size", o.pool_size, "tls_verify",
        o.tls_verify ? Py_True : Py_False, "functions", o.functions ? Py_True : Py_False,
        "ipv6_subnet", HIRATE_IPV6_SUBNET_DEFAULT, "forwarded_header",
        hirate_client_ip_header(NULL));
    if (!d)
        return -1;
    PyObject *ro = PyDictProxy_New(d);
    Py_DECREF(d);
    if (!ro || PyModule_AddObject(m, "DEFAULTS", ro) < 0) {
        Py_XDECREF(ro);
        return -1;
    }
    return 0;
}

static int module_exec(PyObject *m)
{
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
    if (add_defaults(m) < 0)
        return -1;
    limiter_atfork_init();
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

/* Every interpreter has a module of its own: its state, its types and
 * exceptions, its limiters. What the process shares is safe under several
 * GILs: the fork generation is atomic, the atfork handler is installed
 * once (pthread_once), the log callback takes the limiter's own
 * interpreter, and the core is thread-safe. The module still relies on a
 * GIL to serialise the calls on one object (a Limiter's counts of running
 * calls and of live Ops, an Op's state, the attributes made when first
 * asked for), so it does not declare Py_MOD_GIL_NOT_USED. */
static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

struct PyModuleDef hirate_module = {
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
