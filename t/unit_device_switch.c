/* Making a device current and the caller's current again
 * (src/device_switch.c), called directly on the fake runtime with two
 * devices: nothing is switched where the device is current already; the
 * caller's device is asked once; a failed query or switch names its call
 * and leaves no error of cudefer's as the thread's last error (a sticky
 * one stays: it is the device's); the way back after a failed switch sets
 * the caller's device; a failed way back says its error and can be tried
 * again. */
#include <string.h>

#include "device_switch.h"
#include "fake_cuda.h"
#include "tap.h"

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
    struct device_switch sw = DEVICE_SWITCH_NONE;
    unsigned long s0 = sets(), q0 = fake_calls(FAKE_GET_DEVICE);
    is_int(device_switch_to(&sw, 0, NULL), cudaSuccess, "to the current");
    is_int(device_switch_back(&sw), cudaSuccess, "back");
    is_int((int)(sets() - s0), 0, "no cudaSetDevice at all");
    is_int((int)(fake_calls(FAKE_GET_DEVICE) - q0), 1, "one query");
}

static void other_device(void)
{
    fake_reset(2);
    struct device_switch sw = DEVICE_SWITCH_NONE;
    unsigned long s0 = sets(), q0 = fake_calls(FAKE_GET_DEVICE);
    is_int(device_switch_to(&sw, 1, NULL), cudaSuccess, "to device 1");
    is_int(current(), 1, "device 1 is current");
    is_int(device_switch_to(&sw, 1, NULL), cudaSuccess, "to it again");
    is_int((int)(sets() - s0), 1, "one cudaSetDevice for both");
    int caller = -1;
    is_int(device_switch_caller(&sw, &caller), cudaSuccess, "the caller's");
    is_int(caller, 0, "is device 0");
    is_int(device_switch_to(&sw, 0, NULL), cudaSuccess, "to device 0");
    is_int(device_switch_to(&sw, 1, NULL), cudaSuccess, "and 1 again");
    is_int(device_switch_back(&sw), cudaSuccess, "back");
    is_int(current(), 0, "device 0 is current again");
    is_int((int)(sets() - s0), 4, "one cudaSetDevice a change");
    /* current() above asked twice; the switch once. */
    is_int((int)(fake_calls(FAKE_GET_DEVICE) - q0), 3,
           "the caller's device asked once");
    is_int(device_switch_back(&sw), cudaSuccess, "back again: nothing");
    is_int((int)(sets() - s0), 4, "no more calls");
}

static void failed_query(void)
{
    fake_reset(2);
    struct device_switch sw = DEVICE_SWITCH_NONE;
    const char *call = NULL;
    cudaGetLastError();
    fake_fail(FAKE_GET_DEVICE, cudaErrorNotPermitted, 0, 1);
    is_int(device_switch_to(&sw, 1, &call), cudaErrorNotPermitted,
           "a failed query: its error");
    ok(call != NULL && strcmp(call, "cudaGetDevice") == 0, "named: %s",
       call ? call : "(null)");
    is_int(cudaGetLastError(), cudaSuccess, "not left as the last error");
    is_int(current(), 0, "nothing switched");
    is_int(device_switch_back(&sw), cudaSuccess, "back: nothing to do");
    is_int(device_switch_to(&sw, 1, NULL), cudaSuccess,
           "asked again next time");
    is_int(current(), 1, "and switched");
    device_switch_back(&sw);
    is_int(current(), 0, "and back");
}

static void failed_switch(void)
{
    fake_reset(2);
    struct device_switch sw = DEVICE_SWITCH_NONE;
    const char *call = NULL;
    cudaGetLastError();
    fake_fail(FAKE_SET_DEVICE, cudaErrorInvalidDevice, 0, 1);
    is_int(device_switch_to(&sw, 1, &call), cudaErrorInvalidDevice,
           "a failed switch: its error");
    ok(call != NULL && strcmp(call, "cudaSetDevice") == 0, "named: %s",
       call ? call : "(null)");
    is_int(cudaGetLastError(), cudaSuccess, "not left as the last error");
    unsigned long s0 = sets();
    is_int(device_switch_back(&sw), cudaSuccess, "back");
    is_int((int)(sets() - s0), 1,
           "sets the caller's device: the current one is not known");
    is_int(current(), 0, "device 0 is current");

    /* A sticky error is the device's: left for the application. */
    sw = DEVICE_SWITCH_NONE;
    fake_fail(FAKE_SET_DEVICE, cudaErrorIllegalAddress, 0, 1);
    is_int(device_switch_to(&sw, 1, NULL), cudaErrorIllegalAddress,
           "a sticky error");
    is_int(cudaGetLastError(), cudaErrorIllegalAddress,
           "left as the last error");
    fake_fail_clear();
}

static void failed_back(void)
{
    fake_reset(2);
    struct device_switch sw = DEVICE_SWITCH_NONE;
    cudaGetLastError();
    is_int(device_switch_to(&sw, 1, NULL), cudaSuccess, "to device 1");
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    is_int(device_switch_back(&sw), cudaErrorNotPermitted,
           "a failed way back: its error");
    is_int(cudaGetLastError(), cudaSuccess, "not left as the last error");
    is_int(device_switch_back(&sw), cudaSuccess, "tried again");
    is_int(current(), 0, "device 0 is current");
}

int main(void)
{
    plan(39);
    same_device();
    other_device();
    failed_query();
    failed_switch();
    failed_back();
    return 0;
}
