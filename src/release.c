/* Release of one completed entry. */
#include "release.h"

#include <stdio.h>

#include "report.h"

cudaError_t release_entry(const struct entry *e)
{
    cudaError_t err = cudaSuccess;
    const char *call = NULL;
    switch (e->kind) {
    case ENTRY_FREE_DEVICE:
        err = cudaFree(e->u.ptr);
        call = "cudaFree";
        break;
    case ENTRY_FREE_HOST:
        err = cudaFreeHost(e->u.ptr);
        call = "cudaFreeHost";
        break;
    case ENTRY_CALL:
        e->u.call.fn(e->u.call.arg);
        break;
    case ENTRY_FLUSH:
        break;
    }
    if (err != cudaSuccess) {
        char detail[96];
        snprintf(detail, sizeof detail,
                 "; %p (device %d) is not released", e->u.ptr, e->device);
        report_cuda("release", call, err, detail);
    }
    return err;
}
