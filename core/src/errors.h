/* Error messages: a detail formatted into the caller's buffer, and Redis' own
 * words quoted into one (the thread's last message is decide.c's). */
#ifndef HIRATE_ERRORS_H
#define HIRATE_ERRORS_H

#include <stddef.h>

#if defined(__GNUC__)
#  define HIRATE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#  define HIRATE_PRINTF(f, a)
#endif

/* Writes the message into buf (when buf is not NULL) and returns code, so
 * that `return hirate__fail(buf, n, HIRATE_EKEY, "key is empty");` reads well. */
int hirate__fail(char *buf, size_t len, int code, const char *fmt, ...) HIRATE_PRINTF(4, 5);

/* Writes prefix and then text, Redis' own words, into buf: whole when they
 * fit, else cut after the last whole word that fits and ended with "...";
 * bytes that are not printable ASCII show as '?'. Returns code. */
int hirate__fail_quoting(char *buf, size_t len, int code, const char *prefix, const char *text,
                         size_t textlen);

/* Text as a message shows it (an option's value, a list's entry): in double
 * quotes, '"' and '\' escaped, other bytes that are not printable ASCII as
 * \xHH, at most 64 of them, then "..."; cut to fit cap (at least 16). */
void hirate__quote(char *out, size_t cap, const char *text, size_t n);

#endif
