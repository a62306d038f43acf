/* SPDX-License-Identifier: MIT */
/*
 * tap.h — a small TAP (Test Anything Protocol) producer for cudefer's tests.
 *
 * Output goes to stdout (flushed after every line), as the automake
 * tap-driver.sh expects.  Every function is thread-safe: test numbers are
 * assigned and lines written under one mutex, so ok() may be called from
 * many threads at once.
 *
 * Exit status: at exit, if a lazy plan was declared the trailer "1..N" is
 * printed.  If any test failed, or a fixed plan was not met, the process
 * exits with status 1 (after a "# Looks like ..." comment) whatever main
 * returned.  skip_all() exits 0 after "1..0 # SKIP reason" (never 77: under
 * tap-driver.sh that would be an error); bail() exits 255.
 */
#ifndef CUDEFER_TAP_H
#define CUDEFER_TAP_H

#include <stddef.h>

#if defined(__GNUC__)
#  define TAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#  define TAP_NORETURN __attribute__((noreturn))
#else
#  define TAP_PRINTF(f, a)
#  define TAP_NORETURN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Declare that n tests will run; prints "1..n" now.  Call once, first. */
void plan(unsigned long n);

/* Declare that the number of tests is known only at the end; "1..N" is
 * printed at exit. */
void plan_lazy(void);

/* Skip the whole test program: prints "1..0 # SKIP reason", exits 0.
 * Only before any test has run. */
void skip_all(const char *fmt, ...) TAP_PRINTF(1, 2) TAP_NORETURN;

/* Report one test: "ok N - description" or "not ok N - description".
 * fmt may be NULL (no description).  Returns success != 0.  A description
 * ending in a TODO directive ("... # TODO why") marks a known failure: not
 * counted as one (the exit status stays 0); the driver reports it XFAIL,
 * or XPASS (a failure of make check) once it passes. */
int ok(int success, const char *fmt, ...) TAP_PRINTF(2, 3);

/* Test that have == want; on failure, prints both as diagnostics. */
int is_int(long long have, long long want, const char *fmt, ...)
    TAP_PRINTF(3, 4);

/* Same for unsigned values, printed in hex. */
int is_hex(unsigned long long have, unsigned long long want,
           const char *fmt, ...) TAP_PRINTF(3, 4);

/* Test that two strings are equal (two NULLs are equal). */
int is_str(const char *have, const char *want, const char *fmt, ...)
    TAP_PRINTF(3, 4);

/* Report one skipped test: "ok N # skip reason". */
void skip(const char *reason_fmt, ...) TAP_PRINTF(1, 2);

/* Report n skipped tests with the same reason. */
void skip_block(unsigned long n, const char *reason_fmt, ...)
    TAP_PRINTF(2, 3);

/* Print a diagnostic: each line of the message prefixed with "# ". */
void diag(const char *fmt, ...) TAP_PRINTF(1, 2);

/* Abort the test program: "Bail out! message", exit status 255. */
void bail(const char *fmt, ...) TAP_PRINTF(1, 2) TAP_NORETURN;

/* bail() with ": strerror(errno)" appended. */
void sysbail(const char *fmt, ...) TAP_PRINTF(1, 2) TAP_NORETURN;

/* Number of tests reported so far, and how many of them failed. */
unsigned long tap_count(void);
unsigned long tap_failures(void);

#ifdef __cplusplus
}
#endif

#endif /* CUDEFER_TAP_H */
