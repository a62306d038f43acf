/* The reclaimer's side of the block cache (block_cache.h): which free
 * blocks go back to the pool or to CUDA, and when (expiry, trim, shutdown),
 * and when the reclaimer must wake up for it.  Reclaimer thread only. */
#include "reclaimer_state.h"

#include <stdatomic.h>
#include <stdio.h>

#include "block_cache.h"
#include "block_leave.h"
#include "block_pool.h"
#include "cuda.h"
#include "release_policy.h"
#include "report.h"
#include "stats.h"
#include "trace.h"

#define NS_PER_MS UINT64_C(1000000)

/* Release the cache's FREE blocks that nobody took for cache_keep_ms, at a
 * quiet moment (or once 4 x cache_keep_ms passed, quiet or not), and every
 * one on a trim and at shutdown: a batch per device, one cudaFree each.
 * Blocks are reused in the steady state, so these batches are rare: each
 * block is released at most once. */
void reclaimer_cache_release(uint64_t now, bool stopping)
{
    bool all = rs.trims != NULL || stopping;
    struct policy_view view = reclaimer_view_now(now);
    uint64_t keep_ns = (uint64_t)rs.cfg.cache_keep_ms * NS_PER_MS;
    if (!release_policy_quiet(&rs.cfg, &view))
        keep_ns *= 4;
    if (!all && (keep_ns == 0 || now <= keep_ns))
        return;
    uint64_t before = all ? UINT64_MAX : now - keep_ns;
    for (int d = 0; d < rs.ndevices; d++) {
        uint64_t oldest = block_leave_oldest_free_ns(d);
        bool blocks = oldest != UINT64_MAX && oldest <= before;
        bool pool = all && block_pool_exists(d);
        if ((!blocks && !pool) || device_error(d) != cudaSuccess ||
            !reclaimer_use_device(d))
            continue;
        trace_push(all ? "cudefer: cache trim" : "cudefer: cache expiry");
        struct cache_block *batch[64];
        uint64_t released = 0;
        size_t n;
        cudaStream_t async = reclaimer_free_stream(d);
        while ((n = block_leave_expired(d, before, batch, 64, SIZE_MAX)) > 0) {
            for (size_t i = 0; i < n; i++) {
                /* Pool blocks go back to the pool at no cost; others (no
                 * pool could be made) drain the device. */
                struct cache_block *b = batch[i];
                cudaError_t err =
                    !b->pool ? cudaFree(b->ptr)
                    : async != NULL
                        ? block_pool_free(d, b->ptr, b->size, async)
                        : block_pool_free_sync(d, b->ptr, b->size);
                /* The call that failed, by name (a failed cudaFreeAsync was
                 * said as cudaFree before; t/alloc_pool). */
                const char *call =
                    b->pool && async != NULL ? "cudaFreeAsync" : "cudaFree";
                if (err == cudaSuccess) {
                    released++;
                    /* A pool block's bytes leave the device only when the
                     * pool gives back its reserve (a trim, below: counted
                     * there, once; before the fix, twice). */
                    if (!b->pool)
                        rs.pass_released_bytes += b->size;
                } else if (cuda_error_is_sticky(err)) {
                    reclaimer_fail_device(d, call, err);
                } else {
                    char detail[96];
                    snprintf(detail, sizeof detail,
                             "; block %p (device %d) is not released",
                             batch[i]->ptr, d);
                    cuda_report_failure("release", call, err, detail);
                }
                block_cache_forget(batch[i]);
            }
        }
        if (all) /* the pool's unused memory back to CUDA too */
            rs.pass_released_bytes += block_pool_trim(d, async);
        trace_pop();
        stats_add(&stats.cache_releases, released);
    }
}

/* When the next cached block is released (UINT64_MAX: none, or never), as
 * reclaimer_cache_release decides: cache_keep_ms after it was freed if the
 * application is quiet then, else once it is, at most 4 x cache_keep_ms
 * after; never for a failed device's blocks.  The deadline was the first
 * of those alone: past it, with the block not released, the reclaimer's
 * timed sleep ended at once, pass after pass (3,000 wake-ups in 200 ms;
 * found by a review helper). */
uint64_t reclaimer_cache_expiry_ns(void)
{
    if (rs.cfg.cache_keep_ms == 0)
        return UINT64_MAX;
    uint64_t keep = (uint64_t)rs.cfg.cache_keep_ms * NS_PER_MS;
    struct policy_view view = reclaimer_view_now(0);
    uint64_t quiet_at = release_policy_quiet_at(&rs.cfg, &view);
    uint64_t next = UINT64_MAX;
    for (int d = 0; d < rs.ndevices; d++) {
        uint64_t freed = block_leave_oldest_free_ns(d);
        if (freed == UINT64_MAX || device_error(d) != cudaSuccess)
            continue;
        uint64_t at = freed + keep;
        if (at < quiet_at)
            at = quiet_at < freed + 4 * keep ? quiet_at : freed + 4 * keep;
        if (at < next)
            next = at;
    }
    return next;
}
