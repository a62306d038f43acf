/* SPDX-License-Identifier: MIT */
/* A block of defer_alloc's whose release fails, at a trim (an error of
 * the block's alone, and a sticky one that fails the device) and at the
 * cache's expiry, each scenario in a fresh process: include/cudefer.h
 * counts it in cache_release_failures, of the process and of its device,
 * never in cache_releases nor in failed (its entry ended released when
 * the block went back to the cache), and its memory stays allocated.  A
 * release that works after a failed one counts in cache_releases only; a
 * block whose cudaFreeAsync fails (not sticky) goes with cudaFree. */
#include <stdio.h>
#include <string.h>

#include "helpers.h"

#define MiB ((size_t)1 << 20)

/* The counters a scenario compares before and after a release. */
struct counts {
    uint64_t releases, failures, failed, device_releases, device_failures;
};

static struct counts counts_now(void)
{
    struct defer_stats s = stats_now();
    struct defer_device_stats d;
    CHECK(defer_device_stats_get(0, &d) == cudaSuccess, "device 0's stats");
    return (struct counts){s.cache_releases, s.cache_release_failures,
                           s.failed, d.cache_releases,
                           d.cache_release_failures};
}

/* Since before: releases more blocks released and failures more whose
 * release failed, in the process's counters and in device 0's alike, and
 * no entry counted failed (what names the step on failure). */
static void expect_counts(const struct counts *before, uint64_t releases,
                          uint64_t failures, const char *what)
{
    struct counts now = counts_now();
    CHECK(now.releases == before->releases + releases &&
              now.device_releases == before->device_releases + releases,
          "%s: cache_releases %llu -> %llu (device 0: %llu -> %llu), want "
          "%llu more", what, ULL(before->releases), ULL(now.releases),
          ULL(before->device_releases), ULL(now.device_releases),
          ULL(releases));
    CHECK(now.failures == before->failures + failures &&
              now.device_failures == before->device_failures + failures,
          "%s: cache_release_failures %llu -> %llu (device 0: %llu -> "
          "%llu), want %llu more", what, ULL(before->failures),
          ULL(now.failures), ULL(before->device_failures),
          ULL(now.device_failures), ULL(failures));
    CHECK(now.failed == before->failed, "%s: failed %llu -> %llu (entries "
          "only: the block's was released)", what, ULL(before->failed),
          ULL(now.failed));
}

/* A FREE block of the pool, its free's work done. */
static void *free_block(cudaStream_t s)
{
    void *p = NULL;
    CHECK(alloc_checked(&p, MiB, s) == cudaSuccess, "a block");
    CHECK(defer_free(p, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "freed: FREE in the cache");
    return p;
}

/* defer_trim with the next cudaFreeAsync failing with fail, and the next
 * cudaFree too when free_fails; *said (said may be NULL): what it said on
 * stderr. */
static cudaError_t trim_failing(cudaError_t fail, bool free_fails,
                                const char **said)
{
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, fail, 0, 1);
    if (free_fails)
        fake_fail(FAKE_FREE, fail, 0, 1);
    cudaError_t err = defer_trim(NULL);
    const char *text = stderr_capture_end();
    fake_fail_clear();
    if (said != NULL)
        *said = text;
    return err;
}

/* A trim whose cudaFreeAsync of a FREE block fails for that block alone:
 * the block goes with cudaFree instead (it has left the cache: nothing
 * else would release it), said, and counts as released. */
static void trim_falls_back(void)
{
    cudaStream_t s = stream_new();
    void *p = free_block(s);
    struct counts before = counts_now();
    unsigned long frees = fake_calls(FAKE_FREE);
    const char *said;
    cudaError_t err = trim_failing(cudaErrorInvalidValue, false, &said);
    CHECK(err == cudaSuccess, "defer_trim: %s (not sticky)",
          cudaGetErrorName(err));
    CHECK(has_line(said, "cudaFreeAsync failed", "goes back with cudaFree",
                   NULL),
          "said (stderr: \"%s\")", said);
    CHECK(fake_calls(FAKE_FREE) - frees == 1, "one cudaFree (%lu)",
          fake_calls(FAKE_FREE) - frees);
    expect_counts(&before, 1, 0, "a release by cudaFree");
    CHECK(fake_allocation_of(p, NULL, NULL) == 0, "its memory went");
    cudaStreamDestroy(s);
}

/* A trim whose cudaFreeAsync and then cudaFree of a FREE block fail for
 * that block alone: one failure, said; the next trim releases the next
 * block, one release. */
static void trim_fails(void)
{
    cudaStream_t s = stream_new();
    void *p = free_block(s);
    struct counts before = counts_now();
    const char *said;
    cudaError_t err = trim_failing(cudaErrorInvalidValue, true, &said);
    CHECK(err == cudaSuccess, "defer_trim: %s (not sticky)",
          cudaGetErrorName(err));
    CHECK(has_line(said, "cudaFree failed", "not released", NULL),
          "said (stderr: \"%s\")", said);
    expect_counts(&before, 0, 1, "a failed release");
    CHECK(fake_allocation_of(p, NULL, NULL) == 1, "its memory stays");

    void *q = free_block(s);
    before = counts_now();
    CHECK(defer_trim(NULL) == cudaSuccess, "a trim that works");
    expect_counts(&before, 1, 0, "a release after the failed one");
    CHECK(fake_allocation_of(q, NULL, NULL) == 0, "its memory went");
    cudaFree(p); /* the test's now: the oracle's count of live memory */
    cudaStreamDestroy(s);
}

/* A trim whose cudaFreeAsync of a FREE block fails with a sticky error:
 * the device fails, the block counts as a failed release, and no cudaFree
 * is tried (it would meet the same error). */
static void trim_fails_sticky(void)
{
    cudaStream_t s = stream_new();
    void *p = free_block(s);
    struct counts before = counts_now();
    unsigned long frees = fake_calls(FAKE_FREE);
    cudaError_t err = trim_failing(cudaErrorLaunchFailure, false, NULL);
    CHECK(err == cudaErrorLaunchFailure, "defer_trim: %s, want the sticky "
          "error", cudaGetErrorName(err));
    CHECK(fake_calls(FAKE_FREE) == frees, "no cudaFree after a sticky "
          "error (%lu)", fake_calls(FAKE_FREE) - frees);
    expect_counts(&before, 0, 1, "a sticky failed release");
    CHECK(fake_allocation_of(p, NULL, NULL) == 1, "its memory stays");
}

/* A block expires (CUDEFER_CACHE_KEEP_MS=1) and its cudaFreeAsync fails,
 * and its cudaFree too when free_fails.  Its free waits for held work, so
 * the failures are armed before the block can turn FREE, let alone
 * expire; the reclaimer's expiry is then waited for, 10 s at most. */
static void expiry_failing(bool free_fails)
{
    cudaStream_t s = stream_new();
    void *p = NULL;
    CHECK(alloc_checked(&p, MiB, s) == cudaSuccess, "a block");
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "freed behind held work");
    struct counts before = counts_now();
    unsigned long frees = fake_calls(FAKE_FREE_ASYNC);
    stderr_capture_begin();
    fake_fail(FAKE_FREE_ASYNC, cudaErrorInvalidValue, 0, 1);
    if (free_fails)
        fake_fail(FAKE_FREE, cudaErrorInvalidValue, 0, 1);
    fake_complete(w);
    for (double until = now_ms() + 10000;
         counts_now().failures == before.failures &&
         counts_now().releases == before.releases && now_ms() < until;)
        sleep_ms(1);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    CHECK(fake_calls(FAKE_FREE_ASYNC) - frees == 1,
          "the expiry made one cudaFreeAsync (%lu)",
          fake_calls(FAKE_FREE_ASYNC) - frees);
    if (free_fails) {
        CHECK(has_line(said, "cudaFree failed", "not released", NULL),
              "said (stderr: \"%s\")", said);
        expect_counts(&before, 0, 1, "a failed release at expiry");
        CHECK(fake_allocation_of(p, NULL, NULL) == 1, "its memory stays");
        cudaFree(p);
    } else {
        CHECK(has_line(said, "cudaFreeAsync failed",
                       "goes back with cudaFree", NULL),
              "said (stderr: \"%s\")", said);
        expect_counts(&before, 1, 0, "a release by cudaFree at expiry");
        CHECK(fake_allocation_of(p, NULL, NULL) == 0, "its memory went");
    }
    cudaStreamDestroy(s);
}

static void expiry_falls_back(void)
{
    expiry_failing(false);
}

static void expiry_fails(void)
{
    expiry_failing(true);
}

int main(void)
{
    plan_lazy();
    fork_scenario("a trim's block whose cudaFreeAsync fails goes with "
                  "cudaFree, counted in cache_releases", "", 1, 20000,
                  trim_falls_back);
    fork_scenario("a trim's failed release of a block counts in "
                  "cache_release_failures, not cache_releases", "", 1, 20000,
                  trim_fails);
    fork_scenario("a trim's sticky failed release of a block counts in "
                  "cache_release_failures", "", 1, 20000, trim_fails_sticky);
    fork_scenario("an expired block whose cudaFreeAsync fails goes with "
                  "cudaFree", "CUDEFER_CACHE_KEEP_MS=1", 1, 20000,
                  expiry_falls_back);
    fork_scenario("an expired block's failed release counts in "
                  "cache_release_failures", "CUDEFER_CACHE_KEEP_MS=1", 1,
                  20000, expiry_fails);
    return 0;
}
