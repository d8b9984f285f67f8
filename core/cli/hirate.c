/*
 * hirate: the command-line tool. It spends, inspects and resets the same
 * buckets as every application that uses the same Redis, prefix and limits
 * (a capacity and a rate, or --limit "10/s; 1000/day"), so a shell script, a cron job or an operator can take part in a
 * limit; it prints the Redis script for operators who preload it; and it
 * generates load (bench.c).
 *
 *     hirate [OPTIONS] COMMAND [ARGS]      options may also follow the command
 *
 * Exit status: 0 allowed (peek: would pass; check: every node healthy; other
 * commands: done), 1 refused (check: a node is not healthy), 2 error.
 * The URL is never printed: it may hold a password. The sentinels'
 * password comes from the environment only (HIRATE_SENTINEL_PASSWORD): a
 * command line is visible to every user of the machine.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("hirate: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_limiter_new(const hirate_options *opts, hirate_limiter **out)
{
    char why[HIRATE_ERRMSG_SIZE] = "";
    int rc = hirate_limiter_new(out, opts, why, sizeof why);
    if (rc < 0) {
        cli_error("%s", why[0] ? why : hirate_strerror(rc));
        return -1;
    }
    return 0;
}

const char *cli_limiter_error(hirate_limiter *lim, int rc, char *buf, size_t len)
{
    buf[0] = '\0';
    hirate_limiter_errmsg(lim, buf, len);
    if (!buf[0])
        snprintf(buf, len, "%s", hirate_strerror(rc));
    return buf;
}

/* ---- usage ------------------------------------------------------------ */

static void usage(FILE *f)
{
    hirate_options o;
    hirate_options_init(&o);
    fprintf(f,
        "usage: hirate [OPTIONS] COMMAND [ARGS]\n"
        "\n"
        "Spend, inspect or reset a token bucket shared with every program that uses\n"
        "hirate with the same Redis, prefix and limits.\n"
        "\n"
        "Commands:\n"
        "  allow KEY         spend --cost tokens of KEY's bucket if it holds them\n"
        "  peek KEY          what allow would decide now; spends nothing\n"
        "  reset KEY         forget KEY's bucket: it is full again\n"
        "  check             ask every Redis node decisions go to whether it answers,\n"
        "                    has the script (or function) and its role; a line each\n"
        "  script [--sha1]   print the Redis script byte for byte, or only its SHA1\n"
        "  bench             load generator: threads deciding on random keys\n"
        "\n"
        "Options (before or after the command; -- ends them):\n"
        "  --url URL             redis://[[user]:password@]host[:port][/db],\n"
        "                        rediss://... (TLS), unix:///path[?db=N], or a\n"
        "                        Redis Cluster: redis+cluster://host:port[,host:port...]\n"
        "                        (rediss+cluster://... over TLS), or a Sentinel\n"
        "                        service: redis+sentinel://[[user]:password@]host[:port]\n"
        "                        [,host[:port]...]/service[/db] (the sentinels; the\n"
        "                        user and password are the master's; default port\n"
        "                        26379; rediss+sentinel://... over TLS);\n"
        "                        default $REDIS_URL, else in memory (\"\" also means\n"
        "                        in memory)\n"
        "  --capacity N          bucket size, whole tokens (required: allow, peek, bench,\n"
        "                        unless --limit is given)\n"
        "  --rate R              tokens added per second: a number (0.5) or a fraction\n"
        "                        N/M (1/3: one token every 3 seconds); required with\n"
        "                        --capacity\n"
        "  --limit LIMITS        instead of --capacity and --rate: one or more limits,\n"
        "                        e.g. \"100/minute\", \"10/s; 1000/day\", \"100/hour burst 20\";\n"
        "                        several are one all-or-nothing decision\n"
        "  --cost N              tokens to spend, or for peek to test; default 1\n"
        "  --prefix P            prepended to every key in Redis; default \"%s\"\n"
        "  --on-error POLICY     when Redis fails: local, open or closed; default %s\n"
        "  --timeout DURATION    per Redis command: a number and a unit (250us, 100ms,\n"
        "                        0.25s, 2m; a number alone is seconds); default %dms\n"
        "  --connect-timeout DURATION  per connection attempt; default %dms\n"
        "  --no-functions        decide with EVALSHA even where the server has Redis\n"
        "                        Functions (default: FCALL there)\n"
        "  --json                print one JSON object instead of a line of text\n"
        "  -q, --quiet           print nothing on stdout: the exit status says it all\n"
        "  -h, --help            print this help and exit\n"
        "  --version             print the version and exit\n"
        "\n"
        "TLS options (rediss:// URLs only):\n"
        "  --tls-ca-file FILE    trusted CAs, PEM; default the system's trust store\n"
        "  --tls-ca-dir DIR      a directory of trusted CAs (c_rehash layout)\n"
        "  --tls-cert-file FILE  client certificate, PEM (mutual TLS)\n"
        "  --tls-key-file FILE   its private key, PEM\n"
        "  --tls-server-name N   the name sent (SNI) and verified; default the URL's host\n"
        "  --tls-no-verify       do NOT verify the server's certificate: anyone on the\n"
        "                        path can then read and change every call\n"
        "\n"
        "Sentinel options (redis+sentinel:// URLs only):\n"
        "  --sentinel-user NAME  the sentinels' own ACL user; their password is read\n"
        "                        from $HIRATE_SENTINEL_PASSWORD only, never from the\n"
        "                        command line, which every user of the machine sees\n"
        "\n"
        "bench options:\n"
        "  --threads N           threads sharing one limiter; default 4\n"
        "  --keys N              keys bench:0 .. bench:N-1, drawn at random; default 1000\n"
        "  --duration DURATION   how long to run (10s, 500ms; a number alone is\n"
        "                        seconds); default 5s\n"
        "  --batch N             decisions per call: 1 hirate_allow, more\n"
        "                        hirate_allow_many; default 1\n"
        "\n"
        "Exit status: 0 allowed (peek: would pass; check: healthy; reset, script,\n"
        "bench: done), 1 refused (check: a node is not healthy), 2 error. See hirate(1).\n",
        o.prefix ? o.prefix : "", hirate_on_error_name(o.on_error), o.timeout_ms,
        o.connect_timeout_ms);
}

/* ---- strict numbers ----------------------------------------------------- */

/* A whole number in base 10 and nothing else: no blanks, no suffix. */
static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    int digit = s[0] >= '0' && s[0] <= '9';
    int sign = (s[0] == '-' || s[0] == '+') && s[1] >= '0' && s[1] <= '9';
    char *end = NULL;
    errno = 0;
    long long v = digit || sign ? strtoll(s, &end, 10) : 0;
    if (!(digit || sign) || *end != '\0') {
        cli_error("%s: \"%s\" is not a whole number", opt, s);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        if (lo < 0) /* no range of our own: the library checks the value */
            cli_error("%s: %s is out of range", opt, s);
        else
            cli_error("%s: %s is out of range (%lld to %lld)", opt, s, (long long)lo,
                      (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* A finite decimal number (1, 0.5, 2e-3); no hex, inf or nan. */
static int parse_num(const char *opt, const char *s, double *out)
{
    char *end;
    if (s[0] == '\0' || strspn(s, "0123456789+-.eE") != strlen(s)) {
        cli_error("%s: \"%s\" is not a number", opt, s);
        return -1;
    }
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0') {
        cli_error("%s: \"%s\" is not a number", opt, s);
        return -1;
    }
    if (errno == ERANGE || !isfinite(v)) {
        cli_error("%s: %s is out of range", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* A rate: a number, or a fraction N/M of two numbers (1/3 is a third of a
 * token a second), computed as a double division, as 1/3 is in C, Python
 * and Lua. The library checks the range of the result. */
static int parse_rate(const char *s, double *out)
{
    const char *slash = strchr(s, '/');
    if (!slash)
        return parse_num("--rate", s, out);
    char num[64];
    double n, m;
    size_t len = (size_t)(slash - s);
    int bad = len == 0 || len >= sizeof num || strchr(slash + 1, '/') != NULL;
    if (!bad) {
        memcpy(num, s, len);
        num[len] = '\0';
        bad = strspn(num, "0123456789+-.eE") != len || slash[1] == '\0' ||
              strspn(slash + 1, "0123456789+-.eE") != strlen(slash + 1);
    }
    if (bad) {
        cli_error("--rate: \"%s\" is not a number or a fraction N/M (a limit such as "
                  "\"10/minute\" goes in --limit)", s);
        return -1;
    }
    if (parse_num("--rate", num, &n) < 0 || parse_num("--rate", slash + 1, &m) < 0)
        return -1;
    if (m == 0) {
        cli_error("--rate: %s divides by zero", s);
        return -1;
    }
    *out = n / m;
    if (!isfinite(*out)) {
        cli_error("--rate: %s is out of range", s);
        return -1;
    }
    return 0;
}

/* ---- decisions ---------------------------------------------------------- */

/* us as seconds, exactly: integer arithmetic, at most 6 decimals, trailing
 * zeros dropped down to min_decimals (0: "0", "0.2", "1.000001"). */
static void seconds(char *buf, size_t len, int64_t us, int min_decimals)
{
    uint64_t u = us < 0 ? (uint64_t)0 - (uint64_t)us : (uint64_t)us;
    char frac[8];
    snprintf(frac, sizeof frac, "%06llu", (unsigned long long)(u % 1000000));
    int n = 6;
    while (n > min_decimals && frac[n - 1] == '0')
        n--;
    frac[n] = '\0';
    snprintf(buf, len, "%s%llu%s%s", us < 0 ? "-" : "", (unsigned long long)(u / 1000000),
             n ? "." : "", frac);
}

/* A band's name as a JSON string: names are printable ASCII, so only '"'
 * and '\\' need escaping. */
static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        putchar(*s);
    }
    putchar('"');
}

/* The figures every decision shows, as JSON members (without the braces). */
static void json_figures(const hirate_decision *d)
{
    char retry[32], reset[32];
    if (d->retry_after_us == HIRATE_NEVER)
        snprintf(retry, sizeof retry, "null");
    else
        seconds(retry, sizeof retry, d->retry_after_us, 0);
    seconds(reset, sizeof reset, d->reset_after_us, 0);
    printf("\"allowed\":%s,\"remaining\":%lld,\"limit\":%lld,\"retry_after\":%s,"
           "\"reset_after\":%s",
           d->allowed ? "true" : "false", (long long)d->remaining, (long long)d->limit, retry,
           reset);
}

/* The same as text: "allowed  remaining=4 limit=5 reset_after=0.200s". */
static void text_figures(const hirate_decision *d)
{
    char retry[32], reset[32];
    printf("%s  remaining=%lld limit=%lld", d->allowed ? "allowed" : "refused",
           (long long)d->remaining, (long long)d->limit);
    if (!d->allowed) {
        if (d->retry_after_us == HIRATE_NEVER) {
            printf(" retry_after=never");
        } else {
            seconds(retry, sizeof retry, d->retry_after_us, 3);
            printf(" retry_after=%ss", retry);
        }
    }
    seconds(reset, sizeof reset, d->reset_after_us, 3);
    printf(" reset_after=%ss", reset);
}

/* A decision: the whole's line (or object); with several bands (nbands >
 * 1, names[i] band i's name) the band behind the limit, then each band's own
 * figures, a line each (or in "bands"). One band prints only the whole. */
static void print_decision(const hirate_decision *d, const hirate_decision *bands,
                           const char *const *names, size_t nbands, int json)
{
    const char *source = hirate_source_name(d->source);
    if (json) {
        putchar('{');
        json_figures(d);
        printf(",\"source\":\"%s\"", source);
        if (d->error)
            printf(",\"error\":\"%s\"", hirate_err_name(d->error));
        if (nbands > 1) {
            printf(",\"band\":");
            json_string(names[d->band]);
            printf(",\"bands\":[");
            for (size_t i = 0; i < nbands; i++) {
                printf(i ? ",{\"name\":" : "{\"name\":");
                json_string(names[i]);
                putchar(',');
                json_figures(&bands[i]);
                putchar('}');
            }
            putchar(']');
        }
        printf("}\n");
        return;
    }
    text_figures(d);
    printf(" source=%s", source);
    if (d->error)
        printf(" error=%s", hirate_err_name(d->error));
    if (nbands > 1)
        printf(" band=%s", names[d->band]);
    printf("\n");
    for (size_t i = 0; nbands > 1 && i < nbands; i++) {
        printf("  band=%s ", names[i]);
        text_figures(&bands[i]);
        printf("\n");
    }
}

/* allow, peek and reset: one call on one key. */
static int cmd_key(const cli_config *c, const char *cmd, const char *key)
{
    hirate_limiter *lim;
    if (cli_limiter_new(&c->opts, &lim) < 0)
        return CLI_ERROR;
    hirate_decision d, bands[HIRATE_BANDS_MAX];
    const char *names[HIRATE_BANDS_MAX];
    size_t keylen = strlen(key);
    size_t nbands = hirate_limiter_nbands(lim);
    if (nbands > HIRATE_BANDS_MAX)
        nbands = HIRATE_BANDS_MAX;
    for (size_t i = 0; i < nbands; i++) {
        hirate_band band;
        names[i] = hirate_limiter_band(lim, i, &band) == 0 ? band.name : "?";
    }
    int rc;
    if (strcmp(cmd, "reset") == 0)
        rc = hirate_reset(lim, key, keylen);
    else if (strcmp(cmd, "peek") == 0)
        rc = hirate_peek_bands(lim, key, keylen, c->cost, &d, bands, nbands);
    else
        rc = hirate_allow_bands(lim, key, keylen, c->cost, &d, bands, nbands);
    int status;
    if (rc < 0) {
        char why[HIRATE_ERRMSG_SIZE];
        /* What went wrong with Redis is named by its code too, as a
         * decision's error= names it, so that a script tells HIRATE_ETLS
         * from HIRATE_EAUTH without reading the message. A bad input (a
         * key) is the message alone, as for the options. */
        if (rc <= HIRATE_ECONNECT)
            cli_error("%s (%s)", cli_limiter_error(lim, rc, why, sizeof why),
                      hirate_err_name(rc));
        else
            cli_error("%s", cli_limiter_error(lim, rc, why, sizeof why));
        status = CLI_ERROR;
    } else if (strcmp(cmd, "reset") == 0) {
        printf(c->json ? "{\"reset\":true}\n" : "reset\n");
        status = CLI_ALLOWED;
    } else {
        print_decision(&d, bands, names, nbands, c->json);
        status = d.allowed ? CLI_ALLOWED : CLI_REFUSED;
    }
    hirate_limiter_free(lim);
    return status;
}

/* A check's tri-state (1, 0, -1 unknown) as JSON and as text. */
static const char *json_tri(int v)
{
    return v > 0 ? "true" : v == 0 ? "false" : "null";
}

static const char *text_tri(int v)
{
    return v > 0 ? "yes" : v == 0 ? "no" : "unknown";
}

/* JSON of any text (a message quotes Redis' words): '"', '\\' and control
 * bytes escaped. */
static void json_text(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* check: hirate_check on every node decisions go to; a line (or a JSON
 * member) per node. Exit 0 when every node is healthy, 1 when one is not
 * (it did not answer, refused the password, is a replica...), 2 for an
 * error before any node was asked. */
static int cmd_check(const cli_config *c)
{
    hirate_limiter *lim;
    if (cli_limiter_new(&c->opts, &lim) < 0)
        return CLI_ERROR;
    size_t max = 16, n = 0;
    hirate_check_node *nodes = NULL;
    int rc;
    for (;;) {
        hirate_check_node *more = realloc(nodes, max * sizeof *nodes);
        if (!more) {
            cli_error("out of memory");
            free(nodes);
            hirate_limiter_free(lim);
            return CLI_ERROR;
        }
        nodes = more;
        rc = hirate_check(lim, nodes, max, &n);
        if (n <= max)
            break;
        max = n; /* a cluster of more masters: ask again with room for all */
    }
    int status = rc == 0 ? CLI_ALLOWED : CLI_REFUSED;
    if (rc < 0 && n == 0) {
        /* No node to report on: the check itself failed. */
        char why[HIRATE_ERRMSG_SIZE];
        cli_error("%s (%s)", cli_limiter_error(lim, rc, why, sizeof why), hirate_err_name(rc));
        status = rc <= HIRATE_ECONNECT ? CLI_REFUSED : CLI_ERROR;
    } else if (c->json) {
        /* The shape of Python's Health.as_dict() and Lua's lim:check(). */
        printf("{\"ok\":%s,\"error\":", rc == 0 ? "true" : "false");
        if (rc == 0)
            printf("null");
        else
            printf("\"%s\"", hirate_err_name(rc));
        printf(",\"nodes\":[");
        for (size_t i = 0; i < n; i++) {
            const hirate_check_node *d = &nodes[i];
            printf(i ? ",{\"addr\":" : "{\"addr\":");
            json_text(d->addr);
            printf(",\"ok\":%s,\"error\":", d->rc ? "false" : "true");
            if (d->rc)
                printf("\"%s\"", hirate_err_name(d->rc));
            else
                printf("null");
            printf(",\"message\":");
            json_text(d->message);
            printf(",\"role\":");
            if (d->role[0])
                json_text(d->role);
            else
                printf("null");
            printf(",\"functions\":%s,\"loaded\":%s,\"latency\":", json_tri(d->functions),
                   json_tri(d->loaded));
            if (d->latency_us < 0) {
                printf("null}");
            } else {
                char secs[32];
                seconds(secs, sizeof secs, d->latency_us, 0);
                printf("%s}", secs);
            }
        }
        printf("]}\n");
    } else if (n == 0) {
        printf("memory  OK  no Redis to check: decisions are made in this process\n");
    } else {
        for (size_t i = 0; i < n; i++) {
            const hirate_check_node *d = &nodes[i];
            printf("%s  %s  role=%s functions=%s loaded=%s", d->addr, hirate_err_name(d->rc),
                   d->role[0] ? d->role : "unknown", text_tri(d->functions),
                   text_tri(d->loaded));
            if (d->latency_us >= 0) {
                char secs[32];
                seconds(secs, sizeof secs, d->latency_us, 3);
                printf(" latency=%ss", secs);
            }
            if (d->rc)
                printf("  %s", d->message);
            printf("\n");
        }
    }
    free(nodes);
    hirate_limiter_free(lim);
    return status;
}

/* stdout is the script byte for byte, so `hirate script | redis-cli -x
 * SCRIPT LOAD` loads exactly what the library calls by SHA1. */
static int cmd_script(const cli_config *c)
{
    if (c->sha1) {
        printf("%s\n", hirate_script_sha1());
    } else {
        size_t len;
        const char *src = hirate_script_source(&len);
        fwrite(src, 1, len, stdout);
    }
    return CLI_ALLOWED;
}

/* ---- the command line --------------------------------------------------- */

enum {
    OPT_URL = 256, OPT_CAPACITY, OPT_RATE, OPT_COST, OPT_PREFIX, OPT_ON_ERROR,
    OPT_TIMEOUT, OPT_CONNECT_TIMEOUT, OPT_JSON, OPT_VERSION, OPT_SHA1,
    OPT_THREADS, OPT_KEYS, OPT_DURATION, OPT_BATCH,
    OPT_TLS_CA_FILE, OPT_TLS_CA_DIR, OPT_TLS_CERT_FILE, OPT_TLS_KEY_FILE, OPT_TLS_SERVER_NAME,
    OPT_TLS_NO_VERIFY, OPT_SENTINEL_USER, OPT_SENTINEL_PASSWORD, OPT_NO_FUNCTIONS, OPT_LIMIT
};

static const struct option long_options[] = {
    {"url", required_argument, NULL, OPT_URL},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"rate", required_argument, NULL, OPT_RATE},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"cost", required_argument, NULL, OPT_COST},
    {"prefix", required_argument, NULL, OPT_PREFIX},
    {"on-error", required_argument, NULL, OPT_ON_ERROR},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {"sha1", no_argument, NULL, OPT_SHA1},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"keys", required_argument, NULL, OPT_KEYS},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"tls-ca-file", required_argument, NULL, OPT_TLS_CA_FILE},
    {"tls-ca-dir", required_argument, NULL, OPT_TLS_CA_DIR},
    {"tls-cert-file", required_argument, NULL, OPT_TLS_CERT_FILE},
    {"tls-key-file", required_argument, NULL, OPT_TLS_KEY_FILE},
    {"tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME},
    {"tls-no-verify", no_argument, NULL, OPT_TLS_NO_VERIFY},
    {"sentinel-user", required_argument, NULL, OPT_SENTINEL_USER},
    /* Only to refuse it, its value taken so that it is never echoed. */
    {"sentinel-password", required_argument, NULL, OPT_SENTINEL_PASSWORD},
    {"no-functions", no_argument, NULL, OPT_NO_FUNCTIONS},
    {NULL, 0, NULL, 0}
};

/* The option as typed, without any "=value": a mistyped --url=... must not
 * print the password it carries. */
static void option_error(const char *what, const char *arg, int shortopt)
{
    if (shortopt)
        cli_error("%s -%c", what, shortopt);
    else
        cli_error("%s %.*s", what, (int)strcspn(arg ? arg : "?", "="), arg ? arg : "?");
    fputs("Try 'hirate --help'.\n", stderr);
}

/* Whether arg ("--co=5") abbreviates more than one long option. */
static int ambiguous(const char *arg)
{
    if (strncmp(arg, "--", 2) != 0)
        return 0;
    size_t len = strcspn(arg + 2, "=");
    int matches = 0;
    for (const struct option *o = long_options; o->name; o++)
        matches += strncmp(o->name, arg + 2, len) == 0;
    return len > 0 && matches > 1;
}

/* What the command line asked for, besides the cli_config. */
typedef struct cli_args {
    const char *pos[3];   /* the command and its arguments */
    int npos;             /* how many there were (may exceed 3) */
    int help, version;
    int have_capacity, have_rate, have_limit, have_url;
    const char *url;
    const char *bench_opt; /* the last bench-only option given, to name it */
} cli_args;

/* A duration option, as hirate_options_set_duration reads and checks it. */
static int set_duration(cli_config *c, const char *name, const char *v)
{
    char why[HIRATE_ERRMSG_SIZE];
    if (hirate_options_set_duration(&c->opts, name, v, why, sizeof why) < 0) {
        cli_error("%s", why);
        return -1;
    }
    return 0;
}

/* Parses one option into c and a; returns 0 or -1 (message printed). */
static int take_option(int opt, const char *v, cli_config *c, cli_args *a)
{
    int64_t n, us;
    char why[HIRATE_ERRMSG_SIZE];
    switch (opt) {
    case OPT_URL: a->url = v; a->have_url = 1; return 0;
    case OPT_CAPACITY:
        a->have_capacity = 1;
        return parse_int("--capacity", v, INT64_MIN, INT64_MAX, &c->opts.capacity);
    case OPT_RATE: a->have_rate = 1; return parse_rate(v, &c->opts.rate);
    /* The library reads the limits, and words what is wrong with them;
     * given with --capacity or --rate, it says which to leave out. */
    case OPT_LIMIT: a->have_limit = 1; c->opts.limits = v; return 0;
    case OPT_COST: return parse_int("--cost", v, INT64_MIN, INT64_MAX, &c->cost);
    case OPT_PREFIX: c->opts.prefix = v; return 0;
    case OPT_ON_ERROR:
        if (hirate_options_set_on_error(&c->opts, v, why, sizeof why) < 0) {
            cli_error("--on-error: %s", why);
            return -1;
        }
        return 0;
    /* Durations as the library reads them, its ranges in its words. */
    case OPT_TIMEOUT: return set_duration(c, "timeout", v);
    case OPT_CONNECT_TIMEOUT: return set_duration(c, "connect_timeout", v);
    case OPT_JSON: c->json = 1; return 0;
    case 'q': c->quiet = 1; return 0;
    /* The library checks them (a TLS option with a plain URL, a file it
     * cannot read): the tool passes them on as given. */
    case OPT_TLS_CA_FILE: c->opts.tls_ca_file = v; return 0;
    case OPT_TLS_CA_DIR: c->opts.tls_ca_dir = v; return 0;
    case OPT_TLS_CERT_FILE: c->opts.tls_cert_file = v; return 0;
    case OPT_TLS_KEY_FILE: c->opts.tls_key_file = v; return 0;
    case OPT_TLS_SERVER_NAME: c->opts.tls_server_name = v; return 0;
    case OPT_TLS_NO_VERIFY: c->opts.tls_verify = 0; return 0;
    case OPT_SENTINEL_USER: c->opts.sentinel_username = v; return 0;
    case OPT_SENTINEL_PASSWORD:
        cli_error("--sentinel-password: give the sentinels' password in the environment, "
                  "as HIRATE_SENTINEL_PASSWORD (a command line is visible to every user "
                  "of the machine)");
        return -1;
    case OPT_NO_FUNCTIONS: c->opts.functions = 0; return 0;
    case 'h': a->help = 1; return 0;
    case OPT_VERSION: a->version = 1; return 0;
    case OPT_SHA1: c->sha1 = 1; return 0;
    case OPT_THREADS:
        a->bench_opt = "--threads";
        if (parse_int("--threads", v, 1, 1024, &n) < 0)
            return -1;
        c->threads = (int)n;
        return 0;
    case OPT_KEYS:
        a->bench_opt = "--keys";
        if (parse_int("--keys", v, 1, 1000000000, &n) < 0)
            return -1;
        c->keys = (uint64_t)n;
        return 0;
    case OPT_DURATION:
        a->bench_opt = "--duration";
        if (hirate_duration_parse(v, &us, why, sizeof why) < 0) {
            cli_error("--duration: %s", why);
            return -1;
        }
        if (!(us > 0 && us <= 1000000 * (int64_t)1000000)) {
            cli_error("--duration: %s is out of range (above 0, at most 1000000s)", v);
            return -1;
        }
        c->duration_s = (double)us / 1e6;
        return 0;
    case OPT_BATCH:
        a->bench_opt = "--batch";
        if (parse_int("--batch", v, 1, 10000, &n) < 0)
            return -1;
        c->batch = (int)n;
        return 0;
    }
    return -1;
}

/* Reads argv into c and a. A leading '-' in the option string hands every
 * operand back in order as option 1, so options may follow the command
 * whatever POSIXLY_CORRECT says; ':' reports a missing value as ':'. */
static int parse_args(int argc, char **argv, cli_config *c, cli_args *a)
{
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "-:hq", long_options, NULL)) != -1) {
        if (opt == 1) {
            if (a->npos < 3)
                a->pos[a->npos] = optarg;
            a->npos++;
        } else if (opt == ':') {
            option_error("missing value for", argv[optind - 1], 0);
            return -1;
        } else if (opt == '?') {
            option_error(ambiguous(argv[optind - 1]) ? "ambiguous option" : "unknown option",
                         argv[optind - 1], optopt);
            return -1;
        } else if (take_option(opt, optarg, c, a) < 0) {
            return -1;
        }
    }
    for (; optind < argc; optind++) { /* after "--": operands only */
        if (a->npos < 3)
            a->pos[a->npos] = argv[optind];
        a->npos++;
    }
    return 0;
}

/* Which operands and options the command takes; 0 or -1 (message printed). */
static int check_command(const cli_config *c, const cli_args *a, const char *cmd)
{
    int keyed = strcmp(cmd, "allow") == 0 || strcmp(cmd, "peek") == 0 ||
                strcmp(cmd, "reset") == 0;
    int script = strcmp(cmd, "script") == 0, bench = strcmp(cmd, "bench") == 0;
    int check = strcmp(cmd, "check") == 0;
    if (!keyed && !script && !bench && !check) {
        cli_error("unknown command \"%s\"", cmd);
        usage(stderr);
        return -1;
    }
    if (keyed && a->npos != 2) {
        cli_error(a->npos < 2 ? "%s needs a KEY" : "%s takes one KEY", cmd);
        return -1;
    }
    if (!keyed && a->npos != 1) {
        cli_error("%s takes no arguments", cmd);
        return -1;
    }
    if (c->sha1 && !script) {
        cli_error("--sha1 applies to script only");
        return -1;
    }
    if (a->bench_opt && !bench) {
        cli_error("%s applies to bench only", a->bench_opt);
        return -1;
    }
    if (script && c->json) {
        cli_error("--json does not apply to script");
        return -1;
    }
    if (strcmp(cmd, "reset") != 0 && !script && !check && !a->have_limit) {
        if (!a->have_capacity) {
            cli_error("%s needs --capacity N (the bucket size) and --rate R, or --limit", cmd);
            return -1;
        }
        if (!a->have_rate) {
            cli_error("%s needs --rate R (tokens per second)", cmd);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    cli_config c;
    cli_args a;
    memset(&c, 0, sizeof c);
    memset(&a, 0, sizeof a);
    hirate_options_init(&c.opts);
    c.cost = 1;
    c.threads = 4;
    c.keys = 1000;
    c.duration_s = 5;
    c.batch = 1;

    if (parse_args(argc, argv, &c, &a) < 0)
        return CLI_ERROR;
    if (a.help) {
        usage(stdout);
        return fflush(stdout) == 0 ? CLI_ALLOWED : CLI_ERROR;
    }
    if (a.version) {
        printf("hirate %s\n", hirate_version());
        return fflush(stdout) == 0 ? CLI_ALLOWED : CLI_ERROR;
    }
    if (a.npos == 0) {
        cli_error("no command");
        usage(stderr);
        return CLI_ERROR;
    }
    const char *cmd = a.pos[0];
    if (check_command(&c, &a, cmd) < 0)
        return CLI_ERROR;
    /* Quiet: the exit status is the answer; errors still go to stderr. */
    if (c.quiet && !freopen("/dev/null", "w", stdout)) {
        cli_error("cannot open /dev/null: %s", strerror(errno));
        return CLI_ERROR;
    }

    c.opts.url = a.have_url ? a.url : getenv("REDIS_URL");
    if (c.opts.url && !c.opts.url[0])
        c.opts.url = NULL; /* empty: in memory */
    /* The sentinels' password, from the environment only; beside a URL that
     * is not a Sentinel's the library says it does not belong there. */
    const char *sentinel_password = getenv("HIRATE_SENTINEL_PASSWORD");
    if (sentinel_password && sentinel_password[0])
        c.opts.sentinel_password = sentinel_password; /* empty: none */
    if ((strcmp(cmd, "reset") == 0 || strcmp(cmd, "check") == 0) && !a.have_limit) {
        /* reset and check need no bucket size, but a limiter needs valid ones */
        if (!a.have_capacity)
            c.opts.capacity = 1;
        if (!a.have_rate)
            c.opts.rate = 1;
    }

    int status;
    if (strcmp(cmd, "script") == 0)
        status = cmd_script(&c);
    else if (strcmp(cmd, "bench") == 0)
        status = cli_bench(&c);
    else if (strcmp(cmd, "check") == 0)
        status = cmd_check(&c);
    else
        status = cmd_key(&c, cmd, a.pos[1]);

    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("cannot write the output: %s", strerror(errno));
        return CLI_ERROR;
    }
    return status;
}
