/* SPDX-License-Identifier: MIT */
/* Out of host memory where cudefer files what a call already accepted,
 * which it can no longer refuse: the reclaimer, armed the way the sweep
 * (t/host_alloc_sweep.h) arms a calling thread, by a defer_call that runs
 * on it: out of memory for a stream's FIFO it waits for the entry with
 * cudaEventSynchronize, the one call t/faults cannot reach, and a failure
 * of that wait fails the device; a new block of defer_alloc's whose record
 * cannot be allocated is plain memory; a claim that finds no room in its
 * free batch is counted as failed.  Whatever fails, shutdown releases
 * every pointer, nothing stays pending, and the oracle sees nothing
 * released early.  The calls that refuse: t/host_alloc_calls.c.
 *
 * Skipped under ASan and TSan (the allocator is replaced). */
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "cudefer.h"
#include "fake_cuda.h"
#include "free_batch.h"
#include "helpers.h"
#include "host_alloc_sweep.h"
#include "tap.h"

#ifndef UNDER_SANITIZER
/* Callbacks that arm and disarm the thread they run on: the reclaimer. */
static void arm_reclaimer(void *n)
{
    seen = 0;
    fail_at = *(const long *)n;
    armed = true;
}

static void set_flag(void *flag)
{
    *(int *)flag = 1;
}

static void disarm_reclaimer(void *unused)
{
    (void)unused;
    armed = false;
    *reached = seen > fail_at;
}

/* The reclaimer out of host memory: its fail_at-th allocation from the
 * arming fails while it takes entries of a stream it has not seen (each
 * kind needs a FIFO there: memory, a block, a callback) and of s, a
 * group on both, a block used on both and a trim, then releases them.  Whatever fails, nothing is released before its work is
 * done (the oracle), each entry is released or run by the flush, and
 * shutdown leaves nothing the reclaimer allocated meanwhile.  An entry
 * the reclaimer cannot file is waited for at once (cudaEventSynchronize),
 * said in one line. */
static cudaError_t reclaimer_out_of_memory(long n, void **mine, int *nmine)
{
    static long at;
    static int ran;
    at = n;
    ran = 0;
    void *p = device_alloc(1 << 20), *q = NULL, *r = device_alloc(4096);
    mine[(*nmine)++] = p;
    mine[(*nmine)++] = r;
    stderr_capture_begin();
    CHECK(defer_call(arm_reclaimer, &at, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "the reclaimer armed");
    CHECK(defer_alloc(&q, 2 << 20, s2) == cudaSuccess, "a block on s2");
    mine[(*nmine)++] = q;
    fake_launch(s2, 2000, &p, 1);
    CHECK(defer_free(p, s2) == cudaSuccess, "a free behind work on s2");
    CHECK(defer_free(q, s2) == cudaSuccess, "the block's free on s2");
    CHECK(defer_call(set_flag, &ran, s2) == cudaSuccess, "a callback on s2");
    CHECK(defer_free(r, s) == cudaSuccess, "a free on s");
    /* A group (members on both streams) and a block used on two streams. */
    void *g = device_alloc(1 << 20), *b = NULL;
    mine[(*nmine)++] = g;
    cudaStream_t both[2] = {s2, s};
    CHECK(defer_free_streams(g, both, 2) == cudaSuccess, "a group's free");
    CHECK(defer_alloc(&b, 1 << 20, s) == cudaSuccess &&
              defer_record_stream(b, s2) == cudaSuccess,
          "a block also used on s2");
    mine[(*nmine)++] = b;
    CHECK(defer_free(b, s) == cudaSuccess, "its free");
    size_t trimmed = 0;
    CHECK(defer_trim(&trimmed) == cudaSuccess, "a trim");
    cudaError_t err = defer_flush();
    CHECK(defer_call(disarm_reclaimer, NULL, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "the reclaimer disarmed");
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "the flush: %s (stderr: \"%s\")",
          cudaGetErrorName(err), said);
    CHECK(fake_is_released(p) && fake_is_released(r) && fake_is_released(g),
          "the frees released by the flush");
    CHECK(ran, "the callback ran by the flush");
    return err;
}

/* The reclaimer out of memory for a FIFO, and the cudaEventSynchronize it
 * then waits with failing (a non-sticky error, as a query's would be): the
 * device fails as when a query fails, said in one line naming the call,
 * the flush returns the error, and the frees on it are counted failed,
 * never released.  Two frees on streams the reclaimer has not seen: the
 * first may take the FIFO the arming callback left spare, the second needs
 * a new one.  In a child; exits with the checks' verdict. */
static void reclaimer_sync_fails_child(void)
{
    failed_checks = 0;
    fake_reset(1);
    s = stream_new();
    s2 = stream_new();
    cudaStream_t s3 = stream_new();
    static long at = 0;
    void *p[2] = {device_alloc(1 << 20), device_alloc(1 << 20)};
    /* Held, not timed: work done before the reclaimer looks (a stall of a
     * few ms under load) needs no cudaEventSynchronize. */
    fake_work *w[2] = {fake_launch_held(s2, &p[0], 1),
                       fake_launch_held(s3, &p[1], 1)};
    stderr_capture_begin();
    CHECK(defer_call(arm_reclaimer, &at, s) == cudaSuccess &&
              defer_flush() == cudaSuccess,
          "the reclaimer armed");
    fake_fail(FAKE_EVENT_SYNCHRONIZE, cudaErrorInvalidResourceHandle, 0, 1);
    unsigned long long failed = stats_now().failed;
    CHECK(defer_free(p[0], s2) == cudaSuccess &&
              defer_free(p[1], s3) == cudaSuccess,
          "frees behind work on two new streams");
    cudaError_t err = defer_flush();
    const char *said = stderr_capture_end();
    CHECK(fake_calls(FAKE_EVENT_SYNCHRONIZE) == 1,
          "the reclaimer waited with cudaEventSynchronize (%lu calls)",
          fake_calls(FAKE_EVENT_SYNCHRONIZE));
    CHECK(err == cudaErrorInvalidResourceHandle, "the flush: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "device 0", "cudaEventSynchronize", NULL),
          "said, naming the device and the call (stderr: \"%s\")", said);
    CHECK(stats_now().failed - failed == 2, "both frees counted failed (%llu)",
          stats_now().failed - failed);
    CHECK(!fake_is_released(p[0]) && !fake_is_released(p[1]),
          "and never released");
    fake_complete(w[0]);
    fake_complete(w[1]);
    stderr_capture_begin();
    defer_shutdown();
    stderr_capture_end();
    scenario_child_end();
}

/* A return hook: after a failed call, the calling thread's next
 * allocation fails. */
static void arm_next(enum fake_call c, cudaError_t r, void *unused)
{
    (void)c;
    (void)unused;
    if (r == cudaSuccess)
        return;
    seen = 0;
    fail_at = 0;
    armed = true;
}

/* Blocks freed on the legacy stream whose claims find no room in their
 * free batch (out of host memory) stay pending in the cache, never
 * released, said: counted as failed then, so that pending reads 0 after
 * shutdown, not pending for good.  lost_in_add:
 * the free's own claim, while another thread's capture bars the legacy
 * stream (no event may be recorded there); else claims a seal gives back
 * to the batch when it can neither record nor wait for the stream.  In a
 * child; exits with the checks' verdict. */
static void lost_claims_child(bool lost_in_add)
{
    failed_checks = 0;
    set_cudefer_env("CUDEFER_FREE_BATCH=4 CUDEFER_IDLE_US=1000");
    fake_reset(1);
    /* Sealed on demand only: a slow run must not seal the two claims for
     * their age before the failures are armed. */
    free_batch_set_age_ns(UINT64_MAX);
    void *q[3];
    for (int i = 0; i < 3; i++)
        CHECK(defer_alloc(&q[i], (size_t)(i + 1) << 20, NULL) == cudaSuccess,
              "block %d", i);
    CHECK(defer_free(q[0], NULL) == cudaSuccess && defer_flush() ==
              cudaSuccess, "a batch sealed: the next claim needs room");
    stderr_capture_begin();
    cudaError_t err;
    if (lost_in_add) {
        fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorStreamCaptureImplicit,
                  0, -1);
        seen = 0;
        fail_at = 0; /* the batch's room for the claim */
        armed = true;
        err = defer_free(q[1], NULL);
        armed = false;
    } else {
        CHECK(defer_free(q[1], NULL) == cudaSuccess &&
                  defer_free(q[2], NULL) == cudaSuccess,
              "two claims wait");
        fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
        fake_fail(FAKE_STREAM_SYNCHRONIZE, cudaErrorLaunchOutOfResources, 0,
                  1);
        fake_set_return_hook(FAKE_STREAM_SYNCHRONIZE, arm_next, NULL);
        err = defer_flush(); /* its seal gives the two claims back */
        armed = false;
        fake_set_return_hook(FAKE_STREAM_SYNCHRONIZE, NULL, NULL);
    }
    fake_fail_clear();
    uint64_t failed = stats_now().failed;
    cudaError_t down = defer_shutdown();
    const char *said = stderr_capture_end();
    CHECK(strstr(said, "out of memory for") != NULL,
          "a claim was lost for want of memory, said (stderr: \"%s\")",
          said);
    CHECK(down == cudaSuccess, "shutdown: %s (the free: %s)",
          cudaGetErrorName(down), cudaGetErrorName(err));
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.failed >= 1 && failed >= 1,
          "the lost claim counted as failed, nothing pending (pending %llu, "
          "failed %llu, before shutdown %llu)", ULL(st.pending),
          ULL(st.failed), ULL(failed));
    scenario_child_end();
}

/* A return hook: after a successful call, the calling thread's next
 * allocation fails. */
static void arm_after_success(enum fake_call c, cudaError_t r, void *unused)
{
    (void)c;
    (void)unused;
    if (r != cudaSuccess)
        return;
    seen = 0;
    fail_at = 0;
    armed = true;
}

/* A new block of defer_alloc's that cannot be filed (out of host memory
 * for its record) is plain memory, as if the application had allocated
 * it: released when freed, never reused, in neither cache_bytes nor
 * cache_releases.  So it is no new block either: the counters agree, allocs
 * less reused is cache_mallocs, and once everything is released
 * cache_mallocs is cache_releases (were cache_mallocs to count it, 2
 * against 1 and 1, PyTorch's segment count under cudefer.torch,
 * cache_mallocs less cache_releases, would stay 1 for good).  In a child;
 * exits with the checks' verdict. */
static void unfiled_block_child(void)
{
    failed_checks = 0;
    fake_reset(1);
    s = stream_new();
    void *p = NULL, *q = NULL;
    CHECK(defer_alloc(&p, 1 << 20, s) == cudaSuccess, "a block");
    enum fake_call c = fake_calls(FAKE_MALLOC_ASYNC) > 0 ? FAKE_MALLOC_ASYNC
                                                          : FAKE_MALLOC;
    stderr_capture_begin();
    fake_set_return_hook(c, arm_after_success, NULL);
    cudaError_t err = defer_alloc(&q, 4 << 20, s);
    fake_set_return_hook(c, NULL, NULL);
    armed = false;
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess && q != NULL, "the second defer_alloc: %s",
          cudaGetErrorName(err));
    CHECK(strstr(said, "out of memory for the record of") != NULL,
          "its block could not be filed, said (stderr: \"%s\")", said);
    struct defer_device_stats d;
    CHECK(defer_device_stats_get(0, &d) == cudaSuccess, "device stats");
    CHECK(d.allocs - d.reused == d.cache_mallocs,
          "allocs %llu less reused %llu is cache_mallocs %llu",
          ULL(d.allocs), ULL(d.reused), ULL(d.cache_mallocs));
    CHECK(defer_free(p, s) == cudaSuccess && defer_free(q, s) == cudaSuccess,
          "both freed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_is_released(p) && fake_is_released(q), "both released");
    struct defer_stats st = stats_now();
    CHECK(st.cache_mallocs == st.cache_releases && st.cache_bytes == 0,
          "cache_mallocs %llu, cache_releases %llu, cache_bytes %llu",
          ULL(st.cache_mallocs), ULL(st.cache_releases), ULL(st.cache_bytes));
    scenario_child_end();
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_IDLE_US=1000");
    reached = mmap(NULL, sizeof *reached, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (reached == MAP_FAILED)
        bail("mmap");
    static const struct sweep reclaimer = {
        "the reclaimer's own allocations", reclaimer_out_of_memory};
    sweep(&reclaimer);
    pid_t pid = fork_flushed();
    if (pid == 0)
        reclaimer_sync_fails_child();
    int status;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "the reclaimer out of memory, its cudaEventSynchronize failing: the "
       "device fails, said in one line; the flush returns the error");
    pid = fork_flushed();
    if (pid == 0)
        unfiled_block_child();
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a new block that cannot be filed is plain memory: no new block in "
       "the counters");
    for (int add = 1; add >= 0; add--) {
        pid = fork_flushed();
        if (pid == 0)
            lost_claims_child(add);
        ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
               WEXITSTATUS(status) == 0,
           "a claim that finds no room in its free batch %s: counted as "
           "failed, nothing pending", add ? "while the legacy stream is "
           "barred" : "when a seal gives it back");
    }
    return 0;
}
#else
int main(void)
{
    skip_all("the allocator is replaced here, which a sanitizer's clashes "
             "with");
    return 0;
}
#endif
