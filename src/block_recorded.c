/* The streams recorded as users of a block (defer_record_stream): kept on
 * the block's record, under its device's lock (see the header). */
#include "block_recorded.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "block_bins.h"
#include "block_map.h"
#include "report.h"

cudaError_t block_recorded_add(void *ptr, const struct block_user *user)
{
    struct device_cache *c;
    struct cache_block *b = block_cache_find_locked(ptr, &c);
    if (b == NULL) {
        /* python/record_stream_hook.cpp carries on after this (PyTorch's
         * own allocator ignores memory it does not own): the message is
         * the user's only sign. */
        report("defer_record_stream: %p is not the start of a block of "
               "cudefer's (memory from elsewhere, or a pointer inside a "
               "block): nothing recorded", ptr);
        return cudaErrorInvalidValue;
    }
    cudaError_t err = cudaSuccess;
    bool known = false;
    /* Ids told apart by device too: the legacy streams of two devices
     * may share one. */
    for (uint32_t i = 0; i < b->nrecorded && !known; i++)
        known = b->recorded[i].id == user->id &&
                b->recorded[i].device == user->device;
    if (b->state != BLOCK_LIVE) {
        err = cudaErrorInvalidValue;
    } else if (known) {
        /* once is enough */
    } else if (b->nrecorded == BLOCK_MAX_RECORDED) {
        /* Not cudaErrorInvalidValue: python/record_stream_hook.cpp takes
         * that for memory that is not cudefer's, and carries on. */
        err = cudaErrorNotSupported;
    } else {
        /* An array of the largest size at once: a block rarely has any. */
        if (b->recorded == NULL)
            b->recorded = malloc(BLOCK_MAX_RECORDED * sizeof *b->recorded);
        if (b->recorded == NULL)
            err = cudaErrorMemoryAllocation;
        else
            b->recorded[b->nrecorded++] = *user;
    }
    pthread_mutex_unlock(&c->lock);
    if (err != cudaSuccess)
        report("defer_record_stream: %p %s: nothing recorded", ptr,
               err == cudaErrorNotSupported
                   ? "is already recorded on 63 streams (the most)"
               : err == cudaErrorMemoryAllocation
                   ? "needs its list of streams: out of host memory"
                   : "is no live block of cudefer's (already freed?)");
    return err;
}

size_t block_recorded_of(const void *ptr, struct block_user *out)
{
    struct device_cache *c;
    struct cache_block *b = block_cache_find_locked(ptr, &c);
    if (b == NULL)
        return 0;
    size_t n = b->state == BLOCK_LIVE || b->state == BLOCK_FREEING
                   ? b->nrecorded
                   : 0;
    if (out != NULL && n > 0)
        memcpy(out, b->recorded, n * sizeof *out);
    pthread_mutex_unlock(&c->lock);
    return n;
}
