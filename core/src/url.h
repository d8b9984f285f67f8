/* Parsing redis://, rediss://, unix://, Redis Cluster and Sentinel URLs. */
#ifndef HIRATE_URL_H
#define HIRATE_URL_H

#include <stddef.h>

typedef struct hirate_url {
    int is_unix;          /* 1: path is a unix socket */
    int tls;              /* 1: rediss:// */
    char host[256];       /* TCP host, IPv6 without brackets */
    int port;             /* default 6379 */
    char path[108];       /* unix socket path */
    char user[128];       /* ACL user, "" for none (percent-decoded) */
    char password[256];   /* "" for none (percent-decoded) */
    int db;               /* 0 by default */
    int cluster;          /* 1: redis+cluster:// or rediss+cluster:// */
    int sentinel;         /* 1: redis+sentinel:// or rediss+sentinel:// */
    char seeds[1024];     /* a cluster's other seeds, or the other sentinels,
                             "host:port,[v6]:port" as written (host and port
                             above are the first) */
    char service[128];    /* a Sentinel URL's master name */
} hirate_url;

/* Accepts redis://[[user]:password@]host[:port][/db] (host may be [v6]), the
 * same with rediss:// (TLS), unix://[[user]:password@]/path[?db=N], and a
 * cluster's redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]
 * (rediss+cluster:// over TLS), and the sentinels of a master,
 * redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]
 * (default port 26379; rediss+sentinel:// over TLS). Returns 0 or HIRATE_EURL
 * with a message in err that never contains the password. */
int hirate_url_parse(const char *url, hirate_url *out, char *err, size_t errlen);

/* The next of u's other seeds or sentinels: reads one "host[:port]" from *p
 * (in u->seeds, checked by hirate_url_parse), moves *p past it and returns
 * 1, or returns 0 when there is none left. */
int hirate_url_next_seed(const hirate_url *u, const char **p, char host[256], int *port);

/* The connection's handshake, as command arguments: AUTH [user] password
 * when the URL has a password, SELECT db when it names a database other than
 * 0. Each returns argc, 0 when the command is not needed. db is room for the
 * number. The arguments point into u (and db). */
int hirate_url_auth_argv(const hirate_url *u, const char *argv[3], size_t lens[3]);
int hirate_url_select_argv(const hirate_url *u, char db[16], const char *argv[2], size_t lens[2]);

#endif
