/*
 * hirate_url_parse: what it accepts (every field exact), what it rejects with
 * HIRATE_EURL, and that no message ever quotes the password.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "hirate.h"
#include "url.h"

#define CANARY "s3cr3t-canary"

typedef struct ok_case {
    const char *rule;
    const char *url;
    int is_unix;
    const char *host;
    int port;
    const char *path;
    const char *user;
    const char *password;
    int db;
} ok_case;

static const ok_case accepted[] = {
    {"a bare host takes port 6379 and db 0",
     "redis://localhost", 0, "localhost", 6379, "", "", "", 0},
    {"an explicit port", "redis://10.0.0.7:6380", 0, "10.0.0.7", 6380, "", "", "", 0},
    {"the highest port", "redis://h:65535", 0, "h", 65535, "", "", "", 0},
    {"the lowest port", "redis://h:1", 0, "h", 1, "", "", "", 0},
    {"a db after the host", "redis://h/7", 0, "h", 6379, "", "", "", 7},
    {"port and db", "redis://h:6380/15", 0, "h", 6380, "", "", "", 15},
    {"user and password", "redis://rl:pw@h:1234/2", 0, "h", 1234, "", "rl", "pw", 2},
    {"a password without a user", "redis://:pw@h", 0, "h", 6379, "", "", "pw", 0},
    {"a percent-encoded password is decoded",
     "redis://u:p%40ss%3Aw%2Frd%25@h", 0, "h", 6379, "", "u", "p@ss:w/rd%", 0},
    {"a percent-encoded user is decoded", "redis://r%6C:x@h", 0, "h", 6379, "", "rl", "x", 0},
    {"the last '@' ends the userinfo", "redis://u:a@b@h", 0, "h", 6379, "", "u", "a@b", 0},
    {"an IPv6 host loses its brackets", "redis://[::1]:6380", 0, "::1", 6380, "", "", "", 0},
    {"an IPv6 host without a port", "redis://[fe80::1]/4", 0, "fe80::1", 6379, "", "", "", 4},
    {"an IPv6 host with credentials", "redis://u:p@[::1]:7000/1", 0, "::1", 7000, "", "u", "p", 1},
    {"a unix socket with a db", "unix:///tmp/redis.sock?db=3", 1, "", 6379, "/tmp/redis.sock", "", "", 3},
    {"a unix socket alone", "unix:///run/r.sock", 1, "", 6379, "/run/r.sock", "", "", 0},
    {"a unix socket with a password", "unix://:pw@/tmp/r.sock", 1, "", 6379, "/tmp/r.sock", "", "pw", 0},
    {"a unix socket with user, password and db",
     "unix://rl:p%40w@/tmp/r.sock?db=2", 1, "", 6379, "/tmp/r.sock", "rl", "p@w", 2},
};

typedef struct bad_case {
    const char *rule;
    const char *url;
    const char *mention;  /* a word the message must contain, or NULL */
} bad_case;

static const bad_case rejected[] = {
    {"an empty URL", "", NULL},
    {"http:// is not Redis", "http://h:6379", NULL},
    {"rediss:// keeps every rule of redis://: port 0", "rediss://h:0", "port"},
    {"rediss:// needs a host", "rediss://", "host"},
    {"a scheme without slashes", "redis:h", NULL},
    {"no scheme at all", "localhost:6379", NULL},
    {"port 0", "redis://h:0", "port"},
    {"port 65536", "redis://h:65536", "port"},
    {"a port that is not a number", "redis://h:abc", "port"},
    {"an empty port", "redis://h:", "port"},
    {"a negative port", "redis://h:-1", "port"},
    {"a port with trailing junk", "redis://h:63x", "port"},
    {"a huge port", "redis://h:99999999999999999999", "port"},
    {"db -1", "redis://h/-1", "database"},
    {"a db that is not a number", "redis://h/x", "database"},
    {"a db with trailing junk", "redis://h/3x", "database"},
    {"a db with a path after it", "redis://h/3/4", "database"},
    {"no host", "redis://", "host"},
    {"a port but no host", "redis://:6379", "host"},
    {"credentials but no host", "redis://:pw@", "host"},
    {"credentials and a port but no host", "redis://u:pw@:6379/1", "host"},
    {"an unclosed IPv6 bracket", "redis://[::1:6380", NULL},
    {"junk after an IPv6 host", "redis://[::1]x", NULL},
    {"a query on a TCP URL", "redis://h:6379?db=2", NULL},
    {"a user without a password", "redis://u@h", NULL},
    {"a user with an empty password (AUTH would drop the user)", "redis://u:@h", "password"},
    {"a unix user with an empty password", "unix://u:@/tmp/r.sock", "password"},
    {"a malformed percent escape", "redis://u:%zz@h", "password"},
    {"a truncated percent escape", "redis://u:ab%4@h", "password"},
    {"a percent escape that decodes to NUL", "redis://u:a%00b@h", "password"},
    {"unix:// without a path", "unix://", "path"},
    {"unix:// with a relative path", "unix://tmp/r.sock", "path"},
    {"a unix db that is not a number", "unix:///tmp/r.sock?db=x", "db"},
    {"a unix db of -1", "unix:///tmp/r.sock?db=-1", "db"},
    {"an empty unix db", "unix:///tmp/r.sock?db=", "db"},
    {"a unix db with trailing junk", "unix:///tmp/r.sock?db=2&x=1", "db"},
    {"a unix query other than db", "unix:///tmp/r.sock?database=2", "db"},
    {"several hosts need a cluster URL", "redis://a:1,b:2", "cluster"},
    {"a cluster has only database 0", "redis+cluster://a:1,b:2/3", "database 0"},
    {"a cluster seed with port 0", "redis+cluster://a:1,b:0", "seed 2"},
    {"an empty cluster seed", "redis+cluster://a:1,,b:2", "seed 2"},
    {"a trailing comma", "redis+cluster://a:1,", "seed 2"},
    {"a cluster URL needs a host", "redis+cluster://", "host"},
    {"seventeen seeds", "redis+cluster://h:1,h:2,h:3,h:4,h:5,h:6,h:7,h:8,h:9,h:10,h:11,h:12,"
                        "h:13,h:14,h:15,h:16,h:17", "16 seeds"},
};

/* Invalid URLs that carry the canary password (plain or percent-encoded):
 * each must fail, and its message must not contain the password. */
static const char *const canary_urls[] = {
    "redis://u:" CANARY "@h:0",
    "redis://u:" CANARY "@h:65536",
    "redis://:" CANARY "@h:abc",
    "redis://u:" CANARY "@h/x",
    "redis://u:" CANARY "@h/-1",
    "redis://u:" CANARY "@",
    "redis://u:" CANARY "@[::1",
    "redis://u:" CANARY "@h?x=1",
    "redis://u:" CANARY "%zz@h",
    "redis://u:s3cr3t%2Dcanary@h:0",
    "rediss://u:" CANARY "@h:0",
    "http://u:" CANARY "@h",
    "unix://u:" CANARY "@/tmp/r.sock?db=z",
    "unix://:" CANARY "@relative.sock",
};

/* rediss:// is redis:// over TLS: the same fields, and tls set. */
static void test_rediss_is_redis_over_tls(void)
{
    static const struct { const char *url; int tls; const char *host; int port; int db; } cases[] = {
        {"rediss://cache.example:6380", 1, "cache.example", 6380, 0},
        {"rediss://u:p@[::1]/2", 1, "::1", 6379, 2},
        {"redis://cache.example:6380", 0, "cache.example", 6380, 0},
        {"unix:///tmp/r.sock", 0, "", 6379, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_url u;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_url_parse(cases[i].url, &u, err, sizeof err), 0);
        CHECK_EQ_I64(u.tls, cases[i].tls);
        CHECK_EQ_STR(u.host, cases[i].host);
        CHECK_EQ_I64(u.port, cases[i].port);
        CHECK_EQ_I64(u.db, cases[i].db);
    }
}

/* A cluster URL: the first seed in host and port, the others in seeds,
 * read back one by one. */
static void test_cluster_urls_list_their_seeds(void)
{
    static const struct {
        const char *url;
        int tls;
        const char *first;
        int port;
        const char *user, *password;
        const char *rest[3];
    } cases[] = {
        {"redis+cluster://10.0.0.1:7000", 0, "10.0.0.1", 7000, "", "", {NULL}},
        {"redis+cluster://h", 0, "h", 6379, "", "", {NULL}},
        {"redis+cluster://u:p%40w@a:7000,b:7001,[::1]:7002/0", 0, "a", 7000, "u", "p@w",
         {"b:7001", "::1:7002", NULL}},
        {"rediss+cluster://:pw@a,b", 1, "a", 6379, "", "pw", {"b:6379", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_url u;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_url_parse(cases[i].url, &u, err, sizeof err), 0);
        CHECK_EQ_I64(u.cluster, 1);
        CHECK_EQ_I64(u.tls, cases[i].tls);
        CHECK_EQ_STR(u.host, cases[i].first);
        CHECK_EQ_I64(u.port, cases[i].port);
        CHECK_EQ_STR(u.user, cases[i].user);
        CHECK_EQ_STR(u.password, cases[i].password);
        const char *p = u.seeds;
        char host[256], got[300];
        int port;
        size_t k = 0;
        while (hirate_url_next_seed(&u, &p, host, &port)) {
            snprintf(got, sizeof got, "%s:%d", host, port);
            CHECK(cases[i].rest[k] != NULL);
            if (cases[i].rest[k])
                CHECK_EQ_STR(got, cases[i].rest[k++]);
        }
        CHECK(cases[i].rest[k] == NULL);
    }
    hirate_url u;
    CHECK_EQ_I64(hirate_url_parse("redis://h:1", &u, NULL, 0), 0);
    CHECK_EQ_I64(u.cluster, 0);
}

static void expect_rejected(const char *rule, const char *url, const char *mention);

/* A Sentinel URL: the first sentinel in host and port (default 26379), the
 * others in seeds, the master's name, credentials and database. */
static void test_sentinel_urls_name_sentinels_and_a_service(void)
{
    static const struct {
        const char *url;
        int tls;
        const char *first;
        int port;
        const char *user, *password, *service;
        int db;
        const char *rest[3];
    } cases[] = {
        {"redis+sentinel://s1/mymaster", 0, "s1", 26379, "", "", "mymaster", 0, {NULL}},
        {"redis+sentinel://u:p%40w@s1:5000,s2,[::1]:5002/my%2Dmaster/3", 0, "s1", 5000, "u",
         "p@w", "my-master", 3, {"s2:26379", "::1:5002", NULL}},
        {"rediss+sentinel://:pw@a:1,b:2/m", 1, "a", 1, "", "pw", "m", 0, {"b:2", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hirate_url u;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_url_parse(cases[i].url, &u, err, sizeof err), 0);
        CHECK_EQ_I64(u.sentinel, 1);
        CHECK_EQ_I64(u.cluster, 0);
        CHECK_EQ_I64(u.tls, cases[i].tls);
        CHECK_EQ_STR(u.host, cases[i].first);
        CHECK_EQ_I64(u.port, cases[i].port);
        CHECK_EQ_STR(u.user, cases[i].user);
        CHECK_EQ_STR(u.password, cases[i].password);
        CHECK_EQ_STR(u.service, cases[i].service);
        CHECK_EQ_I64(u.db, cases[i].db);
        const char *p = u.seeds;
        char host[256], got[300];
        int port;
        size_t k = 0;
        while (hirate_url_next_seed(&u, &p, host, &port)) {
            snprintf(got, sizeof got, "%s:%d", host, port);
            CHECK(cases[i].rest[k] != NULL);
            if (cases[i].rest[k])
                CHECK_EQ_STR(got, cases[i].rest[k++]);
        }
        CHECK(cases[i].rest[k] == NULL);
    }
    static const char *const missing[] = {
        "redis+sentinel://s1", "redis+sentinel://s1/", "redis+sentinel://s1,s2//0",
        "redis+sentinel://s1?x",
    };
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++)
        expect_rejected("a Sentinel URL without the master's name", missing[i],
                        "a Sentinel URL names the master after the sentinels, as in "
                        "redis+sentinel://host:26379/mymaster");
    expect_rejected("a space in the master's name", "redis+sentinel://s1/my%20master",
                    "the master's name has a space or a control character");
    expect_rejected("a bad database after the master", "redis+sentinel://s1/m/x",
                    "the database must be a number from 0 up");
    expect_rejected("a bad sentinel", "redis+sentinel://s1,s2:0/m",
                    "sentinel 2 must be host[:port] (port 1 to 65535)");
}

static void test_accepts_each_form_with_exact_fields(void)
{
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        const ok_case *c = &accepted[i];
        hirate_url u;
        char err[HIRATE_ERRMSG_SIZE] = "";
        int rc = hirate_url_parse(c->url, &u, err, sizeof err);
        if (rc != 0) fprintf(stderr, "  %s: %s -> %d \"%s\"\n", c->rule, c->url, rc, err);
        CHECK_EQ_I64(rc, 0);
        if (rc != 0) continue;
        CHECK_EQ_I64(u.is_unix, c->is_unix);
        CHECK_EQ_STR(u.host, c->host);
        CHECK_EQ_I64(u.port, c->port);
        CHECK_EQ_STR(u.path, c->path);
        CHECK_EQ_STR(u.user, c->user);
        CHECK_EQ_STR(u.password, c->password);
        CHECK_EQ_I64(u.db, c->db);
    }
}

static void expect_rejected(const char *rule, const char *url, const char *mention)
{
    hirate_url u;
    char err[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_url_parse(url, &u, err, sizeof err);
    if (rc != HIRATE_EURL)
        fprintf(stderr, "  %s: \"%.60s\" -> %d (expected HIRATE_EURL)\n", rule, url, rc);
    CHECK_EQ_I64(rc, HIRATE_EURL);
    CHECK(err[0] != '\0');
    if (mention && !strstr(err, mention)) {
        fprintf(stderr, "  %s: message \"%s\" does not mention \"%s\"\n", rule, err, mention);
        CHECK(strstr(err, mention) != NULL);
    }
}

static void test_rejects_malformed_urls_with_eurl(void)
{
    for (size_t i = 0; i < sizeof rejected / sizeof rejected[0]; i++)
        expect_rejected(rejected[i].rule, rejected[i].url, rejected[i].mention);
}

/* Field sizes in url.h: host[256], path[108], password[256], user[128],
 * each including the NUL. The longest value that fits passes; one more fails. */
static void test_lengths_stop_exactly_at_the_field_size(void)
{
    char url[1024], part[400];
    hirate_url u;
    char err[HIRATE_ERRMSG_SIZE];

    memset(part, 'h', 255);
    part[255] = '\0';
    snprintf(url, sizeof url, "redis://%s:1", part);
    CHECK_EQ_I64(hirate_url_parse(url, &u, err, sizeof err), 0);
    CHECK_EQ_I64(strlen(u.host), 255);
    snprintf(url, sizeof url, "redis://%sh:1", part);
    expect_rejected("a 256-byte host", url, "host");

    part[0] = '/';
    memset(part + 1, 'p', 106);
    part[107] = '\0';
    snprintf(url, sizeof url, "unix://%s", part);
    CHECK_EQ_I64(hirate_url_parse(url, &u, err, sizeof err), 0);
    CHECK_EQ_I64(strlen(u.path), 107);
    snprintf(url, sizeof url, "unix://%sp", part);
    expect_rejected("a 108-byte socket path", url, "path");
    snprintf(url, sizeof url, "unix://%sp?db=1", part);
    expect_rejected("a 108-byte socket path with a db", url, "path");

    memset(part, 'w', 255);
    part[255] = '\0';
    snprintf(url, sizeof url, "redis://:%s@h", part);
    CHECK_EQ_I64(hirate_url_parse(url, &u, err, sizeof err), 0);
    CHECK_EQ_I64(strlen(u.password), 255);
    snprintf(url, sizeof url, "redis://:%sw@h", part);
    expect_rejected("a 256-byte password", url, "password");

    memset(part, 'u', 127);
    part[127] = '\0';
    snprintf(url, sizeof url, "redis://%s:p@h", part);
    CHECK_EQ_I64(hirate_url_parse(url, &u, err, sizeof err), 0);
    CHECK_EQ_I64(strlen(u.user), 127);
    snprintf(url, sizeof url, "redis://%su:p@h", part);
    expect_rejected("a 128-byte user", url, "user");
}

static void test_messages_never_contain_the_password(void)
{
    for (size_t i = 0; i < sizeof canary_urls / sizeof canary_urls[0]; i++) {
        hirate_url u;
        char err[HIRATE_ERRMSG_SIZE] = "";
        CHECK_EQ_I64(hirate_url_parse(canary_urls[i], &u, err, sizeof err), HIRATE_EURL);
        CHECK(err[0] != '\0');
        if (strstr(err, "s3cr3t") || strstr(err, "canary")) {
            fprintf(stderr, "  %s leaked into \"%s\"\n", canary_urls[i], err);
            CHECK(!"the message contains the password");
        }
    }
}

static void test_message_fits_a_small_buffer(void)
{
    hirate_url u;
    char err[32];
    memset(err, 'X', sizeof err);
    CHECK_EQ_I64(hirate_url_parse("redis://h:0", &u, err, 8), HIRATE_EURL);
    CHECK(memchr(err, '\0', 8) != NULL);   /* terminated inside the 8 bytes */
    CHECK(err[8] == 'X' && err[31] == 'X'); /* and nothing written past them */
}

int main(void)
{
    test_rediss_is_redis_over_tls();
    test_cluster_urls_list_their_seeds();
    test_sentinel_urls_name_sentinels_and_a_service();
    test_accepts_each_form_with_exact_fields();
    test_rejects_malformed_urls_with_eurl();
    test_lengths_stop_exactly_at_the_field_size();
    test_messages_never_contain_the_password();
    test_message_fits_a_small_buffer();
    return check_summary("test_url");
}
