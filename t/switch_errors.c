/* SPDX-License-Identifier: MIT */
/* A device switch that fails inside cudefer leaves no error of cudefer's
 * as the thread's last error (PyTorch's launch check reads it after every
 * kernel), and the caller's device current.  An event made for another
 * device's stream (CUDEFER_EVENT_POOL=0: every free makes its own) whose
 * cudaSetDevice fails: the free waits for the stream and releases the
 * pointer at once (said), cudaGetLastError says nothing (no
 * cudaErrorNotPermitted left for the application), and a free after it
 * works.  A pluggable allocation on device 1 (its stream the legacy one)
 * whose switch back to device 0 fails: the block is handed out, the
 * failure said, no error left.  A release made on the calling thread
 * (CUDEFER_DISABLE, or no event to be had) that CUDA refuses (a made-up
 * address, memory of the other kind): accepted, said, counted as failed,
 * and no error of that release left as the thread's last one. */
#include <string.h>

#include "helpers.h"

/* bytes on device d, device 0 current again after. */
static void *device_alloc_on(int d, size_t bytes)
{
    cudaSetDevice(d);
    void *p = device_alloc(bytes);
    cudaSetDevice(0);
    return p;
}

static void event_switch_fails(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    cudaSetDevice(0);
    void *p = device_alloc_on(1, 256);
    cudaGetLastError();
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    cudaError_t err = defer_free(p, s1);
    fake_fail_clear();
    stderr_capture_end();
    CHECK(err == cudaSuccess, "accepted (%d)", (int)err);
    CHECK(fake_is_released(p) == 1, "released synchronously");
    cudaError_t last = cudaGetLastError();
    CHECK(last == cudaSuccess, "no error left as the last one (%d)",
          (int)last);
    int current = -1;
    cudaGetDevice(&current);
    CHECK(current == 0, "device 0 is current (%d)", current);
    void *q = device_alloc_on(1, 256);
    CHECK(defer_free(q, s1) == cudaSuccess, "a free after it works");
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(fake_is_released(q) == 1, "released once");
    cudaGetDevice(&current);
    CHECK(current == 0 && cudaGetLastError() == cudaSuccess,
          "device 0 still current, no error left");
}

static void way_back_fails(void)
{
    cudaSetDevice(0);
    void *first = defer_pluggable_alloc(256, 1, 0); /* starts the library */
    CHECK(first != NULL, "a first allocation on device 1");
    defer_pluggable_free(first, 256, 1, 0);
    cudaGetLastError();
    /* A hit on device 1's legacy stream makes no CUDA call, so device 1
     * is never made current: no switch there, none back. */
    unsigned long sets = fake_calls(FAKE_SET_DEVICE);
    void *hit = defer_pluggable_alloc(256, 1, 0);
    int now = -1;
    cudaGetDevice(&now);
    CHECK(hit == first && fake_calls(FAKE_SET_DEVICE) == sets && now == 0,
          "a hit on device 1 hands out its block with no switch (%lu "
          "cudaSetDevice), device 0 still current (%d)",
          fake_calls(FAKE_SET_DEVICE) - sets, now);
    defer_pluggable_free(hit, 256, 1, 0);
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 1, 1); /* the 2nd */
    /* A miss (no cached block this large) allocates on device 1: made
     * current, then back. */
    void *p = defer_pluggable_alloc(4 << 20, 1, 0);
    fake_fail_clear();
    const char *said = stderr_capture_end();
    CHECK(p != NULL, "the block is handed out");
    CHECK(has_line(said, "defer_pluggable_alloc",
                   "back to the caller's device", NULL),
          "the failed way back is said");
    cudaError_t last = cudaGetLastError();
    CHECK(last == cudaSuccess, "no error left as the last one (%d)",
          (int)last);
    int current = -1;
    cudaGetDevice(&current);
    CHECK(current == 1, "device 1 stays current, as cudefer.h says (%d)",
          current);
    cudaSetDevice(0);
    defer_pluggable_free(p, 4 << 20, 1, 0);
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* A free on another device's stream whose event is made there
 * (CUDEFER_EVENT_POOL=0): device 1 made current, then back, the way back
 * failing: the free is accepted and released (synchronously, as for a
 * failed switch there), the failure said, no error left, and device 1
 * stays current (cudefer.h's limit). */
static void free_way_back_fails(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    cudaSetDevice(0);
    void *first = device_alloc_on(1, 256), *p = device_alloc_on(1, 256);
    CHECK(defer_free(first, s1) == cudaSuccess && defer_flush() == cudaSuccess,
          "a first free, flushed (the library started)");
    cudaSetDevice(1);
    cudaStream_t s2 = stream_new(); /* no event of its own yet */
    cudaSetDevice(0);
    cudaGetLastError();
    unsigned long sets = fake_calls(FAKE_SET_DEVICE);
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 1, 1); /* the 2nd */
    cudaError_t err = defer_free(p, s2);
    fake_fail_clear();
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "accepted (%d)", (int)err);
    CHECK(fake_calls(FAKE_SET_DEVICE) - sets == 2,
          "device 1 made current for the event, then back (%lu calls)",
          fake_calls(FAKE_SET_DEVICE) - sets);
    CHECK(has_line(said, "cudaSetDevice", NULL, NULL),
          "the failed way back is said (stderr: \"%s\")", said);
    cudaError_t last = cudaGetLastError();
    CHECK(last == cudaSuccess, "no error left as the last one (%d)",
          (int)last);
    int current = -1;
    cudaGetDevice(&current);
    CHECK(current == 1, "device 1 stays current, as cudefer.h says (%d)",
          current);
    cudaSetDevice(0);
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1,
          "released");
}

/* Each release refused by CUDA on the calling thread: said, failed, the
 * call accepted, and cudaGetLastError finds nothing. */
static void sync_release_refused(void)
{
    cudaStream_t s = stream_new();
    void *made_up = (void *)0x1, *dev = device_alloc(256);
    uint64_t failed = stats_now().failed;
    cudaGetLastError();
    stderr_capture_begin();
    cudaError_t e1 = defer_free(made_up, s);
    cudaError_t last1 = cudaGetLastError();
    cudaError_t e2 = defer_free_host(dev, s);
    cudaError_t last2 = cudaGetLastError();
    const char *said = stderr_capture_end();
    CHECK(e1 == cudaSuccess && e2 == cudaSuccess, "accepted (%d, %d)",
          (int)e1, (int)e2);
    CHECK(stats_now().failed == failed + 2, "counted as failed (%llu)",
          (unsigned long long)(stats_now().failed - failed));
    CHECK(strstr(said, "not memory CUDA allocated") != NULL &&
              strstr(said, "device memory, which defer_free releases") !=
                  NULL,
          "said (stderr: \"%s\")", said);
    CHECK(last1 == cudaSuccess, "no error left by the refused cudaFree (%s)",
          cudaGetErrorName(last1));
    CHECK(last2 == cudaSuccess,
          "no error left by the refused cudaFreeHost (%s)",
          cudaGetErrorName(last2));
    CHECK(fake_is_released(dev) == 0, "the device memory stays allocated");
    cudaFree(dev);
}

/* The runtime's calls only, every free making its event: a creation that
 * fails has the free wait for its stream and release at once (said); the
 * call is accepted, and the failed creation is no error of the
 * application's to find. */
static void event_create_fails(void)
{
    cudaStream_t s = stream_new();
    void *first = device_alloc(256), *p = device_alloc(256);
    CHECK(defer_free(first, s) == cudaSuccess && defer_flush() == cudaSuccess,
          "a first free, flushed");
    cudaStream_t fresh = stream_new(); /* no event of its own yet */
    cudaGetLastError();
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, 0, -1);
    cudaError_t err = defer_free(p, fresh);
    fake_fail_clear();
    cudaError_t last = cudaGetLastError();
    const char *said = stderr_capture_end();
    CHECK(err == cudaSuccess, "accepted (%s)", cudaGetErrorName(err));
    CHECK(fake_is_released(p) == 1 &&
              strstr(said, "releasing synchronously") != NULL,
          "released synchronously, said (stderr: \"%s\")", said);
    CHECK(last == cudaSuccess, "no error left by the failed creation (%s)",
          cudaGetErrorName(last));
}

int main(void)
{
    plan_lazy();
    fork_scenario("a failed switch for another device's event",
                  "CUDEFER_EVENT_POOL=0", 2, 30000, event_switch_fails);
    fork_scenario("a failed way back from a pluggable allocation's device",
                  "", 2, 30000, way_back_fails);
    fork_scenario("a failed way back from a free's event on another device",
                  "CUDEFER_EVENT_POOL=0", 2, 30000, free_way_back_fails);
    fork_scenario("a synchronous release refused by CUDA leaves no error",
                  "CUDEFER_DISABLE=1", 1, 30000, sync_release_refused);
    fork_scenario("an event creation that fails leaves no error",
                  "CUDEFER_DRIVER_CALLS=0 CUDEFER_EVENT_POOL=0", 1, 30000,
                  event_create_fails);
    return 0;
}
