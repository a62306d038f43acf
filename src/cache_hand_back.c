/* SPDX-License-Identifier: MIT */
/* A miss's hand-back: cached segments the request's new block needs go
 * back to the device's upstream pool before it grows (cache.h says which
 * file holds what, and what cache_hand_back does). */
#include "cache.h"

#include "cuda.h"
#include "stats.h"

/* Hand the memory of n blocks that left the cache back to device's pool,
 * ordered on stream, or with cudaFree where cudaFreeAsync fails
 * (cache_upstream_free).  Returns the bytes of those released; one neither
 * call released is reported as what's (the request goes on), counted as a
 * failed release (never as released), and still lent in the pool's
 * books. */
static size_t give_to_pool(const char *what, int device,
                           const struct block_memory *m, size_t n,
                           cudaStream_t stream)
{
    size_t bytes = 0, released = 0;
    for (size_t i = 0; i < n; i++) {
        const char *call;
        cudaError_t err = cache_upstream_free(what, device, m[i].ptr,
                                              m[i].size, stream, &call);
        if (err != cudaSuccess)
            cuda_report_failure(what, call, err,
                                "; a free block is lost to the pool");
        if (err == cudaSuccess) {
            bytes += m[i].size;
            released++;
        }
    }
    stats_device_count_releases(device, released);
    stats_device_count_release_failures(device, n - released);
    return bytes;
}

/* Why only what is lacking, and the largest first: cache.h. */
void cache_hand_back(const char *what, int device, size_t need,
                     cudaStream_t stream, unsigned long long stream_id,
                     uint64_t before_ns)
{
    if (!cache_upstream_exists(device))
        return;
    size_t slack = cache_upstream_slack(device);
    size_t lacking = need > slack ? need - slack : 0, n, got;
    struct block_memory memory[64];
    while (lacking > 0 &&
           (n = cache_reclaim_for_miss(device, stream_id, before_ns, memory,
                                       64, lacking)) > 0) {
        size_t handed = 0;
        for (size_t i = 0; i < n; i++)
            handed += memory[i].size;
        got = give_to_pool(what, device, memory, n, stream);
        /* A block neither call released is lost (said): the next would
         * most likely go the same way, so the hand-back stops at the first
         * loss rather than empty the cache; the request goes on to its new
         * block (out of memory, its trim still has the cache's rest). */
        if (got < handed)
            break;
        lacking = got < lacking ? lacking - got : 0;
    }
}
