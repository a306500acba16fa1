/* check — the small assertion kit every unit test uses.
 *
 * CHECK(cond), CHECK_EQ_INT(expected, got), CHECK_NEAR(expected, got, atol, rtol) and
 * CHECK_OK(status) print file:line, expected, got and the difference on failure and count it;
 * check_done() prints "N passed, N failed" and returns the process exit status.
 */
#ifndef FSDP_CHECK_H
#define FSDP_CHECK_H

#include <math.h>
#include <stdio.h>

#include "err.h"

static int check_pass_, check_fail_;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (cond) check_pass_++;                                               \
    else {                                                                 \
      check_fail_++;                                                       \
      fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                      \
  } while (0)

#define CHECK_EQ_INT(expected, got)                                                        \
  do {                                                                                     \
    long long e_ = (long long)(expected), g_ = (long long)(got);                           \
    if (e_ == g_) check_pass_++;                                                           \
    else {                                                                                 \
      check_fail_++;                                                                       \
      fprintf(stderr, "%s:%d: FAILED: %s == %s: expected %lld, got %lld (diff %lld)\n",     \
              __FILE__, __LINE__, #expected, #got, e_, g_, g_ - e_);                       \
    }                                                                                      \
  } while (0)

/* |got - expected| <= atol + rtol·|expected| */
#define CHECK_NEAR(expected, got, atol, rtol)                                               \
  do {                                                                                      \
    double e_ = (double)(expected), g_ = (double)(got);                                     \
    double tol_ = (atol) + (rtol) * fabs(e_);                                               \
    if (fabs(g_ - e_) <= tol_) check_pass_++;                                               \
    else {                                                                                  \
      check_fail_++;                                                                        \
      fprintf(stderr, "%s:%d: FAILED: %s ~ %s: expected %.9g, got %.9g (diff %.3g, tol %.3g)\n", \
              __FILE__, __LINE__, #expected, #got, e_, g_, fabs(g_ - e_), tol_);            \
    }                                                                                       \
  } while (0)

#define CHECK_OK(expr)                                                                      \
  do {                                                                                      \
    fsdp_status s_ = (expr);                                                                \
    if (s_ == FSDP_OK) check_pass_++;                                                       \
    else {                                                                                  \
      check_fail_++;                                                                        \
      fprintf(stderr, "%s:%d: FAILED: %s returned %s: %s\n", __FILE__, __LINE__, #expr,     \
              fsdp_strerror(s_), fsdp_last_error());                                        \
    }                                                                                       \
  } while (0)

static inline int check_done(void) {
  printf("%d passed, %d failed\n", check_pass_, check_fail_);
  return check_fail_ ? 1 : 0;
}

#endif
