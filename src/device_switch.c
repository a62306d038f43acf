/* Making a device current and the caller's current again: device_switch.h. */
#include "device_switch.h"

#include "driver_calls.h"
#include "report.h"

cudaError_t device_switch_caller(struct device_switch *sw, int *device)
{
    if (sw->caller < 0) {
        int current;
        cudaError_t err = driver_calls_get_device(&current);
        if (err != cudaSuccess)
            return err;
        sw->caller = sw->on = current;
    }
    *device = sw->caller;
    return cudaSuccess;
}

/* cudaSetDevice(device), its failure (not the device's sticky error)
 * cleared from the thread's last error: cudefer's own, said by its caller
 * (the application's pending error, if any, the runtime had overwritten
 * already). */
static cudaError_t set_device(int device)
{
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess && !report_cuda_error_is_sticky(err))
        cudaGetLastError();
    return err;
}

cudaError_t device_switch_to(struct device_switch *sw, int device,
                             const char **call)
{
    int caller;
    cudaError_t err = device_switch_caller(sw, &caller);
    if (err != cudaSuccess) {
        if (call != NULL)
            *call = "cudaGetDevice";
        return err;
    }
    if (sw->on == device)
        return cudaSuccess;
    /* A failed cudaSetDevice leaves the current device as it was. */
    if ((err = set_device(device)) == cudaSuccess)
        sw->on = device;
    else if (call != NULL)
        *call = "cudaSetDevice";
    return err;
}

cudaError_t device_switch_back(struct device_switch *sw, const char *what)
{
    if (sw->caller < 0 || sw->on == sw->caller)
        return cudaSuccess;
    cudaError_t err = set_device(sw->caller);
    if (err == cudaSuccess)
        sw->on = sw->caller;
    else if (what != NULL)
        report_cuda(what, "cudaSetDevice (back to the caller's device)", err,
                    "");
    return err;
}
