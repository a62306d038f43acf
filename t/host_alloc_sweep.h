/* SPDX-License-Identifier: MIT */
/* Out of host memory, for t/host_alloc_calls.c and t/host_alloc_filing.c:
 * the allocator functions replaced (ELF interposition: the library's calls
 * come here too) so that the armed thread's n-th malloc, calloc or realloc
 * fails (the fake runtime's own are spared), and the sweep, which makes a
 * call again and again, each time in a fresh child process with the next
 * of its allocations failing; shutdown then releases every pointer,
 * returns cudaSuccess, and leaves nothing the armed call allocated behind;
 * scenario_child_end's oracle check sees nothing released early.
 *
 * It defines malloc, calloc, realloc and free: include it in one file of a
 * program only.  A sanitizer's own replacements would clash: where
 * UNDER_SANITIZER is defined it defines nothing, and the program skips. */
#ifndef CUDEFER_T_HOST_ALLOC_SWEEP_H
#define CUDEFER_T_HOST_ALLOC_SWEEP_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudefer.h"
#include "fake_cuda.h"
#include "helpers.h"
#include "tap.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

#ifndef UNDER_SANITIZER
/* ---- the allocator, with failure injection ------------------------------ */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

/* The armed thread's allocations: the fail_at-th (from 0) fails; seen
 * counts them.  Only the thread that armed counts (the reclaimer's are
 * its own business: another test's), and never inside the fake. */
static _Thread_local bool armed;
static _Thread_local long fail_at, seen;

/* What the armed thread allocated and nobody freed yet (any thread may
 * free it): a small open table under a spin lock, enough for a call. */
#define TRACKED 4096
static void *tracked[TRACKED];
static atomic_flag tracked_lock = ATOMIC_FLAG_INIT;
static size_t tracked_count, tracked_overflow;

static inline void track_lock(void)
{
    while (atomic_flag_test_and_set_explicit(&tracked_lock,
                                             memory_order_acquire))
        ;
}

static inline void track_unlock(void)
{
    atomic_flag_clear_explicit(&tracked_lock, memory_order_release);
}

static inline void track(void *p)
{
    track_lock();
    size_t i = 0;
    while (i < TRACKED && tracked[i] != NULL)
        i++;
    if (i < TRACKED) {
        tracked[i] = p;
        tracked_count++;
    } else {
        tracked_overflow++;
    }
    track_unlock();
}

static inline bool untrack(void *p)
{
    bool was = false;
    track_lock();
    for (size_t i = 0; i < TRACKED && tracked_count > 0; i++)
        if (tracked[i] == p) {
            tracked[i] = NULL;
            tracked_count--;
            was = true;
            break;
        }
    track_unlock();
    return was;
}

/* Whether this allocation of the armed thread is the one to fail. */
static inline bool counted(void)
{
    if (!armed || fake_in_call())
        return false;
    return seen++ == fail_at;
}

void *malloc(size_t n)
{
    bool fail = counted(), mine = armed && !fake_in_call();
    if (fail) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = __libc_malloc(n);
    if (p != NULL && mine)
        track(p);
    return p;
}

void *calloc(size_t n, size_t size)
{
    bool fail = counted(), mine = armed && !fake_in_call();
    if (fail) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = __libc_calloc(n, size);
    if (p != NULL && mine)
        track(p);
    return p;
}

void *realloc(void *old, size_t n)
{
    if (old == NULL)
        return malloc(n);
    bool fail = counted(), mine = armed && !fake_in_call();
    if (fail) {
        errno = ENOMEM;
        return NULL;
    }
    bool was = untrack(old);
    void *p = __libc_realloc(old, n);
    if (p == NULL && n != 0 && was)
        track(old);
    else if (p != NULL && (was || mine))
        track(p);
    return p;
}

void free(void *p)
{
    if (p != NULL)
        untrack(p);
    __libc_free(p);
}

/* ---- the sweep ------------------------------------------------------------ */

/* Shared with the children: whether the child's failure point was
 * reached (no: the call makes fewer allocations; the sweep is over). */
static _Atomic int *reached;

/* A call swept: sets up (unarmed), makes the call armed with its
 * fail_at-th allocation failing, then checks what a refusal needs; puts
 * in mine[*nmine...] the pointers shutdown must release; returns the
 * call's error. */
struct sweep {
    const char *what;
    cudaError_t (*call)(long fail_at, void **mine, int *nmine);
};

static cudaStream_t s, s2;

/* In a child: the sweep's call with its fail_at-th allocation failing,
 * then shutdown: everything released, nothing of the call's left. */
static inline void child(const struct sweep *w, long n)
{
    failed_checks = 0;
    fake_reset(1);
    s = stream_new();
    s2 = stream_new();
    void *mine[64];
    int nmine = 0;
    w->call(n, mine, &nmine);
    stderr_capture_begin();
    cudaError_t err = defer_shutdown();
    stderr_capture_end();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    for (int i = 0; i < nmine; i++)
        CHECK(mine[i] == NULL || fake_is_released(mine[i]),
              "pointer %d (%p) released by the shutdown", i, mine[i]);
    /* One stays: the reclaimer's thread-local storage (296 bytes here),
     * which pthread_create allocates on the creating thread and glibc
     * keeps with the thread's cached stack after the join. */
    track_lock();
    size_t left = tracked_count, over = tracked_overflow;
    track_unlock();
    CHECK(over == 0, "tracked every allocation");
    CHECK(left <= 1, "%zu allocations of the armed call left after "
          "shutdown", left);
    scenario_child_end();
}

/* Allocations failed one by one; beyond, one in STRIDE (the first call
 * makes a stock of 2,048 events, an allocation each, in one loop). */
#define EACH 64
#define STRIDE 61

/* One TAP result: w's call with each of its allocations failing in turn. */
static inline void sweep(const struct sweep *w)
{
    long n = 0, bad = 0, tries = 0;
    for (; n < 100000; n += n < EACH ? 1 : STRIDE, tries++) {
        *reached = 0;
        pid_t pid = fork_flushed();
        if (pid == 0)
            child(w, n);
        int status;
        bool fine = wait_child(pid, 20000, &status) && WIFEXITED(status) &&
                    WEXITSTATUS(status) == 0;
        if (!fine) {
            diag("%s: with allocation %ld failing: failed", w->what, n);
            bad++;
        }
        if (!*reached)
            break;
    }
    ok(bad == 0 && n > 0 && n < 100000,
       "%s: its host allocations failing, each of the first %d (of %ld) "
       "and one in %d beyond, in turn (%ld children): refused and said, or "
       "accepted; all released, nothing left", w->what, EACH, n, STRIDE,
       tries);
}
#endif /* UNDER_SANITIZER */

#endif
