/* SPDX-License-Identifier: MIT */
/* defer_record_stream of the legacy stream (0) on two devices: a block of
 * device 1, recorded on stream 0 while device 1 is current (device 1's
 * legacy stream, which still reads it), freed while device 0 is current
 * (PyTorch's free runs on whatever device is current; so may a C
 * program's): the free waits for device 1's legacy stream, not device 0's,
 * and leaves device 0 current (an event on device 0's idle legacy stream
 * would let another stream get the block while device 1's still reads
 * it).  Then the legacy streams of
 * both devices on one block.  The oracle checks every hand-out. */
#include "helpers.h"

static void freed_on_device0(bool pluggable)
{
    const size_t bytes = 65536;
    const char *how = pluggable ? "defer_pluggable_free" : "defer_free";
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new(), s1b = stream_new();
    void *p = NULL;
    if (pluggable) {
        p = defer_pluggable_alloc(bytes, 1, s1);
        fake_oracle_handout_range(p, bytes, s1);
    } else {
        alloc_checked(&p, bytes, s1);
    }
    fake_work *w = work_held(0, p); /* device 1's legacy stream reads it */
    is_int(defer_record_stream(p, 0), cudaSuccess,
           "%s: recorded on stream 0 with device 1 current", how);
    cudaSetDevice(0);
    if (pluggable)
        defer_pluggable_free(p, bytes, 1, s1);
    else
        is_int(defer_free(p, s1), cudaSuccess, "%s with device 0 current",
               how);
    int dev = -1;
    cudaGetDevice(&dev);
    is_int(dev, 0, "%s: device 0 is current again", how);
    /* A trim settles every entry that completed and releases every free
     * block: had the free waited for device 0's idle legacy stream, p
     * would be released under device 1's work (an oracle violation). */
    size_t trimmed = 0;
    is_int(defer_trim(&trimmed), cudaSuccess, "%s: trim", how);
    ok(fake_is_released(p) == 0 && fake_violations() == 0,
       "%s: not released while device 1's legacy stream reads it", how);
    cudaSetDevice(1);
    void *q = NULL, *r = NULL;
    alloc_checked(&q, bytes, s1b);
    ok(q != p, "%s: nor handed to another stream", how);
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "%s: flush once that work is done",
           how);
    alloc_checked(&r, bytes, s1b);
    ok(r == p, "%s: then another stream gets it", how);
    defer_free(q, s1b);
    defer_free(r, s1b);
    is_int(defer_flush(), cudaSuccess, "%s: flush", how);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s1b);
}

/* Recorded on device d's legacy stream, freed on stream 0 with the other
 * device current: two streams with one handle, both waited for (a
 * mutation that took any special handle for the same stream went unseen
 * before; for d = 0, one that took a recorded device 0 for the caller's,
 * in round 3).  The block is device d's. */
static void freed_on_other_legacy(int d)
{
    const size_t bytes = 65536;
    cudaSetDevice(d);
    cudaStream_t s = stream_new(), sb = stream_new();
    void *p = NULL, *q = NULL;
    alloc_checked(&p, bytes, s);
    fake_work *w = work_held(0, p);
    is_int(defer_record_stream(p, 0), cudaSuccess,
           "recorded on device %d's legacy stream", d);
    cudaSetDevice(1 - d);
    is_int(defer_free(p, 0), cudaSuccess,
           "freed on stream 0 with device %d current", 1 - d);
    size_t trimmed = 0;
    defer_trim(&trimmed);
    ok(fake_is_released(p) == 0 && fake_violations() == 0,
       "not released while device %d's legacy stream reads it", d);
    cudaSetDevice(d);
    alloc_checked(&q, bytes, sb);
    ok(q != p, "nor handed to another stream of device %d", d);
    fake_complete(w);
    defer_free(q, sb);
    is_int(defer_flush(), cudaSuccess, "flush");
    cudaStreamDestroy(s);
    cudaStreamDestroy(sb);
    cudaSetDevice(0);
}

/* Recorded on the legacy streams of both devices (one handle), in either
 * order, freed on a created stream of device 0 while device 0's legacy
 * stream still reads it (device 1's done): waited for.  The failure
 * guarded against: with device 1's recorded first, the free takes device
 * 0's legacy stream for device 1's (the one already named) and releases
 * the block under device 0's work. */
static void both_legacy_streams(bool device1_first)
{
    const size_t bytes = 65536;
    const char *order = device1_first ? "device 1's first" : "device 0's first";
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new(), s0b = stream_new();
    void *p = NULL, *q = NULL;
    alloc_checked(&p, bytes, s0);
    fake_work *w0 = NULL, *w1 = NULL;
    for (int k = 0; k < 2; k++) {
        int d = (k == 0) == device1_first ? 1 : 0;
        cudaSetDevice(d);
        *(d == 1 ? &w1 : &w0) = work_held(0, p);
        is_int(defer_record_stream(p, 0), cudaSuccess,
               "%s: recorded on device %d's legacy stream", order, d);
    }
    cudaSetDevice(0);
    fake_complete(w1);
    is_int(defer_free(p, s0), cudaSuccess, "%s: freed on a stream of device "
           "0", order);
    size_t trimmed = 0;
    defer_trim(&trimmed);
    ok(fake_is_released(p) == 0 && fake_violations() == 0,
       "%s: not released while device 0's legacy stream reads it", order);
    alloc_checked(&q, bytes, s0b);
    ok(q != p, "%s: nor handed to another stream", order);
    fake_complete(w0);
    defer_free(q, s0b);
    is_int(defer_flush(), cudaSuccess, "%s: flush", order);
    cudaStreamDestroy(s0);
    cudaStreamDestroy(s0b);
}

/* defer_pluggable_free naming a valid device that is not the block's, on
 * stream 0: the block's own device decides which legacy stream the free
 * waits for.  Taking the caller's word would record the event on device
 * 1's idle legacy stream and hand the block to another stream of device 0
 * while device 0's legacy stream still uses it. */
static void pluggable_free_wrong_device(void)
{
    const size_t bytes = 1 << 20;
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new();
    void *p = defer_pluggable_alloc(bytes, 0, 0);
    ok(p != NULL, "pluggable: a block of device 0 for stream 0");
    fake_oracle_handout_range(p, bytes, 0);
    fake_work *w = work_held(0, p); /* device 0's legacy stream uses it */
    stderr_capture_begin();
    defer_pluggable_free(p, bytes, 1, 0);
    const char *said = stderr_capture_end();
    ok(has_line(said, "defer_pluggable_free", "device 0", NULL),
       "pluggable: freed as device 1's, the mismatch said");
    int dev = -1;
    cudaGetDevice(&dev);
    is_int(dev, 0, "pluggable: device 0 is current again");
    size_t trimmed = 0;
    defer_trim(&trimmed);
    void *q = NULL;
    alloc_checked(&q, bytes, s0);
    ok(q != p && fake_violations() == 0,
       "pluggable: not handed to another stream of device 0 while device "
       "0's legacy stream uses it");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "pluggable: flush once that work is "
           "done");
    void *r = NULL;
    alloc_checked(&r, bytes, s0);
    ok(r == p, "pluggable: then another stream gets it");
    defer_free(q, s0);
    defer_free(r, s0);
    is_int(defer_flush(), cudaSuccess, "pluggable: flush");
    cudaStreamDestroy(s0);
}

/* CUDEFER_DISABLE=1: a free of a block recorded on device 1's legacy
 * stream, made with device 0 current, waits for that stream (on device 1)
 * and leaves device 0 current (a mutation that dropped the switch back
 * went unseen before). */
static void scenario_sync_free_restores_device(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p = NULL;
    CHECK(alloc_checked(&p, 4096, s1) == cudaSuccess && p != NULL, "alloc");
    fake_work *w = work_timed(0, 5000, p); /* device 1's legacy stream */
    CHECK(defer_record_stream(p, 0) == cudaSuccess, "record on stream 0");
    cudaSetDevice(0);
    CHECK(defer_free(p, s1) == cudaSuccess, "defer_free with device 0 current");
    CHECK(fake_work_done(w), "waited for device 1's legacy stream");
    int dev = -1;
    cudaGetDevice(&dev);
    CHECK(dev == 0, "device 0 current again (got %d)", dev);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    cudaStreamDestroy(s1);
}

int main(void)
{
    plan_lazy();
    fork_scenario("CUDEFER_DISABLE: a synchronous free restores the current "
                  "device", "CUDEFER_DISABLE=1", 2, 10000,
                  scenario_sync_free_restores_device);
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s");
    fake_reset(2);
    freed_on_device0(true);
    freed_on_device0(false);
    freed_on_other_legacy(1);
    freed_on_other_legacy(0);
    both_legacy_streams(true);
    both_legacy_streams(false);
    pluggable_free_wrong_device();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing reused early");
    return 0;
}
