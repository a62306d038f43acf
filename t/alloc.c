/* defer_alloc over the block cache, end to end with the reclaimer: a block
 * freed on a stream goes back to that stream at once, to other streams only
 * once its work is done (the oracle checks every hand-out), record_stream,
 * groups, out of memory, capture, devices, the PyTorch entry points, double
 * frees, trim, expiry and shutdown. */
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

/* Wait (at most 2 s) for the reclaimer to see p's work done: requests on
 * stream other (each kept live, so none comes back on its own stream) then
 * get p back.  Returns p, or NULL; frees every other block it took. */
static void *take_when_done(size_t bytes, cudaStream_t other, void *p)
{
    void *taken[64];
    size_t n = 0;
    void *found = NULL;
    for (int i = 0; i < 2000 && found == NULL; i++) {
        void *q = NULL;
        if (alloc_checked(&q, bytes, other) != cudaSuccess)
            break;
        if (q == p) {
            found = q;
        } else if (n < 64) {
            taken[n++] = q;
            sleep_ms(1);
        } else {
            defer_free(q, other);
            sleep_ms(1);
        }
    }
    for (size_t i = 0; i < n; i++)
        defer_free(taken[i], other);
    return found;
}

static void test_same_stream(cudaStream_t s, cudaStream_t s2)
{
    void *p = NULL, *q = NULL;
    unsigned long mallocs = fake_calls(FAKE_MALLOC_ASYNC);
    is_int(alloc_checked(&p, 1000, s), cudaSuccess, "defer_alloc(1000)");
    is_int(fake_calls(FAKE_MALLOC_ASYNC) - mallocs, 1,
           "an empty cache: one allocation from cudefer's pool");
    fake_work *w = work_held(s, p);
    is_int(defer_free(p, s), cudaSuccess, "defer_free on s, work pending");
    is_int(alloc_checked(&q, 900, s), cudaSuccess, "defer_alloc(900) on s");
    ok(q == p, "s gets the block back before its work is done");
    is_int(fake_calls(FAKE_MALLOC_ASYNC) - mallocs, 1,
           "without a new allocation");
    void *r = NULL;
    is_int(alloc_checked(&r, 900, s2), cudaSuccess, "defer_alloc(900) on s2");
    ok(r != p, "another stream does not get a block in use");
    work_timed(s, 10, q);
    defer_free(q, s);
    defer_free(r, s2);
    fake_complete(w);
    void *t = take_when_done(1000, s2, p);
    ok(t == p, "once its work is done, another stream gets it");
    defer_free(t, s2);
    ok(fake_is_released(p) == 0, "the block was never cudaFree'd");
    ok(stats_now().reused_same_stream >= 1, "stats count the same-stream reuse");
}

/* The per-thread default stream is a different stream on every thread. */
struct pts {
    void *p;
    fake_work *w;
    int step;
};

static void *per_thread_other(void *arg)
{
    struct pts *t = arg;
    void *q = NULL;
    alloc_checked(&q, 512, cudaStreamPerThread);
    t->step = q == t->p ? -1 : 1;
    defer_free(q, cudaStreamPerThread);
    return NULL;
}

static void test_per_thread_stream(void)
{
    struct pts t = {0};
    alloc_checked(&t.p, 512, cudaStreamPerThread);
    t.w = work_held(cudaStreamPerThread, t.p);
    defer_free(t.p, cudaStreamPerThread);
    pthread_t th;
    pthread_create(&th, NULL, per_thread_other, &t);
    pthread_join(th, NULL);
    is_int(t.step, 1, "another thread's per-thread stream does not get it");
    void *q = NULL;
    alloc_checked(&q, 512, cudaStreamPerThread);
    ok(q == t.p, "this thread's per-thread stream does");
    fake_complete(t.w);
    defer_free(q, cudaStreamPerThread);
}

static void *legacy_other(void *arg)
{
    struct pts *t = arg;
    void *q = NULL;
    alloc_checked(&q, 512, 0);
    t->step = q == t->p ? 1 : -1;
    defer_free(q, 0);
    return NULL;
}

static void test_legacy_stream(void)
{
    struct pts t = {0};
    alloc_checked(&t.p, 512, 0);
    t.w = work_held(0, t.p);
    defer_free(t.p, 0);
    pthread_t th;
    pthread_create(&th, NULL, legacy_other, &t);
    pthread_join(th, NULL);
    is_int(t.step, 1, "the legacy stream is one stream: another thread's "
                      "stream 0 gets it at once");
    fake_complete(t.w);
}

static void test_record_stream(cudaStream_t s, cudaStream_t side)
{
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 4096, s);
    fake_work *w = work_held(side, p);
    is_int(defer_record_stream(p, side), cudaSuccess, "record_stream(side)");
    is_int(defer_free(p, s), cudaSuccess, "freed on s");
    alloc_checked(&q, 4096, s);
    ok(q != p, "s does not get it while the side stream still reads it");
    defer_free(q, s);
    fake_complete(w);
    void *t = take_when_done(4096, s, p);
    ok(t == p, "once the side stream is done, it comes back");
    ok(fake_is_released(p) == 0, "without a cudaFree");
    stderr_capture_begin();
    is_int(defer_record_stream(p, cudaStreamPerThread), cudaErrorInvalidValue,
           "cudaStreamPerThread cannot be recorded");
    defer_free(t, s);
    is_int(defer_record_stream(p, side), cudaErrorInvalidValue,
           "a freed block cannot be recorded");
    is_int(defer_record_stream(NULL, side), cudaErrorInvalidValue,
           "nor NULL");
    const char *said = stderr_capture_end();
    ok(strstr(said, "no live block") != NULL, "the message names the problem");
}

/* Every way to free a block waits for the streams it was recorded on. */
static void test_recorded_paths(cudaStream_t s, cudaStream_t side)
{
    cudaStream_t s3 = stream_new();
    void *p = NULL, *q = NULL, *r = NULL;
    /* defer_free_streams on one stream */
    alloc_checked(&p, 16384, s);
    fake_work *w = work_held(side, p);
    defer_record_stream(p, side);
    is_int(defer_free_streams(p, &s, 1), cudaSuccess, "defer_free_streams");
    alloc_checked(&q, 16384, s3);
    ok(q != p, "defer_free_streams waits for the recorded stream");
    fake_complete(w);
    void *t = take_when_done(16384, s3, p);
    ok(t == p, "then it comes back");
    /* defer_free_n of a recorded block and another */
    w = work_held(side, t);
    defer_record_stream(t, side);
    void *two[2] = {t, q};
    is_int(defer_free_n(two, 2, s3), cudaSuccess, "defer_free_n");
    alloc_checked(&r, 16384, s);
    ok(r != t, "defer_free_n waits for a block's recorded stream");
    defer_free(r, s);
    /* into a capture: refused, the caller keeps it */
    void *c = NULL;
    alloc_checked(&c, 512, s);
    defer_record_stream(c, side);
    cudaStream_t cap = stream_new();
    cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
    stderr_capture_begin();
    is_int(defer_free(c, cap), cudaErrorStreamCaptureUnsupported,
           "a recorded block cannot be freed into a capture");
    ok(strstr(stderr_capture_end(), "recorded on other streams") != NULL,
       "saying why");
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(cap, &g);
    cudaGraphDestroy(g);
    cudaStreamDestroy(cap);
    fake_complete(w);
    defer_free(c, s);
    defer_flush();
    cudaStreamDestroy(s3);
}

/* A defer_free_n of a block and of memory the application allocated: the
 * block is back in the cache as soon as the work is done, while the
 * policy holds the other (the device is kept busy). */
static void test_mixed_free_n(cudaStream_t s, cudaStream_t busy)
{
    void *b = NULL, *plain = device_alloc(4096);
    alloc_checked(&b, 32768, s);
    fake_work *gate = work_held(busy, NULL);
    void *two[2] = {b, plain};
    work_timed(s, 10, b);
    defer_free_n(two, 2, s);
    cudaStream_t other = stream_new();
    void *t = take_when_done(32768, other, b);
    ok(t == b, "the block comes back while the rest is held");
    ok(fake_is_released(plain) == 0, "the application's memory is held");
    defer_free(t, other);
    fake_complete(gate);
    defer_flush();
    ok(wait_released(plain, 2000), "and released in the end");
    cudaStreamDestroy(other);
}

/* CUDEFER_DISABLE=1: a free waits here for the recorded streams too. */
static void scenario_disable_recorded(void)
{
    set_cudefer_env("CUDEFER_DISABLE=1");
    fake_reset(1);
    cudaStream_t s = stream_new(), side = stream_new();
    void *p = NULL;
    alloc_checked(&p, 4096, s);
    fake_work *w = work_timed(side, 20000, p);
    defer_record_stream(p, side);
    defer_free(p, s);
    CHECK(fake_work_done(w), "disabled: defer_free waited for the recorded "
                             "stream's work");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    scenario_child_end();
}

static void test_groups(cudaStream_t s, cudaStream_t s2)
{
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 8192, s);
    fake_work *w = work_held(s2, p);
    cudaStream_t both[2] = {s, s2};
    is_int(defer_free_streams(p, both, 2), cudaSuccess, "defer_free_streams");
    alloc_checked(&q, 8192, s);
    ok(q != p, "a block of several streams is not stream-ordered");
    defer_free(q, s);
    fake_complete(w);
    void *t = take_when_done(8192, s, p);
    ok(t == p && fake_is_released(p) == 0, "it comes back once all are done");
    void *ptrs[2] = {t, NULL};
    alloc_checked(&ptrs[1], 8192, s);
    is_int(defer_free_n(ptrs, 2, s), cudaSuccess, "defer_free_n of two blocks");
    defer_flush();
    ok(fake_is_released(ptrs[0]) == 0 && fake_is_released(ptrs[1]) == 0,
       "they go back to the cache, not to cudaFree");
}

/* A request that no cached block fits hands the device's free blocks back
 * to the pool first (cudaFreeAsync, no drain): their memory then serves any
 * size. */
static void test_miss_hands_back(cudaStream_t s)
{
    void *big = NULL, *small = NULL;
    alloc_checked(&big, 1 << 20, s);
    defer_free(big, s);
    defer_flush(); /* its work done: FREE */
    uint64_t releases = stats_now().cache_releases;
    unsigned long frees = fake_calls(FAKE_FREE);
    unsigned long async = fake_calls(FAKE_FREE_ASYNC);
    alloc_checked(&small, 256 << 10, s);
    ok(small != big && fake_is_released(big) == 1,
       "a miss gives the free 1 MiB block back to the pool");
    ok(fake_calls(FAKE_FREE_ASYNC) - async >= 1 && fake_calls(FAKE_FREE) == frees,
       "with cudaFreeAsync, never cudaFree");
    ok(stats_now().cache_releases > releases, "counted as released");
    defer_free(small, s);
}

static void test_double_free(cudaStream_t s)
{
    void *p = NULL;
    alloc_checked(&p, 512, s);
    defer_free(p, s);
    stderr_capture_begin();
    is_int(defer_free(p, s), cudaErrorInvalidValue, "a second defer_free");
    const char *said = stderr_capture_end();
    ok(strstr(said, "already free") != NULL, "is refused, saying why");
}

static void test_foreign(cudaStream_t s)
{
    /* A pinned host pointer given to defer_free by mistake, an interior
     * pointer of a block: neither is ever handed out by defer_alloc. */
    void *h = host_alloc(4096), *p = NULL, *q = NULL;
    alloc_checked(&p, 4096, s);
    stderr_capture_begin();
    defer_free(h, s);
    defer_free((char *)p + 2048, s);
    defer_flush();
    const char *said = stderr_capture_end();
    ok(strstr(said, "is not released") != NULL, "both releases fail, reported");
    for (int i = 0; i < 4; i++) {
        alloc_checked(&q, 2048, s);
        ok(q != h && q != (char *)p + 2048, "never handed out (%d)", i);
        defer_free(q, s);
    }
    cudaFreeHost(h);
    defer_free(p, s);
}

static void test_other_device(cudaStream_t s0)
{
    /* A device-1 block freed on a device-0 stream: device 0 never gets it. */
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p = NULL;
    alloc_checked(&p, 65536, s1);
    cudaSetDevice(0);
    defer_free(p, s0);
    defer_flush();
    void *q = NULL;
    alloc_checked(&q, 65536, s0);
    ok(q != p, "device 0 does not get device 1's block");
    defer_free(q, s0);
    void *t = take_when_done(65536, s1, p);
    ok(t == p, "device 1 does");
    defer_free(t, s1);
    /* The PyTorch entry points allocate on their device, whatever is
     * current, and leave the current device alone. */
    void *r = defer_pluggable_alloc(1000, 1, 0);
    int current = -1;
    cudaGetDevice(&current);
    struct cudaPointerAttributes attr;
    ok(r != NULL && cudaPointerGetAttributes(&attr, r) == cudaSuccess &&
           attr.device == 1,
       "defer_pluggable_alloc(device 1, stream 0) allocates on device 1");
    is_int(current, 0, "the current device is still 0");
    fake_oracle_handout(r, 0); /* device 1's legacy stream, as the call saw */
    defer_pluggable_free(r, 1000, 1, 0);
    cudaGetDevice(&current);
    is_int(current, 0, "defer_pluggable_free leaves it alone too");
    stderr_capture_begin();
    void *m = defer_pluggable_alloc(2000, 0, s0);
    defer_pluggable_free(m, 4000, 0, s0);
    ok(strstr(stderr_capture_end(), "freed as 4000 bytes") != NULL,
       "a size that does not match the block is reported");
    cudaStreamDestroy(s1);
}

static void test_capture(void)
{
    cudaStream_t c = stream_new();
    void *p = NULL;
    cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal);
    stderr_capture_begin();
    is_int(defer_alloc(&p, 512, c), cudaErrorStreamCaptureUnsupported,
           "defer_alloc on a capturing stream is refused");
    ok(strstr(stderr_capture_end(), "captured") != NULL, "saying why");
    cudaGraph_t g = NULL;
    is_int(cudaStreamEndCapture(c, &g), cudaSuccess,
           "and the capture is left intact");
    cudaGraphDestroy(g);
    cudaStreamDestroy(c);
}

static void test_out_of_memory(cudaStream_t s)
{
    size_t free_b, total;
    defer_flush();
    defer_trim(NULL); /* nothing cached: the limit below is what is free */
    cudaMemGetInfo(&free_b, &total);
    /* 600 KiB rounds to 608 KiB; only 604 KiB are left. */
    fake_set_device_memory(0, total - free_b + (604 << 10));
    void *p = NULL;
    uint64_t before = stats_now().cache_bytes;
    is_int(defer_alloc(&p, 600 << 10, s), cudaSuccess,
           "the rounded size does not fit, the exact size does");
    is_int(stats_now().cache_bytes - before, 600 << 10, "a block of 600 KiB");
    defer_free(p, s);
    /* Cached free blocks are released to make room. */
    void *big = NULL;
    defer_flush();
    is_int(defer_alloc(&big, 602 << 10, s), cudaSuccess,
           "out of memory: the cache is trimmed, then it fits");
    ok(fake_is_released(p) == 1, "the cached block made room");
    defer_free(big, s);
    fake_set_device_memory(0, total);
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
    ok(fake_is_released(p) == 1, "with cudaFree");
}

/* A child with CUDEFER_CACHE_KEEP_MS=50: a free block nobody takes is
 * released after 50 ms, even though the application went quiet. */
static void scenario_expiry(void)
{
    set_cudefer_env("CUDEFER_CACHE_KEEP_MS=50");
    fake_reset(1);
    cudaStream_t s = stream_new();
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 4096, s);
    alloc_checked(&q, 8192, s);
    defer_free(p, s);
    defer_flush();
    CHECK(fake_is_released(p) == 0, "not released at once");
    CHECK(wait_released(p, 2000), "released once unused for 50 ms");
    CHECK(stats_now().cache_releases == 1, "counted");
    CHECK(fake_is_released(q) == 0, "a live block stays the application's");
    defer_free(q, s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_is_released(q) == 1, "shutdown releases the free blocks (%d; "
          "releases %llu, cache bytes %llu free %llu)", fake_is_released(q),
          ULL(stats_now().cache_releases), ULL(stats_now().cache_bytes),
          ULL(stats_now().cache_free_bytes));
    scenario_child_end();
}

int main(void)
{
    plan_lazy();
    pid_t pid = fork_flushed();
    if (pid == 0)
        scenario_expiry();
    int status;
    ok(wait_child(pid, 10000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "CUDEFER_CACHE_KEEP_MS: unused blocks expire; shutdown releases");
    pid = fork_flushed();
    if (pid == 0)
        scenario_disable_recorded();
    ok(wait_child(pid, 10000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "CUDEFER_DISABLE: a free waits for the recorded streams");
    set_cudefer_env(NULL);
    fake_reset(2);
    cudaStream_t s = stream_new(), s2 = stream_new();
    void *p = NULL;
    is_int(defer_alloc(&p, 0, s), cudaSuccess, "0 bytes: success");
    ok(p == NULL, "and NULL");
    stderr_capture_begin();
    is_int(defer_alloc(NULL, 8, s), cudaErrorInvalidValue, "NULL ptr: invalid");
    stderr_capture_end();
    test_same_stream(s, s2);
    test_per_thread_stream();
    test_legacy_stream();
    test_record_stream(s, s2);
    test_groups(s, s2);
    test_recorded_paths(s, s2);
    test_mixed_free_n(s, s2);
    test_miss_hands_back(s);
    test_double_free(s);
    test_foreign(s);
    test_other_device(s);
    test_capture();
    test_out_of_memory(s);
    test_trim(s);
    void *live = NULL;
    alloc_checked(&live, 512, s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 1,
           "only the live block is left: the application's");
    cudaFree(live);
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
