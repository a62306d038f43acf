/*
 * Block leave: the blocks that leave the block cache (block_cache.h) and
 * give their memory back to the device's pool or to CUDA.  The reclaimer
 * collects FREE whole segments nobody took for a while (expiry), or all of
 * them (trim, shutdown), oldest first; a request that missed takes back
 * pool segments, the largest first, for the pool to serve it.  Each call
 * holds the device's mutex only while it picks; none makes a CUDA call.
 */
#ifndef CUDEFER_BLOCK_LEAVE_H
#define CUDEFER_BLOCK_LEAVE_H

#include <stddef.h>
#include <stdint.h>

#include "block_cache.h"

/* Reclaimer.  Removes FREE blocks of device that became free at or before
 * freed_before_ns (UINT64_MAX: all), oldest first, into out: at most max
 * of them, and no more once their sizes add up to max_bytes (SIZE_MAX: no
 * such limit).  The caller releases each
 * (block_pool_free for pool blocks, else cudaFree) and gives it to
 * block_cache_forget.  Returns how many. */
size_t block_leave_expired(int device, uint64_t freed_before_ns,
                           struct cache_block **out, size_t max,
                           size_t max_bytes);

/* The memory of a block that left the cache. */
struct block_memory {
    void *ptr;
    size_t size;
};

/* A request that missed, on stream stream_id of device.  Removes pool
 * blocks that are FREE (free at or before freed_before_ns, named by no
 * entry) or PENDING on that stream, the largest first (size for size, FREE
 * first), at most max of them and no more once their sizes add up to
 * max_bytes, and copies their memory to out: the caller hands it back to
 * the pool, ordered on that very stream.  The records are not the caller's:
 * a FREE one is forgotten here; a PENDING one is GONE and goes (on the
 * reclaimer) once the entry that names it is done, which may be before the
 * caller reads out.  Returns how many.  Never blocks but on the device's
 * mutex. */
size_t block_leave_for_miss(int device, unsigned long long stream_id,
                            uint64_t freed_before_ns, struct block_memory *out,
                            size_t max, size_t max_bytes);

/* Reclaimer.  The time from which block_leave_expired takes a FREE block
 * of device: the first one no entry names, at the latest free time of the
 * blocks before it on the age list (UINT64_MAX: none).  The reclaimer
 * sleeps until then plus cache_keep_ms; an earlier time would end every
 * such sleep at once. */
uint64_t block_leave_oldest_free_ns(int device);

#endif
