/* SPDX-License-Identifier: MIT */
/* A training loop's allocations replayed on the fake runtime (replay.h). */
#include <stdlib.h>

#include "replay.h"

/* The replay's owner, before anything else.  Bails when an event cannot
 * be made. */
void replay_init(struct replay *r, cudaStream_t stream, unsigned depth,
                 unsigned kernel_us)
{
    if (depth == 0)
        bail("replay: a launch queue of 0 kernels");
    *r = (struct replay){.stream = stream, .kernel_us = kernel_us,
                         .depth = depth};
    r->queued = calloc(depth, sizeof *r->queued);
    if (r->queued == NULL)
        bail("replay: out of memory for a queue of %u kernels", depth);
    for (unsigned i = 0; i < depth; i++)
        if (cudaEventCreate(&r->queued[i]) != cudaSuccess)
            bail("cudaEventCreate");
}

/* The replay's owner, once done.  Blocks until the stream is idle. */
void replay_finish(struct replay *r)
{
    if (cudaStreamSynchronize(r->stream) != cudaSuccess)
        bail("cudaStreamSynchronize");
    for (unsigned i = 0; i < r->depth; i++)
        cudaEventDestroy(r->queued[i]);
    free(r->queued);
    r->queued = NULL;
}

/* The replay's owner.  Blocks where defer_alloc does. */
void *replay_take(struct replay *r, size_t bytes)
{
    void *p = NULL;
    if (r->pluggable) {
        if (defer_pluggable_alloc_status(&p, bytes, 0, r->stream) !=
                cudaSuccess || p == NULL)
            bail("defer_pluggable_alloc_status of %zu bytes refused", bytes);
        fake_oracle_handout_range(p, bytes, r->stream);
    } else if (alloc_checked(&p, bytes, r->stream) != cudaSuccess ||
               p == NULL) {
        bail("defer_alloc of %zu bytes refused", bytes);
    }
    r->live += bytes;
    if (r->live > r->live_peak)
        r->live_peak = r->live;
    return p;
}

/* The replay's owner.  Never blocks on the GPU.  defer_pluggable_free
 * returns nothing: a refusal is said on stderr (and counted rejected). */
void replay_give(struct replay *r, void *p, size_t bytes)
{
    if (r->pluggable) {
        defer_pluggable_free(p, bytes, 0, r->stream);
        r->live -= bytes;
        return;
    }
    if (defer_free(p, r->stream) != cudaSuccess)
        bail("defer_free refused");
    r->live -= bytes;
}

/* The replay's owner.  Blocks while the queue is full. */
void replay_kernel(struct replay *r, void *const *uses, size_t n)
{
    cudaEvent_t slot = r->queued[r->launched % r->depth];
    if (r->launched >= r->depth && cudaEventQuery(slot) == cudaErrorNotReady) {
        double t0 = now_ms();
        if (cudaEventSynchronize(slot) != cudaSuccess)
            bail("cudaEventSynchronize");
        r->waited_ms += now_ms() - t0;
    }
    if (fake_launch(r->stream, r->kernel_us, uses, n) == NULL)
        bail("fake_launch refused");
    if (cudaEventRecord(slot, r->stream) != cudaSuccess)
        bail("cudaEventRecord");
    r->launched++;
}

/* The replay's owner.  Never blocks. */
unsigned replay_kernels_behind(const struct replay *r)
{
    unsigned n = 0;
    for (unsigned i = 0; i < r->depth && i < r->launched; i++)
        n += cudaEventQuery(r->queued[i]) == cudaErrorNotReady;
    return n;
}

/* The replay's owner.  Never blocks. */
void replay_pace(struct replay *r, double cpu_ms, unsigned long long kernels)
{
    if (kernels == 0)
        return;
    double us = 2000.0 * cpu_ms / (double)kernels;
    if (us > REPLAY_MAX_KERNEL_US)
        us = REPLAY_MAX_KERNEL_US;
    if (us > r->kernel_us)
        r->kernel_us = (unsigned)us;
}

/* Anyone.  Never blocks. */
uint64_t replay_pool_reserved(void)
{
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(fake_mem_pool(0),
                                cudaMemPoolAttrReservedMemCurrent,
                                &reserved) != cudaSuccess)
        bail("cudaMemPoolGetAttribute of the fake pool");
    return reserved;
}

/* Anyone.  Never blocks on the GPU. */
struct replay_cache_counts replay_cache_since(struct defer_stats *since)
{
    struct defer_stats now = stats_now();
    struct replay_cache_counts c = {
        .misses = now.cache_mallocs - since->cache_mallocs,
        .releases = now.cache_releases - since->cache_releases};
    *since = now;
    return c;
}
