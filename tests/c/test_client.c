/*
 * Client identity: every case of tests/vectors/client_ip.json, the file the
 * Python and Lua bindings check too (config, peer and header values -> the
 * client address, its key, its identity and its bucket key; bucket keys of
 * identities; bad configs and their messages), then SHA-256 against the
 * FIPS 180-4 examples.
 *
 *   test_client [client_ip.json]   (default: under $HIRATE_SOURCE_DIR)
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hirate.h"
#include "sha256.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

static const char *str_or_null(const cJSON *j)
{
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static int compile(const cJSON *cfg, hirate_client_ip **c, char *err, size_t errlen)
{
    const char *list[16];
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(cfg, "trusted_proxies"))
        list[n++] = e->valuestring;
    const cJSON *hops = cJSON_GetObjectItem(cfg, "proxy_hops");
    const cJSON *sub = cJSON_GetObjectItem(cfg, "ipv6_subnet");
    return hirate_client_ip_new(c, list, n, hops ? hops->valuedouble : 0,
                                str_or_null(cJSON_GetObjectItem(cfg, "header")),
                                sub ? sub->valuedouble : 64, err, errlen);
}

static void resolve_cases(const cJSON *cases)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, cases) {
        const char *rule = cJSON_GetObjectItem(k, "rule")->valuestring;
        hirate_client_ip *c;
        char err[HIRATE_ERRMSG_SIZE];
        CHECK_EQ_I64(compile(cJSON_GetObjectItem(k, "config"), &c, err, sizeof err), 0);
        const char *values[8];
        size_t lens[8], n = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(k, "values")) {
            values[n] = v->valuestring;
            lens[n++] = strlen(v->valuestring);
        }
        const char *peer = str_or_null(cJSON_GetObjectItem(k, "peer"));
        char out[HIRATE_CLIENT_TEXT_MAX];
        int kind = hirate_client_ip_resolve(c, peer, peer ? strlen(peer) : 0, values, lens, n,
                                            out, sizeof out);
        const char *addr = kind == HIRATE_CLIENT_ADDRESS ? out
                           : kind == HIRATE_CLIENT_AS_GIVEN ? peer : NULL;
        const char *want = str_or_null(cJSON_GetObjectItem(k, "address"));
        if (!want) {
            CHECK_EQ_I64(kind, HIRATE_CLIENT_NONE);
        } else {
            CHECK_EQ_STR(addr, want);
        }
        char keytext[HIRATE_CLIENT_TEXT_MAX];
        int kk = hirate_client_ip_key(c, addr, addr ? strlen(addr) : 0, keytext, sizeof keytext);
        const char *key = kk == HIRATE_CLIENT_ADDRESS ? keytext : kk == HIRATE_CLIENT_AS_GIVEN ? addr
                                                                                               : NULL;
        const char *want_key = str_or_null(cJSON_GetObjectItem(k, "key"));
        if (!want_key)
            CHECK_EQ_I64(kk, HIRATE_CLIENT_NONE);
        else
            CHECK_EQ_STR(key, want_key);
        char ident[600], bk[1200];
        size_t il, bl;
        CHECK_EQ_I64(hirate_ident(HIRATE_IDENT_ADDRESS, key, key ? strlen(key) : 0, ident,
                                  sizeof ident, &il), 0);
        CHECK_EQ_STR(ident, cJSON_GetObjectItem(k, "ident")->valuestring);
        const char *scope = cJSON_GetObjectItem(k, "scope")->valuestring;
        const char *head = cJSON_GetObjectItem(k, "head")->valuestring;
        CHECK_EQ_I64(hirate_bucket_key(ident, il, scope, strlen(scope), head, strlen(head), bk,
                                       sizeof bk, &bl), 0);
        CHECK_EQ_STR(bk, cJSON_GetObjectItem(k, "bucket_key")->valuestring);
        if (check_failed_)
            fprintf(stderr, "  (after %s)\n", rule);
        hirate_client_ip_free(c);
    }
}

static void bucket_key_cases(const cJSON *cases)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, cases) {
        const char *ident = cJSON_GetObjectItem(k, "ident")->valuestring;
        const char *scope = str_or_null(cJSON_GetObjectItem(k, "scope"));
        const char *head = str_or_null(cJSON_GetObjectItem(k, "head"));
        const char *want = cJSON_GetObjectItem(k, "bucket_key")->valuestring;
        char out[1200];
        size_t n;
        CHECK_EQ_I64(hirate_bucket_key(ident, strlen(ident), scope, scope ? strlen(scope) : 0, head,
                                       head ? strlen(head) : 0, out, sizeof out, &n), 0);
        CHECK_EQ_STR(out, want);
        CHECK_EQ_I64(n, strlen(want));
        /* Too small a buffer: the length, nothing written. */
        char tiny[4] = "abc";
        CHECK_EQ_I64(hirate_bucket_key(ident, strlen(ident), scope, scope ? strlen(scope) : 0, head,
                                       head ? strlen(head) : 0, tiny, sizeof tiny, &n), 0);
        CHECK_EQ_I64(n, strlen(want));
        CHECK_EQ_STR(tiny, "abc");
    }
}

static void error_cases(const cJSON *cases)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, cases) {
        hirate_client_ip *c = (hirate_client_ip *)1;
        char err[HIRATE_ERRMSG_SIZE];
        CHECK_EQ_I64(compile(cJSON_GetObjectItem(k, "config"), &c, err, sizeof err), HIRATE_EOPTION);
        CHECK(c == NULL);
        CHECK_EQ_STR(err, cJSON_GetObjectItem(k, "error")->valuestring);
    }
}

static void the_api_edges(void)
{
    hirate_client_ip *c;
    char err[HIRATE_ERRMSG_SIZE];
    CHECK_EQ_I64(hirate_client_ip_new(&c, NULL, 0, 1.5, NULL, 64, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "proxy_hops must be a whole number from 0 to 64, got 1.5");
    const char *odd[] = {"1.2.3.4\"\\\n"};
    CHECK_EQ_I64(hirate_client_ip_new(&c, odd, 1, 0, NULL, 64, err, sizeof err), HIRATE_EOPTION);
    CHECK_EQ_STR(err, "trusted_proxies: \"1.2.3.4\\\"\\\\\\x0a\" is not an address or network "
                      "(e.g. '10.0.0.0/8', '::1', 'unix')");
    const char *ok[] = {" 10.0.0.0/8 ", "UNIX"};
    CHECK_EQ_I64(hirate_client_ip_new(&c, ok, 2, 0, "FORWARDED", 64, err, sizeof err), 0);
    CHECK_EQ_STR(hirate_client_ip_header(c), "Forwarded");
    CHECK_EQ_I64(hirate_client_ip_uses_header(c), 1);
    char out[HIRATE_CLIENT_TEXT_MAX];
    CHECK_EQ_I64(hirate_client_ip_resolve(c, "10.0.0.1", 8, NULL, NULL, 0, out, 8), HIRATE_EINVAL);
    /* Many hops: more than the walk holds on the stack. */
    char many[4000] = "";
    for (int i = 0; i < 100; i++)
        strcat(many, i ? ", for=10.0.0.9" : "for=198.51.100.1");
    const char *v[] = {many};
    size_t l[] = {strlen(many)};
    CHECK_EQ_I64(hirate_client_ip_resolve(c, "10.0.0.1", 8, v, l, 1, out, sizeof out),
                 HIRATE_CLIENT_ADDRESS);
    CHECK_EQ_STR(out, "198.51.100.1");
    hirate_client_ip_free(c);
    CHECK_EQ_I64(hirate_client_ip_new(&c, NULL, 0, 0, NULL, 64, err, sizeof err), 0);
    CHECK_EQ_STR(hirate_client_ip_header(c), "X-Forwarded-For");
    CHECK_EQ_I64(hirate_client_ip_uses_header(c), 0);
    CHECK_EQ_I64(hirate_client_ip_key(c, NULL, 0, out, sizeof out), HIRATE_CLIENT_NONE);
    hirate_client_ip_free(c);
    size_t n;
    CHECK_EQ_I64(hirate_ident(HIRATE_IDENT_KEY, "\0a", 2, out, sizeof out, &n), 0);
    CHECK_EQ_I64(n, 4);
    CHECK(memcmp(out, "k:\0a", 4) == 0);
    CHECK_EQ_I64(hirate_ident(7, "a", 1, out, sizeof out, &n), HIRATE_EINVAL);
}

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < HIRATE_SHA256_SIZE; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

/* FIPS 180-4's examples (NIST's SHA256.pdf) and lengths around the padding. */
static void sha256_vectors(void)
{
    uint8_t d[HIRATE_SHA256_SIZE];
    char h[65];
    hirate__sha256("abc", 3, d);
    hex(d, h);
    CHECK_EQ_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    hirate__sha256("", 0, d);
    hex(d, h);
    CHECK_EQ_STR(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hirate__sha256(m, strlen(m), d);
    hex(d, h);
    CHECK_EQ_STR(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m2 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                     "klmnopqrlmnopqrsmnopqrstnopqrstu";
    hirate__sha256(m2, strlen(m2), d);
    hex(d, h);
    CHECK_EQ_STR(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    hirate__sha256(a, 1000000, d);
    hex(d, h);
    CHECK_EQ_STR(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

int main(int argc, char **argv)
{
    char path[4096];
    if (argc > 1) {
        snprintf(path, sizeof path, "%s", argv[1]);
    } else {
        const char *src = getenv("HIRATE_SOURCE_DIR");
        if (!src) {
            fprintf(stderr, "usage: test_client [client_ip.json] (or set HIRATE_SOURCE_DIR)\n");
            return 2;
        }
        snprintf(path, sizeof path, "%s/tests/vectors/client_ip.json", src);
    }
    char *text = slurp(path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    if (!doc) {
        fprintf(stderr, "test_client: cannot read %s\n", path);
        return 2;
    }
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "resolve")) >= 40);
    resolve_cases(cJSON_GetObjectItem(doc, "resolve"));
    bucket_key_cases(cJSON_GetObjectItem(doc, "bucket_keys"));
    error_cases(cJSON_GetObjectItem(doc, "errors"));
    the_api_edges();
    sha256_vectors();
    cJSON_Delete(doc);
    free(text);
    return check_summary("test_client");
}
