/* Parsing redis://, rediss:// and unix:// URLs. */
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
} hirate_url;

/* Accepts redis://[[user]:password@]host[:port][/db] (host may be [v6]), the
 * same with rediss:// (TLS), and unix://[[user]:password@]/path[?db=N]. Returns 0 or HIRATE_EURL with a
 * message in err that never contains the password. */
int hirate_url_parse(const char *url, hirate_url *out, char *err, size_t errlen);

/* The connection's handshake, as command arguments: AUTH [user] password
 * when the URL has a password, SELECT db when it names a database other than
 * 0. Each returns argc, 0 when the command is not needed. db is room for the
 * number. The arguments point into u (and db). */
int hirate_url_auth_argv(const hirate_url *u, const char *argv[3], size_t lens[3]);
int hirate_url_select_argv(const hirate_url *u, char db[16], const char *argv[2], size_t lens[2]);

#endif
