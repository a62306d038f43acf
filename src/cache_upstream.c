/* SPDX-License-Identifier: MIT */
/* The block cache's upstream: one stream-ordered memory pool of cudefer's
 * own per device (cudaMemPoolCreate), where new segments come from (cache.h
 * says which file holds what, and what each function does).
 *
 * Every call on a pool, and each cudaMalloc and cudaFree here, goes through
 * the CUDA layer's relaxed calls (cuda.h, "the block cache's memory"): CUDA
 * counts them "potentially unsafe", so in the calling thread's default
 * Global mode, while another thread captures in Global mode, each would be
 * refused and invalidate that capture (bench/probes/capture_unsafe.cu). */
#define _GNU_SOURCE /* PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP */
#include "cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda.h"
#include "report.h"

enum { MEMPOOL_UNTRIED, MEMPOOL_READY, MEMPOOL_NONE };

struct mempool {
    _Atomic int state;
    cudaMemPool_t pool;
    _Atomic uint64_t held; /* bytes of blocks taken and not handed back */
    _Atomic uint64_t device_bytes; /* the device's memory; 0: not known yet */
};

static struct mempool *mempools;
static int nmempools;
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
/* A trim measures what it released as the shrink of a pool's reserve
 * across cudaMemPoolTrimTo; an allocation from the pool in between may grow
 * that reserve and hide released bytes.  Only cudefer allocates from its
 * pools (their handles are its own), so allocations (readers) and trims
 * (the writer) exclude each other, and the measure is exact: a miss waits
 * for the three calls of a trim under way, a trim for the allocations
 * under way.  Taken under no other lock; the child of a fork makes it
 * anew, as create_lock.  Writers first: misses on several threads may
 * overlap without a gap, and a trim that let new readers pass it would
 * wait until they all stopped, the reclaimer stuck with it.  So no thread
 * takes it for reading twice (a second read would wait behind the trim
 * that waits for the first). */
static pthread_rwlock_t trim_lock =
    PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;

bool cache_upstream_init(int ndevices)
{
    mempools = calloc((size_t)(ndevices > 0 ? ndevices : 1), sizeof *mempools);
    nmempools = mempools != NULL ? ndevices : 0;
    return mempools != NULL;
}

void cache_upstream_destroy(void)
{
    for (int d = 0; d < nmempools; d++)
        if (atomic_load(&mempools[d].state) == MEMPOOL_READY)
            cuda_pool_destroy(mempools[d].pool);
    free(mempools);
    mempools = NULL;
    nmempools = 0;
}

void cache_upstream_fork_child(void)
{
    pthread_mutex_init(&create_lock, NULL);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&trim_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    mempools = NULL; /* the child has no CUDA: the parent's are of no use */
    nmempools = 0;
}

/* Under create_lock: makes p's pool for device, its release threshold the
 * maximum; false when CUDA cannot (said in the words of what, the call
 * the user made: the device's blocks come from cudaMalloc). */
static bool mempool_create(struct mempool *p, int device, const char *what)
{
    const char *call;
    cudaError_t err = cuda_pool_create(device, &p->pool, &call);
    if (err != cudaSuccess) {
        cuda_forget_failure(err);
        cuda_report_failure(what, call, err,
                            "; blocks come from cudaMalloc on this device");
    }
    return err == cudaSuccess;
}

/* Create device's pool, once, for what (the call the user made, which
 * says a failure); false when there is none.  A device without
 * memory pools (cudaDevAttrMemoryPoolsSupported 0) has none quietly:
 * nothing failed, cudaMalloc is its way (cudefer(7)).  Its CUDA calls,
 * made under create_lock (Note [Locks]): the first miss of each device,
 * once. */
static bool mempool_ready(int device, const char *what)
{
    struct mempool *p = &mempools[device];
    int state = atomic_load_explicit(&p->state, memory_order_acquire);
    if (state != MEMPOOL_UNTRIED)
        return state == MEMPOOL_READY;
    pthread_mutex_lock(&create_lock);
    if ((state = atomic_load(&p->state)) == MEMPOOL_UNTRIED) {
        state = cuda_device_has_pools(device) && mempool_create(p, device, what)
                    ? MEMPOOL_READY
                    : MEMPOOL_NONE;
        atomic_store_explicit(&p->state, state, memory_order_release);
    }
    pthread_mutex_unlock(&create_lock);
    return state == MEMPOOL_READY;
}

bool cache_upstream_beyond_device(int device, size_t bytes)
{
    if (device < 0 || device >= nmempools)
        return false;
    uint64_t total = atomic_load_explicit(&mempools[device].device_bytes,
                                          memory_order_relaxed);
    if (total == 0) {
        if (cuda_device_memory(device, &total) != cudaSuccess)
            return false; /* not known: no guard, asked again later */
        atomic_store_explicit(&mempools[device].device_bytes, total,
                              memory_order_relaxed);
    }
    return bytes > total;
}

/* cudaMalloc on device from any thread, restoring its current device; a
 * failed switch back frees the block and returns that error (said in the
 * words of what, where cudaMalloc's error is the one returned). */
static cudaError_t malloc_on(const char *what, int device, void **ptr,
                             size_t bytes)
{
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    cudaError_t err = cuda_switch_device(&sw, device, NULL);
    if (err != cudaSuccess)
        return err;
    err = cuda_malloc_relaxed(ptr, bytes);
    cudaError_t back =
        cuda_switch_back(&sw, err == cudaSuccess ? NULL : what);
    if (err == cudaSuccess && back != cudaSuccess) {
        cuda_free_relaxed(*ptr);
        *ptr = NULL;
        err = back;
    }
    return err;
}

cudaError_t cache_upstream_malloc(const char *what, int device, size_t bytes,
                                  cudaStream_t stream, void **ptr,
                                  bool *upstream)
{
    *upstream =
        device >= 0 && device < nmempools && mempool_ready(device, what);
    cudaError_t err;
    if (*upstream) {
        pthread_rwlock_rdlock(&trim_lock);
        err = cuda_pool_malloc(ptr, bytes, mempools[device].pool, stream);
        pthread_rwlock_unlock(&trim_lock);
    } else {
        err = malloc_on(what, device, ptr, bytes);
    }
    cuda_forget_failure(err); /* the caller's to say */
    if (err == cudaSuccess && *upstream)
        atomic_fetch_add(&mempools[device].held, bytes);
    return err;
}

/* Both frees relaxed (above): a miss on an application thread hands
 * cached blocks back while another thread may capture, or while the thread
 * captures another stream; the blocks are in no capture (a free into one
 * waits for its graph before the block is cached again).  A failure is
 * returned to cudefer's caller, never to the application's: a miss goes on
 * to its block, so the error it left (not a sticky one) is cleared, or the
 * application's next cudaGetLastError would take it for its own (cuda.h).
 * The fallback to cudaFree: a block given here has left the cache, and
 * nothing else would ever release it. */
cudaError_t cache_upstream_free(const char *what, int device, void *ptr,
                                size_t bytes, cudaStream_t stream,
                                const char **call)
{
    *call = "cudaFreeAsync";
    cudaError_t err = cuda_free_async_relaxed(ptr, stream);
    if (err == cudaSuccess)
        cache_upstream_forget(device, bytes);
    cuda_forget_failure(err);
    if (err == cudaSuccess || cuda_error_is_sticky(err))
        return err;
    cuda_report_failure(what, *call, err,
                        "; the block goes back with cudaFree");
    *call = "cudaFree";
    return cache_upstream_free_sync(device, ptr, bytes);
}

cudaError_t cache_upstream_free_sync(int device, void *ptr, size_t bytes)
{
    cudaError_t err = cuda_free_relaxed(ptr);
    if (err == cudaSuccess) /* else the memory stays lent: lost to the pool */
        cache_upstream_forget(device, bytes);
    cuda_forget_failure(err);
    return err;
}

void cache_upstream_forget(int device, size_t bytes)
{
    if (device >= 0 && device < nmempools)
        atomic_fetch_sub(&mempools[device].held, bytes);
}

size_t cache_upstream_slack(int device)
{
    if (!cache_upstream_exists(device))
        return 0;
    uint64_t reserved = 0;
    cudaError_t err = cuda_pool_reserved(mempools[device].pool, &reserved);
    if (err != cudaSuccess) {
        cuda_forget_failure(err);
        return 0;
    }
    uint64_t held = atomic_load(&mempools[device].held);
    return reserved > held ? (size_t)(reserved - held) : 0;
}

cudaError_t cache_upstream_grant(int device, int peer, const char **call)
{
    *call = NULL;
    if (device < 0 || device >= nmempools || peer < 0 || peer >= nmempools)
        return cudaErrorInvalidDevice;
    if (peer == device || !mempool_ready(device, "defer_peer_access"))
        return cudaSuccess;
    bool can = false;
    *call = "cudaDeviceCanAccessPeer";
    cudaError_t err = cuda_can_access_peer(device, peer, &can);
    if (err == cudaSuccess && !can)
        return cudaErrorPeerAccessUnsupported;
    if (err == cudaSuccess) {
        *call = "cudaMemPoolSetAccess";
        err = cuda_pool_grant(mempools[device].pool, peer);
    }
    cuda_forget_failure(err); /* the caller's to say */
    return err;
}

bool cache_upstream_exists(int device)
{
    return device >= 0 && device < nmempools &&
           atomic_load(&mempools[device].state) == MEMPOOL_READY;
}

size_t cache_upstream_trim(int device,
                           void (*fail)(int device, const char *call,
                                        cudaError_t err))
{
    if (device < 0 || device >= nmempools ||
        atomic_load(&mempools[device].state) != MEMPOOL_READY)
        return 0;
    cudaMemPool_t pool = mempools[device].pool;
    uint64_t before = 0, after = 0;
    pthread_rwlock_wrlock(&trim_lock); /* no allocation grows it meanwhile */
    cuda_pool_reserved(pool, &before);
    cudaError_t err = cuda_pool_trim(pool);
    cudaError_t got = cuda_pool_reserved(pool, &after);
    pthread_rwlock_unlock(&trim_lock);
    if (cuda_error_is_sticky(err)) /* the device's, not the pool's */
        fail(device, "cudaMemPoolTrimTo", err);
    else if (err != cudaSuccess)
        cuda_report_failure("release", "cudaMemPoolTrimTo", err, "");
    if (got != cudaSuccess)
        after = before;
    return before > after ? (size_t)(before - after) : 0;
}
