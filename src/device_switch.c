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

cudaError_t device_switch_to(struct device_switch *sw, int device,
                             const char **call)
{
    const char *failed = "cudaGetDevice";
    int caller;
    cudaError_t err = device_switch_caller(sw, &caller);
    if (err == cudaSuccess && sw->on != device) {
        failed = "cudaSetDevice";
        err = cudaSetDevice(device);
        /* Failed, the current device is not known: the way back sets the
         * caller's whatever it was. */
        sw->on = err == cudaSuccess ? device : -1;
    }
    if (err == cudaSuccess)
        return cudaSuccess;
    if (call != NULL)
        *call = failed;
    if (!report_cuda_error_is_sticky(err))
        cudaGetLastError(); /* cudefer's error, said by its caller */
    return err;
}

cudaError_t device_switch_back(struct device_switch *sw)
{
    if (sw->caller < 0 || sw->on == sw->caller)
        return cudaSuccess;
    cudaError_t err = cudaSetDevice(sw->caller);
    sw->on = err == cudaSuccess ? sw->caller : -1;
    if (err != cudaSuccess && !report_cuda_error_is_sticky(err))
        cudaGetLastError(); /* returned, for the caller to say */
    return err;
}
