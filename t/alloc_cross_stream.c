/* SPDX-License-Identifier: MIT */
/* A block of defer_alloc used on another stream than the one it was asked
 * for, as cudefer.h allows: once that stream waits for the block's own
 * (cudaStreamWaitEvent after the call), as with cudaMallocAsync.  The
 * block here is the hardest case: handed out at once on its stream while a
 * piece merged into it still waits for its previous owner's work (the
 * cache must not make such a block FREE before the piece's entry is
 * done).  The oracle checks every hand-out: the block
 * must reach a third stream only once that work is done. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

static void scenario_merged_piece_then_other_stream(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new(), s3 = stream_new();
    void *whole = NULL, *a = NULL, *b = NULL, *x = NULL, *y = NULL,
         *z = NULL;
    CHECK(alloc_checked(&whole, 2 * MiB, s) == cudaSuccess, "2 MiB on s");
    CHECK(defer_free(whole, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed, its work done: a FREE 2 MiB block");
    CHECK(alloc_checked(&a, MiB, s) == cudaSuccess &&
              alloc_checked(&b, MiB, s) == cudaSuccess,
          "two 1 MiB pieces cut from it");
    CHECK(defer_free(a, s) == cudaSuccess, "a freed on s (no work)");
    fake_work *wb = work_held(s, b); /* b's owner's work, still running */
    CHECK(defer_free(b, s) == cudaSuccess, "b freed on s behind it");
    CHECK(alloc_checked(&x, 2 * MiB, s) == cudaSuccess, "2 MiB on s again");
    CHECK(x == whole, "the pieces merged, handed out at once on s "
                      "(x %p, the block %p)", x, whole);

    /* Used on s2 as cudefer.h asks: s2 waits for s after the call. */
    cudaEvent_t after_alloc;
    CHECK(cudaEventCreateWithFlags(&after_alloc, cudaEventDisableTiming) ==
                  cudaSuccess &&
              cudaEventRecord(after_alloc, s) == cudaSuccess &&
              cudaStreamWaitEvent(s2, after_alloc, 0) == cudaSuccess,
          "s2 waits for s");
    work_timed(s2, 1000, x);
    CHECK(defer_free(x, s2) == cudaSuccess, "x freed on s2");
    sleep_ms(30); /* the reclaimer polls x's event: not complete (s2 waits) */
    CHECK(alloc_checked(&y, 2 * MiB, s3) == cudaSuccess && y != x,
          "a request on s3 while b's work runs: not x");
    fake_complete(wb);
    CHECK(defer_flush() == cudaSuccess, "flush: every piece's work done");
    CHECK(alloc_checked(&z, 2 * MiB, s3) == cudaSuccess && z == x,
          "then x goes to s3 (z %p)", z);
    CHECK(defer_free(y, s3) == cudaSuccess && defer_free(z, s3) == cudaSuccess,
          "freed");
    CHECK(defer_flush() == cudaSuccess, "flush");
    cudaEventDestroy(after_alloc);
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    cudaStreamDestroy(s3);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a merged block with a piece pending, used on another stream "
                  "after a wait, reaches a third only once all is done",
                  "", 1, 20000, scenario_merged_piece_then_other_stream);
    return 0;
}
