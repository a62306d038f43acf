/* SPDX-License-Identifier: MIT */
/* The pool behind the block cache (src/cache_upstream.c), end to end with
 * the reclaimer: what a miss hands back to the pool (only what the pool lacks:
 * the oldest free blocks, then those pending on the request's own stream),
 * and defer_trim.  The oracle checks every hand-out and every free. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "helpers.h"

/* A request that no cached block fits.  When the pool has the memory
 * unused, it serves the request and the cache keeps its free blocks; when
 * it lacks it, the oldest free blocks go back to the pool (cudaFreeAsync,
 * no drain), as many as the request lacks, and the others stay cached. */
static void test_miss_hands_back(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed); /* the pool reserves what is in use, no more */
    void *a = NULL, *b = NULL, *c = NULL;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, 1 << 20, s);
    alloc_checked(&c, 1 << 20, s);
    void *order[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        defer_free(order[i], s);
        defer_flush(); /* its work done: FREE, a the oldest */
    }
    uint64_t releases = stats_now().cache_releases;
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long async = fake_calls(FAKE_FREE_ASYNC);
    void *e = NULL;
    alloc_checked(&e, 3 << 19, s); /* 1.5 MiB: no free block fits */
    ok(fake_is_released(a) == 1 && fake_is_released(b) == 1,
       "a miss the pool cannot serve gives the two oldest free 1 MiB blocks "
       "back to it");
    ok(fake_is_released(c) == 0, "the block it does not need stays cached");
    ok(fake_calls(FAKE_FREE_ASYNC) - async == 2 && fake_calls(FAKE_FREE) == frees,
       "with cudaFreeAsync, never cudaFree");
    ok(stats_now().cache_releases == releases + 2, "counted as released");
    void *g = NULL;
    alloc_checked(&g, 1 << 20, s);
    ok(g == c, "and serves a request of its size");
    /* The pool keeps 0.5 MiB it does not lend (3 reserved, 2.5 lent). */
    defer_free(g, s);
    defer_flush();
    void *h = NULL;
    alloc_checked(&h, 256 << 10, s);
    ok(h != c && fake_is_released(c) == 0 &&
           stats_now().cache_releases == releases + 2,
       "a miss the pool can serve takes no block from the cache");
    defer_free(e, s);
    defer_free(h, s);
}

/* A miss on stream s when the pool lacks memory and nothing is FREE: the
 * blocks PENDING on s itself go back to the pool, ordered on s (the oracle
 * checks the free comes after the work that uses them), never those of
 * another stream. */
static void test_miss_hands_back_pending(cudaStream_t s, cudaStream_t s2)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, 1 << 20, s);
    fake_work *wa = work_held(s, a), *wb = work_held(s, b);
    defer_free(a, s);
    defer_free(b, s); /* both PENDING on s: their work is held */
    alloc_checked(&c, 3 << 19, s2);
    ok(fake_is_released(a) == 0 && fake_is_released(b) == 0,
       "a miss on another stream leaves s's pending blocks alone");
    unsigned long async = fake_calls(FAKE_FREE_ASYNC);
    alloc_checked(&d, 3 << 19, s);
    ok(fake_is_released(a) == 1 && fake_is_released(b) == 1 &&
           fake_calls(FAKE_FREE_ASYNC) - async == 2,
       "a miss on s gives s's pending blocks to the pool, ordered on s");
    fake_complete(wa);
    fake_complete(wb);
    is_int(defer_flush(), cudaSuccess, "their entries complete");
    ok(fake_is_released(d) == 0 && fake_is_released(c) == 0,
       "nothing else is released");
    defer_free(c, s2);
    defer_free(d, s);
}

/* The pending blocks a miss hands back go with their entries, on the
 * reclaimer, maybe while the miss is still handing the memory back: here
 * every cudaFreeAsync takes 50 ms and the blocks' work completes
 * meanwhile.  The miss must not read the blocks then (it copies their
 * memory first: cache_reclaim_for_miss); a read would be a use after free,
 * which ASan sees here and TSan in t/stress. */
static void test_hand_back_outlives_blocks(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a = NULL, *b = NULL, *c = NULL;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, 1 << 20, s);
    work_timed(s, 5000, a);
    work_timed(s, 5000, b);
    defer_free(a, s);
    defer_free(b, s); /* PENDING on s for 5 ms more */
    fake_set_latency(FAKE_FREE_ASYNC, 50000000);
    alloc_checked(&c, 3 << 19, s);
    fake_set_latency(FAKE_FREE_ASYNC, 0);
    ok(c != NULL && fake_is_released(a) == 1 && fake_is_released(b) == 1,
       "both pending blocks went back to the pool while their entries "
       "completed");
    is_int(defer_flush(), cudaSuccess, "flush");
    defer_free(c, s);
}

/* A stream destroyed while its blocks are pending, its handle handed to
 * a new stream (as CUDA may): the new stream is another stream, so it gets
 * none of the old one's pending blocks, neither from the cache nor through
 * a hand-back to the pool, even from a thread that knew the old stream. */
static void test_reused_handle(void)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    cudaStream_t a = stream_new();
    void *p = NULL, *q = NULL, *r = NULL;
    alloc_checked(&p, 1 << 20, a); /* this thread now knows a's identity */
    fake_work *w = work_held(a, p);
    defer_free(p, a); /* PENDING on a: its work is held */
    cudaStreamDestroy(a);
    cudaStream_t b = fake_stream_create_reusing(a);
    ok(b == a, "the new stream has the old one's handle");
    alloc_checked(&q, 1 << 20, b);
    ok(q != p, "it does not get the old stream's pending block");
    alloc_checked(&r, 3 << 19, b); /* a miss, the pool lacking memory */
    ok(fake_is_released(p) == 0,
       "nor does a miss on it hand that block back to the pool");
    fake_complete(w);
    defer_free(q, b);
    defer_free(r, b);
    is_int(defer_flush(), cudaSuccess, "flush");
}

/* One free block of 1 MiB cached on s, FREE, and the pool lending all it
 * has (no slack): the next miss hands that block back.  Returns it. */
static void *one_free_block(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a = NULL;
    alloc_checked(&a, 1 << 20, s);
    defer_free(a, s);
    defer_flush();
    return a;
}

/* A block whose hand-back fails has left the cache: nothing else would
 * ever release it, so it goes with cudaFree instead (counted as released
 * otherwise, it would stay allocated past the shutdown).  When that fails
 * too, it is reported, not counted as released, and the
 * pool's slack does not count memory it never got back. */
static void test_failed_hand_back(cudaStream_t s)
{
    void *a = one_free_block(s), *b = NULL;
    is_int(cache_upstream_slack(0), 0, "the pool has no slack");
    uint64_t releases = stats_now().cache_releases;
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    cudaGetLastError();
    cudaError_t err = alloc_checked(&b, 3 << 19, s); /* a miss: a goes back,
                                                        and that fails */
    cudaError_t last = cudaGetLastError();
    ok(strstr(stderr_capture_end(), "goes back with cudaFree") != NULL,
       "the failed hand-back is reported");
    fake_fail_clear();
    ok(err == cudaSuccess && last == cudaSuccess,
       "the request succeeds and leaves the thread's last error clear (the "
       "failed cudaFreeAsync is cudefer's business; PyTorch's next launch "
       "check would raise it): %d, last %d", (int)err, (int)last);
    ok(fake_is_released(a) == 1, "and its block released with cudaFree");
    ok(stats_now().cache_releases == releases + 1, "counted once");
    defer_free(b, s);
    is_int(defer_flush(), cudaSuccess, "flush");

    /* Both fail. */
    a = one_free_block(s);
    releases = stats_now().cache_releases;
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    err = alloc_checked(&b, 3 << 19, s);
    last = cudaGetLastError();
    ok(strstr(stderr_capture_end(), "lost to the pool") != NULL,
       "a block neither call released is reported lost");
    fake_fail_clear();
    ok(err == cudaSuccess && last == cudaSuccess,
       "the request succeeds, the last error clear: %d, last %d", (int)err,
       (int)last);
    ok(fake_is_released(a) == 0 && stats_now().cache_releases == releases,
       "and not counted as released");
    is_int(cache_upstream_slack(0), 0,
           "the pool still counts that memory as lent");
    cudaFree(a); /* the test's now: the oracle's count of live memory */
    defer_free(b, s);
    is_int(defer_flush(), cudaSuccess, "flush");
}

/* A hand-back whose blocks neither cudaFreeAsync nor cudaFree releases:
 * the first block lost stops it.  Before the fix the miss went on taking
 * the next largest block for the bytes it still lacked, and lost it the
 * same way, until no block was left: here a 0.5 MiB miss lost all three
 * free 1 MiB blocks of the cache. */
static void test_failed_hand_back_stops(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a[3], *b = NULL;
    for (int i = 0; i < 3; i++)
        alloc_checked(&a[i], 1 << 20, s);
    for (int i = 0; i < 3; i++)
        defer_free(a[i], s);
    defer_flush(); /* FREE; the pool lends all it has */
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, -1);
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, -1);
    stderr_capture_begin();
    alloc_checked(&b, 1 << 19, s); /* a miss: the pool lacks 0.5 MiB */
    stderr_capture_end();
    fake_fail_clear();
    int left = 0;
    for (int i = 0; i < 3; i++)
        left += cache_test_find(a[i]) != NULL;
    is_int(left, 2, "one lost block stops the hand-back: the other two stay "
           "cached");
    for (int i = 0; i < 3; i++)
        if (cache_test_find(a[i]) == NULL && fake_is_released(a[i]) == 0)
            cudaFree(a[i]); /* the test's now: the oracle's live memory */
    defer_free(b, s);
    is_int(defer_flush(), cudaSuccess, "flush");
}

/* The failed hand-back of test_failed_hand_back under PyTorch's entry
 * points: said in the words of the call the application made
 * (defer_pluggable_alloc, defer_pluggable_alloc_status), never
 * defer_alloc's, a call it never made. */
static void test_failed_hand_back_words(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a = defer_pluggable_alloc(1 << 20, 0, s), *b = NULL;
    ok(a != NULL, "defer_pluggable_alloc: a block");
    defer_pluggable_free(a, 1 << 20, 0, s);
    defer_flush(); /* FREE; the pool lends all it has */
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    b = defer_pluggable_alloc(3 << 19, 0, s); /* a miss: a goes back */
    const char *said = stderr_capture_end();
    fake_fail_clear();
    ok(b != NULL &&
           has_line(said, "cudefer: defer_pluggable_alloc: cudaFreeAsync "
                    "failed", "goes back with cudaFree", NULL) &&
           strstr(said, "defer_alloc") == NULL,
       "a failed hand-back under defer_pluggable_alloc is said in its "
       "words (stderr: \"%s\")", said);
    defer_pluggable_free(b, 3 << 19, 0, s);
    is_int(defer_flush(), cudaSuccess, "flush");

    defer_trim(&trimmed);
    ok(defer_pluggable_alloc_status(&a, 1 << 20, 0, s) == cudaSuccess,
       "defer_pluggable_alloc_status: a block");
    defer_pluggable_free(a, 1 << 20, 0, s);
    defer_flush();
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    cudaError_t err = defer_pluggable_alloc_status(&b, 3 << 19, 0, s);
    said = stderr_capture_end();
    fake_fail_clear();
    ok(err == cudaSuccess &&
           has_line(said, "cudefer: defer_pluggable_alloc_status: cudaFree "
                    "failed", "lost to the pool", NULL) &&
           strstr(said, "defer_alloc") == NULL,
       "a block neither call released, under "
       "defer_pluggable_alloc_status: said in its words (stderr: \"%s\")",
       said);
    cudaFree(a); /* the test's now: the oracle's count of live memory */
    defer_pluggable_free(b, 3 << 19, 0, s);
    is_int(defer_flush(), cudaSuccess, "flush");
}

/* A miss on a plain stream while a graph capture runs, begun Global on
 * another thread or on this one: the hand-back's cudaFreeAsync is one of
 * CUDA's "potentially unsafe" calls, which in the calling thread's default
 * (Global) mode is refused and invalidates that capture.  A miss that
 * cudaMallocAsync would serve without touching the capture must leave it
 * intact, and still hand the free block back to the pool.  Before the fix
 * the capture was invalidated and the block went back with cudaFree. */
static cudaStream_t begun_elsewhere;

static void *begin_global_capture(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)cudaStreamBeginCapture(
        begun_elsewhere, cudaStreamCaptureModeGlobal);
}

static void test_hand_back_during_capture(cudaStream_t s)
{
    cudaStream_t cap = stream_new();
    for (int own = 0; own < 2; own++) {
        void *a = one_free_block(s), *b = NULL;
        unsigned long frees = fake_calls(FAKE_FREE);
        if (own) {
            is_int(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal),
                   cudaSuccess, "this thread captures another stream");
        } else {
            pthread_t t;
            void *began;
            begun_elsewhere = cap;
            pthread_create(&t, NULL, begin_global_capture, NULL);
            pthread_join(t, &began);
            is_int((intptr_t)began, cudaSuccess,
                   "another thread captures, Global");
        }
        stderr_capture_begin();
        cudaError_t err = defer_alloc(&b, 3 << 19, s); /* a goes back */
        const char *said = stderr_capture_end();
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing(cap, &st);
        is_int(st, cudaStreamCaptureStatusActive,
               "%s: the capture is intact after the miss's hand-back",
               own ? "own capture" : "another thread's");
        ok(err == cudaSuccess && said[0] == '\0' &&
               fake_is_released(a) == 1 && fake_calls(FAKE_FREE) == frees,
           "the block went back with cudaFreeAsync, nothing said "
           "(stderr: \"%s\")", said);
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(cap, &g);
        if (g != NULL)
            cudaGraphDestroy(g);
        defer_free(b, s);
        is_int(defer_flush(), cudaSuccess, "flush");
    }
    cudaStreamDestroy(cap);
}

static void test_trim(cudaStream_t s)
{
    void *p = NULL;
    alloc_checked(&p, 1 << 20, s);
    defer_free(p, s);
    defer_flush();
    size_t bytes = 0;
    is_int(defer_trim(&bytes), cudaSuccess, "defer_trim");
    ok(bytes >= (1 << 20), "releases the free blocks (%zu bytes)", bytes);
    /* p may have been cut from a larger free block (block splitting): its
     * allocation goes. */
    ok(fake_allocation_of(p, NULL, NULL) == 0, "with cudaFree");
}

/* In a fresh process, one block of 1 MiB, the pool's whole reserve: a
 * trim says 1 MiB, not 2 (the block's bytes when it went back to the pool,
 * and again in the pool's trim). */
static void trim_counts_once(void)
{
    cudaStream_t s = stream_new();
    void *p = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess, "a block");
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    size_t bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess, "trim");
    CHECK(bytes == (1 << 20), "the trim says %zu bytes, want %d", bytes,
          1 << 20);
    CHECK(fake_allocation_of(p, NULL, NULL) == 0, "its memory went");
}

/* In a fresh process, while another thread captures in Global mode: the
 * first miss creates cudefer's pool (cudaMemPoolCreate, its release
 * threshold) and takes its block from it, and a trim reads and trims the
 * pool; each is one of CUDA's "potentially unsafe" calls, which in this
 * thread's default Global mode would be refused and invalidate that
 * capture (and the block would come from cudaMalloc, said).  The capture
 * must stay intact, the block come from the pool, nothing be said. */
static void *begin_global(void *stream)
{
    return (void *)(intptr_t)cudaStreamBeginCapture(
        (cudaStream_t)stream, cudaStreamCaptureModeGlobal);
}

static void pool_calls_leave_capture(void)
{
    cudaStream_t s = stream_new(), cap = stream_new();
    pthread_t t;
    void *began;
    pthread_create(&t, NULL, begin_global, cap);
    pthread_join(t, &began);
    CHECK((intptr_t)began == cudaSuccess, "another thread captures, Global");
    unsigned long mallocs = fake_calls(FAKE_MALLOC);
    stderr_capture_begin();
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 1 << 20, s);
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    size_t bytes = 0;
    cudaError_t trimmed = defer_trim(&bytes);
    const char *said = stderr_capture_end();
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(cap, &st);
    CHECK(st == cudaStreamCaptureStatusActive,
          "the capture is intact after the miss and the trim: status %d",
          (int)st);
    CHECK(err == cudaSuccess && fake_calls(FAKE_MALLOC) == mallocs,
          "the block came from the pool: defer_alloc %d, %lu cudaMalloc",
          (int)err, fake_calls(FAKE_MALLOC) - mallocs);
    CHECK(trimmed == cudaSuccess && bytes == (1 << 20),
          "the trim gave the pool's memory back: %zu bytes", bytes);
    CHECK(said[0] == '\0', "nothing said (stderr: \"%s\")", said);
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(cap, &g);
    if (g != NULL)
        cudaGraphDestroy(g);
}

/* The bytes cudefer's pool on device 0 reserves now. */
static uint64_t pool_reserve(void)
{
    uint64_t reserved = UINT64_MAX;
    cudaMemPoolGetAttribute(fake_mem_pool(0), cudaMemPoolAttrReservedMemCurrent,
                            &reserved);
    return reserved;
}

/* In a fresh process, two blocks of 1 MiB, the pool's whole reserve, go
 * back to it on a trim with frees that take 30 ms each on the reclaimer's
 * free stream: the trim waits for them (cudaStreamSynchronize) before it
 * trims, so the pool gives back both and the trim says 2 MiB.  Trimmed
 * before the frees ran, the pool would keep their memory and the trim say
 * 0 (the fake frees pool memory only once the free ran on its stream). */
static void trim_waits_for_frees(void)
{
    fake_set_free_async_us(30000);
    cudaStream_t s = stream_new();
    void *p = NULL, *q = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess &&
              defer_alloc(&q, 1 << 20, s) == cudaSuccess,
          "two blocks");
    CHECK(pool_reserve() == (2 << 20), "the pool reserves %llu bytes, want %d",
          (unsigned long long)pool_reserve(), 2 << 20);
    CHECK(defer_free(p, s) == cudaSuccess && defer_free(q, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "freed");
    size_t bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess, "trim");
    CHECK(bytes == (2 << 20), "the trim says %zu bytes, want %d", bytes,
          2 << 20);
    CHECK(fake_allocation_of(p, NULL, NULL) == 0 &&
              fake_allocation_of(q, NULL, NULL) == 0,
          "their memory went back to the pool");
    CHECK(pool_reserve() == 0, "the pool still reserves %llu bytes, want 0",
          (unsigned long long)pool_reserve());
}

/* A shutdown while a request allocates a new block (here the allocation
 * takes 50 ms): the shutdown waits for it, since it destroys the pools the
 * allocation counts in (else a write to freed memory: ASan). */
struct racing_alloc {
    cudaStream_t s;
    void *p;
    cudaError_t err;
};

static void *alloc_slowly(void *arg)
{
    struct racing_alloc *r = arg;
    r->err = defer_alloc(&r->p, 5 << 20, r->s);
    return NULL;
}

static void test_shutdown_during_malloc(cudaStream_t s)
{
    struct racing_alloc r = {.s = s};
    unsigned long mallocs = fake_calls(FAKE_MALLOC_ASYNC);
    fake_set_latency(FAKE_MALLOC_ASYNC, 50000000);
    pthread_t t;
    unsigned long entered = fake_entered(FAKE_MALLOC_ASYNC);
    pthread_create(&t, NULL, alloc_slowly, &r);
    /* Its cudaMallocAsync has begun (inside its admitted request): waited
     * for, not slept for (a loaded machine may not run the thread for tens
     * of ms). */
    for (int i = 0; i < 10000 && fake_entered(FAKE_MALLOC_ASYNC) == entered;
         i++)
        sleep_ms(1);
    ok(fake_entered(FAKE_MALLOC_ASYNC) > entered, "the block is being made");
    is_int(defer_shutdown(), cudaSuccess, "shutdown while a block is made");
    pthread_join(t, NULL);
    fake_set_latency(FAKE_MALLOC_ASYNC, 0);
    is_int(r.err, cudaSuccess, "the request it waited for got its block");
    is_int(fake_calls(FAKE_MALLOC_ASYNC) - mallocs, 1, "a new one");
    cudaFree(r.p); /* the application's memory now */
}

/* No pool could be made (cudaMemPoolCreate fails): blocks come from
 * cudaMalloc on the stream's device, made current for the call from the
 * caller's thread and the caller's device made current again (a mutant
 * that left device 1 current went unseen: the fake's pool never failed,
 * so the fallback was never run); a trim gives them back with cudaFree. */
static void no_pool_mallocs_on_the_stream_device(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    cudaSetDevice(0);
    fake_fail(FAKE_MEM_POOL_CREATE, cudaErrorNotSupported, 0, -1); /* every call */
    unsigned long mallocs = fake_calls(FAKE_MALLOC);
    stderr_capture_begin();
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 1 << 20, s1);
    const char *said = stderr_capture_end();
    int current = -1;
    cudaGetDevice(&current);
    CHECK(err == cudaSuccess && p != NULL, "defer_alloc: %d", (int)err);
    CHECK(current == 0, "the caller's device is current again (%d)", current);
    CHECK(fake_calls(FAKE_MALLOC) - mallocs == 1, "a cudaMalloc");
    struct cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, p) == cudaSuccess && at.device == 1,
          "on the stream's device (%d)", at.device);
    CHECK(strstr(said, "cudaMemPoolCreate") != NULL, "the failure is said");
    CHECK(defer_free(p, s1) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    size_t bytes = 0;
    CHECK(defer_trim(&bytes) == cudaSuccess && bytes == (1 << 20),
          "a trim gives it back: %zu bytes", bytes);
    CHECK(fake_allocation_of(p, NULL, NULL) == 0, "its memory went");
    fake_fail_clear();
}

/* No pool could be made, found by the calls that create a device's pool
 * other than defer_alloc: the failure is said in the words of the call
 * the application made (defer_peer_access, defer_pluggable_alloc_status),
 * never defer_alloc's. */
static void no_pool_said_in_the_callers_words(void)
{
    fake_fail(FAKE_MEM_POOL_CREATE, cudaErrorNotSupported, 0, -1);
    stderr_capture_begin();
    cudaError_t err = defer_peer_access(1, 0);
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_peer_access: %s (no pool: nothing to "
          "grant)", cudaGetErrorName(err));
    CHECK(has_line(said, "cudefer: defer_peer_access: cudaMemPoolCreate "
                   "failed", NULL, NULL) &&
              strstr(said, "defer_alloc") == NULL,
          "said as defer_peer_access's (stderr: \"%s\")", said);
    cudaStream_t s = stream_new();
    void *p = NULL;
    stderr_capture_begin();
    err = defer_pluggable_alloc_status(&p, 1 << 20, 0, s);
    said = stderr_capture_end();
    CHECK(err == cudaSuccess && p != NULL, "defer_pluggable_alloc_status: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "cudefer: defer_pluggable_alloc_status: "
                   "cudaMemPoolCreate failed", NULL, NULL) &&
              strstr(said, "defer_alloc:") == NULL,
          "said as defer_pluggable_alloc_status's (stderr: \"%s\")", said);
    defer_pluggable_free(p, 1 << 20, 0, s);
    CHECK(defer_flush() == cudaSuccess, "freed");
    fake_fail_clear();
}

/* A device without memory pools (cudaDevAttrMemoryPoolsSupported 0): its
 * blocks come from cudaMalloc without a word (nothing failed: cudefer.h
 * says such a device uses cudaMalloc and cudaFree), and go back with
 * cudaFree. */
static void no_pool_support_quiet(void)
{
    fake_set_memory_pools(0, 0);
    cudaStream_t s = stream_new();
    unsigned long mallocs = fake_calls(FAKE_MALLOC);
    stderr_capture_begin();
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 1 << 20, s);
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess && p != NULL, "defer_alloc: %d", (int)err);
    CHECK(fake_calls(FAKE_MALLOC) - mallocs == 1, "a cudaMalloc");
    CHECK(said[0] == '\0', "nothing said (stderr: \"%s\")", said);
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    size_t bytes = 0;
    unsigned long frees = fake_calls(FAKE_FREE);
    CHECK(defer_trim(&bytes) == cudaSuccess && bytes == (1 << 20),
          "a trim gives it back: %zu bytes", bytes);
    CHECK(fake_calls(FAKE_FREE) - frees == 1 &&
              fake_allocation_of(p, NULL, NULL) == 0,
          "with cudaFree: its memory went");
}

/* A trim whose cudaFreeAsync of a cached pool block fails (not sticky):
 * said, naming the block and the call that failed; not counted as
 * released; the memory stays allocated (the pool's).  (A mutant that
 * dropped the report said nothing; the line named cudaFree for the
 * cudaFreeAsync that failed.) */
static void trim_free_fails_said(void)
{
    cudaStream_t s = stream_new();
    void *p = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess, "a block");
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed: FREE in the cache");
    uint64_t released = stats_now().cache_releases;
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    cudaError_t err = defer_trim(NULL);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    char text[32];
    snprintf(text, sizeof text, "%p", p);
    CHECK(err == cudaSuccess, "defer_trim: %d (not sticky: no device error)",
          (int)err);
    CHECK(strstr(said, "cudaFreeAsync failed") != NULL &&
              strstr(said, text) != NULL && strstr(said, "not released"),
          "said, with the call and the block: %s", said);
    CHECK(stats_now().cache_releases == released, "not counted as released");
    CHECK(fake_allocation_of(p, NULL, NULL) == 1, "its memory stays");
}

/* A call of a trim's failing: what a failed release of the reclaimer's
 * is.  Another error is said once, naming the call, and the trim returns
 * cudaSuccess; a sticky one fails the device, said once naming the device
 * and the call, and defer_trim returns it. */
static void trim_call_fails(enum fake_call c)
{
    const char *call = fake_call_name(c);
    char failed[64];
    snprintf(failed, sizeof failed, "%s failed", call);
    cudaStream_t s = stream_new();
    void *p = NULL, *q = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess &&
              defer_alloc(&q, 1 << 20, s) == cudaSuccess,
          "two blocks");
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "one freed: FREE in the cache");
    unsigned long calls = fake_calls(c);
    stderr_capture_begin();
    fake_fail(c, cudaErrorInvalidResourceHandle, 0, 1);
    cudaError_t err = defer_trim(NULL);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    CHECK(fake_calls(c) - calls == 1, "the trim made %s once (%lu calls)",
          call, fake_calls(c) - calls);
    CHECK(err == cudaSuccess, "defer_trim: %s (not sticky: no device error)",
          cudaGetErrorName(err));
    CHECK(has_line(said, failed, "cudaErrorInvalidResourceHandle", NULL),
          "said, naming the call and the error (stderr: \"%s\")", said);

    CHECK(defer_free(q, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "the other freed");
    stderr_capture_begin();
    fake_fail(c, cudaErrorLaunchFailure, 0, 1);
    err = defer_trim(NULL);
    said = stderr_capture_end();
    fake_fail_clear();
    CHECK(err == cudaErrorLaunchFailure, "defer_trim: %s, want the sticky "
          "error", cudaGetErrorName(err));
    CHECK(has_line(said, "device 0", call, NULL),
          "said, naming the device and the call (stderr: \"%s\")", said);
    CHECK(defer_flush() == cudaErrorLaunchFailure,
          "a later flush hears the device's error");
}

/* The trim's wait for the frees it trims after (cudaStreamSynchronize of
 * the reclaimer's free stream, src/reclaimer_frees.c).  The frees take
 * 30 ms, so a trim that went on unsaid would find the pool's reserve
 * unchanged. */
static void trim_sync_fails_said(void)
{
    fake_set_free_async_us(30000);
    trim_call_fails(FAKE_STREAM_SYNCHRONIZE);
}

/* The pool's own trim (cudaMemPoolTrimTo) after the trim's releases. */
static void pool_trim_fails_said(void)
{
    trim_call_fails(FAKE_MEM_POOL_TRIM);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a trim counts a pool block's bytes once", "", 1, 20000,
                  trim_counts_once);
    fork_scenario("a trim waits for the frees it trims after", "", 1, 20000,
                  trim_waits_for_frees);
    fork_scenario("the pool's creation, allocation and trim leave another "
                  "thread's Global capture intact", "", 1, 20000,
                  pool_calls_leave_capture);
    fork_scenario("no pool: blocks from cudaMalloc on the stream's device, "
                  "the caller's device restored", "", 2, 20000,
                  no_pool_mallocs_on_the_stream_device);
    fork_scenario("no pool: said in the words of the call that made it "
                  "(defer_peer_access, defer_pluggable_alloc_status)", "", 2,
                  20000, no_pool_said_in_the_callers_words);
    fork_scenario("a device without memory pools: blocks from cudaMalloc, "
                  "nothing said, back with cudaFree", "", 1, 20000,
                  no_pool_support_quiet);
    fork_scenario("a trim's failed cudaFreeAsync of a cached block is said",
                  "", 1, 20000, trim_free_fails_said);
    fork_scenario("a trim's failed wait for its frees is said; a sticky "
                  "error fails the device", "", 1, 20000, trim_sync_fails_said);
    fork_scenario("the pool's failed trim is said; a sticky error fails the "
                  "device", "", 1, 20000, pool_trim_fails_said);
    /* No age limit: a slow run (sanitizers) must not see the application's
     * memory released for its age while a test expects it held. */
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0");
    fake_reset(1);
    cudaStream_t s = stream_new(), s2 = stream_new();
    test_miss_hands_back(s);
    test_miss_hands_back_pending(s, s2);
    test_hand_back_outlives_blocks(s);
    test_reused_handle();
    test_failed_hand_back(s);
    test_failed_hand_back_stops(s);
    test_failed_hand_back_words(s);
    test_hand_back_during_capture(s);
    test_trim(s);
    test_shutdown_during_malloc(s);
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
