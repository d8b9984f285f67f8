/* General replies through hiredis' redisReader, into bounded objects. */
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "reply.h"

struct hirate_rreader {
    redisReader *reader;
    size_t max_bytes, max_elems, max_str;
    size_t taken;               /* bytes of the reply being read so far */
    const char *broke;          /* which bound a reply object broke */
};

static hirate_rnode *node(const redisReadTask *task, char type)
{
    hirate_rreader *r = task->privdata;
    (void)r;
    hirate_rnode *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->type = type;
    if (task->parent) {
        hirate_rnode *parent = task->parent->obj;
        parent->elem[task->idx] = n;
    }
    return n;
}

static void *create_string(const redisReadTask *task, char *str, size_t len)
{
    hirate_rreader *r = task->privdata;
    if (len > r->max_str) {
        r->broke = "a string in the reply is too long";
        return NULL;
    }
    char type = task->type == REDIS_REPLY_ERROR ? '-' : task->type == REDIS_REPLY_STATUS ? '+' : '$';
    hirate_rnode *n = node(task, type);
    if (!n || !(n->str = malloc(len + 1))) {
        if (n && task->parent)
            ((hirate_rnode *)task->parent->obj)->elem[task->idx] = NULL;
        free(n);
        return NULL;
    }
    memcpy(n->str, str, len);
    n->str[len] = '\0';
    n->len = len;
    return n;
}

#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
static void *create_array(const redisReadTask *task, size_t elements)
#else
static void *create_array(const redisReadTask *task, int elements)
#endif
{
    hirate_rreader *r = task->privdata;
    if ((size_t)elements > r->max_elems) {
        r->broke = "an array in the reply has too many elements";
        return NULL;
    }
    hirate_rnode *n = node(task, '*');
    if (!n)
        return NULL;
    if (elements > 0 && !(n->elem = calloc((size_t)elements, sizeof *n->elem))) {
        if (task->parent)
            ((hirate_rnode *)task->parent->obj)->elem[task->idx] = NULL;
        free(n);
        return NULL;
    }
    n->len = (size_t)elements;
    return n;
}

static void *create_integer(const redisReadTask *task, long long value)
{
    hirate_rnode *n = node(task, ':');
    if (n)
        n->integer = value;
    return n;
}

static void *create_nil(const redisReadTask *task)
{
    return node(task, 0);
}

void hirate_rnode_free(hirate_rnode *n)
{
    if (!n)
        return;
    for (size_t i = 0; n->type == '*' && i < n->len; i++)
        hirate_rnode_free(n->elem[i]);
    free(n->elem);
    free(n->str);
    free(n);
}

static void free_object(void *obj)
{
    hirate_rnode_free(obj);
}

static redisReplyObjectFunctions functions = {
    .createString = create_string,
    .createArray = create_array,
    .createInteger = create_integer,
    .createNil = create_nil,
    .freeObject = free_object,
};

hirate_rreader *hirate_rreader_new(size_t max_bytes, size_t max_elems, size_t max_str)
{
    hirate_rreader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (!(r->reader = redisReaderCreateWithFunctions(&functions))) {
        free(r);
        return NULL;
    }
    r->reader->privdata = r;
    r->max_bytes = max_bytes;
    r->max_elems = max_elems;
    r->max_str = max_str;
    return r;
}

void hirate_rreader_free(hirate_rreader *r)
{
    if (!r)
        return;
    redisReaderFree(r->reader);
    free(r);
}

size_t hirate_rreader_pending(const hirate_rreader *r)
{
    return r->reader->len - r->reader->pos;
}

int hirate_rreader_feed(hirate_rreader *r, const char *buf, size_t len, const char **why)
{
    if (r->taken + len > r->max_bytes) {
        *why = "the reply is longer than the longest reply accepted";
        return -1;
    }
    if (len && redisReaderFeed(r->reader, buf, len) != REDIS_OK) {
        *why = "out of memory";
        return -1;
    }
    r->taken += len;
    return 0;
}

int hirate_rreader_next(hirate_rreader *r, hirate_rnode **out, const char **why)
{
    void *reply = NULL;
    *out = NULL;
    if (redisReaderGetReply(r->reader, &reply) != REDIS_OK) {
        *why = r->broke ? r->broke
               : r->reader->err == REDIS_ERR_PROTOCOL ? "the bytes are not RESP"
                                                      : "out of memory";
        return -1;
    }
    if (!reply)
        return 0;
    /* The next reply's bound starts with the bytes left over. */
    r->taken = hirate_rreader_pending(r);
    *out = reply;
    return 1;
}
