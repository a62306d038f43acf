/* SPDX-License-Identifier: MIT */
/*
 * tap.c — TAP producer; see tap.h.
 */
#define _POSIX_C_SOURCE 200809L

#include "tap.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

enum plan_kind { PLAN_NONE, PLAN_FIXED, PLAN_LAZY };

/* All state below is guarded by tap_lock. */
static pthread_mutex_t tap_lock = PTHREAD_MUTEX_INITIALIZER;
static enum plan_kind plan_kind = PLAN_NONE;
static unsigned long planned;    /* fixed plan: number of tests */
static unsigned long count;      /* tests reported so far */
static unsigned long failures;   /* tests reported "not ok" */
static int atexit_done;          /* finish() registered */

/* Format into a malloc'd string (NULL for a NULL fmt or on ENOMEM). */
static char *vformat(const char *fmt, va_list ap)
{
    char small[512];
    va_list ap2;
    int n;
    char *s;

    if (fmt == NULL)
        return NULL;
    va_copy(ap2, ap);
    n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return NULL;
    s = malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    if ((size_t)n < sizeof small)
        memcpy(s, small, (size_t)n + 1);
    else
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

/* Print msg as TAP comment lines ("# " before each line).  Lock held. */
static void print_comment(const char *msg)
{
    const char *p = msg;

    do {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);

        if (nl != NULL && nl[1] == '\0')
            nl = NULL;                  /* a trailing newline ends it */
        printf("# %.*s\n", (int)len, p);
        p = nl ? nl + 1 : NULL;
    } while (p != NULL);
    fflush(stdout);
}

/* At exit: print the lazy trailer, and make the exit status reflect
 * failures and a plan that was not met.  _exit() because calling exit()
 * from an atexit handler is undefined. */
static void finish(void)
{
    int bad = 0;

    pthread_mutex_lock(&tap_lock);
    if (plan_kind == PLAN_LAZY) {
        if (count == 0) {
            printf("# Looks like no tests were run\n");
            bad = 1;
        } else {
            printf("1..%lu\n", count);
        }
    } else if (plan_kind == PLAN_FIXED && count != planned) {
        printf("# Looks like you planned %lu test%s but ran %lu\n",
               planned, planned == 1 ? "" : "s", count);
        bad = 1;
    }
    if (failures > 0) {
        printf("# Looks like you failed %lu test%s of %lu\n",
               failures, failures == 1 ? "" : "s", count);
        bad = 1;
    }
    fflush(stdout);
    pthread_mutex_unlock(&tap_lock);
    if (bad)
        _exit(1);
}

/* Keep tap_lock consistent across fork() (a child may report results). */
static void fork_prepare(void) { pthread_mutex_lock(&tap_lock); }
static void fork_release(void) { pthread_mutex_unlock(&tap_lock); }

/* Set the plan (lock held). */
static void set_plan(enum plan_kind kind, unsigned long n)
{
    if (plan_kind != PLAN_NONE) {
        pthread_mutex_unlock(&tap_lock);
        bail("plan declared twice");
    }
    plan_kind = kind;
    planned = n;
    if (!atexit_done) {
        atexit_done = 1;
        if (atexit(finish) != 0 ||
            pthread_atfork(fork_prepare, fork_release, fork_release) != 0) {
            pthread_mutex_unlock(&tap_lock);
            bail("cannot register the TAP exit and fork handlers");
        }
    }
    if (kind == PLAN_FIXED) {
        printf("1..%lu\n", n);
        fflush(stdout);
    }
}

void plan(unsigned long n)
{
    pthread_mutex_lock(&tap_lock);
    set_plan(PLAN_FIXED, n);
    pthread_mutex_unlock(&tap_lock);
}

void plan_lazy(void)
{
    pthread_mutex_lock(&tap_lock);
    set_plan(PLAN_LAZY, 0);
    pthread_mutex_unlock(&tap_lock);
}

void skip_all(const char *fmt, ...)
{
    va_list ap;
    char *why;

    va_start(ap, fmt);
    why = vformat(fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&tap_lock);
    printf("1..0 # SKIP%s%s\n", why ? " " : "", why ? why : "");
    fflush(stdout);
    free(why);
    _exit(0);   /* no atexit handlers: they would judge a plan we skipped */
}

/* Whether desc ends in a TODO directive ("... # TODO reason"): TAP counts a
 * "not ok" with one as an expected failure, not a failure (and the
 * driver counts an "ok" with one as an unexpected pass). */
static int is_todo(const char *desc)
{
    const char *hash = desc != NULL ? strrchr(desc, '#') : NULL;

    if (hash == NULL)
        return 0;
    for (hash++; *hash == ' '; hash++)
        ;
    return strncasecmp(hash, "TODO", 4) == 0;
}

/* Report one test result (desc is consumed; extra is printed as
 * diagnostics after a failure).  Returns success. */
static int report(int success, char *desc, const char *extra)
{
    char *p;

    for (p = desc; p != NULL && *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    pthread_mutex_lock(&tap_lock);
    if (plan_kind == PLAN_NONE)
        set_plan(PLAN_LAZY, 0);
    count++;
    if (!success && !is_todo(desc))
        failures++;
    printf("%sok %lu%s%s\n", success ? "" : "not ", count,
           desc && *desc ? " - " : "", desc ? desc : "");
    if (!success && extra != NULL)
        print_comment(extra);
    fflush(stdout);
    pthread_mutex_unlock(&tap_lock);
    free(desc);
    return success;
}

int ok(int success, const char *fmt, ...)
{
    va_list ap;
    char *desc;

    va_start(ap, fmt);
    desc = vformat(fmt, ap);
    va_end(ap);
    return report(success != 0, desc, NULL);
}

int is_int(long long have, long long want, const char *fmt, ...)
{
    va_list ap;
    char *desc, extra[128];

    va_start(ap, fmt);
    desc = vformat(fmt, ap);
    va_end(ap);
    snprintf(extra, sizeof extra, "  wanted: %lld\n    seen: %lld", want, have);
    return report(have == want, desc, extra);
}

int is_hex(unsigned long long have, unsigned long long want,
           const char *fmt, ...)
{
    va_list ap;
    char *desc, extra[128];

    va_start(ap, fmt);
    desc = vformat(fmt, ap);
    va_end(ap);
    snprintf(extra, sizeof extra, "  wanted: 0x%llx\n    seen: 0x%llx",
             want, have);
    return report(have == want, desc, extra);
}

int is_str(const char *have, const char *want, const char *fmt, ...)
{
    va_list ap;
    char *desc, *extra;
    int same, r;
    size_t n;

    va_start(ap, fmt);
    desc = vformat(fmt, ap);
    va_end(ap);
    same = (have == NULL || want == NULL) ? have == want
                                          : strcmp(have, want) == 0;
    if (same)
        return report(1, desc, NULL);
    if (have == NULL)
        have = "(null)";
    if (want == NULL)
        want = "(null)";
    n = strlen(have) + strlen(want) + 32;
    extra = malloc(n);
    if (extra != NULL)
        snprintf(extra, n, "  wanted: \"%s\"\n    seen: \"%s\"", want, have);
    r = report(0, desc, extra);
    free(extra);
    return r;
}

void skip_block(unsigned long n, const char *reason_fmt, ...)
{
    va_list ap;
    char *why;
    unsigned long i;

    va_start(ap, reason_fmt);
    why = vformat(reason_fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&tap_lock);
    if (plan_kind == PLAN_NONE)
        set_plan(PLAN_LAZY, 0);
    for (i = 0; i < n; i++)
        printf("ok %lu # skip%s%s\n", ++count, why ? " " : "", why ? why : "");
    fflush(stdout);
    pthread_mutex_unlock(&tap_lock);
    free(why);
}

void skip(const char *reason_fmt, ...)
{
    va_list ap;
    char *why;

    va_start(ap, reason_fmt);
    why = vformat(reason_fmt, ap);
    va_end(ap);
    skip_block(1, "%s", why ? why : "");
    free(why);
}

void diag(const char *fmt, ...)
{
    va_list ap;
    char *msg;

    va_start(ap, fmt);
    msg = vformat(fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&tap_lock);
    print_comment(msg ? msg : "(diag: out of memory)");
    pthread_mutex_unlock(&tap_lock);
    free(msg);
}

/* Print "Bail out! msg[: strerror]" and exit 255 without running atexit
 * handlers (a bail-out needs no trailer or plan check). */
static void TAP_NORETURN vbail(int err, const char *fmt, va_list ap)
{
    char *msg = vformat(fmt, ap);

    fflush(stdout);
    printf("Bail out! %s%s%s\n", msg ? msg : "", err ? ": " : "",
           err ? strerror(err) : "");
    fflush(stdout);
    _exit(255);
}

void bail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vbail(0, fmt, ap);
}

void sysbail(const char *fmt, ...)
{
    int err = errno;
    va_list ap;

    va_start(ap, fmt);
    vbail(err, fmt, ap);
}

unsigned long tap_count(void)
{
    unsigned long n;

    pthread_mutex_lock(&tap_lock);
    n = count;
    pthread_mutex_unlock(&tap_lock);
    return n;
}

unsigned long tap_failures(void)
{
    unsigned long n;

    pthread_mutex_lock(&tap_lock);
    n = failures;
    pthread_mutex_unlock(&tap_lock);
    return n;
}
