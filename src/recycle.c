/* defer_alloc: device memory for a stream, taken back from what cudefer
 * holds (completed, not yet released, of the request's size class) before
 * asking cudaMalloc, so a loop of {defer_alloc, launch, defer_free} stops
 * paying cudaMalloc and cudaFree at all.  Size classes: see held.h. */
#include "cudefer.h"
#include "held.h"
#include "reclaimer.h"
#include "reclaimer_state.h"
#include "report.h"
#include "stats.h"

/* Any thread, admitted (see reclaimer.h): a shelved entry, taken back and
 * handed to the reclaimer to finish without freeing; its pointer, or NULL. */
void *reclaimer_reuse(int device, int size_class)
{
    if (device < 0 || device >= rs.ndevices ||
        rs.cfg.policy == DEFER_POLICY_EAGER)
        return NULL;
    struct entry *e = held_take_shelved(&rs.held[device], size_class);
    if (e == NULL)
        return NULL;
    void *ptr = e->ptrs[0];
    e->kind = ENTRY_REUSED; /* the reclaimer finishes it without freeing */
    reclaimer_push(e);
    stats_add(&stats.reused, 1);
    return ptr;
}

/* cudaMalloc on device from any thread, restoring its current device. */
static cudaError_t malloc_on(int device, void **ptr, size_t bytes)
{
    int current;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess)
        return err;
    if (current != device && (err = cudaSetDevice(device)) != cudaSuccess)
        return err;
    err = cudaMalloc(ptr, bytes);
    if (current != device) {
        cudaError_t back = cudaSetDevice(current);
        if (err == cudaSuccess && back != cudaSuccess) {
            cudaFree(*ptr);
            *ptr = NULL;
            err = back;
        }
    }
    return err;
}

/* A fresh allocation; out of memory, trim what cudefer holds and try once
 * more. */
static cudaError_t malloc_or_trim(int device, void **ptr, size_t bytes)
{
    cudaError_t err = malloc_on(device, ptr, bytes);
    if (err != cudaErrorMemoryAllocation)
        return err;
    cudaGetLastError(); /* not sticky: clear it for the caller */
    size_t trimmed = 0;
    defer_trim(&trimmed);
    err = malloc_on(device, ptr, bytes);
    if (err == cudaErrorMemoryAllocation)
        cudaGetLastError();
    return err;
}

cudaError_t defer_alloc(void **ptr, size_t bytes, cudaStream_t stream)
{
    if (ptr == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_alloc: ptr is NULL: refused");
        return cudaErrorInvalidValue;
    }
    *ptr = NULL;
    if (bytes == 0)
        return cudaSuccess; /* like cudaMalloc: nothing to allocate */
    cudaError_t err = reclaimer_enter("defer_alloc");
    if (err != cudaSuccess)
        return err;
    int device;
    if ((err = cudaStreamGetDevice(stream, &device)) != cudaSuccess) {
        reclaimer_leave();
        report_cuda("defer_alloc", "cudaStreamGetDevice", err, "");
        return err;
    }
    size_t class_bytes = bytes;
    int cls = size_class_of(bytes, &class_bytes);
    if (cls >= 0 && (*ptr = reclaimer_reuse(device, cls)) != NULL) {
        reclaimer_leave();
        return cudaSuccess;
    }
    reclaimer_leave(); /* a trim below must not wait behind our admission */
    return malloc_or_trim(device, ptr, class_bytes);
}
