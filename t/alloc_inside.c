/* SPDX-License-Identifier: MIT */
/* Pointers inside defer_alloc's memory where no block starts, end to end
 * with the reclaimer (block splitting on, the default): an interior pointer
 * of a live block (a cut one, a whole one) and a cut block freed again after
 * its first free's work was done and it merged with its free neighbour are
 * refused at the call (cudaErrorInvalidValue, reported, counted in
 * rejected, nothing deferred), by every free path; memory cudefer does not
 * own takes the ordinary path as before.  Before the segment index, each was
 * accepted and its release failed later (cudaFree of an interior pointer). */
#include <string.h>

#include "helpers.h"

static const size_t MiB = (size_t)1 << 20;

/* defer_free(ptr, s) is refused at the call, said with want on stderr,
 * counted in rejected, with nothing deferred; name says which. */
static void refused(const char *name, void *ptr, cudaStream_t s,
                    const char *want)
{
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    cudaError_t err = defer_free(ptr, s);
    const char *said = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "%s: refused", name);
    ok(strstr(said, "defer_free: ") != NULL && strstr(said, want) != NULL,
       "%s: reported (\"%s\")", name, want);
    struct defer_stats after = stats_now();
    ok(after.rejected == before.rejected + 1 &&
           after.deferred == before.deferred,
       "%s: counted in rejected, nothing deferred", name);
}

/* A 4 MiB segment made FREE, then a 1 MiB piece cut from its end for
 * stream s: the piece, LIVE (the rest at *base stays FREE). */
static char *cut_piece(cudaStream_t s, char **base)
{
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 4 * MiB, s);
    defer_free(p, s);
    defer_flush(); /* its work done: FREE */
    alloc_checked(&q, MiB, s);
    ok(q == (char *)p + 3 * MiB, "a 1 MiB piece is cut from the end of a "
                                 "FREE 4 MiB segment");
    *base = p;
    return q;
}

static void test_interior_of_live(cudaStream_t s, cudaStream_t s2)
{
    char *base, *q = cut_piece(s, &base);
    refused("an interior pointer of a live cut block", q + 4096, s,
            "points inside a live block");
    refused("the same on another stream", q + MiB - 512, s2,
            "points inside a live block");
    refused("an interior pointer of the FREE rest", base + MiB, s,
            "free or being freed");
    void *p = NULL;
    alloc_checked(&p, 65536, s);
    refused("an interior pointer of a whole live block", (char *)p + 512, s,
            "points inside a live block");
    /* Every other free path refuses it too, deferring none of its
     * pointers. */
    void *plain = device_alloc(4096);
    void *two[2] = {plain, q + 4096};
    stderr_capture_begin();
    is_int(defer_free_n(two, 2, s), cudaErrorInvalidValue,
           "defer_free_n naming one is refused");
    is_int(defer_free_streams(q + 4096, &s, 1), cudaErrorInvalidValue,
           "so is defer_free_streams");
    ok(strstr(stderr_capture_end(), "defer_free_streams: ") != NULL,
       "each reported under its own name");
    is_int(defer_free(q, s), cudaSuccess, "the piece's own free is accepted");
    is_int(defer_free(p, s), cudaSuccess, "and the whole block's");
    defer_flush();
    is_int(fake_is_released(plain), 0,
           "the refused defer_free_n deferred its plain pointer neither");
    cudaFree(plain);
}

/* The header's former limit: a block freed again once its first free's
 * work is done and it merged with a free neighbour is no block any more. */
static void test_freed_twice_after_merge(cudaStream_t s)
{
    char *base, *q = cut_piece(s, &base);
    is_int(defer_free(q, s), cudaSuccess, "the piece is freed");
    defer_flush(); /* done: FREE, merged into the FREE rest */
    struct defer_stats before = stats_now();
    refused("the piece freed again after it merged", q, s,
            "free or being freed");
    void *plain = device_alloc(4096);
    void *two[2] = {plain, q};
    stderr_capture_begin();
    is_int(defer_free_n(two, 2, s), cudaErrorInvalidValue,
           "by defer_free_n too, deferring none of its pointers");
    is_int(defer_free_streams(q, &s, 1), cudaErrorInvalidValue,
           "and by defer_free_streams");
    stderr_capture_end();
    defer_flush();
    ok(stats_now().failed == before.failed &&
           stats_now().released == before.released,
       "nothing was released, no release failed");
    is_int(fake_is_released(plain), 0, "the plain pointer is still live");
    cudaFree(plain);
    void *whole = NULL;
    alloc_checked(&whole, 4 * MiB, s);
    ok(whole == base, "the segment is whole again, handed out in one piece");
    defer_free(whole, s);
}

/* Memory cudefer does not own, once the block cache is in use: the
 * ordinary path, as before (an interior pointer of it is CUDA's to
 * refuse). */
static void test_not_ours(cudaStream_t s)
{
    void *plain = device_alloc(4096), *other = device_alloc(4096);
    struct defer_stats before = stats_now();
    is_int(defer_free(plain, s), cudaSuccess, "plain cudaMalloc memory is "
                                              "accepted");
    stderr_capture_begin();
    is_int(defer_free((char *)other + 512, s), cudaSuccess,
           "so is an interior pointer of it");
    defer_flush();
    const char *said = stderr_capture_end();
    ok(wait_released(plain, 10000), "the plain pointer is released");
    ok(strstr(said, "is not released") != NULL &&
           stats_now().failed == before.failed + 1 &&
           stats_now().rejected == before.rejected,
       "the interior one's release fails (reported), as before");
    cudaFree(other);
}

/* defer_record_stream of memory cudefer never handed out, and of a
 * pointer inside a block: refused and said (a caller may carry on after
 * the error, so the line is its only sign), nothing recorded. */
static void test_record_not_a_block(cudaStream_t s, cudaStream_t side)
{
    void *raw = NULL, *u = NULL;
    cudaMalloc(&raw, 4096);
    alloc_checked(&u, 2 * MiB, s);
    uint64_t rejected = stats_now().rejected;
    void *bad[] = {raw, (char *)u + MiB};
    const char *what[] = {"memory from cudaMalloc", "a pointer inside a block"};
    for (int i = 0; i < 2; i++) {
        stderr_capture_begin();
        is_int(defer_record_stream(bad[i], side), cudaErrorInvalidValue,
               "defer_record_stream of %s is refused", what[i]);
        ok(strstr(stderr_capture_end(), "not the start of a block") != NULL,
           "and said");
    }
    is_int(stats_now().rejected - rejected, 2, "both counted in rejected");
    cudaFree(raw);
    defer_free(u, s);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0");
    fake_reset(1);
    cudaStream_t s = stream_new(), s2 = stream_new();
    test_interior_of_live(s, s2);
    test_freed_twice_after_merge(s);
    test_not_ours(s);
    test_record_not_a_block(s, s2);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    is_int(fake_invalid_releases(), 1, "the only release that failed is the "
                                       "interior pointer of plain memory");
    return 0;
}
