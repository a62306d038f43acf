/* SPDX-License-Identifier: MIT */
/* The identities include/cudefer.h states for struct defer_stats and
 * struct defer_device_stats, checked once the program is quiet after a mix
 * of calls: plain frees (one pointer, several), defer_alloc's blocks freed
 * on a stream of their own and on the legacy stream (a free batch), singly
 * and several in one call, a callback, a pinned host free, a refused call,
 * a device that fails with its frees pending, and a trim.  Once quiet:
 * deferred = released + failed + pending with pending 0, nothing held,
 * the median latency no more than the largest, and the cache counters the
 * sums over the devices. */
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

#define KiB ((size_t)1024)

#define WAIT_UNTIL(cond, ms)                                                   \
    for (unsigned wait_ = 0; !(cond) && wait_ < (unsigned)(ms); wait_++)       \
    sleep_ms(1)

static void callback(void *arg)
{
    (void)arg;
}

/* Since before: n calls refused, each counted in rejected and none in
 * deferred (what names them on failure). */
static void check_refused(const struct defer_stats *before, uint64_t n,
                          const char *what)
{
    struct defer_stats now = stats_now();
    CHECK(now.rejected == before->rejected + n &&
              now.deferred == before->deferred,
          "%s: rejected %llu -> %llu, deferred %llu -> %llu", what,
          ULL(before->rejected), ULL(now.rejected), ULL(before->deferred),
          ULL(now.deferred));
}

/* The identities of a quiet program: the numbers said on failure. */
static void check_quiet(const char *step)
{
    CHECK(wait_stats_settled(5000), "%s: the statistics settle", step);
    struct defer_stats s = stats_now();
    CHECK(s.deferred == s.released + s.failed + s.pending,
          "%s: deferred %llu = released %llu + failed %llu + pending %llu",
          step, ULL(s.deferred), ULL(s.released), ULL(s.failed),
          ULL(s.pending));
    CHECK(s.pending == 0, "%s: nothing pending (%llu)", step,
          ULL(s.pending));
    CHECK(s.held == 0 && s.held_bytes == 0, "%s: nothing held (%llu, %llu)",
          step, ULL(s.held), ULL(s.held_bytes));
    CHECK(s.latency_p50_us <= s.latency_max_us,
          "%s: latency_p50_us %llu <= latency_max_us %llu", step,
          ULL(s.latency_p50_us), ULL(s.latency_max_us));
    uint64_t bytes = 0, free_bytes = 0, mallocs = 0, releases = 0,
             reused = 0, failures = 0;
    for (int d = 0; d < 2; d++) {
        struct defer_device_stats ds;
        CHECK(defer_device_stats_get(d, &ds) == cudaSuccess, "device %d", d);
        bytes += ds.cache_bytes;
        free_bytes += ds.cache_free_bytes;
        mallocs += ds.cache_mallocs;
        releases += ds.cache_releases;
        reused += ds.reused;
        failures += ds.cache_release_failures;
        CHECK(ds.reused <= ds.allocs && ds.live_bytes <= ds.cache_bytes &&
                  ds.cache_bytes <= ds.cache_bytes_peak &&
                  ds.live_bytes <= ds.live_bytes_peak &&
                  ds.held_bytes <= ds.held_bytes_peak,
              "%s: device %d's fields agree with each other", step, d);
    }
    CHECK(s.cache_bytes == bytes && s.cache_free_bytes == free_bytes &&
              s.cache_mallocs == mallocs && s.cache_releases == releases &&
              s.reused == reused && s.cache_release_failures == failures,
          "%s: the cache counters are the sums over the devices", step);
    CHECK(s.reused_same_stream <= s.reused, "%s: reused_same_stream %llu "
          "<= reused %llu", step, ULL(s.reused_same_stream), ULL(s.reused));
}

static void scenario_identities(void)
{
    struct defer_stats before = stats_now();
    cudaStream_t s = stream_new();
    /* One plain free, then three in one call. */
    void *p = device_alloc(KiB);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    void *q[3] = {device_alloc(KiB), device_alloc(KiB), device_alloc(KiB)};
    CHECK(defer_free_n(q, 3, s) == cudaSuccess, "defer_free_n of 3");
    fake_complete(w);
    /* defer_alloc's blocks: one freed alone, two in one call, on s. */
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK(alloc_checked(&a, KiB, s) == cudaSuccess &&
              alloc_checked(&b, KiB, s) == cudaSuccess &&
              alloc_checked(&c, KiB, s) == cudaSuccess,
          "three blocks");
    CHECK(defer_free(a, s) == cudaSuccess, "a block freed alone");
    void *bc[2] = {b, c};
    CHECK(defer_free_n(bc, 2, s) == cudaSuccess, "two blocks in one call");
    /* Blocks freed on the legacy stream: a free batch. */
    void *l[4];
    for (int i = 0; i < 4; i++) {
        CHECK(alloc_checked(&l[i], 2 * KiB, 0) == cudaSuccess, "block %d", i);
        CHECK(defer_free(l[i], 0) == cudaSuccess, "legacy free %d", i);
    }
    void *h = host_alloc(KiB);
    CHECK(defer_free_host(h, s) == cudaSuccess, "defer_free_host");
    CHECK(defer_call(callback, NULL, s) == cudaSuccess, "defer_call");
    /* A refused call counts in rejected, not in deferred. */
    struct defer_stats mid = stats_now();
    CHECK(defer_alloc(NULL, KiB, s) != cudaSuccess, "defer_alloc(NULL) "
          "refused");
    check_refused(&mid, 1, "refused");
    CHECK(defer_flush() == cudaSuccess, "flush");
    check_quiet("after the frees and a flush");
    size_t trimmed = 0;
    CHECK(defer_trim(&trimmed) == cudaSuccess, "trim");
    check_quiet("after a trim");
    struct defer_stats t = stats_now();
    CHECK(t.cache_free_bytes == 0, "trim left no free bytes (%llu)",
          ULL(t.cache_free_bytes));
    CHECK(t.deferred - before.deferred >= 4, "deferred counted");
    /* Device 1 fails with two frees pending there. */
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *x = device_alloc(KiB), *y = NULL;
    fake_work *w1 = work_held(s1, x);
    CHECK(alloc_checked(&y, KiB, s1) == cudaSuccess, "a block on device 1");
    CHECK(defer_free(x, s1) == cudaSuccess && defer_free(y, s1) ==
              cudaSuccess, "two frees on device 1");
    /* and one whose work is done, held by the policy (not eager) */
    cudaStream_t s1b = stream_new();
    CHECK(defer_free(device_alloc(KiB), s1b) == cudaSuccess, "a third");
    WAIT_UNTIL(stats_now().held == 1, 5000);
    bool holds = stats_now().held == 1;
    uint64_t failed0 = stats_now().failed;
    fake_fail(FAKE_EVENT_QUERY, cudaErrorIllegalAddress, 0, 1);
    WAIT_UNTIL(stats_now().failed >= failed0 + 2 + holds, 10000);
    fake_fail_clear();
    fake_complete(w1);
    CHECK(stats_now().failed == failed0 + 2 + holds, "all counted failed");
    struct defer_device_stats d1;
    defer_device_stats_get(1, &d1);
    CHECK(d1.held_bytes == 0, "device 1 holds nothing once failed (%llu)",
          ULL(d1.held_bytes));
    /* Each refusal counts once in rejected, never in deferred. */
    struct refusal {
        const char *what;
        cudaError_t err;
    } refusals[4];
    void *z = device_alloc(KiB), *nb = NULL;
    cudaStream_t none[1] = {s1};
    struct defer_stats r0 = stats_now();
    refusals[0] = (struct refusal){"defer_free on failed device 1",
                                   defer_free(z, s1)};
    refusals[1] = (struct refusal){"defer_alloc on failed device 1",
                                   defer_alloc(&nb, KiB, s1)};
    refusals[2] = (struct refusal){"defer_call on failed device 1",
                                   defer_call(callback, NULL, s1)};
    refusals[3] = (struct refusal){"defer_free_streams with n 0",
                                   defer_free_streams(z, none, 0)};
    for (int i = 0; i < 4; i++) {
        CHECK(refusals[i].err != cudaSuccess, "%s: refused", refusals[i].what);
    }
    check_refused(&r0, 4, "4 refusals");
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    defer_flush();
    check_quiet("after device 1 failed");
    defer_shutdown();
    check_quiet("after shutdown");
    struct defer_stats a0 = stats_now();
    void *after = device_alloc(KiB);
    CHECK(defer_free(after, s) == cudaErrorNotPermitted, "after shutdown");
    check_refused(&a0, 1, "after shutdown");
    cudaStreamDestroy(s);
}

/* The other paths: a free on several streams (a group), a block used on
 * a second stream, a block freed twice (refused), a host pointer given to
 * defer_free (its release fails), frees and a callback that get no event
 * (released on the caller's thread), a trim with held memory. */
static void scenario_more_paths(void)
{
    cudaStream_t s = stream_new(), s2 = stream_new();
    cudaStream_t both[2] = {s, s2};
    void *p = device_alloc(KiB);
    fake_work *w = work_held(s2, p);
    CHECK(defer_free_streams(p, both, 2) == cudaSuccess, "a group free");
    CHECK(defer_call_streams(callback, NULL, both, 2) == cudaSuccess,
          "a group callback");
    void *a = NULL;
    CHECK(alloc_checked(&a, KiB, s) == cudaSuccess, "a block");
    CHECK(defer_record_stream(a, s2) == cudaSuccess, "used on s2");
    CHECK(defer_free(a, s) == cudaSuccess, "freed");
    struct defer_stats mid = stats_now();
    CHECK(defer_free(a, s) == cudaErrorInvalidValue, "freed twice: refused");
    check_refused(&mid, 1, "the second free");
    static char host_buf[64];
    CHECK(defer_free(host_buf, s) == cudaSuccess, "a host pointer");
    fake_complete(w);
    /* No event to be had: each call waits for its stream. */
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    void *q = device_alloc(KiB), *b = NULL;
    uint64_t sync0 = stats_now().sync_releases;
    defer_free(q, s);
    defer_call(callback, NULL, s);
    if (alloc_checked(&b, KiB, s) == cudaSuccess)
        defer_free(b, s);
    fake_fail_clear();
    CHECK(defer_flush() == cudaSuccess, "flush");
    check_quiet("after frees with no event");
    CHECK(stats_now().sync_releases >= sync0 + 1, "sync_releases %llu -> "
          "%llu", ULL(sync0), ULL(stats_now().sync_releases));
    /* Held memory, then a trim. */
    void *h[3];
    for (int i = 0; i < 3; i++) {
        h[i] = device_alloc(KiB);
        CHECK(defer_free(h[i], s) == cudaSuccess, "held free %d", i);
    }
    WAIT_UNTIL(stats_now().held == 3, 5000);
    struct defer_device_stats d0;
    defer_device_stats_get(0, &d0);
    CHECK(d0.held_bytes == 3 * KiB && stats_now().held_bytes == 3 * KiB,
          "held 3 KiB: device %llu, process %llu", ULL(d0.held_bytes),
          ULL(stats_now().held_bytes));
    CHECK(defer_trim(NULL) == cudaSuccess, "trim");
    check_quiet("after a trim of held memory");
    defer_device_stats_get(0, &d0);
    CHECK(d0.held_bytes == 0 && d0.held_bytes_peak >= 3 * KiB,
          "device 0 holds 0 after the trim, peak %llu",
          ULL(d0.held_bytes_peak));
    CHECK(defer_device_stats_reset_peaks(0) == cudaSuccess, "reset");
    defer_device_stats_get(0, &d0);
    CHECK(d0.held_bytes_peak == 0 && d0.cache_bytes_peak == d0.cache_bytes &&
              d0.live_bytes_peak == d0.live_bytes,
          "after the reset each peak is its current value (held %llu, "
          "cache %llu/%llu, live %llu/%llu)", ULL(d0.held_bytes_peak),
          ULL(d0.cache_bytes_peak), ULL(d0.cache_bytes),
          ULL(d0.live_bytes_peak), ULL(d0.live_bytes));
    defer_shutdown();
    check_quiet("after shutdown");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
}

/* In a fork child, what the parent had pending is abandoned (cudefer.h:
 * counted as failed, never released there): nothing is pending, and the
 * policy holds nothing either, so held and held_bytes, of the process and
 * of the device, read 0 in the child. */
static void scenario_fork_child(void)
{
    cudaStream_t s = stream_new();
    for (int i = 0; i < 3; i++)
        CHECK(defer_free(device_alloc(KiB), s) == cudaSuccess, "free %d", i);
    WAIT_UNTIL(stats_now().held == 3, 5000);
    CHECK(stats_now().held == 3, "the parent holds 3");
    pid_t pid = fork_flushed();
    if (pid == 0) {
        failed_checks = 0;
        struct defer_stats st = stats_now();
        struct defer_device_stats d0;
        defer_device_stats_get(0, &d0);
        CHECK(st.pending == 0 && st.failed == 3,
              "child: pending %llu, failed %llu", ULL(st.pending),
              ULL(st.failed));
        CHECK(st.held == 0 && st.held_bytes == 0 && d0.held_bytes == 0,
              "child: nothing held: held %llu, held_bytes %llu, device 0's "
              "held_bytes %llu", ULL(st.held), ULL(st.held_bytes),
              ULL(d0.held_bytes));
        child_end(failed_checks);
    }
    int status;
    CHECK(wait_child(pid, 10000, &status) && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "the fork child's checks");
    CHECK(defer_flush() == cudaSuccess, "flush in the parent");
    check_quiet("the parent after the fork");
    defer_shutdown();
    cudaStreamDestroy(s);
}

/* One release: its latency is the only one seen, the median and the
 * largest at once, so latency_p50_us reads latency_max_us.  The median's
 * histogram bucket bounds it by a power of two above every latency the
 * bucket holds (a latency of 3 us is in the bucket below 4), which the
 * observed largest clamps: a median never reads above the largest. */
static void scenario_latency_one(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(KiB);
    fake_work *w = work_held(s, p);
    CHECK(defer_free(p, s) == cudaSuccess, "one free");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush: released");
    struct defer_stats st = stats_now();
    CHECK(st.released == 1, "one release (%llu)", ULL(st.released));
    CHECK(st.latency_p50_us == st.latency_max_us,
          "its latency is the median and the largest: latency_p50_us %llu, "
          "latency_max_us %llu", ULL(st.latency_p50_us),
          ULL(st.latency_max_us));
    check_quiet("after one release");
    defer_shutdown();
    cudaStreamDestroy(s);
}

/* The policy holds completed frees until a flush, trim or shutdown. */
#define HOLDS "CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0"

int main(void)
{
    plan_lazy();
    fork_scenario("struct defer_stats' identities once quiet", "", 2, 30000,
                  scenario_identities);
    fork_scenario("struct defer_stats' identities once quiet",
                  "CUDEFER_POLICY=eager CUDEFER_FREE_BATCH=2", 2, 30000,
                  scenario_identities);
    /* These two check that the policy holds three frees: no idle or age
     * release may take them first (2 ms of quiet by default, which a
     * loaded machine's make -j check gave: "held 3 KiB: process 0"). */
    fork_scenario("struct defer_stats' identities once quiet: groups, "
                  "refusals, failed releases, no event, a trim",
                  "CUDEFER_EVENT_POOL=0 " HOLDS, 1, 30000,
                  scenario_more_paths);
    fork_scenario("a fork child: what the parent held is abandoned, not "
                  "held", HOLDS, 1, 30000, scenario_fork_child);
    fork_scenario("one release: latency_p50_us is its latency, the "
                  "largest, not the power of two above it", "", 1, 30000,
                  scenario_latency_one);
    return 0;
}
