/* SPDX-License-Identifier: MIT */
/* Bugs the stress test found (t/stress, then with --double-free-every-path,
 * now its default), each in its smallest form; every test here fails
 * without the rules it pins (a block is FREEING from the moment any free
 * accepts it; defer_flush returns only a device's error).  t/alloc.c
 * tests every pair of free paths.
 *
 * 1. A block of defer_alloc's freed a second time is refused (the header:
 *    "a block freed twice is refused and reported") only when its first
 *    free was a stream-ordered defer_free.  After a free that waits for
 *    more (a block recorded on another stream, a free on another device's
 *    stream, defer_free_streams, defer_free_n of several pointers) the
 *    block stays LIVE until the reclaimer adopts it, so a second defer_free
 *    is accepted, and so is defer_record_stream.  The second entry makes
 *    the block FREE again when its event completes, by then possibly
 *    another owner's: that owner's block is handed out while its work
 *    still runs (the oracle sees the premature reuse).  A second free on
 *    a stream of the block's device is even parked at once (stream-
 *    ordered) while the first free's work may still use the block.
 * 2. defer_flush returns cudaErrorInvalidValue when an entry it waited for
 *    failed its release (a host pointer given to defer_free), though the
 *    header says it returns cudaSuccess, cudaErrorNotPermitted or a
 *    device's sticky error: any thread's flush fails for another thread's
 *    bad pointer.  (Or the header should say so.)
 * 3. An interior pointer given to defer_free (seed 423, before t/stress
 *    avoided such pointers) where a block is cut later: the release looked
 *    the pointer up again and took that block, another owner's, still
 *    being freed (FREEING, its own free waiting for its work), for its
 *    own: FREE early, handed to another stream while its work ran.  Fixed
 *    when each entry carries the block its free claimed (or none) to the
 *    release; CUDEFER_CHECK, keyed by address, dropped the owner's free as
 *    a second free of the interior pointer (the block stayed claimed for
 *    good) until claimed pointers were left out of its set.  Since then an interior pointer of defer_alloc's
 *    memory is refused at the call: the scenario checks that too.
 */
#include <string.h>

#include "helpers.h"

static cudaStream_t s, side, dev1, dev1b;

/* A block freed one way (way: recorded on another stream, on another
 * device's stream, defer_free_streams, defer_free_n of two), work held on
 * the free's streams keeping the free from completing, then freed again
 * with defer_free: refused, as the header promises. */
static void twice(const char *how, int way)
{
    void *p = NULL, *q = NULL;
    alloc_checked(&p, 4096, s);
    fake_work *held = work_held(s, p), *held1 = work_held(dev1, NULL);
    stderr_capture_begin();
    if (way == 0) { /* recorded on another stream */
        work_timed(side, 10, p);
        defer_record_stream(p, side);
        defer_free(p, s);
    } else if (way == 1) { /* another device's stream */
        defer_free(p, dev1);
    } else if (way == 2) {
        defer_free_streams(p, &s, 1);
    } else { /* defer_free_n of several */
        alloc_checked(&q, 4096, s);
        void *two[2] = {p, q};
        defer_free_n(two, 2, s);
    }
    cudaError_t err = defer_free(p, s);
    stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "a second defer_free after a free %s "
           "is refused", how);
    fake_complete(held);
    fake_complete(held1);
    defer_flush();
}

/* After a free that waits for a recorded stream, the block is no live
 * block: defer_record_stream must refuse it. */
static void record_after_free(void)
{
    void *p = NULL;
    alloc_checked(&p, 4096, s);
    fake_work *held = work_held(s, p);
    work_timed(side, 10, p);
    defer_record_stream(p, side);
    defer_free(p, s);
    stderr_capture_begin();
    cudaError_t err = defer_record_stream(p, side);
    stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "defer_record_stream of a block "
           "already freed (waiting for a recorded stream) is refused");
    fake_complete(held);
    defer_flush();
}

/* Wait (10 s at most) until the cache's free bytes are by above before:
 * the reclaimer saw a freed block's work done, however late it ran (the
 * search loops below try only 64 times). */
static void wait_cache_free_grows(uint64_t before, uint64_t by)
{
    for (int i = 0; i < 10000 && stats_now().cache_free_bytes < before + by;
         i++)
        sleep_ms(1);
}

/* The harm: the second free of a double free lands on the block's next
 * owner, whose block another stream then gets while its work runs.  Both
 * frees are on streams of device 1 (the block is device 0's), behind held
 * work: the first completes, the block goes to a new owner on s2, then the
 * second completes. */
static void innocent_owner(void)
{
    cudaStream_t s2 = stream_new();
    void *p = NULL, *q = NULL, *r = NULL;
    alloc_checked(&p, 8192, s);
    fake_work *first = work_held(dev1, NULL), *late = work_held(dev1b, NULL);
    defer_free(p, dev1);                      /* the free */
    stderr_capture_begin();
    defer_free(p, dev1b);                     /* the mistake */
    stderr_capture_end();
    uint64_t free_bytes = stats_now().cache_free_bytes;
    fake_complete(first);
    wait_cache_free_grows(free_bytes, 8192);
    /* The other blocks s2 gets before p stay live, so that no other block
     * of the size is free for the request on s below. */
    void *taken[64];
    size_t n = 0;
    while (alloc_checked(&q, 8192, s2) == cudaSuccess && q != p && n < 64) {
        taken[n++] = q;
        sleep_ms(1);
    }
    fake_work *use = work_held(s2, q);
    fake_complete(late);
    defer_flush();
    alloc_checked(&r, 8192, s);
    ok(q == p && r != q, "a block freed twice is not handed to another "
       "stream while its next owner's work runs");
    fake_complete(use);
    defer_free(q, s2);
    defer_free(r, s);
    for (size_t i = 0; i < n; i++)
        defer_free(taken[i], s2);
    defer_flush();
    cudaStreamDestroy(s2);
}

/* Bug 3: an interior pointer inside block p, given to defer_free behind
 * held work (alone, or with defer_free_n beside a plain allocation): it is
 * refused at the call now (nothing deferred, the plain pointer neither);
 * p is freed and a 1 MiB block q is cut at that very address for another
 * owner, who frees it with defer_free_streams behind work of its own
 * (FREEING until then): q must not be handed out again while its owner's
 * work runs, and its release succeeds. */
static void interior_then_cut(bool with_free_n)
{
    const size_t MiB = (size_t)1 << 20;
    cudaStream_t s2 = stream_new(), s3 = stream_new(), s4 = stream_new();
    char *p = NULL;
    void *q = NULL, *r = NULL, *plain = device_alloc(4096);
    alloc_checked((void **)&p, 4 * MiB, s);
    char *inside = p + 3 * MiB; /* where a 1 MiB piece is cut from p */
    fake_work *interior_work = work_held(s3, NULL);
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    void *two[2] = {inside, plain};
    cudaError_t err = with_free_n ? defer_free_n(two, 2, s3)
                                  : defer_free(inside, s3); /* the mistake */
    const char *said = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "%s of an interior pointer is refused",
           with_free_n ? "defer_free_n" : "defer_free");
    ok(strstr(said, "points inside a live block") != NULL,
       "reported as an interior pointer");
    ok(stats_now().rejected == before.rejected + 1 &&
           stats_now().deferred == before.deferred,
       "counted as rejected, nothing deferred");
    defer_free(p, s);
    /* p's work is done (it had none): FREE once the reclaimer saw so,
     * which a flush waits for (the cache's free bytes growing by 4 MiB,
     * waited for before, could be other blocks': TSan under load once
     * cut no block at inside in 64 tries).  Blocks s2 gets before are
     * kept live until the end, so that no other 1 MiB block is cached for
     * the requests below. */
    is_int(defer_flush(), cudaSuccess, "p is back in the cache");
    void *taken[64];
    size_t n = 0;
    while (alloc_checked(&q, MiB, s2) == cudaSuccess && q != inside &&
           n < 64) {
        taken[n++] = q;
        sleep_ms(1);
    }
    ok(q == inside, "a 1 MiB block is cut from p at the interior address");
    fake_work *owner_work = work_held(s2, q);
    is_int(defer_free_streams(q, &s2, 1), cudaSuccess,
           "its owner frees it behind its work (FREEING until done)");
    fake_complete(interior_work);
    alloc_checked(&r, MiB, s4);
    ok(r != q, "the owner's block is not handed to another stream while its "
               "work runs");
    is_int(fake_violations(), 0, "the oracle saw no premature reuse");
    fake_complete(owner_work);
    defer_flush();
    is_int((int)(stats_now().failed - before.failed), 0,
           "no release failed: the owner's succeeds (CUDEFER_CHECK)");
    defer_free(r, s4);
    for (size_t i = 0; i < n; i++)
        defer_free(taken[i], s2);
    defer_flush();
    is_int(fake_is_released(plain), 0, "the plain pointer was not deferred");
    cudaFree(plain);
    cudaStreamDestroy(s2);
    cudaStreamDestroy(s3);
    cudaStreamDestroy(s4);
}

static void flush_after_failed_release(void)
{
    void *h = host_alloc(4096);
    work_timed(s, 10, h);
    stderr_capture_begin();
    defer_free(h, s); /* the wrong call: its release fails, reported */
    cudaError_t err = defer_flush();
    stderr_capture_end();
    is_int(err, cudaSuccess, "defer_flush returns cudaSuccess when a release "
           "failed that was no device's sticky error");
    cudaFreeHost(h);
}

int main(void)
{
    plan_lazy();
    /* Every check on: CUDEFER_CHECK must not take a block cut at a pending
     * interior pointer's address for a second free of it (bug 3). */
    set_cudefer_env("CUDEFER_CHECK=1");
    fake_reset(2);
    cudaSetDevice(1);
    dev1 = stream_new();
    dev1b = stream_new();
    cudaSetDevice(0);
    s = stream_new();
    side = stream_new();
    twice("waiting for a recorded stream", 0);
    twice("on another device's stream", 1);
    twice("with defer_free_streams", 2);
    twice("with defer_free_n of two blocks", 3);
    record_after_free();
    innocent_owner();
    flush_after_failed_release();
    interior_then_cut(false);
    interior_then_cut(true);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    return 0;
}
