/* SPDX-License-Identifier: MIT */
/* Making a device current and the caller's current again (cuda_switch_*
 * in src/cuda.c), called directly on the fake runtime with two
 * devices: nothing is switched where the device is current already; the
 * caller's device is asked once; a failed query or switch names its call;
 * a failed switch leaves no error of cudefer's as the thread's last error
 * (a sticky one stays: it is the device's) and nothing to switch back; a
 * failed way back is said (when named) and can be tried again; a failed
 * query through the driver leaves the application's pending error
 * alone. */
#include <string.h>

#include "cuda.h"
#include "helpers.h"

static int current(void)
{
    int d = -1;
    cudaGetDevice(&d);
    return d;
}

static unsigned long sets(void) { return fake_calls(FAKE_SET_DEVICE); }

static void same_device(void)
{
    fake_reset(2);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    unsigned long s0 = sets(), q0 = fake_calls(FAKE_GET_DEVICE);
    is_int(cuda_switch_device(&sw, 0, NULL), cudaSuccess, "to the current");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "back");
    is_int((int)(sets() - s0), 0, "no cudaSetDevice at all");
    is_int((int)(fake_calls(FAKE_GET_DEVICE) - q0), 1, "one query");
}

static void other_device(void)
{
    fake_reset(2);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    unsigned long s0 = sets(), q0 = fake_calls(FAKE_GET_DEVICE);
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess, "to device 1");
    is_int(current(), 1, "device 1 is current");
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess, "to it again");
    is_int((int)(sets() - s0), 1, "one cudaSetDevice for both");
    int caller = -1;
    is_int(cuda_switch_caller_device(&sw, &caller), cudaSuccess,
           "the caller's");
    is_int(caller, 0, "is device 0");
    is_int(cuda_switch_device(&sw, 0, NULL), cudaSuccess, "to device 0");
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess, "and 1 again");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "back");
    is_int(current(), 0, "device 0 is current again");
    is_int((int)(sets() - s0), 4, "one cudaSetDevice a change");
    /* current() above asked twice; the switch once. */
    is_int((int)(fake_calls(FAKE_GET_DEVICE) - q0), 3,
           "the caller's device asked once");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "back again: nothing");
    is_int((int)(sets() - s0), 4, "no more calls");
}

/* A switch that failed: got is want, call names the call. */
static void failed_as(cudaError_t got, cudaError_t want, const char *call,
                      const char *name)
{
    is_int(got, want, "failed: its error");
    ok(call != NULL && strcmp(call, name) == 0, "named: %s",
       call ? call : "(null)");
}

static void failed_query(void)
{
    fake_reset(2);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *call = NULL;
    cudaGetLastError();
    fake_fail(FAKE_GET_DEVICE, cudaErrorNotPermitted, 0, 1);
    cudaError_t err = cuda_switch_device(&sw, 1, &call);
    failed_as(err, cudaErrorNotPermitted, call, "cudaGetDevice");
    cudaGetLastError(); /* the runtime's query (no driver here) left it */
    is_int(current(), 0, "nothing switched");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "back: nothing to do");
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess,
           "asked again next time");
    is_int(current(), 1, "and switched");
    cuda_switch_back(&sw, NULL);
    is_int(current(), 0, "and back");
}

static void failed_switch(void)
{
    fake_reset(2);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *call = NULL;
    cudaGetLastError();
    fake_fail(FAKE_SET_DEVICE, cudaErrorInvalidDevice, 0, 1);
    cudaError_t err = cuda_switch_device(&sw, 1, &call);
    failed_as(err, cudaErrorInvalidDevice, call, "cudaSetDevice");
    is_int(cudaGetLastError(), cudaSuccess, "not left as the last error");
    unsigned long s0 = sets();
    is_int(cuda_switch_back(&sw, "test"), cudaSuccess, "back");
    is_int((int)(sets() - s0), 0,
           "nothing to do: a failed cudaSetDevice changed nothing");
    is_int(current(), 0, "device 0 is current");

    /* A sticky error is the device's: left for the application. */
    sw = CUDA_SWITCH_NONE;
    fake_fail(FAKE_SET_DEVICE, cudaErrorIllegalAddress, 0, 1);
    is_int(cuda_switch_device(&sw, 1, NULL), cudaErrorIllegalAddress,
           "a sticky error");
    is_int(cudaGetLastError(), cudaErrorIllegalAddress,
           "left as the last error");
    fake_fail_clear();
}

static void failed_back(void)
{
    fake_reset(2);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    cudaGetLastError();
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess, "to device 1");
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    stderr_capture_begin();
    cudaError_t err = cuda_switch_back(&sw, "test");
    const char *said = stderr_capture_end();
    is_int(err, cudaErrorNotPermitted, "a failed way back: its error");
    ok(has_line(said, "test", "back to the caller's device", NULL),
       "said, naming the call");
    is_int(cudaGetLastError(), cudaSuccess, "not left as the last error");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "tried again");
    is_int(current(), 0, "device 0 is current");
}

/* Through the driver's query (resolved as the library's start does): a
 * failed query leaves the application's pending error for it to read. */
static void driver_query_keeps_pending_error(void)
{
    fake_reset(2);
    cuda_resolve_entry_points("unit_device_switch", true);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *call = NULL;
    cudaGetLastError();
    cudaSetDevice(7); /* the application's own error, pending */
    unsigned long driver = fake_driver_calls();
    fake_fail(FAKE_GET_DEVICE, cudaErrorNotPermitted, 0, 1);
    cudaError_t err = cuda_switch_device(&sw, 1, &call);
    failed_as(err, cudaErrorNotPermitted, call, "cudaGetDevice");
    ok(fake_driver_calls() > driver, "asked through the driver");
    is_int(cudaGetLastError(), cudaErrorInvalidDevice,
           "the application's error is still there");
    is_int(cuda_switch_device(&sw, 1, NULL), cudaSuccess, "then it switches");
    is_int(cuda_switch_back(&sw, NULL), cudaSuccess, "and back");
    is_int(current(), 0, "device 0 is current");
}

int main(void)
{
    plan(46);
    same_device();
    other_device();
    failed_query();
    failed_switch();
    failed_back();
    driver_query_keeps_pending_error();
    return 0;
}
