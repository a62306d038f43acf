/* SPDX-License-Identifier: MIT */
/* defer_device_stats_get and defer_device_stats_reset_peaks on three fake
 * devices: every field of each device checked exactly after each step
 * (misses, a free, a hit, a trim, held memory, a reset, a miss that
 * hands a block back, a free on two streams, shutdown), the
 * devices kept apart, the global cache counters the sum over the devices,
 * a device never used all 0; the refusals, each one line; and the sized
 * struct's rule (a smaller size writes only its whole fields, a larger one
 * gets zeros past this library's struct and no byte more). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

#define KIB ((uint64_t)1024)

/* The fields, in the struct's order: what a test expects of one device. */
struct want {
    uint64_t cache, cache_peak, live, live_peak, free, held, held_peak,
        mallocs, releases, allocs, reused, release_failures;
};

/* device's counters equal w, field by field (one test, the wrong fields
 * said). */
static void expect(int device, struct want w, const char *step)
{
    struct defer_device_stats s;
    memset(&s, 0xA5, sizeof s);
    cudaError_t err = defer_device_stats_get(device, &s);
    struct {
        const char *name;
        uint64_t have, want;
    } f[] = {
        {"cache_bytes", s.cache_bytes, w.cache},
        {"cache_bytes_peak", s.cache_bytes_peak, w.cache_peak},
        {"live_bytes", s.live_bytes, w.live},
        {"live_bytes_peak", s.live_bytes_peak, w.live_peak},
        {"cache_free_bytes", s.cache_free_bytes, w.free},
        {"held_bytes", s.held_bytes, w.held},
        {"held_bytes_peak", s.held_bytes_peak, w.held_peak},
        {"cache_mallocs", s.cache_mallocs, w.mallocs},
        {"cache_releases", s.cache_releases, w.releases},
        {"allocs", s.allocs, w.allocs},
        {"reused", s.reused, w.reused},
        {"cache_release_failures", s.cache_release_failures,
         w.release_failures},
    };
    _Static_assert(sizeof f / sizeof f[0] ==
                       sizeof(struct defer_device_stats) / sizeof(uint64_t),
                   "every field of struct defer_device_stats is checked");
    bool all = err == cudaSuccess;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].have != f[i].want) {
            diag("device %d, %s: %s is %llu, expected %llu", device, step,
                 f[i].name, ULL(f[i].have), ULL(f[i].want));
            all = false;
        }
    ok(all, "device %d, %s: every field as expected", device, step);
}

/* The global cache counters are the sums over the devices. */
static void expect_sums(const char *step)
{
    struct defer_stats g = stats_now();
    uint64_t bytes = 0, free_bytes = 0, mallocs = 0, releases = 0, reused = 0,
             failures = 0;
    for (int d = 0; d < 3; d++) {
        struct defer_device_stats s;
        defer_device_stats_get(d, &s);
        bytes += s.cache_bytes;
        free_bytes += s.cache_free_bytes;
        mallocs += s.cache_mallocs;
        releases += s.cache_releases;
        reused += s.reused;
        failures += s.cache_release_failures;
    }
    ok(g.cache_bytes == bytes && g.cache_free_bytes == free_bytes &&
           g.cache_mallocs == mallocs && g.cache_releases == releases &&
           g.reused == reused && g.cache_release_failures == failures,
       "%s: defer_stats' cache_bytes %llu, cache_free_bytes %llu, "
       "cache_mallocs %llu, cache_releases %llu, reused %llu are the sums "
       "over the devices (%llu, %llu, %llu, %llu, %llu)", step,
       ULL(g.cache_bytes), ULL(g.cache_free_bytes), ULL(g.cache_mallocs),
       ULL(g.cache_releases), ULL(g.reused), ULL(bytes), ULL(free_bytes),
       ULL(mallocs), ULL(releases), ULL(reused));
}

static void *alloc_on(size_t bytes, cudaStream_t s)
{
    void *p = NULL;
    if (alloc_checked(&p, bytes, s) != cudaSuccess || p == NULL)
        bail("defer_alloc of %zu bytes failed", bytes);
    return p;
}

static void free_on(void *p, cudaStream_t s)
{
    if (defer_free(p, s) != cudaSuccess)
        bail("defer_free failed");
}

/* Poll device's held_bytes until it is want, 5 s at most. */
static bool wait_held(int device, uint64_t want)
{
    double until = now_ms() + 5000;
    struct defer_device_stats s;
    do {
        defer_device_stats_get(device, &s);
        if (s.held_bytes == want)
            return true;
        sleep_ms(1);
    } while (now_ms() < until);
    return false;
}

/* A refused call says one line starting "cudefer: " and containing what. */
static void said_once(const char *text, const char *what, const char *name)
{
    size_t lines = 0;
    for (const char *c = text; *c != '\0'; c++)
        lines += *c == '\n';
    ok(lines == 1 && strncmp(text, "cudefer: ", 9) == 0 &&
           strstr(text, what) != NULL,
       "%s: said in one line naming it", name);
}

static uint64_t rejected_now(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    return st.rejected;
}

static void test_refusals(void)
{
    struct defer_device_stats s;
    memset(&s, 0xA5, sizeof s);
    uint64_t before = rejected_now();
    stderr_capture_begin();
    cudaError_t err = defer_device_stats_get(-1, &s);
    const char *text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "device -1: cudaErrorInvalidValue");
    is_str(text,
           "cudefer: defer_device_stats_get_sized: device -1 is out of "
           "range: cudefer counts devices 0 .. 63 (DEFER_STATS_MAX_DEVICES "
           "- 1): refused\n",
           "... said in one line with the device and the range");
    ok(s.cache_bytes == UINT64_C(0xA5A5A5A5A5A5A5A5), "... nothing written");

    stderr_capture_begin();
    err = defer_device_stats_get(DEFER_STATS_MAX_DEVICES, &s);
    text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "device %d: cudaErrorInvalidValue",
           DEFER_STATS_MAX_DEVICES);
    said_once(text, "device 64 is out of range", "device 64");

    stderr_capture_begin();
    err = defer_device_stats_get_sized(0, NULL, sizeof s);
    text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "a NULL out: cudaErrorInvalidValue");
    said_once(text, "out is NULL", "a NULL out");

    stderr_capture_begin();
    err = defer_device_stats_get_sized(0, &s, 4);
    text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue,
           "a size of 4 bytes: cudaErrorInvalidValue");
    said_once(text, "size 4 holds no field", "a size of 4");
    ok(s.cache_bytes == UINT64_C(0xA5A5A5A5A5A5A5A5), "... nothing written");

    stderr_capture_begin();
    err = defer_device_stats_reset_peaks(-2);
    text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "reset, device -2: refused");
    is_str(text,
           "cudefer: defer_device_stats_reset_peaks: device -2 is out of "
           "range: cudefer counts devices 0 .. 63 (DEFER_STATS_MAX_DEVICES "
           "- 1), or -1 for all: refused\n",
           "... said in one line with the device and the range");
    stderr_capture_begin();
    err = defer_device_stats_reset_peaks(DEFER_STATS_MAX_DEVICES);
    text = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "reset, device 64: refused");
    said_once(text, "device 64 is out of range", "reset, device 64");
    is_int((int)(rejected_now() - before), 6,
           "the six refusals: 6 counted in rejected");
}

#define CANARY 0xA5
static _Alignas(8) unsigned char buf[sizeof(struct defer_device_stats) + 64];

static bool canary_from(size_t from)
{
    for (size_t i = from; i < sizeof buf; i++)
        if (buf[i] != CANARY) {
            diag("byte %zu was written", i);
            return false;
        }
    return true;
}

/* The sized rule, on device 0 as it is now (nothing changes meanwhile). */
static void test_sized(void)
{
    struct defer_device_stats full;
    is_int(defer_device_stats_get(0, &full), cudaSuccess, "the macro");
    ok(full.cache_bytes != 0 && full.allocs != 0,
       "... device 0 has counts to copy");

    /* A program built against a header with two fields. */
    memset(buf, CANARY, sizeof buf);
    is_int(defer_device_stats_get_sized(
               0, (struct defer_device_stats *)buf, 2 * sizeof(uint64_t)),
           cudaSuccess, "two fields' size");
    uint64_t two[2];
    memcpy(two, buf, sizeof two);
    ok(two[0] == full.cache_bytes && two[1] == full.cache_bytes_peak,
       "... its two fields written");
    ok(canary_from(sizeof two), "... no byte past them");

    /* This header less its last field, and a size that ends in a field. */
    size_t less = sizeof full - sizeof(uint64_t);
    memset(buf, CANARY, sizeof buf);
    defer_device_stats_get_sized(0, (struct defer_device_stats *)buf,
                                 less + 5);
    ok(memcmp(buf, &full, less) == 0, "this header less a field (and 5 "
       "bytes): the whole fields written");
    ok(canary_from(less), "... the field cut short and what follows not");

    /* A program built against a later header: its fields read 0. */
    size_t later = sizeof full + 2 * sizeof(uint64_t);
    memset(buf, CANARY, sizeof buf);
    defer_device_stats_get_sized(0, (struct defer_device_stats *)buf, later);
    unsigned char zeros[2 * sizeof(uint64_t)] = {0};
    ok(memcmp(buf, &full, sizeof full) == 0 &&
           memcmp(buf + sizeof full, zeros, sizeof zeros) == 0,
       "a later header: the known fields, then zeros");
    ok(canary_from(later), "... and no byte more");
}

int main(void)
{
    plan_lazy();
    fake_reset(3);
    /* Held memory stays held until a flush or trim: no idle, age or cap
     * release while the test looks. */
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.idle_us = 10000000;
    cfg.max_delay_ms = 0;
    cfg.max_pending_bytes = UINT64_C(1) << 50;
    if (defer_configure(&cfg) != cudaSuccess)
        bail("defer_configure failed");

    struct want none = {0};
    expect(0, none, "before the first call");
    test_refusals();

    /* Device 0: two misses, a free, a hit on the same stream, two frees. */
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new();
    void *a = alloc_on(64 * KIB, s0), *b = alloc_on(128 * KIB, s0);
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live = 192 * KIB, .live_peak = 192 * KIB,
                            .mallocs = 2, .allocs = 2},
           "two new blocks");
    free_on(a, s0);
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live = 128 * KIB, .live_peak = 192 * KIB,
                            .free = 64 * KIB, .mallocs = 2, .allocs = 2},
           "one freed: live down, its peak kept");
    void *c = alloc_on(64 * KIB, s0);
    ok(c == a, "the same stream takes the freed block back");
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live = 192 * KIB, .live_peak = 192 * KIB,
                            .mallocs = 2, .allocs = 3, .reused = 1},
           "a hit");
    free_on(b, s0);
    free_on(c, s0);
    is_int(defer_flush(), cudaSuccess, "flush");
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live_peak = 192 * KIB, .free = 192 * KIB,
                            .mallocs = 2, .allocs = 3, .reused = 1},
           "all freed");
    is_int(defer_device_stats_reset_peaks(0), cudaSuccess, "reset device 0");
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .free = 192 * KIB, .mallocs = 2, .allocs = 3,
                            .reused = 1},
           "reset: each peak its current value");
    void *d = alloc_on(128 * KIB, s0);
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live = 128 * KIB, .live_peak = 128 * KIB,
                            .free = 64 * KIB, .mallocs = 2, .allocs = 4,
                            .reused = 2},
           "a hit after the reset: the live peak grows from there");

    /* Device 1: its own counts; device 0's stay. */
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *e = alloc_on(256 * KIB, s1), *f = alloc_on(256 * KIB, s1);
    free_on(e, s1);
    struct want d1 = {.cache = 512 * KIB, .cache_peak = 512 * KIB,
                      .live = 256 * KIB, .live_peak = 512 * KIB,
                      .free = 256 * KIB, .mallocs = 2, .allocs = 2};
    expect(1, d1, "two new blocks, one freed");
    expect(0, (struct want){.cache = 192 * KIB, .cache_peak = 192 * KIB,
                            .live = 128 * KIB, .live_peak = 128 * KIB,
                            .free = 64 * KIB, .mallocs = 2, .allocs = 4,
                            .reused = 2},
           "unchanged by device 1's");
    expect(2, none, "never used");
    expect_sums("live and free blocks on two devices");
    test_sized();

    /* A trim releases the free blocks: one a device. */
    size_t trimmed = 0;
    is_int(defer_trim(&trimmed), cudaSuccess, "trim");
    expect(0, (struct want){.cache = 128 * KIB, .cache_peak = 192 * KIB,
                            .live = 128 * KIB, .live_peak = 128 * KIB,
                            .mallocs = 2, .releases = 1, .allocs = 4,
                            .reused = 2},
           "trimmed: its free block released");
    d1.cache = 256 * KIB, d1.free = 0, d1.releases = 1;
    expect(1, d1, "trimmed: its free block released");
    expect_sums("after the trim");

    /* Held: device 1's memory of cudaMalloc, deferred and complete. */
    void *h = device_alloc(1024 * KIB);
    free_on(h, s1);
    ok(wait_held(1, 1024 * KIB), "device 1 holds the completed 1 MiB");
    d1.held = d1.held_peak = 1024 * KIB;
    expect(1, d1, "held");
    expect(0, (struct want){.cache = 128 * KIB, .cache_peak = 192 * KIB,
                            .live = 128 * KIB, .live_peak = 128 * KIB,
                            .mallocs = 2, .releases = 1, .allocs = 4,
                            .reused = 2},
           "nothing held there");
    ok(wait_stats_settled(5000) && stats_now().held_bytes == 1024 * KIB,
       "defer_stats' held_bytes is the device's");
    is_int(defer_flush(), cudaSuccess, "flush: the held memory released");
    ok(fake_is_released(h) == 1, "... it is");
    d1.held = 0;
    expect(1, d1, "released: held 0, its peak kept");

    /* Reset every device. */
    is_int(defer_device_stats_reset_peaks(-1), cudaSuccess, "reset all");
    d1.cache_peak = 256 * KIB, d1.live_peak = 256 * KIB, d1.held_peak = 0;
    expect(1, d1, "reset: each peak its current value");
    expect(0, (struct want){.cache = 128 * KIB, .cache_peak = 128 * KIB,
                            .live = 128 * KIB, .live_peak = 128 * KIB,
                            .mallocs = 2, .releases = 1, .allocs = 4,
                            .reused = 2},
           "reset too");
    expect(2, none, "still 0");

    /* A miss that the pool lacks memory for hands back the block pending
     * on its stream first (released), then makes a new one.  The block's
     * work is held until then: done, the reclaimer could make it FREE
     * between the miss's clock read and its hand-back, and a block that
     * turned FREE after that read stays cached (alloc.c). */
    cudaSetDevice(0);
    fake_work *on_d = work_held(s0, d);
    free_on(d, s0);
    void *g = alloc_on(256 * KIB, s0);
    fake_complete(on_d);
    expect(0, (struct want){.cache = 256 * KIB, .cache_peak = 256 * KIB,
                            .live = 256 * KIB, .live_peak = 256 * KIB,
                            .mallocs = 3, .releases = 2, .allocs = 5,
                            .reused = 2},
           "a miss handed a block back");
    expect_sums("after a hand-back");

    /* Shutdown releases the blocks freed before it; the counters stay
     * readable. */
    free_on(g, s0);
    /* A free that waits for two streams: the block is live until their
     * work is done, then back in the cache. */
    cudaSetDevice(1);
    cudaStream_t both[2] = {s1, stream_new()};
    fake_work *w = work_held(both[1], f);
    is_int(defer_free_streams(f, both, 2), cudaSuccess,
           "device 1: a free on two streams");
    expect(1, d1, "live while the other stream's work runs");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush once it is done");
    d1.live = 0, d1.free = 256 * KIB;
    expect(1, d1, "then back in the cache");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    expect(0, (struct want){.cache_peak = 256 * KIB, .live_peak = 256 * KIB,
                            .mallocs = 3, .releases = 3, .allocs = 5,
                            .reused = 2},
           "after shutdown");
    d1.cache = d1.free = 0, d1.releases = 2;
    expect(1, d1, "after shutdown");
    expect_sums("after shutdown");
    is_int(defer_device_stats_reset_peaks(-1), cudaSuccess,
           "a reset after shutdown");
    expect(0, (struct want){.mallocs = 3, .releases = 3, .allocs = 5,
                            .reused = 2},
           "reset after shutdown");
    ok(fake_violations() == 0, "the oracle saw no violation");
    return 0;
}
