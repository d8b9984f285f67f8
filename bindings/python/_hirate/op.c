/*
 * The no-I/O binding that hirate.AsyncLimiter runs on: Limiter._endpoint,
 * _handshake_start and the Handshake type, _op_start, _op_start_reset,
 * _op_start_check and the Op type wrap the public no-I/O API of hirate_io.h,
 * so that AsyncLimiter does its own socket I/O on the event loop while the
 * core keeps every rule: the bytes, what the replies mean, the reconnect
 * backoff, the breaker, the deny cache and the policy. For a Redis Cluster
 * or a Sentinel service the same hooks take a node (_endpoint(node),
 * _handshake_start(node)), and an Op's rounds of legs are there (legs,
 * leg_node, leg_request, leg_feed, leg_fail, leg_drop, next): which node,
 * what a redirection means, where the master is and when to ask the
 * sentinels again stay the core's.
 */
#include "_hirate.h"

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

PyObject *limiter_op_start(PyObject *op, PyObject *args, PyObject *kw)
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
PyObject *limiter_op_start_reset(PyObject *op, PyObject *key)
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

PyType_Spec op_spec = {
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

PyObject *limiter_handshake_start(PyObject *op, PyObject *args, PyObject *kw)
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

PyType_Spec hs_spec = {
    .name = "hirate._hirate.Handshake",
    .basicsize = sizeof(HandshakeObject),
    .flags = Py_TPFLAGS_DEFAULT | HR_IMMUTABLE,
    .slots = hs_slots,
};

/* ---- endpoints ------------------------------------------------------------- */

/* A path of the endpoint (a socket, a TLS file) as str, or None. */
static PyObject *path_or_none(const char *p)
{
    return p ? PyUnicode_DecodeFSDefault(p) : Py_NewRef(Py_None);
}

PyObject *limiter_endpoint(PyObject *op, PyObject *args, PyObject *kw)
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

/* ---- the health check ------------------------------------------------------- */

/* _op_start_check() -> Op: check() with the caller doing the I/O. */
PyObject *limiter_op_start_check(PyObject *op, PyObject *unused)
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
