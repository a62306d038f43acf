/* Allocation size and pool membership through the driver's
 * cuPointerGetAttributes (driver_calls.h resolves it). */
#include "alloc_info.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "driver_calls.h"
#include "report.h"

/* The name of a driver result (the common ones; others by number). */
static const char *result_name(CUresult res)
{
    static char other[32];
    switch (res) {
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default:
        snprintf(other, sizeof other, "CUresult %d", (int)res);
        return other;
    }
}

bool alloc_info_query(const void *ptr, struct alloc_info *info)
{
    info->bytes = 0;
    info->pool = false;
    driver_calls_pointer_attributes_fn pointer_get_attributes =
        driver_calls_pointer_attributes();
    if (pointer_get_attributes == NULL)
        return false;
    size_t bytes = 0;
    CUmemoryPool pool = NULL;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
    void *data[] = {&bytes, &pool};
    CUresult res =
        pointer_get_attributes(2, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
    if (res != CUDA_SUCCESS) {
        report("reclaimer: the size of %p is unknown: cuPointerGetAttributes "
               "failed: %s; it is released with cudaFree or cudaFreeHost as "
               "given, and the cap does not count it", ptr, result_name(res));
        return false;
    }
    /* The driver answers a pointer it knows nothing of with every
     * attribute 0 (cuPointerGetAttributes' documentation): its release
     * will fail, and says so. */
    if (bytes == 0)
        return false;
    info->bytes = bytes;
    info->pool = pool != NULL;
    return true;
}

enum alloc_kind alloc_info_kind(const void *ptr, const void **start)
{
    *start = ptr;
    driver_calls_pointer_attributes_fn pointer_get_attributes =
        driver_calls_pointer_attributes();
    if (pointer_get_attributes == NULL)
        return ALLOC_UNSURE;
    size_t bytes = 0;
    CUdeviceptr begin = 0;
    unsigned int type = 0;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
    void *data[] = {&bytes, &begin, &type};
    if (pointer_get_attributes(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr) !=
        CUDA_SUCCESS)
        return ALLOC_UNSURE;
    if (bytes == 0)
        return ALLOC_UNKNOWN;
    *start = (const void *)(uintptr_t)begin;
    return type == CU_MEMORYTYPE_HOST ? ALLOC_HOST : ALLOC_DEVICE;
}
