/*
 * TLS for the blocking client, through OpenSSL (1.1.1 or 3.x): one context
 * per limiter (CA file or directory, else the system's trust store; client
 * certificate and key; TLS 1.2 at least), and per connection the SNI and the
 * name that the certificate must carry, checked as OpenSSL checks them.
 */
#ifndef HIRATE_TLS_H
#define HIRATE_TLS_H

#include <stddef.h>

typedef struct hirate_tls_ctx hirate_tls_ctx;

typedef struct hirate_tls_cfg {
    const char *ca_file, *ca_dir, *cert_file, *key_file;   /* NULL: not set */
    int verify;
} hirate_tls_cfg;

/* NULL on failure, with HIRATE_ETLS (or HIRATE_ENOMEM) in *rc and a message
 * in err naming the file and what is wrong with it. */
hirate_tls_ctx *hirate_tls_ctx_new(const hirate_tls_cfg *cfg, int *rc, char *err, size_t errlen);
void hirate_tls_ctx_free(hirate_tls_ctx *ctx);

/* The OpenSSL context inside (an SSL_CTX *), for transport.c. */
struct ssl_ctx_st *hirate__tls_ssl_ctx(hirate_tls_ctx *ctx);

/* A context that verifies nothing, for the mismatch probe (made once). */
hirate_tls_ctx *hirate_tls_probe_ctx(void);

#endif
