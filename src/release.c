/* Release of one completed entry. */
#include "release.h"

#include <stdio.h>
#include <stdlib.h>

#include "block_cache.h"
#include "report.h"

/* Free one pointer of e; report a failure with the pointer named. */
static cudaError_t release_pointer(const struct entry *e, void *ptr,
                                   cudaStream_t async_stream)
{
    cudaError_t err;
    const char *call;
    /* A block of the cache goes back to it: reusable by any stream now. */
    if (e->kind != ENTRY_FREE_HOST && block_cache_adopt(ptr))
        return cudaSuccess;
    if (e->kind == ENTRY_FREE_HOST) {
        err = cudaFreeHost(ptr);
        call = "cudaFreeHost";
    } else if (e->pool && async_stream != NULL &&
               ((err = cudaFreeAsync(ptr, async_stream)) == cudaSuccess ||
                err == cudaErrorInvalidValue)) {
        /* A pointer cudaFreeAsync rejects (an interior one, say) would be
         * rejected by cudaFree too: reported below, not tried twice. */
        call = "cudaFreeAsync";
    } else {
        if (e->pool && async_stream != NULL) {
            char detail[96];
            snprintf(detail, sizeof detail, "; freeing %p with cudaFree instead",
                     ptr);
            report_cuda("release", "cudaFreeAsync", err, detail);
        }
        err = cudaFree(ptr);
        call = "cudaFree";
    }
    /* A sticky error is the device's, not the pointer's: the caller marks
     * the device failed and says so once. */
    if (err != cudaSuccess && !report_cuda_error_is_sticky(err)) {
        char detail[96];
        snprintf(detail, sizeof detail, "; %p (device %d) is not released",
                 ptr, e->device);
        report_cuda("release", call, err, detail);
    }
    return err;
}

cudaError_t release_entry(const struct entry *e, cudaStream_t async_stream)
{
    if (e->kind == ENTRY_CALL) {
        e->fn(e->arg);
        return cudaSuccess;
    }
    cudaError_t first = cudaSuccess;
    for (size_t i = 0; i < e->nptrs; i++) {
        cudaError_t err = release_pointer(e, e->ptrs[i], async_stream);
        if (first == cudaSuccess)
            first = err;
    }
    return first;
}

void release_forget_pointers(struct entry *e)
{
    if (e->ptrs != &e->one_ptr)
        free(e->ptrs);
    e->ptrs = &e->one_ptr;
    e->nptrs = 0;
}
