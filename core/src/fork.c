/* The list of live limiters and the pthread_atfork handlers that walk it. */
#include <pthread.h>

#include "fork.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static hirate_fork_node registry = {&registry, &registry, 0, 0, 0};
static pthread_once_t handlers_once = PTHREAD_ONCE_INIT;

/* Locks are taken in list order and released in reverse. */
static void before_fork(void)
{
    pthread_mutex_lock(&registry_lock);
    for (hirate_fork_node *n = registry.next; n != &registry; n = n->next)
        n->prepare(n);
}

static void after_fork_parent(void)
{
    for (hirate_fork_node *n = registry.prev; n != &registry; n = n->prev)
        n->parent(n);
    pthread_mutex_unlock(&registry_lock);
}

static void after_fork_child(void)
{
    for (hirate_fork_node *n = registry.prev; n != &registry; n = n->prev)
        n->child(n);
    pthread_mutex_unlock(&registry_lock);
}

static void install_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void hirate_fork_register(hirate_fork_node *n)
{
    pthread_once(&handlers_once, install_handlers);
    pthread_mutex_lock(&registry_lock);
    n->next = &registry;
    n->prev = registry.prev;
    registry.prev->next = n;
    registry.prev = n;
    pthread_mutex_unlock(&registry_lock);
}

void hirate_fork_unregister(hirate_fork_node *n)
{
    pthread_mutex_lock(&registry_lock);
    n->prev->next = n->next;
    n->next->prev = n->prev;
    pthread_mutex_unlock(&registry_lock);
}
