/* SPDX-License-Identifier: MIT */
/* The out-of-memory handler (defer_set_oom_handler): told the bytes and
 * device of a request that failed after cudefer's own trim and retry, on
 * the allocating thread; nonzero has the request tried again, 0 lets it
 * fail; bounded calls, no recursion, not called for a request above the
 * device; NULL removes it and the pair replaced comes back; a handler that
 * frees, flushes, trims or allocates runs without deadlock; a pair set
 * while others allocate is read whole.  Each scenario in a child with a
 * deadline: a deadlock is a failure, not a hang. */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)
#define ENV "CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s"

/* Leave room bytes free on device dev (made current), with nothing of
 * cudefer's cached: what the device holds now plus room is all it has. */
static void leave_room(int dev, size_t room)
{
    cudaSetDevice(dev);
    defer_flush();
    defer_trim(NULL);
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    fake_set_device_memory(dev, total - free_b + room);
}

/* What a handler saw, and what it answers. */
struct seen {
    atomic_int calls;
    size_t bytes;
    int device;
    pthread_t thread;
    unsigned long tries; /* cudaMallocFromPoolAsync calls at its first call */
    int answer;
};

static int recording_handler(size_t bytes, int device, void *arg)
{
    struct seen *s = arg;
    if (atomic_fetch_add(&s->calls, 1) == 0)
        s->tries = fake_entered(FAKE_MALLOC_ASYNC);
    s->bytes = bytes;
    s->device = device;
    s->thread = pthread_self();
    return s->answer;
}

/* A handler that answers 0, on device 1 of 2: called once per request,
 * with the bytes asked for and the block's device, on the caller's thread,
 * after cudefer's own tries; the request fails as without it, counted,
 * nothing said.  The pluggable entry points call it too; a request above
 * the device's memory does not. */
static void scenario_told(void)
{
    struct seen seen = {.answer = 0};
    cudaSetDevice(1);
    cudaStream_t s = stream_new();
    void *warm = NULL;
    CHECK(defer_alloc(&warm, 4096, s) == cudaSuccess, "a first block");
    CHECK(defer_free(warm, s) == cudaSuccess, "freed");
    leave_room(1, 4 * MiB);
    cudaSetDevice(0);
    CHECK(defer_set_oom_handler(recording_handler, &seen, NULL, NULL) ==
              cudaSuccess, "set");
    uint64_t rejected = stats_now().rejected;
    unsigned long tries = fake_entered(FAKE_MALLOC_ASYNC);
    void *p = &p;
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, 8 * MiB + 1, s);
    const char *said = stderr_capture_end();
    CHECK(err == cudaErrorMemoryAllocation && p == NULL,
          "answer 0: out of memory (%s)", cudaGetErrorName(err));
    CHECK(atomic_load(&seen.calls) == 1, "called once (%d)",
          atomic_load(&seen.calls));
    CHECK(seen.bytes == 8 * MiB + 1 && seen.device == 1,
          "told %zu bytes on device %d", seen.bytes, seen.device);
    CHECK(pthread_equal(seen.thread, pthread_self()),
          "on the allocating thread");
    CHECK(seen.tries - tries >= 2,
          "after cudefer's try and its retry after the trim (%lu before)",
          seen.tries - tries);
    CHECK(stats_now().rejected == rejected + 1, "counted in rejected once");
    CHECK(said[0] == '\0', "nothing said (%s)", said);

    /* PyTorch's entry points, with device 0 current. */
    void *q = &q;
    err = defer_pluggable_alloc_status(&q, 6 * MiB, 1, 0);
    CHECK(err == cudaErrorMemoryAllocation && q == NULL &&
              atomic_load(&seen.calls) == 2 && seen.bytes == 6 * MiB &&
              seen.device == 1,
          "defer_pluggable_alloc_status: called with %zu bytes, device %d",
          seen.bytes, seen.device);
    stderr_capture_begin();
    void *r = defer_pluggable_alloc(5 * MiB, 1, s);
    stderr_capture_end();
    CHECK(r == NULL && atomic_load(&seen.calls) == 3 &&
              seen.bytes == 5 * MiB && seen.device == 1,
          "defer_pluggable_alloc: called with %zu bytes, device %d",
          seen.bytes, seen.device);

    /* No freeing makes these fit: not called.  (The device's memory is
     * what it had when cudefer first missed on it.) */
    size_t total = FAKE_DEFAULT_DEVICE_MEMORY;
    err = defer_alloc(&p, total + 1, s);
    CHECK(err == cudaErrorMemoryAllocation && atomic_load(&seen.calls) == 3,
          "above the device's memory (%zu bytes): not called (%s, %d calls)",
          total + 1, cudaGetErrorName(err), atomic_load(&seen.calls));
    stderr_capture_begin();
    CHECK(defer_alloc(&p, SIZE_MAX, s) == cudaErrorMemoryAllocation &&
              atomic_load(&seen.calls) == 3,
          "SIZE_MAX bytes: not called");
    stderr_capture_end();
    /* Room again: a request that fits never calls it. */
    fake_set_device_memory(1, FAKE_DEFAULT_DEVICE_MEMORY);
    CHECK(defer_alloc(&p, 8 * MiB, s) == cudaSuccess &&
              atomic_load(&seen.calls) == 3,
          "a request that fits: not called");
    CHECK(defer_free(p, s) == cudaSuccess, "freed");
    defer_set_oom_handler(NULL, NULL, NULL, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* The handler frees memory of the application's own and answers 1. */
static void *mine;
static atomic_int freeing_calls;

static int freeing_handler(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    atomic_fetch_add(&freeing_calls, 1);
    if (mine != NULL && cudaFree(mine) == cudaSuccess)
        mine = NULL;
    return 1;
}

/* The handler frees 8 MiB of the application's and asks for a retry: the
 * request succeeds, the handler called once, nothing counted as rejected. */
static void scenario_retry_fits(void)
{
    cudaStream_t s = stream_new();
    void *warm = NULL;
    CHECK(defer_alloc(&warm, 4096, s) == cudaSuccess, "a first block");
    CHECK(defer_free(warm, s) == cudaSuccess, "freed");
    mine = device_alloc(8 * MiB);
    leave_room(0, 4 * MiB);
    defer_set_oom_handler(freeing_handler, NULL, NULL, NULL);
    uint64_t rejected = stats_now().rejected;
    void *p = NULL;
    cudaError_t err = alloc_checked(&p, 8 * MiB, s);
    CHECK(err == cudaSuccess && p != NULL,
          "8 MiB with 4 MiB free, the handler freeing 8: %s",
          cudaGetErrorName(err));
    CHECK(atomic_load(&freeing_calls) == 1 && mine == NULL,
          "called once (%d), its memory freed",
          atomic_load(&freeing_calls));
    CHECK(stats_now().rejected == rejected, "nothing rejected");
    CHECK(defer_free(p, s) == cudaSuccess, "freed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A handler that leaves another device current (it freed memory there,
 * say): the retry still allocates on the request's device, and the
 * caller's current device is as it was before the call. */
static int switching_handler(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    atomic_fetch_add(&freeing_calls, 1);
    if (mine != NULL && cudaFree(mine) == cudaSuccess)
        mine = NULL;
    cudaSetDevice(1);
    return 1;
}

static void scenario_handler_switches_device(void)
{
    void *warm = defer_pluggable_alloc(4096, 0, 0);
    CHECK(warm != NULL, "a first block");
    defer_pluggable_free(warm, 4096, 0, 0);
    mine = device_alloc(8 * MiB);
    leave_room(0, 4 * MiB);
    cudaSetDevice(0);
    defer_set_oom_handler(switching_handler, NULL, NULL, NULL);
    void *p = defer_pluggable_alloc(8 * MiB, 0, 0);
    int current = -1;
    cudaGetDevice(&current);
    struct cudaPointerAttributes at = {0};
    CHECK(p != NULL && cudaPointerGetAttributes(&at, p) == cudaSuccess &&
              at.device == 0,
          "8 MiB on device 0 with 4 MiB free, the handler freeing 8 and "
          "switching to device 1: %p on device %d", p, at.device);
    CHECK(atomic_load(&freeing_calls) == 1, "called once (%d)",
          atomic_load(&freeing_calls));
    CHECK(current == 0, "device 0 current after the call (%d)", current);
    defer_pluggable_free(p, 8 * MiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess, "flushed");
    CHECK(fake_violations() == 0, "oracle: nothing released or reused early");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A handler that uses cudefer itself: defer_free of a block whose work on
 * another stream is still running, defer_flush (waits for that work),
 * defer_trim, and a nested defer_alloc that runs out of memory too (fails
 * at once, the handler not called again); then answers 1. */
static struct {
    void *block;
    cudaStream_t other;
    atomic_int calls;
    cudaError_t freed, flushed, trimmed, nested;
    void *nested_ptr;
} user;

static int using_handler(size_t bytes, int device, void *arg)
{
    (void)device, (void)arg;
    if (atomic_fetch_add(&user.calls, 1) > 0)
        return 0;
    user.freed = defer_free(user.block, user.other);
    user.flushed = defer_flush();
    user.trimmed = defer_trim(NULL);
    /* Nothing fits for the nested request: it runs out of memory too. */
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    user.nested_ptr = &user;
    user.nested = defer_alloc(&user.nested_ptr, bytes, user.other);
    fake_fail_clear();
    return 1;
}

static void scenario_handler_uses_cudefer(void)
{
    cudaStream_t s = stream_new();
    user.other = stream_new();
    CHECK(alloc_checked(&user.block, 8 * MiB, user.other) == cudaSuccess,
          "a block of 8 MiB on the other stream");
    leave_room(0, 4 * MiB);
    work_timed(user.other, 20000, user.block); /* 20 ms */
    defer_set_oom_handler(using_handler, NULL, NULL, NULL);
    void *p = NULL;
    double start = now_ms();
    cudaError_t err = alloc_checked(&p, 6 * MiB, s);
    CHECK(err == cudaSuccess && p != NULL,
          "6 MiB with 4 MiB free, the handler freeing 8: %s (%.0f ms)",
          cudaGetErrorName(err), now_ms() - start);
    CHECK(atomic_load(&user.calls) == 1, "called once (%d)",
          atomic_load(&user.calls));
    CHECK(user.freed == cudaSuccess && user.flushed == cudaSuccess &&
              user.trimmed == cudaSuccess,
          "defer_free, defer_flush and defer_trim inside: %s, %s, %s",
          cudaGetErrorName(user.freed), cudaGetErrorName(user.flushed),
          cudaGetErrorName(user.trimmed));
    CHECK(user.nested == cudaErrorMemoryAllocation && user.nested_ptr == NULL,
          "a nested defer_alloc out of memory: fails, no recursion (%s)",
          cudaGetErrorName(user.nested));
    CHECK(defer_free(p, s) == cudaSuccess, "freed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* The pair replaced comes back, to chain to; NULL removes the handler. */
static struct seen first = {.answer = 0}, second_seen = {.answer = 0};
static defer_oom_handler chained_fn;
static void *chained_arg;

static int chaining_handler(size_t bytes, int device, void *arg)
{
    recording_handler(bytes, device, arg);
    return chained_fn != NULL ? chained_fn(bytes, device, chained_arg) : 0;
}

static void scenario_chain_and_remove(void)
{
    defer_oom_handler fn = chaining_handler;
    void *arg = &fn;
    CHECK(defer_set_oom_handler(recording_handler, &first, &fn, &arg) ==
              cudaSuccess && fn == NULL && arg == NULL,
          "the first set: none replaced");
    CHECK(defer_set_oom_handler(chaining_handler, &second_seen, &chained_fn,
                                &chained_arg) == cudaSuccess &&
              chained_fn == recording_handler && chained_arg == &first,
          "the second: the first pair back");
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    cudaStream_t s = stream_new();
    void *p = NULL;
    CHECK(defer_alloc(&p, MiB, s) == cudaErrorMemoryAllocation &&
              atomic_load(&second_seen.calls) == 1 &&
              atomic_load(&first.calls) == 1,
          "out of memory: both called once (%d, %d)",
          atomic_load(&second_seen.calls), atomic_load(&first.calls));
    /* Only one of a pointer pair asked for. */
    fn = NULL;
    CHECK(defer_set_oom_handler(NULL, &fn, &fn, NULL) == cudaSuccess &&
              fn == chaining_handler,
          "removed; the handler replaced back alone");
    CHECK(defer_alloc(&p, MiB, s) == cudaErrorMemoryAllocation &&
              atomic_load(&second_seen.calls) == 1 &&
              atomic_load(&first.calls) == 1,
          "out of memory without a handler: nothing called");
    arg = &arg;
    CHECK(defer_set_oom_handler(NULL, NULL, &fn, &arg) == cudaSuccess &&
              fn == NULL && arg == NULL,
          "a removal's arg is not kept: none replaced");
    fake_fail_clear();
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    /* After shutdown it still sets (nothing calls it). */
    CHECK(defer_set_oom_handler(recording_handler, &first, &fn, NULL) ==
              cudaSuccess && fn == NULL,
          "after shutdown: set");
}

/* A handler that always asks for a retry: called DEFER_OOM_MAX_CALLS
 * times, each retry the whole request with its trim, then the request
 * fails, said. */
static atomic_int eager_calls;

static int always_retry(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    atomic_fetch_add(&eager_calls, 1);
    return 1;
}

static void scenario_bound(void)
{
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    defer_set_oom_handler(always_retry, NULL, NULL, NULL);
    cudaStream_t s = stream_new();
    uint64_t rejected = stats_now().rejected;
    unsigned long tries = fake_entered(FAKE_MALLOC_ASYNC);
    void *p = &p;
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, MiB, s);
    const char *said = stderr_capture_end();
    tries = fake_entered(FAKE_MALLOC_ASYNC) - tries;
    CHECK(err == cudaErrorMemoryAllocation && p == NULL,
          "a handler that always answers 1: out of memory in the end (%s)",
          cudaGetErrorName(err));
    CHECK(atomic_load(&eager_calls) == DEFER_OOM_MAX_CALLS,
          "called %d times, want %d", atomic_load(&eager_calls),
          DEFER_OOM_MAX_CALLS);
    CHECK(tries == 2 * (DEFER_OOM_MAX_CALLS + 1),
          "each try with its retry after the trim: %lu allocations", tries);
    char want[64];
    snprintf(want, sizeof want, "asked for %d retries: giving up",
             DEFER_OOM_MAX_CALLS);
    CHECK(strstr(said, want) != NULL, "said (%s)", said);
    CHECK(stats_now().rejected == rejected + 1, "counted once");
    /* A new request starts its count again. */
    stderr_capture_begin();
    err = defer_alloc(&p, MiB, s);
    stderr_capture_end();
    CHECK(err == cudaErrorMemoryAllocation &&
              atomic_load(&eager_calls) == 2 * DEFER_OOM_MAX_CALLS,
          "the next request: %d more calls",
          atomic_load(&eager_calls) - DEFER_OOM_MAX_CALLS);
    /* PyTorch's entry point: the one error in one line, its NULL too
     * (an out-of-memory line followed the handler's before). */
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(MiB, 0, s);
    said = stderr_capture_end();
    CHECK(none == NULL && strchr(said, '\n') == strrchr(said, '\n') &&
              has_line(said, "defer_pluggable_alloc: out of memory", want,
                       NULL) &&
              strstr(said, "; returning NULL for 1048576 bytes on device 0"),
          "defer_pluggable_alloc: said in one line (%s)", said);
    fake_fail_clear();
    defer_set_oom_handler(NULL, NULL, NULL, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A set while a handler runs returns at once, and the request's next
 * failure reads the new pair: here none, so it ends after one call. */
static int slow_entered; /* written with __atomic: wait_flag reads it */
static atomic_int slow_go, slow_calls;

static int slow_handler(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    atomic_fetch_add(&slow_calls, 1);
    __atomic_store_n(&slow_entered, 1, __ATOMIC_SEQ_CST);
    for (double until = now_ms() + 10000;
         !atomic_load(&slow_go) && now_ms() < until;)
        sleep_ms(1);
    return 1;
}

struct request {
    cudaStream_t s;
    cudaError_t err;
};

static void *request_mib(void *arg)
{
    struct request *r = arg;
    void *p = NULL;
    r->err = defer_alloc(&p, MiB, r->s);
    return NULL;
}

static void scenario_set_while_running(void)
{
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    defer_set_oom_handler(slow_handler, NULL, NULL, NULL);
    struct request r = {.s = stream_new()};
    pthread_t t;
    pthread_create(&t, NULL, request_mib, &r);
    CHECK(wait_flag(&slow_entered, 10000),
          "the handler runs");
    defer_oom_handler prev = NULL;
    CHECK(defer_set_oom_handler(NULL, NULL, &prev, NULL) == cudaSuccess &&
              prev == slow_handler,
          "removed while it runs");
    CHECK(!atomic_load(&slow_go), "without waiting for it");
    atomic_store(&slow_go, 1);
    pthread_join(t, NULL);
    CHECK(r.err == cudaErrorMemoryAllocation && atomic_load(&slow_calls) == 1,
          "its retry failed; no handler then: %d calls, %s",
          atomic_load(&slow_calls), cudaGetErrorName(r.err));
    fake_fail_clear();
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* Threads allocate out of memory while another sets the pair again and
 * again (two handlers, each with its own arg, and none): every call sees
 * its own handler's arg.  Each thread makes RACE_REQUESTS requests, and
 * goes on (up to RACE_MORE times as many) until a handler was called: on
 * a loaded machine the setter may not run before the first requests end. */
#define RACE_REQUESTS 150
#define RACE_MORE 100
static const int tag_a = 'a', tag_b = 'b';
static atomic_int race_calls, race_mixed, race_done, race_requests;

static int handler_a(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device;
    atomic_fetch_add(&race_calls, 1);
    if (arg != &tag_a)
        atomic_fetch_add(&race_mixed, 1);
    return 0;
}

static int handler_b(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device;
    atomic_fetch_add(&race_calls, 1);
    if (arg != &tag_b)
        atomic_fetch_add(&race_mixed, 1);
    return 0;
}

static void *race_allocate(void *arg)
{
    cudaStream_t s = arg;
    for (int i = 0;
         i < RACE_REQUESTS || (atomic_load(&race_calls) == 0 &&
                               i < RACE_MORE * RACE_REQUESTS);
         i++) {
        void *p = NULL;
        atomic_fetch_add(&race_requests, 1);
        if (defer_alloc(&p, MiB, s) != cudaErrorMemoryAllocation)
            atomic_fetch_add(&race_mixed, 1000);
    }
    return NULL;
}

static void *race_set(void *arg)
{
    (void)arg;
    unsigned long sets = 0;
    defer_oom_handler fn;
    void *was;
    while (!atomic_load(&race_done)) {
        switch (sets++ % 3) {
        case 0: defer_set_oom_handler(handler_a, (void *)&tag_a, &fn, &was);
            break;
        case 1: defer_set_oom_handler(handler_b, (void *)&tag_b, &fn, &was);
            break;
        default: defer_set_oom_handler(NULL, NULL, &fn, &was);
        }
        if ((fn == handler_a && was != &tag_a) ||
            (fn == handler_b && was != &tag_b) || (fn == NULL && was != NULL))
            atomic_fetch_add(&race_mixed, 1);
    }
    return NULL;
}

static void scenario_race(void)
{
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    cudaStream_t s[2] = {stream_new(), stream_new()};
    pthread_t alloc_threads[2], setter;
    pthread_create(&setter, NULL, race_set, NULL);
    for (int i = 0; i < 2; i++)
        pthread_create(&alloc_threads[i], NULL, race_allocate, s[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(alloc_threads[i], NULL);
    atomic_store(&race_done, 1);
    pthread_join(setter, NULL);
    CHECK(atomic_load(&race_mixed) == 0,
          "every call got its own handler's arg (%d mixed)",
          atomic_load(&race_mixed));
    CHECK(atomic_load(&race_calls) > 0 &&
              atomic_load(&race_calls) <= atomic_load(&race_requests),
          "called at most once a request: %d calls for %d requests",
          atomic_load(&race_calls), atomic_load(&race_requests));
    diag("%d handler calls for %d requests", atomic_load(&race_calls),
         atomic_load(&race_requests));
    fake_fail_clear();
    defer_set_oom_handler(NULL, NULL, NULL, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A defer_alloc in a defer_call callback: the handler runs on the
 * reclaimer thread, under a callback's rules (defer_flush refused, not a
 * deadlock). */
static struct {
    pthread_t main_thread, handler_thread;
    atomic_int calls;
    cudaError_t flushed, allocated;
    cudaStream_t s;
} cb;

static int callback_handler(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    atomic_fetch_add(&cb.calls, 1);
    cb.handler_thread = pthread_self();
    cb.flushed = defer_flush();
    return 0;
}

static void allocate_in_callback(void *arg)
{
    (void)arg;
    void *p = NULL;
    cb.allocated = defer_alloc(&p, MiB, cb.s);
}

static void scenario_in_callback(void)
{
    cb.main_thread = pthread_self();
    cb.s = stream_new();
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    defer_set_oom_handler(callback_handler, NULL, NULL, NULL);
    stderr_capture_begin();
    CHECK(defer_call(allocate_in_callback, NULL, cb.s) == cudaSuccess,
          "defer_call");
    CHECK(defer_flush() == cudaSuccess, "flushed: the callback ran");
    stderr_capture_end();
    CHECK(atomic_load(&cb.calls) == 1 &&
              !pthread_equal(cb.handler_thread, cb.main_thread),
          "called once (%d), on the reclaimer thread",
          atomic_load(&cb.calls));
    CHECK(cb.flushed == cudaErrorNotPermitted &&
              cb.allocated == cudaErrorMemoryAllocation,
          "defer_flush inside refused (%s); out of memory (%s)",
          cudaGetErrorName(cb.flushed), cudaGetErrorName(cb.allocated));
    fake_fail_clear();
    defer_set_oom_handler(NULL, NULL, NULL, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* The header's limit: a handler that leaves by longjmp is never called
 * again on that thread (its out-of-memory requests fail as with no
 * handler), while other threads still call it. */
static jmp_buf escape;
static atomic_int escapes;

static int leave_by_longjmp(size_t bytes, int device, void *arg)
{
    (void)bytes, (void)device, (void)arg;
    if (atomic_fetch_add(&escapes, 1) == 0)
        longjmp(escape, 1);
    return 0;
}

static void *alloc_elsewhere(void *arg)
{
    void *p = NULL;
    *(cudaError_t *)arg = defer_alloc(&p, MiB, 0);
    return NULL;
}

static void scenario_longjmp(void)
{
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    defer_set_oom_handler(leave_by_longjmp, NULL, NULL, NULL);
    cudaStream_t s = stream_new();
    void *p = NULL;
    stderr_capture_begin();
    if (setjmp(escape) == 0) {
        defer_alloc(&p, MiB, s);
        CHECK(0, "the handler returned");
    }
    CHECK(atomic_load(&escapes) == 1, "left by longjmp on its first call");
    p = &p;
    cudaError_t err = defer_alloc(&p, MiB, s);
    CHECK(err == cudaErrorMemoryAllocation && p == NULL &&
              atomic_load(&escapes) == 1,
          "on that thread, out of memory again: not called (%s, %d calls)",
          cudaGetErrorName(err), atomic_load(&escapes));
    pthread_t t;
    cudaError_t other = cudaSuccess;
    pthread_create(&t, NULL, alloc_elsewhere, &other);
    pthread_join(t, NULL);
    stderr_capture_end();
    CHECK(other == cudaErrorMemoryAllocation && atomic_load(&escapes) == 2,
          "another thread still calls it (%s, %d calls)",
          cudaGetErrorName(other), atomic_load(&escapes));
    fake_fail_clear();
    defer_set_oom_handler(NULL, NULL, NULL, NULL);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

int main(void)
{
    plan_lazy();
    fork_scenario("told bytes and device on the allocating thread; 0 gives "
                  "out of memory; every entry point; not above the device",
                  ENV, 2, 30000, scenario_told);
    fork_scenario("a handler that frees and answers 1: the retry fits", ENV,
                  1, 30000, scenario_retry_fits);
    fork_scenario("a handler that leaves another device current: the retry "
                  "on the request's device, the caller's device kept", ENV, 2,
                  30000, scenario_handler_switches_device);
    fork_scenario("a handler that frees, flushes, trims and allocates: no "
                  "deadlock, no recursion, the retry fits", ENV, 1, 30000,
                  scenario_handler_uses_cudefer);
    fork_scenario("the pair replaced comes back; NULL removes", ENV, 1, 30000,
                  scenario_chain_and_remove);
    fork_scenario("at most DEFER_OOM_MAX_CALLS calls a request", ENV, 1,
                  30000, scenario_bound);
    fork_scenario("a set does not wait for a running handler; the retry "
                  "reads the new pair", ENV, 1, 30000,
                  scenario_set_while_running);
    fork_scenario("set while others allocate: the pair read whole", ENV, 1,
                  60000, scenario_race);
    fork_scenario("in a defer_call callback: on the reclaimer, a callback's "
                  "rules", ENV, 1, 30000, scenario_in_callback);
    fork_scenario("a handler that leaves by longjmp: never called again on "
                  "that thread, still on others", ENV, 1, 30000,
                  scenario_longjmp);
    return 0;
}
