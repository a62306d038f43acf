/* SPDX-License-Identifier: MIT */
/* What the counters and defer_trim's released_bytes say of releases that
 * do not go as planned:
 * - a trim of cudefer's memory pool while another thread's defer_alloc
 *   makes that pool grow: released_bytes is what the trim gave back, not
 *   less by the new block;
 * - an entry of several pointers (defer_free_n, with and without blocks
 *   of defer_alloc's) or of several streams (defer_free_streams) whose
 *   release partly fails: the entry counts once, in failed (the counters
 *   count entries, as deferred does: one a call), pending goes back to 0,
 *   and the bytes of the pointers that were released count in
 *   released_bytes, those of the one refused do not (none do where its
 *   size cannot be asked again, nor where a pointer inside an allocation
 *   is refused after another pointer of the call released that
 *   allocation: nothing is said released that was not). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

/* deferred = released + failed + pending, pending 0, nothing held: the
 * identities of a quiet program (step names the check). */
static void check_quiet(const char *step)
{
    ok(wait_stats_settled(5000), "%s: the statistics settle", step);
    struct defer_stats s = stats_now();
    ok(s.deferred == s.released + s.failed + s.pending && s.pending == 0 &&
           s.held == 0 && s.held_bytes == 0,
       "%s: deferred %llu = released %llu + failed %llu + pending %llu, "
       "none pending or held (%llu, %llu bytes)",
       step, ULL(s.deferred), ULL(s.released), ULL(s.failed),
       ULL(s.pending), ULL(s.held), ULL(s.held_bytes));
}

/* ---- a trim while the pool grows ---------------------------------------- */

/* A thread that allocates a block once told to, as a defer_alloc of the
 * application may run while the reclaimer trims. */
struct grower {
    cudaStream_t s;
    size_t bytes;
    void *p;
    cudaError_t err;
    int go, done;
};

static void *grow(void *arg)
{
    struct grower *g = arg;
    wait_flag(&g->go, 10000);
    g->err = alloc_checked(&g->p, g->bytes, g->s);
    __atomic_store_n(&g->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* On the reclaimer, just after its cudaMemPoolTrimTo returned, before it
 * reads what the pool holds now: let the grower allocate, and give its
 * allocation time to land (it may wait for the trim to end instead, and
 * then lands after it). */
static void trim_returned(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)r;
    struct grower *g = arg;
    fake_set_return_hook(FAKE_MEM_POOL_TRIM, NULL, NULL); /* once */
    __atomic_store_n(&g->go, 1, __ATOMIC_RELEASE);
    wait_flag(&g->done, 300);
}

static void test_trim_while_pool_grows(void)
{
    cudaStream_t s = stream_new();
    void *a = NULL;
    is_int(alloc_checked(&a, 8 * MiB, s), cudaSuccess, "an 8 MiB block");
    struct defer_device_stats ds;
    defer_device_stats_get(0, &ds);
    size_t segment = ds.cache_bytes;
    is_int(defer_free(a, s), cudaSuccess, "freed");
    is_int(defer_flush(), cudaSuccess, "flush: the block back in the cache");
    struct grower g = {.s = stream_new(), .bytes = 1 * MiB};
    pthread_t t;
    ok(pthread_create(&t, NULL, grow, &g) == 0, "the growing thread");
    fake_set_return_hook(FAKE_MEM_POOL_TRIM, trim_returned, &g);
    size_t released = 0;
    is_int(defer_trim(&released), cudaSuccess, "trim");
    pthread_join(t, NULL);
    fake_set_return_hook(FAKE_MEM_POOL_TRIM, NULL, NULL);
    is_int(g.err, cudaSuccess, "the other thread's block, made meanwhile");
    ok(released == segment,
       "released_bytes %zu: the %zu bytes the trim gave back, not less "
       "by the block the pool grew for meanwhile", released, segment);
    is_int(defer_free(g.p, g.s), cudaSuccess, "its block freed");
    is_int(defer_trim(&released), cudaSuccess, "a trim on a quiet pool");
    ok(released >= g.bytes,
       "it gives that block's memory back (%zu bytes)", released);
    check_quiet("trim while the pool grows");
}

/* ---- entries whose release partly fails ---------------------------------- */

/* Trim what is completed and held now (count entries held), the counters
 * before in *before; what the trim gave back in *released. */
static void trim_held(uint64_t count, struct defer_stats *before,
                      size_t *released, const char **said)
{
    WAIT_UNTIL(stats_now().held == count, 10000);
    is_int(stats_now().held, count, "%llu entries held", ULL(count));
    *before = stats_now();
    stderr_capture_begin();
    is_int(defer_trim(released), cudaSuccess, "trim");
    *said = stderr_capture_end();
    wait_stats_settled(5000);
}

/* The counters of one call deferred since start whose entry failed since
 * before (after: now): counted once, in failed, not released. */
static void check_one_failed(const struct defer_stats *start,
                             const struct defer_stats *before,
                             const struct defer_stats *after)
{
    ok(after->deferred - start->deferred == 1 &&
           after->failed - before->failed == 1 &&
           after->released == before->released,
       "one entry, counted once, in failed (deferred +%llu, failed +%llu, "
       "released +%llu)",
       ULL(after->deferred - start->deferred),
       ULL(after->failed - before->failed),
       ULL(after->released - before->released));
}

/* p0 (3 KiB), h (7 KiB: pinned host memory, or plain host memory of
 * malloc's where plain) and p1 (5 KiB) freed on s in one defer_free_n
 * (ptrs gets them), their work completed; the counters just before the
 * call in *start. */
static void free_three_of(cudaStream_t s, void *ptrs[3],
                          struct defer_stats *start, bool plain)
{
    ptrs[0] = device_alloc(3 * KiB);
    ptrs[1] = plain ? malloc(7 * KiB) : host_alloc(7 * KiB);
    if (ptrs[1] == NULL)
        bail("out of host memory");
    ptrs[2] = device_alloc(5 * KiB);
    fake_work *w = fake_launch_held(s, ptrs, 3);
    *start = stats_now();
    is_int(defer_free_n(ptrs, 3, s), cudaSuccess, "defer_free_n of 3");
    fake_complete(w);
}

static void free_three(cudaStream_t s, void *ptrs[3],
                       struct defer_stats *start)
{
    free_three_of(s, ptrs, start, false);
}

/* Three pointers in one call, the middle one pinned host memory, which
 * defer_free_n's cudaFreeAsync (and cudaFree) refuse. */
static void test_free_n_part_fails(void)
{
    void *ptrs[3];
    struct defer_stats start;
    free_three(stream_new(), ptrs, &start);
    void *p0 = ptrs[0], *h = ptrs[1], *p1 = ptrs[2];
    struct defer_stats before;
    size_t released = 0;
    const char *said;
    trim_held(1, &before, &released, &said);
    struct defer_stats after = stats_now();
    ok(has_line(said, "defer_free_n", "pinned host memory", NULL),
       "the refused pointer said: %s", said);
    ok(fake_is_released(p0) == 1 && fake_is_released(p1) == 1 &&
           fake_is_released(h) == 0,
       "the device pointers released, the host one not");
    check_one_failed(&start, &before, &after);
    is_int(released, 8 * KiB,
           "released_bytes: the two device pointers' bytes, not the host "
           "one's");
    check_quiet("defer_free_n, one pointer refused");
    cudaFreeHost(h);
}

/* As test_free_n_part_fails, the middle pointer plain host memory
 * (malloc's), which CUDA never knew: it held no bytes of the entry, so the
 * device pointers' bytes all count as given back. */
static void test_free_n_plain_host_fails(void)
{
    void *ptrs[3];
    struct defer_stats start;
    free_three_of(stream_new(), ptrs, &start, true);
    void *p0 = ptrs[0], *h = ptrs[1], *p1 = ptrs[2];
    struct defer_stats before;
    size_t released = 0;
    const char *said;
    trim_held(1, &before, &released, &said);
    struct defer_stats after = stats_now();
    ok(has_line(said, "defer_free_n", "not memory CUDA allocated", NULL),
       "the refused pointer said: %s", said);
    ok(fake_is_released(p0) == 1 && fake_is_released(p1) == 1,
       "the device pointers released");
    check_one_failed(&start, &before, &after);
    is_int(released, 8 * KiB,
           "released_bytes: the two device pointers' bytes (the plain host "
           "pointer held none)");
    check_quiet("defer_free_n, a plain host pointer refused");
    free(h);
}

/* As test_free_n_part_fails, but the size of the refused pointer cannot
 * be asked again once its release failed (cuPointerGetAttributes fails
 * then): the trim does not count it given back, and says nothing that
 * claims it was released. */
static void test_free_n_part_fails_unsized(void)
{
    void *ptrs[3];
    struct defer_stats start;
    free_three(stream_new(), ptrs, &start);
    void *p0 = ptrs[0], *h = ptrs[1], *p1 = ptrs[2];
    WAIT_UNTIL(stats_now().held == 1, 10000);
    is_int(stats_now().held, 1, "1 entry held");
    /* The release's calls: what h is (said refused), then its size. */
    fake_fail(FAKE_CU_POINTER_GET_ATTRIBUTES, cudaErrorUnknown, 1, 1);
    stderr_capture_begin();
    size_t released = 0;
    is_int(defer_trim(&released), cudaSuccess, "trim");
    const char *said = stderr_capture_end();
    fake_fail_clear();
    ok(fake_is_released(p0) == 1 && fake_is_released(p1) == 1 &&
           fake_is_released(h) == 0,
       "the device pointers released, the host one not");
    ok(released <= 8 * KiB,
       "released_bytes %zu: at most the two device pointers' bytes, never "
       "the refused one's", released);
    ok(strstr(said, "released all the same") == NULL,
       "nothing says the refused pointer is released: %s", said);
    check_quiet("defer_free_n, one pointer refused, its size not known");
    cudaFreeHost(h);
}

/* One allocation named twice in one call, at its start and inside it:
 * its memory goes back once, the pointer inside is refused, and
 * released_bytes never says the allocation's bytes twice (with
 * cudaFreeAsync, and with cudaFree on a device without memory pools). */
static void test_free_n_inside(void)
{
    cudaStream_t s = stream_new();
    char *b = device_alloc(64 * KiB);
    void *ptrs[2] = {b, b + 4 * KiB};
    fake_work *w = fake_launch_held(s, ptrs, 1);
    is_int(defer_free_n(ptrs, 2, s), cudaSuccess,
           "defer_free_n of a pointer and one inside it");
    fake_complete(w);
    struct defer_stats before;
    size_t released = 0;
    const char *said;
    trim_held(1, &before, &released, &said);
    ok(fake_is_released(b) == 1, "the allocation released");
    ok(released <= 64 * KiB,
       "released_bytes %zu: at most the allocation's 64 KiB, once",
       released);
    check_quiet("defer_free_n naming one allocation twice");
}

/* A block of defer_alloc's, plain memory and a refused pointer in one
 * call: the block back in the cache, the plain memory released and
 * counted in released_bytes, the entry failed once. */
static void test_free_n_block_part_fails(void)
{
    cudaStream_t s = stream_new();
    void *b = NULL;
    is_int(alloc_checked(&b, 64 * KiB, s), cudaSuccess, "a block");
    struct defer_device_stats ds;
    defer_device_stats_get(0, &ds);
    uint64_t live = ds.live_bytes;
    void *p = device_alloc(3 * KiB), *h = host_alloc(7 * KiB);
    void *ptrs[3] = {b, h, p};
    fake_work *w = fake_launch_held(s, ptrs, 3);
    struct defer_stats start = stats_now();
    is_int(defer_free_n(ptrs, 3, s), cudaSuccess, "defer_free_n of 3");
    fake_complete(w);
    struct defer_stats before;
    size_t released = 0;
    const char *said;
    trim_held(1, &before, &released, &said);
    struct defer_stats after = stats_now();
    defer_device_stats_get(0, &ds);
    ok(fake_is_released(p) == 1 && fake_is_released(h) == 0,
       "the plain pointer released, the host one not");
    ok(ds.live_bytes < live, "the block back in the cache (live %llu -> "
       "%llu)", ULL(live), ULL(ds.live_bytes));
    check_one_failed(&start, &before, &after);
    /* The block's segment went back to the pool and the pool was trimmed
     * in the same pass: its bytes count too. */
    ok(released >= 3 * KiB + 64 * KiB && released < 3 * KiB + 128 * KiB,
       "released_bytes %zu: the plain pointer's and the block's segment, "
       "not the host one's", released);
    check_quiet("defer_free_n with a block, one pointer refused");
    cudaFreeHost(h);
}

/* defer_free_streams of a pointer refused, on two streams: one entry (its
 * parts are not the caller's), failed once; and one released, once. */
static void test_free_streams_once(void)
{
    cudaStream_t st[2] = {stream_new(), stream_new()};
    void *h = host_alloc(7 * KiB), *p = device_alloc(3 * KiB);
    fake_work *w0 = work_held(st[0], p), *w1 = work_held(st[1], p);
    struct defer_stats start = stats_now();
    is_int(defer_free_streams(h, st, 2), cudaSuccess,
           "defer_free_streams of a host pointer");
    is_int(defer_free_streams(p, st, 2), cudaSuccess,
           "defer_free_streams of device memory");
    fake_complete(w0);
    fake_complete(w1);
    struct defer_stats before;
    size_t released = 0;
    const char *said;
    trim_held(2, &before, &released, &said);
    struct defer_stats after = stats_now();
    ok(fake_is_released(p) == 1 && fake_is_released(h) == 0,
       "the device memory released, the host one not");
    ok(after.deferred - start.deferred == 2 &&
           after.failed - before.failed == 1 &&
           after.released - before.released == 1,
       "two entries: one failed, one released (deferred +%llu, failed "
       "+%llu, released +%llu)",
       ULL(after.deferred - start.deferred),
       ULL(after.failed - before.failed),
       ULL(after.released - before.released));
    is_int(released, 3 * KiB, "released_bytes: the device memory's");
    check_quiet("defer_free_streams");
    cudaFreeHost(h);
}

int main(void)
{
    plan_lazy();
    /* Completed frees stay held until the trim releases them: no release
     * at a quiet moment nor for their age. */
    set_cudefer_env("CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0");
    fake_reset(1);
    test_free_n_part_fails();
    test_free_n_plain_host_fails();
    test_free_n_part_fails_unsized();
    test_free_n_inside();
    fake_set_memory_pools(0, 0);
    test_free_n_inside();
    fake_set_memory_pools(0, 1);
    test_free_n_block_part_fails();
    test_free_streams_once();
    test_trim_while_pool_grows();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released twice or early");
    return 0;
}
