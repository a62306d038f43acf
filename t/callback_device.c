/* SPDX-License-Identifier: MIT */
/* The reclaimer's current device around callbacks (W6's drain
 * runs 10^6 callbacks).  A callback may switch the reclaimer thread's
 * device; rather than forget which device is current after each one and
 * make a cudaSetDevice before the next query or callback (one per
 * callback), the reclaimer reads the device the callback left current.
 * Checked here: a drain of many callbacks on one stream makes no
 * cudaSetDevice per callback, and a callback that switches the device still
 * leaves the next callback on its own stream's device. */
#include <stdatomic.h>

#include "helpers.h"

#define CALLBACKS 1000

static atomic_int ran;

static void count_run(void *unused)
{
    (void)unused;
    atomic_fetch_add(&ran, 1);
}

static void switch_to_device_1(void *unused)
{
    (void)unused;
    cudaSetDevice(1);
}

/* Stores the current device in *(int *)out. */
static void read_device(void *out)
{
    cudaGetDevice(out);
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new();

    /* Start the reclaimer; one callback already ran. */
    is_int(defer_call(count_run, NULL, s0), cudaSuccess, "defer_call starts");
    is_int(defer_flush(), cudaSuccess, "flush");

    fake_work *gate = work_held(s0, NULL);
    bool refused = false;
    for (int i = 0; i < CALLBACKS; i++)
        refused |= defer_call(count_run, NULL, s0) != cudaSuccess;
    ok(!refused, "%d callbacks deferred behind held work", CALLBACKS);
    sleep_ms(50); /* taken in by the reclaimer, all waiting */
    unsigned long sets = fake_calls(FAKE_SET_DEVICE);
    fake_complete(gate);
    is_int(defer_flush(), cudaSuccess, "flush after the work completes");
    sets = fake_calls(FAKE_SET_DEVICE) - sets;
    is_int(atomic_load(&ran), CALLBACKS + 1, "every callback ran");
    ok(sets <= 2, "the drain made %lu cudaSetDevice for %d callbacks (at "
       "most 2)", sets, CALLBACKS);

    /* A callback that switches to device 1, then one on device 0's stream:
     * it runs with device 0 current, as every callback on s0 does. */
    int seen_s0 = -1, seen_s1 = -1;
    fake_work *held = work_held(s0, NULL);
    is_int(defer_call(switch_to_device_1, NULL, s0), cudaSuccess,
           "a callback that switches the device");
    is_int(defer_call(read_device, &seen_s0, s0), cudaSuccess,
           "then one that reads it, on the same stream");
    fake_complete(held);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(seen_s0, 0, "the second callback ran on device 0, its stream's");

    cudaSetDevice(1);
    is_int(defer_call(read_device, &seen_s1, s1), cudaSuccess,
           "a callback on device 1's stream");
    cudaSetDevice(0);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(seen_s1, 1, "it ran on device 1");

    is_int(defer_call(switch_to_device_1, NULL, s1), cudaSuccess,
           "device 1's stream: a callback that stays on device 1");
    is_int(defer_call(read_device, &seen_s0, s0), cudaSuccess,
           "then one on device 0's stream");
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(seen_s0, 0, "it ran on device 0");

    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int((int)fake_violations(), 0, "no oracle violation");
    return 0;
}
