/*
 * hirate._hirate's client identity: ClientRules, the core's compiled
 * options for finding the client of a request behind proxies, and the
 * identity and bucket-key functions (hirate.h, "Client identity"). The
 * rules are the core's; this file converts types. hirate._http's ClientIP,
 * ident_for_ip, ident_for_key and bucket keys are built on it.
 */
#include "_hirate.h"

typedef struct {
    PyObject_HEAD
    hirate_client_ip *c;
} RulesObject;

/* The UTF-8 bytes of a str (lone surrogates kept, as the package encodes
 * keys) or the bytes of a bytes object, in *hold. */
static int text_of(PyObject *o, const char *what, PyObject **hold, const char **p, Py_ssize_t *n)
{
    if (PyUnicode_Check(o)) {
        *hold = PyUnicode_AsEncodedString(o, "utf-8", "surrogatepass");
    } else if (PyBytes_Check(o)) {
        *hold = Py_NewRef(o);
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!*hold)
        return -1;
    *p = PyBytes_AS_STRING(*hold);
    *n = PyBytes_GET_SIZE(*hold);
    return 0;
}

static PyObject *rules_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"trusted_proxies", "proxy_hops", "header", "ipv6_subnet", NULL};
    PyObject *list, *header_obj = Py_None;
    double hops = 0, subnet = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|dOd:ClientRules", kwlist, &list, &hops,
                                     &header_obj, &subnet))
        return NULL;
    PyObject *seq = PySequence_Fast(list, "trusted_proxies must be a list of str");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *holds = PyList_New(0);
    const char **entries = PyMem_Calloc((size_t)n + 1, sizeof *entries);
    PyObject *result = NULL, *hh = NULL;
    if (!holds || !entries)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hold;
        const char *p;
        Py_ssize_t len;
        if (text_of(PySequence_Fast_GET_ITEM(seq, i), "a trusted_proxies entry", &hold, &p, &len) < 0)
            goto done;
        /* The core reads C strings: a NUL shows as '?' in its message. */
        if ((Py_ssize_t)strlen(p) != len) {
            PyObject *fixed = PyBytes_FromStringAndSize(p, len);
            Py_DECREF(hold);
            if (!(hold = fixed))
                goto done;
            char *q = PyBytes_AS_STRING(hold);
            for (Py_ssize_t k = 0; k < len; k++)
                if (!q[k])
                    q[k] = '?';
        }
        int added = PyList_Append(holds, hold);
        entries[i] = PyBytes_AS_STRING(hold);
        Py_DECREF(hold);
        if (added < 0)
            goto done;
    }
    const char *header = NULL;
    if (header_obj != Py_None) {
        Py_ssize_t len;
        if (text_of(header_obj, "header", &hh, &header, &len) < 0)
            goto done;
        if ((Py_ssize_t)strlen(header) != len)
            header = "\\0";
    }
    hirate_client_ip *c;
    char err[HIRATE_ERRMSG_SIZE];
    int rc = hirate_client_ip_new(&c, entries, (size_t)n, hops, header, subnet, err, sizeof err);
    if (rc < 0) {
        raise_code(state_of_module(PyType_GetModule(tp)), rc, err);
        goto done;
    }
    RulesObject *self = (RulesObject *)tp->tp_alloc(tp, 0);
    if (!self) {
        hirate_client_ip_free(c);
        goto done;
    }
    self->c = c;
    result = (PyObject *)self;
done:
    Py_XDECREF(hh);
    PyMem_Free(entries);
    Py_XDECREF(holds);
    Py_DECREF(seq);
    return result;
}

static void rules_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    hirate_client_ip_free(((RulesObject *)op)->c);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* A kind and the text the core wrote: the Python answer. */
static PyObject *answer(int kind, const char *out, PyObject *given)
{
    if (kind == HIRATE_CLIENT_ADDRESS)
        return PyUnicode_FromString(out);
    if (kind == HIRATE_CLIENT_AS_GIVEN)
        return Py_NewRef(given);
    if (kind == HIRATE_CLIENT_NONE)
        Py_RETURN_NONE;
    return kind == HIRATE_ENOMEM ? PyErr_NoMemory()
                                 : PyErr_Format(PyExc_SystemError, "client rules: %d", kind);
}

/* resolve(peer, header_values=()) -> str or None */
static PyObject *rules_resolve(PyObject *op, PyObject *const *args, Py_ssize_t nargs)
{
    RulesObject *self = (RulesObject *)op;
    if (nargs < 1 || nargs > 2)
        return PyErr_Format(PyExc_TypeError, "resolve(peer, header_values=()) takes 1 or 2 "
                                             "arguments, got %zd", nargs);
    PyObject *peer = args[0], *peer_hold = NULL, *seq = NULL, *result = NULL;
    const char *pp = NULL;
    Py_ssize_t pn = 0;
    if (peer != Py_None && text_of(peer, "peer", &peer_hold, &pp, &pn) < 0)
        return NULL;
    enum { SMALL = 8 };
    const char *vs[SMALL];
    size_t ls[SMALL];
    PyObject *holds[SMALL];
    const char **v = vs;
    size_t *l = ls;
    PyObject **h = holds;
    Py_ssize_t n = 0, got = 0;
    if (nargs == 2 && hirate_client_ip_uses_header(self->c)) {
        if (!(seq = PySequence_Fast(args[1], "header_values must be a list of str")))
            goto done;
        n = PySequence_Fast_GET_SIZE(seq);
        if (n > SMALL) {
            v = PyMem_Malloc((size_t)n * sizeof *v);
            l = PyMem_Malloc((size_t)n * sizeof *l);
            h = PyMem_Malloc((size_t)n * sizeof *h);
            if (!v || !l || !h) {
                PyErr_NoMemory();
                goto done;
            }
        }
        for (; got < n; got++) {
            Py_ssize_t len;
            if (text_of(PySequence_Fast_GET_ITEM(seq, got), "a header value", &h[got], &v[got],
                        &len) < 0)
                goto done;
            l[got] = (size_t)len;
        }
    }
    char out[HIRATE_CLIENT_TEXT_MAX];
    int kind = hirate_client_ip_resolve(self->c, pp, (size_t)pn, v, l, (size_t)n, out, sizeof out);
    result = answer(kind, out, peer);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        Py_DECREF(h[i]);
    if (v != vs) {
        PyMem_Free(v);
        PyMem_Free(l);
        PyMem_Free(h);
    }
    Py_XDECREF(seq);
    Py_XDECREF(peer_hold);
    return result;
}

/* key(address) -> str or None */
static PyObject *rules_key(PyObject *op, PyObject *address)
{
    if (address == Py_None)
        Py_RETURN_NONE;
    PyObject *hold;
    const char *p;
    Py_ssize_t n;
    if (text_of(address, "address", &hold, &p, &n) < 0)
        return NULL;
    char out[HIRATE_CLIENT_TEXT_MAX];
    int kind = hirate_client_ip_key(((RulesObject *)op)->c, p, (size_t)n, out, sizeof out);
    Py_DECREF(hold);
    return answer(kind, out, address);
}

static PyObject *rules_header(PyObject *op, void *c)
{
    (void)c;
    return PyUnicode_FromString(hirate_client_ip_header(((RulesObject *)op)->c));
}

static PyObject *rules_uses_header(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(hirate_client_ip_uses_header(((RulesObject *)op)->c));
}

static PyObject *rules_hops(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromLong(hirate_client_ip_proxy_hops(((RulesObject *)op)->c));
}

static PyObject *rules_subnet(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromLong(hirate_client_ip_ipv6_subnet(((RulesObject *)op)->c));
}

static PyMethodDef rules_methods[] = {
    {"resolve", (PyCFunction)(void (*)(void))rules_resolve, METH_FASTCALL,
     "resolve(peer, header_values=()) -> the client's address (str), or None."},
    {"key", rules_key, METH_O, "key(address) -> its key for buckets (str), or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rules_getset[] = {
    {"header", rules_header, NULL, "'X-Forwarded-For' or 'Forwarded'", NULL},
    {"uses_header", rules_uses_header, NULL, "whether the header can change the answer", NULL},
    {"hops", rules_hops, NULL, "proxy_hops", NULL},
    {"ipv6_subnet", rules_subnet, NULL, "the prefix length IPv6 clients are keyed by", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot rules_slots[] = {
    {Py_tp_new, rules_new},
    {Py_tp_dealloc, rules_dealloc},
    {Py_tp_methods, rules_methods},
    {Py_tp_getset, rules_getset},
    {Py_tp_doc, "ClientRules(trusted_proxies, proxy_hops=0, header=None, ipv6_subnet=64): the "
                "core's rules for the client of a request (hirate.h, \"Client identity\")."},
    {0, NULL},
};

static PyType_Spec rules_spec = {
    "hirate._hirate.ClientRules", sizeof(RulesObject), 0,
    Py_TPFLAGS_DEFAULT | HR_IMMUTABLE, rules_slots,
};

/* The bytes the core writes: sized by a first call when they do not fit. */
static PyObject *core_bytes(int (*fill)(const void *, char *, size_t, size_t *), const void *arg)
{
    char small[HIRATE_KEY_MAX + 1];
    size_t n;
    if (fill(arg, small, sizeof small, &n) < 0)
        return PyErr_Format(PyExc_ValueError, "bad identity arguments");
    if (n < sizeof small)
        return PyBytes_FromStringAndSize(small, (Py_ssize_t)n);
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    char *big = PyMem_Malloc(n + 1);
    if (!b || !big || fill(arg, big, n + 1, &n) < 0) {
        Py_XDECREF(b);
        PyMem_Free(big);
        return big ? NULL : PyErr_NoMemory();
    }
    memcpy(PyBytes_AS_STRING(b), big, n);
    PyMem_Free(big);
    return b;
}

typedef struct ident_args {
    int kind;
    const char *p;
    Py_ssize_t n;
} ident_args;

static int fill_ident(const void *arg, char *out, size_t cap, size_t *n)
{
    const ident_args *a = arg;
    return hirate_ident(a->kind, a->p, (size_t)a->n, out, cap, n);
}

static PyObject *ident_of(int kind, PyObject *value)
{
    ident_args a = {kind, NULL, 0};
    PyObject *hold = NULL;
    if (value != Py_None && text_of(value, "value", &hold, &a.p, &a.n) < 0)
        return NULL;
    PyObject *r = core_bytes(fill_ident, &a);
    Py_XDECREF(hold);
    return r;
}

/* ident_for_ip(key) -> b"ip:<key>" (b"ip:unknown" for None) */
static PyObject *mod_ident_for_ip(PyObject *m, PyObject *key)
{
    (void)m;
    return ident_of(HIRATE_IDENT_ADDRESS, key);
}

/* ident_for_key(value) -> b"k:<value>" (value: str or bytes) */
static PyObject *mod_ident_for_key(PyObject *m, PyObject *value)
{
    (void)m;
    if (value == Py_None)
        return PyErr_Format(PyExc_TypeError, "value must be a str, not None");
    return ident_of(HIRATE_IDENT_KEY, value);
}

typedef struct key_args {
    const char *ident, *scope, *head;
    Py_ssize_t ni, ns, nh;
} key_args;

static int fill_key(const void *arg, char *out, size_t cap, size_t *n)
{
    const key_args *a = arg;
    return hirate_bucket_key(a->ident, (size_t)a->ni, a->scope, (size_t)a->ns, a->head,
                             (size_t)a->nh, out, cap, n);
}

/* bucket_key(ident, scope, head) -> bytes (scope None: "{ident}") */
static PyObject *mod_bucket_key(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    (void)m;
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "bucket_key(ident, scope, head) takes 3 arguments");
    key_args a = {NULL, NULL, NULL, 0, 0, 0};
    PyObject *hold[3] = {NULL, NULL, NULL}, *r = NULL;
    if (text_of(args[0], "ident", &hold[0], &a.ident, &a.ni) < 0 ||
        (args[1] != Py_None && (text_of(args[1], "scope", &hold[1], &a.scope, &a.ns) < 0 ||
                                text_of(args[2], "head", &hold[2], &a.head, &a.nh) < 0)))
        goto done;
    r = core_bytes(fill_key, &a);
done:
    for (int i = 0; i < 3; i++)
        Py_XDECREF(hold[i]);
    return r;
}

static PyMethodDef client_functions[] = {
    {"ident_for_ip", mod_ident_for_ip, METH_O,
     "ident_for_ip(key) -> the identity of a client address's key (None: unknown)."},
    {"ident_for_key", mod_ident_for_key, METH_O,
     "ident_for_key(value) -> the identity of a key function's value (str or bytes)."},
    {"bucket_key", (PyCFunction)(void (*)(void))mod_bucket_key, METH_FASTCALL,
     "bucket_key(ident, scope, head) -> the bucket's key (bytes), long identities hashed."},
    {NULL, NULL, 0, NULL},
};

int hirate_py_client_add(PyObject *module)
{
    PyObject *tp = PyType_FromModuleAndSpec(module, &rules_spec, NULL);
    if (!tp)
        return -1;
    int rc = PyModule_AddType(module, (PyTypeObject *)tp);
    Py_DECREF(tp);
    if (rc < 0 || PyModule_AddFunctions(module, client_functions) < 0 ||
        PyModule_AddIntConstant(module, "CLIENT_TEXT_MAX", HIRATE_CLIENT_TEXT_MAX) < 0)
        return -1;
    return 0;
}
