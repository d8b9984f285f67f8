/* The link to one Redis server: settings, endpoint, reconnect backoff. */
#include <errno.h>
#include <stdarg.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "handshake.h"
#include "link.h"
#include "memory.h"

#define BACKOFF_FIRST_MS 10
#define BACKOFF_LAST_MS 1000

/* The TLS options by name, for checking and copying them alike. */
#define TLS_STRINGS(X) X(tls_ca_file) X(tls_ca_dir) X(tls_cert_file) X(tls_key_file) \
                       X(tls_server_name)

static int copy_option(char **dst, const char *src, const char *name, char *err, size_t errlen)
{
    if (!src)
        return 0;
    if (!*src || strlen(src) > 4095)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "%s must be 1 to 4095 bytes, got %zu",
                            name, strlen(src));
    if (!(*dst = strdup(src)))
        return hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
    return 0;
}

/* A file the TLS context will read must be readable now: a typo in a path is
 * a misconfiguration to report when the limiter is made, not an outage. */
static int check_readable(const char *path, const char *name, int dir, char *err, size_t errlen)
{
    if (!path)
        return 0;
    FILE *f = dir ? NULL : fopen(path, "r");
    if (dir ? access(path, R_OK | X_OK) == 0 : f != NULL) {
        if (f)
            fclose(f);
        return 0;
    }
    return hirate__fail(err, errlen, HIRATE_ETLS, "%s %s: %s", name, path, strerror(errno));
}

/* The sentinels' credentials, wiped before they are freed. */
static void free_secrets(hirate_link *k)
{
    if (k->sentinel_password)
        memset(k->sentinel_password, 0, strlen(k->sentinel_password));
    free(k->sentinel_password);
    free(k->sentinel_user);
    k->sentinel_password = k->sentinel_user = NULL;
}

int hirate_link_init(hirate_link *k, const hirate_options *o, char *err, size_t errlen)
{
    int rc;
    memset(k, 0, sizeof *k);
    if ((rc = hirate_url_parse(o->url, &k->url, err, errlen)) < 0)
        return rc;
    k->connect_timeout_ms = o->connect_timeout_ms;
    k->timeout_ms = o->timeout_ms;
    k->role = k->url.sentinel ? HIRATE_LINK_SENTINEL : HIRATE_LINK_REDIS;
    k->functions = o->functions;
    k->log = o->log;
    k->log_arg = o->log_arg;
    if (o->functions != 0 && o->functions != 1)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "functions must be 0 or 1, got %d",
                            o->functions);
    if (!k->url.sentinel && (o->sentinel_username || o->sentinel_password))
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "%s is set, but the URL is not redis+sentinel:// (or "
                            "rediss+sentinel://)",
                            o->sentinel_username ? "sentinel_username" : "sentinel_password");
    if (o->sentinel_username && !o->sentinel_password)
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "sentinel_username needs sentinel_password");
    if ((rc = copy_option(&k->sentinel_user, o->sentinel_username, "sentinel_username", err,
                          errlen)) < 0 ||
        (rc = copy_option(&k->sentinel_password, o->sentinel_password, "sentinel_password", err,
                          errlen)) < 0)
        goto fail;
    if (o->tls_verify != 0 && o->tls_verify != 1)
        return hirate__fail(err, errlen, HIRATE_EOPTION, "tls_verify must be 0 or 1, got %d",
                            o->tls_verify);
    k->tls_verify = o->tls_verify;
    if (!k->url.tls) {
        /* TLS settings on a plain URL mean the URL is not what was meant. */
#define HIRATE_PLAIN_CHECK_(f) \
        if (o->f) return hirate__fail(err, errlen, HIRATE_EOPTION, \
                                      #f " is set, but the URL is not rediss:// (TLS)");
        TLS_STRINGS(HIRATE_PLAIN_CHECK_)
#undef HIRATE_PLAIN_CHECK_
        if (!o->tls_verify)
            return hirate__fail(err, errlen, HIRATE_EOPTION,
                                "tls_verify is off, but the URL is not rediss:// (TLS)");
    }
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
        return hirate__fail(err, errlen, HIRATE_EOPTION,
                            "tls_cert_file and tls_key_file go together: set both or neither");
#define HIRATE_COPY_(f) \
    if ((rc = copy_option(&k->f, o->f, #f, err, errlen)) < 0) goto fail;
    TLS_STRINGS(HIRATE_COPY_)
#undef HIRATE_COPY_
    if ((rc = check_readable(k->tls_ca_file, "tls_ca_file", 0, err, errlen)) < 0 ||
        (rc = check_readable(k->tls_ca_dir, "tls_ca_dir", 1, err, errlen)) < 0 ||
        (rc = check_readable(k->tls_cert_file, "tls_cert_file", 0, err, errlen)) < 0 ||
        (rc = check_readable(k->tls_key_file, "tls_key_file", 0, err, errlen)) < 0)
        goto fail;
    k->server_name_given = k->tls_server_name != NULL;
    if (k->url.tls && !k->tls_server_name && !(k->tls_server_name = strdup(k->url.host))) {
        rc = hirate__fail(err, errlen, HIRATE_ENOMEM, "out of memory");
        goto fail;
    }
    if (k->url.tls) {
        /* Made now, so that a certificate or key OpenSSL cannot use is
         * reported by hirate_limiter_new, not by the first call. */
        hirate_tls_cfg tc = {k->tls_ca_file, k->tls_ca_dir, k->tls_cert_file, k->tls_key_file,
                             k->tls_verify};
        if (!(k->tls = hirate_tls_ctx_new(&tc, &rc, err, errlen)))
            goto fail;
    }
    return 0;
fail:
#define HIRATE_FREE_(f) free(k->f); k->f = NULL;
    TLS_STRINGS(HIRATE_FREE_)
#undef HIRATE_FREE_
    free_secrets(k);
    memset(&k->url, 0, sizeof k->url);
    return rc;
}

int hirate_link_clone(hirate_link *k, const hirate_link *seed, const char *host, int port,
                      int role)
{
    memset(k, 0, sizeof *k);
    k->url = seed->url;
    snprintf(k->url.host, sizeof k->url.host, "%s", host);
    k->url.port = port;
    k->url.seeds[0] = '\0';
    k->role = role;
    k->functions = seed->functions;
    k->log = seed->log;
    k->log_arg = seed->log_arg;
    k->connect_timeout_ms = seed->connect_timeout_ms;
    k->timeout_ms = seed->timeout_ms;
    k->tls_verify = seed->tls_verify;
    k->server_name_given = seed->server_name_given;
    k->tls = seed->tls;
    k->tls_borrowed = 1;
    int ok = 1;
#define HIRATE_COPY_(f) \
    if (seed->f && !(k->f = strdup(seed->f))) ok = 0;
    TLS_STRINGS(HIRATE_COPY_)
    HIRATE_COPY_(sentinel_user)
    HIRATE_COPY_(sentinel_password)
#undef HIRATE_COPY_
    if (ok && k->url.tls && !k->server_name_given) {
        free(k->tls_server_name);
        ok = (k->tls_server_name = strdup(host)) != NULL;
    }
    if (!ok) {
        hirate_link_destroy(k);
        return HIRATE_ENOMEM;
    }
    return 0;
}

void hirate_link_start(hirate_link *k)
{
    pthread_mutex_init(&k->lock, NULL);
    k->started = 1;
    k->jitter = (uint64_t)(uintptr_t)k * 0x9e3779b97f4a7c15ull ^ (uint64_t)hirate_monotonic_us();
    k->jitter |= 1;
}

void hirate_link_destroy(hirate_link *k)
{
    if (!k->tls_borrowed)
        hirate_tls_ctx_free(k->tls);
#define HIRATE_FREE_(f) free(k->f);
    TLS_STRINGS(HIRATE_FREE_)
#undef HIRATE_FREE_
    free_secrets(k);
    if (k->started)
        pthread_mutex_destroy(&k->lock);
    /* The password lived in url: do not leave it in freed memory. */
    memset(k, 0, sizeof *k);
}

void hirate_link_endpoint(const hirate_link *k, hirate_endpoint *out)
{
    const hirate_url *u = &k->url;
    memset(out, 0, sizeof *out);
    out->is_unix = u->is_unix;
    snprintf(out->host, sizeof out->host, "%s", u->host);
    out->port = u->port;
    snprintf(out->path, sizeof out->path, "%s", u->path);
    if (u->is_unix)
        snprintf(out->where, sizeof out->where, "%s", u->path);
    else if (strchr(u->host, ':'))
        snprintf(out->where, sizeof out->where, "[%s]:%d", u->host, u->port);
    else
        snprintf(out->where, sizeof out->where, "%s:%d", u->host, u->port);
    /* A TLS handshake that gets no answer may be a plain port: a quarter of
     * the connect timeout is kept back to ask it (see handshake.c). */
    out->probe_timeout_ms = k->connect_timeout_ms / 4 > 0 ? k->connect_timeout_ms / 4 : 1;
    out->connect_timeout_ms = k->connect_timeout_ms;
    if (u->tls && k->connect_timeout_ms > 1)
        out->connect_timeout_ms = k->connect_timeout_ms - out->probe_timeout_ms;
    out->timeout_ms = k->timeout_ms;
    out->tls = u->tls;
    out->tls_verify = u->tls ? k->tls_verify : 0;
    out->tls_ca_file = k->tls_ca_file;
    out->tls_ca_dir = k->tls_ca_dir;
    out->tls_cert_file = k->tls_cert_file;
    out->tls_key_file = k->tls_key_file;
    out->tls_server_name = k->tls_server_name;
}

/* backoff +-25%, so that processes that failed together retry apart. */
static int64_t jittered_us(hirate_link *k, int ms)
{
    uint64_t x = k->jitter;   /* xorshift64, under the lock */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    k->jitter = x;
    int64_t us = (int64_t)ms * 1000;
    return us * 3 / 4 + (int64_t)(x % (uint64_t)(us / 2 + 1));
}

int hirate_link_handshake(hirate_link *k, hirate_handshake **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_mutex_lock(&k->lock);
    int64_t now = hirate_monotonic_us();
    if (k->failing && now < k->next_try_us) {
        /* The failure's own code: a wrong password stays a configuration
         * error during the backoff, an outage stays an outage. */
        int rc = hirate__fail(err, errlen, k->code, "not reconnecting for %lld ms after: %s",
                              (long long)((k->next_try_us - now + 999) / 1000), k->why);
        pthread_mutex_unlock(&k->lock);
        return rc;
    }
    if (k->failing) {
        /* This caller tries; until its outcome is known the others wait. */
        k->backoff_ms = k->backoff_ms * 2 > BACKOFF_LAST_MS ? BACKOFF_LAST_MS : k->backoff_ms * 2;
        k->next_try_us = now + jittered_us(k, k->backoff_ms);
    }
    pthread_mutex_unlock(&k->lock);
    __atomic_fetch_add(&k->connects, 1, __ATOMIC_RELAXED);
    int rc = hirate__handshake_new(k, out);
    return rc < 0 ? hirate__fail(err, errlen, rc, "out of memory for a handshake") : 0;
}

void hirate_link_outcome(hirate_link *k, int rc, const char *why)
{
    if (rc == HIRATE_ECLOSED)
        return;   /* given up: nothing was learnt about the server */
    pthread_mutex_lock(&k->lock);
    if (rc == 0) {
        __atomic_store_n(&k->failing, 0, __ATOMIC_RELAXED);
        k->backoff_ms = 0;
    } else {
        if (!k->failing) {
            __atomic_store_n(&k->failing, 1, __ATOMIC_RELAXED);
            k->backoff_ms = BACKOFF_FIRST_MS;
            k->next_try_us = hirate_monotonic_us() + jittered_us(k, k->backoff_ms);
        }
        k->code = rc;
        snprintf(k->why, sizeof k->why, "%s", why ? why : hirate_strerror(rc));
    }
    pthread_mutex_unlock(&k->lock);
}

void hirate_link_fork_prepare(hirate_link *k)
{
    pthread_mutex_lock(&k->lock);
}

void hirate_link_fork_release(hirate_link *k, int child)
{
    if (child) {
        /* The child starts with a clean slate, as its pool does. */
        __atomic_store_n(&k->failing, 0, __ATOMIC_RELAXED);
        k->backoff_ms = 0;
    }
    pthread_mutex_unlock(&k->lock);
}

void hirate_link_log(const hirate_link *k, int level, const char *fmt, ...)
{
    if (!k->log)
        return;
    char msg[HIRATE_ERRMSG_SIZE * 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    k->log(k->log_arg, level, msg);
}

void hirate_link_no_functions(hirate_link *k, const char *msg, size_t len)
{
    int was = 1;
    /* Once: the first caller to turn them off says so. */
    if (!__atomic_compare_exchange_n(&k->functions, &was, 0, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return;
    hirate_endpoint ep;
    hirate_link_endpoint(k, &ep);
    char quoted[HIRATE_ERRMSG_SIZE];
    hirate__fail_quoting(quoted, sizeof quoted, 0, "Redis replied: ", msg, len);
    hirate_link_log(k, HIRATE_LOG_WARNING,
                    "Redis Functions are not usable on %s (%s): deciding with EVALSHA there",
                    ep.where, quoted);
}
