/*
 * A minimal test vocabulary: CHECK(cond), CHECK_EQ_I64(a, b), CHECK_EQ_STR(a, b),
 * then `return check_summary("name");`, which prints "N passed, N failed" and
 * gives the exit status. Failures print the file, line and both values.
 */
#ifndef HIRATE_CHECK_H
#define HIRATE_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int check_passed_, check_failed_;

#define CHECK(cond) do {                                                        \
    if (cond) check_passed_++;                                                  \
    else { check_failed_++;                                                     \
           fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); } \
} while (0)

#define CHECK_EQ_I64(a, b) do {                                                 \
    int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                               \
    if (a_ == b_) check_passed_++;                                              \
    else { check_failed_++;                                                     \
           fprintf(stderr, "%s:%d: %s == %s failed: %" PRId64 " != %" PRId64 "\n", \
                   __FILE__, __LINE__, #a, #b, a_, b_); }                       \
} while (0)

#define CHECK_EQ_STR(a, b) do {                                                 \
    const char *a_ = (a), *b_ = (b);                                            \
    if (a_ && b_ && strcmp(a_, b_) == 0) check_passed_++;                       \
    else { check_failed_++;                                                     \
           fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n",        \
                   __FILE__, __LINE__, #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } \
} while (0)

static inline int check_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
