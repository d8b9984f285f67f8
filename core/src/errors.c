/* Error codes and names, generated from the one list in hirate.h. */
#include <stdarg.h>
#include <stdio.h>

#include "errors.h"
#include "hirate.h"

const char *hirate_strerror(int code)
{
    switch (code) {
#define HIRATE_STRERROR_CASE_(name, value, msg) case HIRATE_##name: return msg;
    HIRATE_ERRNO_MAP(HIRATE_STRERROR_CASE_)
#undef HIRATE_STRERROR_CASE_
    case HIRATE_OK: return "success";
    default: return "unknown error";
    }
}

const char *hirate_err_name(int code)
{
    switch (code) {
#define HIRATE_ERR_NAME_CASE_(name, value, msg) case HIRATE_##name: return #name;
    HIRATE_ERRNO_MAP(HIRATE_ERR_NAME_CASE_)
#undef HIRATE_ERR_NAME_CASE_
    case HIRATE_OK: return "OK";
    default: return "UNKNOWN";
    }
}

int hirate_range_errmsg(int code, const char *what, const char *shown, char *err, size_t errlen)
{
    if ((code != HIRATE_ECAPACITY && code != HIRATE_ECOST) || !shown)
        return hirate__fail(err, errlen, HIRATE_EINVAL,
                            "hirate_range_errmsg takes ECAPACITY or ECOST, and a value");
    int capacity = code == HIRATE_ECAPACITY;
    return hirate__fail(err, errlen, code, "%s must be a whole number from %d to 2^53-1, got %s",
                        what ? what : capacity ? "capacity" : "cost", capacity, shown);
}

const char *hirate_source_name(int source)
{
    switch (source) {
    case HIRATE_SOURCE_REDIS: return "redis";
    case HIRATE_SOURCE_LOCAL: return "local";
    case HIRATE_SOURCE_CACHE: return "cache";
    case HIRATE_SOURCE_FAIL_OPEN: return "fail_open";
    case HIRATE_SOURCE_FAIL_CLOSED: return "fail_closed";
    default: return "unknown";
    }
}

int hirate__fail(char *buf, size_t len, int code, const char *fmt, ...)
{
    if (buf && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

int hirate__fail_quoting(char *buf, size_t len, int code, const char *prefix, const char *text,
                         size_t textlen)
{
    if (!buf || !len)
        return code;
    size_t at = (size_t)snprintf(buf, len, "%s", prefix);
    if (at >= len - 1)
        return code;
    size_t room = len - 1 - at, n = textlen;
    if (n > room) {
        /* The last whole word that leaves room for "...". */
        n = room >= 3 ? room - 3 : 0;
        while (n > 0 && text[n] != ' ')
            n--;
        while (n > 0 && text[n - 1] == ' ')
            n--;
        if (n == 0)   /* one word longer than the buffer */
            n = room >= 3 ? room - 3 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        buf[at++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (n < textlen)
        for (int i = 0; i < 3 && at < len - 1; i++)
            buf[at++] = '.';
    buf[at] = '\0';
    return code;
}

void hirate__quote(char *out, size_t cap, const char *text, size_t len)
{
    size_t n = 0;
    out[n++] = '"';
    for (size_t i = 0; i < len && n + 8 < cap; i++) {
        unsigned char c = (unsigned char)text[i];
        if (i == 64) {
            n += (size_t)snprintf(out + n, cap - n, "...");
            break;
        }
        if (c == '"' || c == '\\')
            n += (size_t)snprintf(out + n, cap - n, "\\%c", c);
        else if (c < 0x20 || c > 0x7e)
            n += (size_t)snprintf(out + n, cap - n, "\\x%02x", c);
        else
            out[n++] = (char)c;
    }
    out[n++] = '"';
    out[n] = '\0';
}
