/*
 * fork() safety. Every live limiter is on one list; around fork() its locks
 * are taken (so the child never inherits a lock held by a thread that does
 * not exist there) and, in the child, its inherited connections are closed.
 */
#ifndef HIRATE_FORK_H
#define HIRATE_FORK_H

typedef struct hirate_fork_node {
    struct hirate_fork_node *prev, *next;
    void (*prepare)(struct hirate_fork_node *);
    void (*parent)(struct hirate_fork_node *);
    void (*child)(struct hirate_fork_node *);
} hirate_fork_node;

void hirate_fork_register(hirate_fork_node *n);
void hirate_fork_unregister(hirate_fork_node *n);

#endif
