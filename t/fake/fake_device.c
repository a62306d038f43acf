/* SPDX-License-Identifier: MIT */
/*
 * fake_device.c — the fake's devices: how many, the calling thread's
 * current device (and which devices the application, as opposed to
 * cudefer's reclaimer, has used), device synchronisation, attributes of an
 * H100-like device, versions (CUDA 13.0) and the error strings.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 if the calling thread is cudefer's reclaimer (by its name). */
static int is_reclaimer(void)
{
    char name[32] = "";

    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0)
        return 0;
    return strcmp(name, FAKE_RECLAIMER_THREAD_NAME) == 0;
}

/* Note that the calling thread used device dev. */
void fake_touch(int dev)
{
    fake.touched[dev] = 1;
    if (!fake.app_touched[dev] && !is_reclaimer())
        fake.app_touched[dev] = 1;
}

/* The device queries of the control API (fake_cuda.h).  Any thread. */
void fake_set_device_memory(int dev, size_t bytes)
{
    fake_lock();
    if (dev >= 0 && dev < FAKE_MAX_DEVICES)
        fake.devmem[dev] = bytes;
    fake_unlock();
}

void fake_set_memory_pools(int dev, int on)
{
    fake_lock();
    if (dev >= 0 && dev < FAKE_MAX_DEVICES)
        fake.no_pools[dev] = !on;
    fake_unlock();
}

void fake_set_pool_granularity(size_t bytes)
{
    fake_lock();
    fake.pool_granularity = bytes > 0 ? bytes : 1;
    fake_unlock();
}

void fake_set_address_reuse(int on)
{
    fake_lock();
    fake.reuse_addresses = on != 0;
    fake_unlock();
}

void fake_set_reuse_inside(size_t offset)
{
    fake_lock();
    fake.reuse_offset = offset;
    fake_unlock();
}

size_t fake_addresses_reused(void)
{
    fake_lock();
    size_t n = fake.addresses_reused;
    fake_unlock();
    return n;
}

int fake_device_touched(int dev)
{
    int r;

    fake_lock();
    r = dev >= 0 && dev < fake.ndev && fake.touched[dev];
    fake_unlock();
    return r;
}

int fake_device_touched_by_app(int dev)
{
    int r;

    fake_lock();
    r = dev >= 0 && dev < fake.ndev && fake.app_touched[dev];
    fake_unlock();
    return r;
}

/* ---- cudart: devices -------------------------------------------------- */

/* Number of fake devices. */
cudaError_t cudaGetDeviceCount(int *count)
{
    ENTER(FAKE_GET_DEVICE_COUNT);
    if (count == NULL)
        return fake_leave(cudaErrorInvalidValue);
    *count = fake.ndev;
    return fake_leave(cudaSuccess);
}

/* The calling thread's current device. */
cudaError_t cudaGetDevice(int *device)
{
    ENTER(FAKE_GET_DEVICE);
    if (device == NULL)
        return fake_leave(cudaErrorInvalidValue);
    *device = fake_thread.dev;
    return fake_leave(cudaSuccess);
}

/* Set the calling thread's current device.  The reclaimer setting a device
 * the application never used is a violation (it would create a context). */
cudaError_t cudaSetDevice(int device)
{
    ENTER(FAKE_SET_DEVICE);
    if (device < 0 || device >= fake.ndev)
        return fake_leave(cudaErrorInvalidDevice);
    if (is_reclaimer()) {
        if (!fake.app_touched[device])
            fake_violation("reclaimer thread set device %d, which the "
                           "application never used (would create a context "
                           "there)", device);
        fake.touched[device] = 1;
    } else {
        fake_touch(device);
    }
    fake_thread.dev = device;
    return fake_leave(cudaSuccess);
}

/* Wait for all work on all streams of the current device. */
cudaError_t cudaDeviceSynchronize(void)
{
    struct fake_work **tails;
    size_t i, n = 0;

    ENTER(FAKE_DEVICE_SYNCHRONIZE);
    fake_touch(fake_thread.dev);
    {   /* refused during any capture on the device, whatever the modes */
        int refused = 0;

        for (i = 0; i < fake.ngraphs; i++)
            if (fake.graphs[i]->capturing && !fake.graphs[i]->invalidated &&
                fake.graphs[i]->origin->dev == fake_thread.dev)
                fake.graphs[i]->invalidated = refused = 1;
        if (refused)
            return fake_leave(cudaErrorStreamCaptureUnsupported);
    }
    tails = malloc((fake.nstreams + 1) * sizeof *tails);
    if (tails == NULL)
        fake_die("out of memory");
    for (i = 0; i < fake.nstreams; i++)
        if (fake.streams[i]->dev == fake_thread.dev &&
            fake.streams[i]->tail != NULL)
            tails[n++] = fake.streams[i]->tail;
    fake_work_wait(tails, n);
    free(tails);
    for (i = 0; i < fake.nstreams; i++)
        if (fake.streams[i]->dev == fake_thread.dev)
            fake_unmap_settle(fake.streams[i]);
    return fake_leave(cudaSuccess);
}

/* The name, total memory (fake_set_device_memory) and a few plausible
 * properties of an H100-like device, 0 for the rest; counted (and failed
 * by injection) as cudaDeviceGetAttribute. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    ENTER(FAKE_DEVICE_GET_ATTRIBUTE);
    if (prop == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if (device < 0 || device >= fake.ndev)
        return fake_leave(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "fake device %d", device);
    prop->totalGlobalMem = fake.devmem[device];
    prop->major = 9;
    prop->multiProcessorCount = 132;
    prop->warpSize = 32;
    return fake_leave(cudaSuccess);
}

/* Every two devices of the fake are peers; no device is its own. */
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device,
                                    int peerDevice)
{
    int ndev;

    if (canAccessPeer == NULL)
        return cudaErrorInvalidValue;
    fake_lock();
    ndev = fake.ndev;
    fake_unlock();
    if (device < 0 || device >= ndev || peerDevice < 0 || peerDevice >= ndev)
        return cudaErrorInvalidDevice;
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

/* Plausible attributes of an H100-like device; 0 for the others. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr,
                                   int device)
{
    ENTER(FAKE_DEVICE_GET_ATTRIBUTE);
    if (value == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if (device < 0 || device >= fake.ndev)
        return fake_leave(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrPciBusId: *value = device + 1; break;
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrHostRegisterSupported: *value = 1; break;
    case cudaDevAttrMemoryPoolsSupported: *value = !fake.no_pools[device]; break;
    default: *value = 0; break;
    }
    return fake_leave(cudaSuccess);
}

/* 13000 (CUDA 13.0). */
cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    ENTER(FAKE_DRIVER_GET_VERSION);
    if (driverVersion == NULL)
        return fake_leave(cudaErrorInvalidValue);
    *driverVersion = 13000;
    return fake_leave(cudaSuccess);
}

/* 13000 (CUDA 13.0). */
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    ENTER(FAKE_RUNTIME_GET_VERSION);
    if (runtimeVersion == NULL)
        return fake_leave(cudaErrorInvalidValue);
    *runtimeVersion = 13000;
    return fake_leave(cudaSuccess);
}

/* The calling thread's last failure since it last asked (cudaGetLastError
 * clears it; the fake has no sticky errors, so nothing else does). */
cudaError_t cudaGetLastError(void)
{
    fake_lock();
    cudaError_t r = fake_thread.last_error;
    fake_thread.last_error = cudaSuccess;
    fake_unlock();
    return r;
}

cudaError_t cudaPeekAtLastError(void)
{
    fake_lock();
    cudaError_t r = fake_thread.last_error;
    fake_unlock();
    return r;
}

static const struct { cudaError_t code; const char *name, *text; } errtab[] = {
#define E(code, text) { code, #code, text }
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorInsufficientDriver,
      "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorDevicesUnavailable,
      "CUDA-capable device(s) is/are busy or unavailable"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    E(cudaErrorAssert, "device-side assert triggered"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorLaunchFailure, "unspecified launch failure"),
    E(cudaErrorNotPermitted, "operation not permitted"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorStreamCaptureUnsupported,
      "operation not permitted when stream is capturing"),
    E(cudaErrorStreamCaptureInvalidated,
      "operation failed due to a previous error during capture"),
    E(cudaErrorStreamCaptureUnmatched,
      "capture was not initiated in this stream"),
    E(cudaErrorStreamCaptureImplicit,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(cudaErrorIllegalState,
      "the operation cannot be performed in the present state"),
    E(cudaErrorUnknown, "unknown error"),
#undef E
};

/* Message of err, as CUDA words it. */
const char *cudaGetErrorString(cudaError_t error)
{
    size_t i;

    for (i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error)
            return errtab[i].text;
    return "unrecognized error code";
}

/* Enumerator name of err ("cudaErrorNotReady"). */
const char *cudaGetErrorName(cudaError_t error)
{
    size_t i;

    for (i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error)
            return errtab[i].name;
    return "unrecognized error code";
}
