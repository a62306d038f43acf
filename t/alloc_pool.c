/* SPDX-License-Identifier: MIT */
/* The pool behind the block cache (src/cache_upstream.c), end to end with
 * the reclaimer in one process: what a miss hands back to the pool (only
 * what the pool lacks: the oldest free blocks, then those pending on the
 * request's own stream), a failed hand-back, and defer_trim.  The oracle
 * checks every hand-out and every free. */
#include <pthread.h>
#include <string.h>

#include "alloc_pool.h"
#include "cache.h"

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

/* The pool's reserved bytes on device 0. */
static uint64_t pool_reserved(void)
{
    uint64_t v = 0;
    cudaMemPoolGetAttribute(fake_mem_pool(0),
                            cudaMemPoolAttrReservedMemCurrent, &v);
    return v;
}

/* What a miss lacks is its new block's size (the request rounded up), not
 * the bytes asked for: free blocks go back until the pool holds that, so
 * that it serves the new block without growing.  2 MiB + 64 KiB asked
 * makes a block of 2 MiB + 128 KiB; the two largest free blocks hold only
 * 2 MiB + 64 KiB, so the third goes back too. */
static void test_miss_hands_back_fresh_size(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed); /* the pool reserves what is in use, no more */
    void *a = NULL, *b = NULL, *c = NULL, *e = NULL;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, (1 << 20) + (64 << 10), s);
    alloc_checked(&c, 1 << 20, s);
    void *order[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        defer_free(order[i], s);
        defer_flush(); /* its work done: FREE */
    }
    uint64_t reserved = pool_reserved();
    alloc_checked(&e, (2 << 20) + (64 << 10), s); /* no free block fits */
    ok(fake_is_released(a) == 1 && fake_is_released(b) == 1 &&
           fake_is_released(c) == 1,
       "a miss for 2 MiB + 64 KiB gives back free blocks until the pool "
       "has its new block's 2 MiB + 128 KiB: all three (released: %d %d %d)",
       fake_is_released(a), fake_is_released(b), fake_is_released(c));
    ok(pool_reserved() == reserved,
       "and the pool serves it without growing (reserved %llu, then %llu)",
       (unsigned long long)reserved, (unsigned long long)pool_reserved());
    defer_free(e, s);
    is_int(defer_flush(), cudaSuccess, "flush");
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
 * the blocks' work completes as the first cudaFreeAsync of the hand-back
 * returns, and the miss waits there while the reclaimer sees it.  The
 * miss must not read the blocks then (it copies their memory first:
 * cache_reclaim_for_miss); a read would be a use after free, which ASan
 * sees here and TSan in t/stress.  (Work timed to end during the hand-back
 * could end before the miss's clock read on a loaded machine, when the
 * blocks stay cached: alloc.c.) */
static fake_work *outlive_work[2];

static void complete_on_first_free(enum fake_call c, cudaError_t r,
                                   void *arg)
{
    (void)c, (void)r, (void)arg;
    if (outlive_work[0] == NULL)
        return;
    fake_complete(outlive_work[0]);
    fake_complete(outlive_work[1]);
    outlive_work[0] = outlive_work[1] = NULL;
    wait_stats_settled(1000); /* the reclaimer takes the entries back */
}

static void test_hand_back_outlives_blocks(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *a = NULL, *b = NULL, *c = NULL;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, 1 << 20, s);
    outlive_work[0] = work_held(s, a);
    outlive_work[1] = work_held(s, b);
    defer_free(a, s);
    defer_free(b, s); /* PENDING on s until the hand-back's first free */
    fake_set_return_hook(FAKE_FREE_ASYNC, complete_on_first_free, NULL);
    alloc_checked(&c, 3 << 19, s);
    fake_set_return_hook(FAKE_FREE_ASYNC, NULL, NULL);
    ok(c != NULL && fake_is_released(a) == 1 && fake_is_released(b) == 1 &&
           outlive_work[0] == NULL,
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
 * too, it is reported, counted in cache_release_failures and not as
 * released, and the pool's slack does not count memory it never got
 * back. */
static void test_failed_hand_back(cudaStream_t s)
{
    void *a = one_free_block(s), *b = NULL;
    is_int(cache_upstream_slack(0), 0, "the pool has no slack");
    uint64_t releases = stats_now().cache_releases;
    uint64_t failures = stats_now().cache_release_failures;
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
    ok(stats_now().cache_releases == releases + 1 &&
           stats_now().cache_release_failures == failures,
       "counted once, as released");
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
    ok(stats_now().cache_release_failures == failures + 1,
       "counted in cache_release_failures: %llu -> %llu",
       (unsigned long long)failures,
       (unsigned long long)stats_now().cache_release_failures);
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
            is_int(capture_elsewhere(cap), cudaSuccess,
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
        end_capture_dropped(cap);
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

static struct defer_device_stats device_now(void)
{
    struct defer_device_stats d;
    memset(&d, 0, sizeof d);
    defer_device_stats_get(0, &d);
    return d;
}

/* Only whole allocations go back to CUDA (include/cudefer.h, defer_trim's
 * limit): of two 1 MiB blocks cut from one free 4 MiB block (splitting, 1
 * MiB by default), one freed, a trim releases nothing while the other is
 * live; once that one is freed too, the whole allocation goes. */
static void test_trim_keeps_cut_piece(cudaStream_t s)
{
    size_t trimmed = 0;
    defer_trim(&trimmed); /* nothing free cached */
    struct defer_device_stats d0 = device_now();
    void *whole = NULL, *a = NULL, *b = NULL;
    alloc_checked(&whole, 4 << 20, s);
    defer_free(whole, s);
    defer_flush(); /* its work done: FREE */
    uint64_t mallocs = device_now().cache_mallocs;
    alloc_checked(&a, 1 << 20, s);
    alloc_checked(&b, 1 << 20, s);
    void *base_a = NULL, *base_b = NULL;
    fake_allocation_of(a, &base_a, NULL);
    fake_allocation_of(b, &base_b, NULL);
    ok(a != NULL && b != NULL && base_a == whole && base_b == whole &&
           device_now().cache_mallocs == mallocs,
       "two 1 MiB blocks cut from one 4 MiB allocation (%p, %p of %p)", a,
       b, whole);
    defer_free(a, s);
    defer_flush();
    is_int(defer_trim(&trimmed), cudaSuccess, "trim with one piece live");
    struct defer_device_stats d = device_now();
    ok(fake_allocation_of(whole, NULL, NULL) == 1 &&
           d.cache_bytes - d0.cache_bytes == (4 << 20) &&
           d.cache_free_bytes - d0.cache_free_bytes == (3 << 20) &&
           d.live_bytes - d0.live_bytes == (1 << 20),
       "the freed piece stays cached, free, with the rest of its "
       "allocation: %llu bytes cached, %llu free, %llu live",
       ULL(d.cache_bytes - d0.cache_bytes),
       ULL(d.cache_free_bytes - d0.cache_free_bytes),
       ULL(d.live_bytes - d0.live_bytes));
    defer_free(b, s);
    defer_flush();
    is_int(defer_trim(&trimmed), cudaSuccess, "trim with no piece live");
    d = device_now();
    ok(fake_allocation_of(whole, NULL, NULL) == 0 &&
           d.cache_bytes == d0.cache_bytes,
       "the whole allocation goes: %llu bytes cached",
       ULL(d.cache_bytes - d0.cache_bytes));
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

int main(void)
{
    plan_lazy();
    /* No age limit: a slow run (sanitizers) must not see the application's
     * memory released for its age while a test expects it held. */
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0");
    fake_reset(1);
    cudaStream_t s = stream_new(), s2 = stream_new();
    test_miss_hands_back(s);
    test_miss_hands_back_fresh_size(s);
    test_miss_hands_back_pending(s, s2);
    test_hand_back_outlives_blocks(s);
    test_reused_handle();
    test_failed_hand_back(s);
    test_failed_hand_back_stops(s);
    test_failed_hand_back_words(s);
    test_hand_back_during_capture(s);
    test_trim(s);
    test_trim_keeps_cut_piece(s);
    test_shutdown_during_malloc(s);
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
