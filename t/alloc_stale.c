/* SPDX-License-Identifier: MIT */
/* defer_alloc's blocks freed with cudaFree behind cudefer's back (Note
 * [Stale blocks]), end to end with the reclaimer: the blocks cut from such
 * an allocation are dropped once CUDA gives its address out again, or a
 * new allocation starts inside it, and what is said names the call the
 * application made. */
#include <string.h>

#include "helpers.h"

/* Both stale-segment scenarios' start, on s: a 2 MiB allocation cut in
 * two, its second half x freed (FREE), its first half y cudaFree'd behind
 * cudefer's back, which frees the whole allocation.  Returns its start. */
static void *stale_whole(cudaStream_t s)
{
    const size_t MiB = (size_t)1 << 20;
    void *whole = NULL, *x = NULL, *y = NULL;
    CHECK(alloc_checked(&whole, 2 * MiB, s) == cudaSuccess &&
              defer_free(whole, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "a FREE 2 MiB block");
    CHECK(alloc_checked(&x, MiB, s) == cudaSuccess &&
              alloc_checked(&y, MiB, s) == cudaSuccess && y == whole &&
              x == (char *)whole + MiB,
          "cut in two: y at its start, x after it");
    CHECK(defer_free(x, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "x freed, its work done: FREE");
    CHECK(cudaFree(y) == cudaSuccess,
          "y cudaFree'd behind cudefer's back: the whole allocation goes");
    return whole;
}

/* A block at the start of its allocation cudaFree'd behind cudefer's back
 * (Note [Stale blocks]), while a block cut from the same allocation waits
 * FREE in the cache: CUDA released the allocation whole, so once its
 * address comes back, the other block goes with the stale one.  Left in
 * the cache, it was handed out over the new allocation at that address
 * while work on another stream used it (the oracle), and its bytes stayed
 * counted. */
static void scenario_stale_segment(void)
{
    const size_t MiB = (size_t)1 << 20;
    fake_set_address_reuse(1);
    cudaStream_t s = stream_new(), s2 = stream_new(), s3 = stream_new();
    void *whole = stale_whole(s), *n = NULL, *z = NULL;
    stderr_capture_begin();
    CHECK(alloc_checked(&n, 2 * MiB, s3) == cudaSuccess && n == whole,
          "a new 2 MiB block gets the address back (n %p)", n);
    const char *said = stderr_capture_end();
    CHECK(has_line(said, "instead of defer_free", "with the 1 other block cut "
                   "from its allocation", NULL),
          "said, with the other block dropped: %s", said);
    CHECK(stats_now().cache_bytes == 2 * MiB &&
              stats_now().cache_free_bytes == 0,
          "only the new block counts (cache bytes %llu, free %llu)",
          ULL(stats_now().cache_bytes), ULL(stats_now().cache_free_bytes));
    fake_work *w = work_held(s3, n);
    CHECK(alloc_checked(&z, MiB, s2) == cudaSuccess,
          "1 MiB on s2 while n's work runs on s3");
    CHECK(z < (void *)whole || z >= (void *)((char *)whole + 2 * MiB),
          "not x, inside n (z %p)", z);
    fake_complete(w);
    CHECK(defer_free(n, s3) == cudaSuccess && defer_free(z, s2) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "freed");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    cudaStreamDestroy(s3);
}

/* As scenario_stale_segment, but the new allocation starts inside the
 * cudaFree'd one, where no block of it starts (CUDA may hand out such an
 * address: fake_set_reuse_inside): the old allocation's blocks are dropped
 * all the same, else its FREE piece is handed out over the new one. */
static void scenario_stale_segment_inside(void)
{
    const size_t MiB = (size_t)1 << 20, KiB = 1024;
    fake_set_address_reuse(1);
    cudaStream_t s = stream_new(), s2 = stream_new(), s3 = stream_new();
    void *whole = stale_whole(s), *n = NULL, *z = NULL;
    fake_set_reuse_inside(512 * KiB);
    stderr_capture_begin();
    CHECK(alloc_checked(&n, 1536 * KiB, s3) == cudaSuccess &&
              n == (char *)whole + 512 * KiB,
          "a new 1.5 MiB block 512 KiB inside the old allocation (n %p)", n);
    const char *said = stderr_capture_end();
    CHECK(has_line(said, "instead of defer_free", NULL, NULL),
          "the stale allocation said: %s", said);
    CHECK(stats_now().cache_bytes == 1536 * KiB &&
              stats_now().cache_free_bytes == 0,
          "only the new block counts (cache bytes %llu, free %llu)",
          ULL(stats_now().cache_bytes), ULL(stats_now().cache_free_bytes));
    fake_work *w = work_held(s3, n);
    CHECK(alloc_checked(&z, MiB, s2) == cudaSuccess,
          "1 MiB on s2 while n's work runs on s3");
    CHECK(z < n || z >= (void *)((char *)n + 1536 * KiB),
          "not x, inside n (z %p)", z);
    fake_complete(w);
    CHECK(defer_free(n, s3) == cudaSuccess && defer_free(z, s2) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "freed");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    cudaStreamDestroy(s3);
}

/* A block of defer_pluggable_alloc's cudaFree'd behind cudefer's back,
 * found when its address comes back to defer_pluggable_alloc: said in the
 * words of the calls the application made, defer_pluggable_alloc and its
 * free, defer_pluggable_free, never defer_alloc's. */
static void scenario_stale_said_as_pluggable(void)
{
    const size_t MiB = (size_t)1 << 20;
    fake_set_address_reuse(1);
    cudaStream_t s = stream_new();
    void *p = defer_pluggable_alloc(2 * MiB, 0, s);
    CHECK(p != NULL, "a 2 MiB block");
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree'd behind cudefer's back");
    stderr_capture_begin();
    void *q = defer_pluggable_alloc(2 * MiB, 0, s);
    const char *said = stderr_capture_end();
    CHECK(q == p, "its address comes back (q %p, p %p)", q, p);
    CHECK(has_line(said, "cudefer: defer_pluggable_alloc: CUDA gave out",
                   "instead of defer_pluggable_free;", NULL) &&
              strstr(said, "defer_alloc") == NULL,
          "said in the words of defer_pluggable_alloc (stderr: \"%s\")",
          said);
    defer_pluggable_free(q, 2 * MiB, 0, s);
    CHECK(defer_flush() == cudaSuccess, "freed");
    cudaStreamDestroy(s);
}

/* A block freed with defer_free_streams, cudaFree'd behind cudefer's back
 * while its free waits, its address given out again: the free's release
 * says so naming defer_free_streams, the call the application made, not
 * defer_free. */
static void scenario_dropped_claim_said_as_streams(void)
{
    const size_t MiB = (size_t)1 << 20;
    fake_set_address_reuse(1);
    cudaStream_t s = stream_new(), s2 = stream_new(), s3 = stream_new();
    void *p = NULL, *n = NULL;
    CHECK(alloc_checked(&p, 2 * MiB, s) == cudaSuccess, "a 2 MiB block");
    void *other = device_alloc(64);
    fake_work *w = work_held(s, other); /* the free waits; p unused */
    cudaStream_t both[2] = {s, s2};
    CHECK(defer_free_streams(p, both, 2) == cudaSuccess,
          "freed with defer_free_streams, waiting for s");
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree'd behind cudefer's back");
    stderr_capture_begin();
    CHECK(alloc_checked(&n, 2 * MiB, s3) == cudaSuccess && n == p,
          "its address given out again (n %p)", n);
    stderr_capture_end();
    stderr_capture_begin();
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    const char *said = stderr_capture_end();
    CHECK(has_line(said, "behind cudefer's back while its "
                   "defer_free_streams waited", NULL, NULL),
          "the release names defer_free_streams (stderr: \"%s\")", said);
    CHECK(defer_free(n, s3) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed");
    cudaFree(other);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a block cudaFree'd behind cudefer's back: the blocks cut "
                  "from its allocation are dropped with it once its address "
                  "comes back",
                  "", 1, 20000, scenario_stale_segment);
    fork_scenario("a block cudaFree'd behind cudefer's back: its allocation's "
                  "blocks are dropped once a new one starts inside it",
                  "", 1, 20000, scenario_stale_segment_inside);
    fork_scenario("a block of defer_pluggable_alloc's cudaFree'd behind "
                  "cudefer's back: said in its words", "", 1, 20000,
                  scenario_stale_said_as_pluggable);
    fork_scenario("a block of a waiting defer_free_streams cudaFree'd "
                  "behind cudefer's back: its release names the call", "", 1,
                  20000, scenario_dropped_claim_said_as_streams);
    return 0;
}
