/*
 * A RESP server in a thread of the test program, for what a real Redis will
 * not do: malformed, hostile or oddly timed replies. It listens on a free
 * loopback port, reads whole commands (RESP arrays of bulk strings, as every
 * client sends them) and asks the test's handler what to answer: a list of
 * steps, each a write of some bytes, a pause, or closing the connection.
 *
 * The handler runs in the server's thread. The bytes it hands over are not
 * copied: they must stay valid until the handler is called again (static or
 * long-lived buffers), which also keeps the server from allocating per reply.
 */
#ifndef HIRATE_TEST_MOCK_SERVER_H
#define HIRATE_TEST_MOCK_SERVER_H

#include <stddef.h>
#include <stdint.h>

#define MOCK_MAX_ARGS 16
#define MOCK_MAX_STEPS 256

typedef struct mock_cmd {
    int argc;                        /* as sent; at most MOCK_MAX_ARGS are kept */
    const char *argv[MOCK_MAX_ARGS]; /* not NUL-terminated: use lens */
    size_t lens[MOCK_MAX_ARGS];
    uint64_t conn;                   /* which connection (1, 2, ... in accept order) */
} mock_cmd;

typedef struct mock_reply {
    int n;
    struct mock_step {
        int kind;                    /* MOCK_SEND, MOCK_PAUSE or MOCK_CLOSE */
        const char *bytes;
        size_t len;
        int ms;
    } steps[MOCK_MAX_STEPS];
} mock_reply;

enum { MOCK_SEND = 1, MOCK_PAUSE, MOCK_CLOSE };

/* Steps of a reply, run in order once the handler returns. A reply with no
 * steps answers nothing (the client waits for its timeout). */
void mock_send(mock_reply *r, const void *bytes, size_t len);
void mock_send_str(mock_reply *r, const char *s);
void mock_pause(mock_reply *r, int ms);
void mock_close(mock_reply *r);

typedef void (*mock_handler)(void *arg, const mock_cmd *cmd, mock_reply *reply);

typedef struct mock_stats {
    uint64_t accepted;        /* connections accepted */
    uint64_t open;            /* connections open now */
    uint64_t commands;        /* whole commands read */
    uint64_t client_closes;   /* connections the client closed */
    uint64_t server_closes;   /* connections closed by a MOCK_CLOSE step */
    uint64_t bytes_in;        /* bytes read from clients */
} mock_stats;

typedef struct mock_server mock_server;

/* Starts the server thread. Returns 0, or -1 with a message on stderr. */
int mock_start(mock_server **out, mock_handler handler, void *arg);
int mock_port(const mock_server *m);
/* "redis://127.0.0.1:<port>" */
const char *mock_url(const mock_server *m);
void mock_get_stats(mock_server *m, mock_stats *out);
/* Closes every connection, stops the thread and frees the server. NULL is ignored. */
void mock_stop(mock_server *m);

#endif
