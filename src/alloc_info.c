/* Allocation size and pool membership through the driver's
 * cuPointerGetAttributes, resolved once via the runtime. */
#include "alloc_info.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

#include "report.h"

typedef CUresult (*pointer_get_attributes_fn)(unsigned int,
                                              CUpointer_attribute *,
                                              void **, CUdeviceptr);

enum { UNRESOLVED, RESOLVED, UNAVAILABLE };
static int resolution = UNRESOLVED;
static pointer_get_attributes_fn pointer_get_attributes;

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

/* Look the entry point up once; later calls reuse the answer. */
static bool resolve(void)
{
    if (resolution == UNRESOLVED) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult status;
        cudaError_t err = cudaGetDriverEntryPointByVersion(
            "cuPointerGetAttributes", &fn, 12000, cudaEnableDefault, &status);
        if (err == cudaSuccess && status == cudaDriverEntryPointSuccess &&
            fn != NULL) {
            pointer_get_attributes = (pointer_get_attributes_fn)fn;
            resolution = RESOLVED;
        } else {
            resolution = UNAVAILABLE;
            report_cuda("reclaimer", "cudaGetDriverEntryPointByVersion"
                        "(cuPointerGetAttributes)",
                        err != cudaSuccess ? err : cudaErrorSymbolNotFound,
                        "; allocation sizes and pools are unknown: pool "
                        "memory is freed with cudaFree, and the cap does "
                        "not see these bytes");
        }
    }
    return resolution == RESOLVED;
}

bool alloc_info_query(const void *ptr, struct alloc_info *info)
{
    info->bytes = 0;
    info->pool = false;
    if (!resolve())
        return false;
    size_t bytes = 0;
    CUmemoryPool pool = NULL;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
    void *data[] = {&bytes, &pool};
    CUresult res =
        pointer_get_attributes(2, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
    if (res != CUDA_SUCCESS) {
        report("reclaimer: cuPointerGetAttributes(%p) failed: %s; its size "
               "and pool are unknown (it is freed with cudaFree or "
               "cudaFreeHost, and the cap does not see it)",
               ptr, result_name(res));
        return false;
    }
    info->bytes = bytes;
    info->pool = pool != NULL;
    return true;
}

void alloc_info_reset(void)
{
    resolution = UNRESOLVED;
    pointer_get_attributes = NULL;
}
