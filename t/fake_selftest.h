/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest.h — what the parts of the fake runtime's self-test share:
 * small helpers and the groups of tests, one function each, that main()
 * (fake_selftest.c) runs in order:
 *   fake_selftest.c          exit-time behaviour of the oracle and of tap.c
 *   fake_selftest_streams.c  devices, streams, work ordering, events,
 *                            ordering through many waits
 *   fake_selftest_memory.c   allocations, the oracle, handouts (whole
 *                            allocations and blocks of one)
 *   fake_selftest_async.c    pools, frees in stream order (cudaFreeAsync)
 *   fake_selftest_control.c  failure injection, error strings, reset
 *   fake_selftest_threads.c  concurrency, fork
 * Each group starts with fake_reset and may call fake_oracle_forgive after
 * violations it provokes on purpose; main checks after each group that it
 * left none it did not expect.
 */
#ifndef CUDEFER_FAKE_SELFTEST_H
#define CUDEFER_FAKE_SELFTEST_H

#include <cuda.h>

#include "fake_cuda.h"
#include "tap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

/* The per-thread-default-stream entry points are not declared by
 * cuda_runtime_api.h unless CUDA_API_PER_THREAD_DEFAULT_STREAM is set. */
cudaError_t cudaStreamGetId_ptsz(cudaStream_t, unsigned long long *);
cudaError_t cudaEventRecord_ptsz(cudaEvent_t, cudaStream_t);

#define GiB ((size_t)1 << 30)
#define MiB ((size_t)1 << 20)
#define ULL(x) ((unsigned long long)(x))

/* ---- Helpers ---------------------------------------------------------- */

static inline double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Run fn(arg) on a new thread and join it. */
static inline void *on_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    void *ret;

    if (pthread_create(&t, NULL, fn, arg) != 0)
        sysbail("pthread_create");
    pthread_join(t, &ret);
    return ret;
}

static inline unsigned long long stream_id(cudaStream_t s)
{
    unsigned long long id = 0;

    if (cudaStreamGetId(s, &id) != cudaSuccess)
        return 0;
    return id;
}

/* The last violation message contains what. */
static inline int last_violation_has(const char *what)
{
    char buf[512];

    fake_last_violation(buf, sizeof buf);
    return strstr(buf, what) != NULL;
}

/* A thread that calls fake_complete(w) after ms milliseconds. */
/* completing_ms: when the completer began to complete w (0 before), so
 * that a wait can be checked to have returned after it, however late the
 * threads ran. */
struct completer { pthread_t t; fake_work *w; unsigned ms; _Atomic double completing_ms; };

static inline void *completer_main(void *arg)
{
    struct completer *c = arg;

    sleep_ms(c->ms);
    atomic_store(&c->completing_ms, now_ms());
    fake_complete(c->w);
    return NULL;
}

/* Whether c's work was being completed before now (a wait that returned
 * waited for it). */
static inline bool completed_before_now(struct completer *c)
{
    double at = atomic_load(&c->completing_ms);
    return at > 0 && at <= now_ms();
}

static inline void complete_later(struct completer *c, fake_work *w, unsigned ms)
{
    c->w = w;
    c->ms = ms;
    atomic_store(&c->completing_ms, 0.0);
    if (pthread_create(&c->t, NULL, completer_main, c) != 0)
        sysbail("pthread_create");
}

/* The groups of tests (main runs them in this order).  Main thread only. */
void test_exit_behaviour(void);
void test_devices(void);
void test_streams(void);
void test_work(void);
void test_events(void);
void test_wait_lattice(void);
void test_allocations(void);
void test_oracle(void);
void test_handout(void);
void test_handout_ranges(void);
/* fake_selftest_async.c */
void test_pools(void);
void test_pool_frees(void);
void test_malloc_free_async(void);
void test_address_reuse(void);
void test_injection(void);
void test_misc(void);
void test_reset(void);
void test_concurrency(void);
void test_thread_accessors(void);
void test_fork(void);

#endif /* CUDEFER_FAKE_SELFTEST_H */
