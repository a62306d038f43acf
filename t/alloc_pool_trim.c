/* SPDX-License-Identifier: MIT */
/* cudefer's pool on a device, each scenario in a fresh process: the
 * trim's count and its wait for the frees it trims after, the pool's calls
 * under another thread's Global capture, cudaMalloc and cudaFree where no
 * pool can be had, and the trim's failed calls, said. */
#include <stdio.h>
#include <string.h>

#include "alloc_pool.h"

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
static void pool_calls_leave_capture(void)
{
    cudaStream_t s = stream_new(), cap = stream_new();
    CHECK(capture_elsewhere(cap) == cudaSuccess,
          "another thread captures, Global");
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
    end_capture_dropped(cap);
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

/* A trim whose cudaFreeAsync of a cached pool block fails (not sticky),
 * and the cudaFree it then tries too: each said, naming the call that
 * failed, the last the block; not counted as released; the memory stays
 * allocated (the pool's).  (A mutant that dropped the report said
 * nothing; the line named cudaFree for the cudaFreeAsync that failed.) */
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
    fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    cudaError_t err = defer_trim(NULL);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    char text[32];
    snprintf(text, sizeof text, "%p", p);
    CHECK(err == cudaSuccess, "defer_trim: %d (not sticky: no device error)",
          (int)err);
    CHECK(has_line(said, "cudaFreeAsync failed", "goes back with cudaFree",
                   NULL) &&
              has_line(said, "cudaFree failed", text, "not released"),
          "said, with the calls and the block: %s", said);
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

/* In a fresh process with CUDEFER_CACHE_KEEP_MS=50: a block freed and not
 * taken again expires, and its memory leaves cudefer, as a trim's does.
 * Handed back to the pool alone, it stays reserved there (the pool's
 * release threshold is the maximum), out of every count of cudefer's
 * (cache_bytes 0) and out of the application's reach, until a defer_trim
 * that may never come. */
static void expiry_gives_the_pool_back(void)
{
    cudaStream_t s = stream_new();
    void *p = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess, "a block");
    CHECK(pool_reserve() == (1 << 20), "the pool reserves %llu bytes, want %d",
          (unsigned long long)pool_reserve(), 1 << 20);
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    for (int waited = 0; stats_now().cache_releases == 0 && waited < 10000;
         waited++)
        sleep_ms(1);
    CHECK(stats_now().cache_releases == 1 && stats_now().cache_bytes == 0,
          "expired: cache_releases %llu, cache_bytes %llu",
          ULL(stats_now().cache_releases), ULL(stats_now().cache_bytes));
    for (int waited = 0; pool_reserve() != 0 && waited < 2000; waited++)
        sleep_ms(1);
    CHECK(pool_reserve() == 0, "the expired block's memory is still reserved "
          "by cudefer's pool: %llu bytes, want 0",
          (unsigned long long)pool_reserve());
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
    fork_scenario("an expired block's memory leaves cudefer's pool too",
                  "CUDEFER_CACHE_KEEP_MS=50", 1, 20000,
                  expiry_gives_the_pool_back);
    return 0;
}
