/* The blocking client's TLS contexts (see tls.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "errors.h"
#include "hirate.h"
#include "tls.h"

/* The SSL_CTX is shared by every connection of a limiter (OpenSSL makes that
 * safe); what belongs to one connection, such as its session, lives with it. */
struct hirate_tls_ctx {
    SSL_CTX *ssl;
};

/* OpenSSL's reason for the last failure ("key values mismatch"), or the
 * system's when a file could not be read ("No such file or directory"), and
 * an empty queue for the next caller of this thread. */
static const char *reason(void)
{
    const char *why = NULL;
    int sys = 0;
    for (unsigned long e; (e = ERR_get_error()) != 0;) {
        if (ERR_GET_LIB(e) == ERR_LIB_SYS && !sys)
            sys = ERR_GET_REASON(e);
        else if (ERR_reason_error_string(e))
            why = ERR_reason_error_string(e);
    }
    if (sys)
        return strerror(sys);
    return why ? why : "unknown error";
}

static hirate_tls_ctx *ctx_make(int verify, int *rc, char *err, size_t errlen)
{
    hirate_tls_ctx *c = calloc(1, sizeof *c);
    if (!c || !(c->ssl = SSL_CTX_new(TLS_client_method()))) {
        free(c);
        *rc = hirate__fail(err, errlen, HIRATE_ENOMEM, "TLS: out of memory");
        ERR_clear_error();
        return NULL;
    }
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
    /* Sessions are kept by each pooled connection (hirate_sock_close hands
     * its session out) and offered again by that connection only: a
     * session is never shared between threads, so the context stores none. */
    SSL_CTX_set_session_cache_mode(c->ssl, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    /* SSL_read returns after a record without data (a TLS 1.3 session
     * ticket), so that the caller's deadline, not each recv's timeout,
     * bounds a read. */
    SSL_CTX_clear_mode(c->ssl, SSL_MODE_AUTO_RETRY);
    /* A record in one recv() rather than its header and then its body: a
     * lone call stays one send and one receive over TLS too. */
    SSL_CTX_set_read_ahead(c->ssl, 1);
    SSL_CTX_set_verify(c->ssl, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    return c;
}

hirate_tls_ctx *hirate_tls_ctx_new(const hirate_tls_cfg *cfg, int *rc, char *err, size_t errlen)
{
    hirate_tls_ctx *c = ctx_make(cfg->verify, rc, err, errlen);
    if (!c)
        return NULL;
    const char *file = NULL;
    if (cfg->ca_file || cfg->ca_dir) {
        if (!SSL_CTX_load_verify_locations(c->ssl, cfg->ca_file, cfg->ca_dir)) {
            file = cfg->ca_file ? cfg->ca_file : cfg->ca_dir;
            *rc = hirate__fail(err, errlen, HIRATE_ETLS, "TLS CA %s %s: %s",
                               cfg->ca_file ? "file" : "directory", file, reason());
            goto fail;
        }
    } else if (!SSL_CTX_set_default_verify_paths(c->ssl)) {
        *rc = hirate__fail(err, errlen, HIRATE_ETLS, "TLS: the system's trust store: %s", reason());
        goto fail;
    }
    if (cfg->cert_file || cfg->key_file) {
        if (!cfg->cert_file || !cfg->key_file) {
            *rc = hirate__fail(err, errlen, HIRATE_ETLS, "TLS client %s %s needs a %s too",
                               cfg->cert_file ? "certificate" : "key",
                               cfg->cert_file ? cfg->cert_file : cfg->key_file,
                               cfg->cert_file ? "key" : "certificate");
            goto fail;
        }
        if (!SSL_CTX_use_certificate_chain_file(c->ssl, cfg->cert_file)) {
            *rc = hirate__fail(err, errlen, HIRATE_ETLS, "TLS client certificate %s: %s",
                               cfg->cert_file, reason());
            goto fail;
        }
        if (!SSL_CTX_use_PrivateKey_file(c->ssl, cfg->key_file, SSL_FILETYPE_PEM)) {
            *rc = hirate__fail(err, errlen, HIRATE_ETLS, "TLS client key %s (for %s): %s",
                               cfg->key_file, cfg->cert_file, reason());
            goto fail;
        }
        if (!SSL_CTX_check_private_key(c->ssl)) {
            *rc = hirate__fail(err, errlen, HIRATE_ETLS,
                               "TLS client key %s does not match the certificate %s: %s",
                               cfg->key_file, cfg->cert_file, reason());
            goto fail;
        }
    }
    *rc = 0;
    return c;
fail:
    hirate_tls_ctx_free(c);
    return NULL;
}

void hirate_tls_ctx_free(hirate_tls_ctx *ctx)
{
    if (!ctx)
        return;
    SSL_CTX_free(ctx->ssl);
    free(ctx);
}

/* For transport.c: the SSL_CTX inside. */
SSL_CTX *hirate__tls_ssl_ctx(hirate_tls_ctx *ctx)
{
    return ctx->ssl;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static hirate_tls_ctx *probe_ctx;

static void probe_make(void)
{
    int rc;
    probe_ctx = ctx_make(0, &rc, NULL, 0);
}

hirate_tls_ctx *hirate_tls_probe_ctx(void)
{
    /* Made on first use and kept for the life of the process: it holds no
     * setting of any limiter, and probes are rare. */
    pthread_once(&probe_once, probe_make);
    return probe_ctx;
}
