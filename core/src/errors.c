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
#define HIRATE_ERR_NAME_CASE_(name, value, msg) case HIRATE_##name: return "HIRATE_" #name;
    HIRATE_ERRNO_MAP(HIRATE_ERR_NAME_CASE_)
#undef HIRATE_ERR_NAME_CASE_
    case HIRATE_OK: return "HIRATE_OK";
    default: return "HIRATE_UNKNOWN";
    }
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
