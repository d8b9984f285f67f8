/*
 * The items of a batch, read from Python's (key, cost) pairs and checked
 * before any is decided, for allow_many (limiter.c) and the Op of
 * _op_start (op.c); and an item's outcome as Python sees it.
 */
#include "_hirate.h"

void batch_clear(batch *b)
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
int value_check(hstate *st, const void *key, size_t keylen, int64_t cost)
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
int batch_from(hstate *st, const char *fname, PyObject *pairs, batch *b)
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
int batch_bands(batch *b, int nbands)
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
int batch_msgs(batch *b)
{
    size_t m = b->n > 0 ? (size_t)b->n : 1;
    if (!(b->msgs = PyMem_Calloc(m, HIRATE_ERRMSG_SIZE))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Item i's message, or NULL (then the code's words serve). */
const char *batch_msg(const batch *b, Py_ssize_t i)
{
    return b->msgs ? b->msgs + (size_t)i * HIRATE_ERRMSG_SIZE : NULL;
}

/* Decides every item of b in memory (no URL), as allow_many and the Op of a
 * limiter without Redis do: one by one, in order, with band figures when b
 * has room for them, and each failed item's message when it has room for
 * them. */
void batch_decide_here(hirate_limiter *lim, batch *b, int spend, int64_t now_us)
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
PyObject *item_result(hstate *st, const hirate_item *it, const char *msg,
                             const hirate_decision *bv, int nb)
{
    if (it->rc == 0)
        return decision_new_bands(st, &it->decision, bv, nb);
    return error_obj(st, it->rc, msg);
}
