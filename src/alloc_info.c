/* Allocation size and pool membership through the driver's
 * cuPointerGetAttributes, resolved once via the runtime. */
#include "alloc_info.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "report.h"

typedef CUresult (*pointer_get_attributes_fn)(unsigned int,
                                              CUpointer_attribute *,
                                              void **, CUdeviceptr);

enum { UNRESOLVED, RESOLVED, UNAVAILABLE };
static int resolution = UNRESOLVED;
static pointer_get_attributes_fn pointer_get_attributes;

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
    if (pointer_get_attributes(2, attrs, data, (CUdeviceptr)(uintptr_t)ptr) !=
        CUDA_SUCCESS)
        return false;
    info->bytes = bytes;
    info->pool = pool != NULL;
    return true;
}

void alloc_info_reset(void)
{
    resolution = UNRESOLVED;
    pointer_get_attributes = NULL;
}
