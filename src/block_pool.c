/* Block pool: one cudaMemPool per device behind the block cache (see the
 * header). */
#include "block_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda.h"
#include "report.h"

enum { POOL_UNTRIED, POOL_READY, POOL_NONE };

struct pool {
    _Atomic int state;
    cudaMemPool_t pool;
    _Atomic uint64_t held; /* bytes of blocks taken and not handed back */
    _Atomic uint64_t device_bytes; /* the device's memory; 0: not known yet */
};

static struct pool *pools;
static int npools;
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

bool block_pool_init(int ndevices)
{
    pools = calloc((size_t)(ndevices > 0 ? ndevices : 1), sizeof *pools);
    npools = pools != NULL ? ndevices : 0;
    return pools != NULL;
}

void block_pool_destroy_all(void)
{
    for (int d = 0; d < npools; d++)
        if (atomic_load(&pools[d].state) == POOL_READY)
            cudaMemPoolDestroy(pools[d].pool);
    free(pools);
    pools = NULL;
    npools = 0;
}

void block_pool_fork_child(void)
{
    pthread_mutex_init(&create_lock, NULL);
    pools = NULL; /* the child has no CUDA: the parent's pools are of no use */
    npools = 0;
}

/* Create device's pool, once; false when there is none (reported once). */
static bool pool_ready(int device)
{
    struct pool *p = &pools[device];
    int state = atomic_load_explicit(&p->state, memory_order_acquire);
    if (state != POOL_UNTRIED)
        return state == POOL_READY;
    pthread_mutex_lock(&create_lock); /* a CUDA call under it: only here */
    if ((state = atomic_load(&p->state)) == POOL_UNTRIED) {
        struct cudaMemPoolProps props = {0};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        cudaError_t err = cudaMemPoolCreate(&p->pool, &props);
        uint64_t keep = UINT64_MAX;
        if (err == cudaSuccess &&
            (err = cudaMemPoolSetAttribute(p->pool,
                                           cudaMemPoolAttrReleaseThreshold,
                                           &keep)) != cudaSuccess)
            cudaMemPoolDestroy(p->pool);
        if (err != cudaSuccess) {
            cudaGetLastError();
            cuda_report_failure("defer_alloc", "cudaMemPoolCreate", err,
                                "; blocks come from cudaMalloc on this device");
        }
        state = err == cudaSuccess ? POOL_READY : POOL_NONE;
        atomic_store_explicit(&p->state, state, memory_order_release);
    }
    pthread_mutex_unlock(&create_lock);
    return state == POOL_READY;
}

bool block_pool_beyond_device(int device, size_t bytes)
{
    if (device < 0 || device >= npools)
        return false;
    uint64_t total = atomic_load_explicit(&pools[device].device_bytes,
                                          memory_order_relaxed);
    if (total == 0) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
            cudaGetLastError(); /* not known: no guard, asked again later */
            return false;
        }
        total = prop.totalGlobalMem;
        atomic_store_explicit(&pools[device].device_bytes, total,
                              memory_order_relaxed);
    }
    return bytes > total;
}

/* cudaMalloc on device from any thread, restoring its current device; a
 * failed switch back frees the block and returns that error (said, where
 * cudaMalloc's error is the one returned). */
static cudaError_t malloc_on(int device, void **ptr, size_t bytes)
{
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    cudaError_t err = cuda_switch_device(&sw, device, NULL);
    if (err != cudaSuccess)
        return err;
    err = cudaMalloc(ptr, bytes);
    cudaError_t back =
        cuda_switch_back(&sw, err == cudaSuccess ? NULL : "defer_alloc");
    if (err == cudaSuccess && back != cudaSuccess) {
        cudaFree(*ptr);
        *ptr = NULL;
        err = back;
    }
    return err;
}

cudaError_t block_pool_malloc(int device, size_t bytes, cudaStream_t stream,
                              void **ptr, bool *pooled)
{
    *pooled = device >= 0 && device < npools && pool_ready(device);
    cudaError_t err =
        *pooled ? cudaMallocFromPoolAsync(ptr, bytes, pools[device].pool, stream)
                : malloc_on(device, ptr, bytes);
    if (err != cudaSuccess && !cuda_error_is_sticky(err))
        cudaGetLastError(); /* not sticky: clear it for the caller */
    else if (err == cudaSuccess && *pooled)
        atomic_fetch_add(&pools[device].held, bytes);
    return err;
}

cudaError_t block_pool_free(int device, void *ptr, size_t bytes,
                            cudaStream_t stream)
{
    cudaError_t err = cudaFreeAsync(ptr, stream);
    if (err == cudaSuccess) /* else the memory stays lent: lost to the pool */
        block_pool_forget(device, bytes);
    return err;
}

void block_pool_forget(int device, size_t bytes)
{
    if (device >= 0 && device < npools)
        atomic_fetch_sub(&pools[device].held, bytes);
}

cudaError_t block_pool_free_sync(int device, void *ptr, size_t bytes)
{
    cudaError_t err = cudaFree(ptr);
    if (err == cudaSuccess)
        block_pool_forget(device, bytes);
    return err;
}

size_t block_pool_slack(int device)
{
    if (!block_pool_exists(device))
        return 0;
    uint64_t reserved = 0;
    if (cudaMemPoolGetAttribute(pools[device].pool,
                                cudaMemPoolAttrReservedMemCurrent,
                                &reserved) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    uint64_t held = atomic_load(&pools[device].held);
    return reserved > held ? (size_t)(reserved - held) : 0;
}

bool block_pool_exists(int device)
{
    return device >= 0 && device < npools &&
           atomic_load(&pools[device].state) == POOL_READY;
}

size_t block_pool_trim(int device, cudaStream_t stream)
{
    if (device < 0 || device >= npools ||
        atomic_load(&pools[device].state) != POOL_READY)
        return 0;
    cudaMemPool_t pool = pools[device].pool;
    /* The frees were ordered on stream: the trim must come after them.  The
     * stream holds nothing but frees, so this costs no device drain. */
    if (stream != NULL)
        cudaStreamSynchronize(stream);
    uint64_t before = 0, after = 0;
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &before);
    cudaError_t err = cudaMemPoolTrimTo(pool, 0);
    if (err != cudaSuccess)
        cuda_report_failure("release", "cudaMemPoolTrimTo", err, "");
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent,
                                &after) != cudaSuccess)
        after = before;
    return before > after ? (size_t)(before - after) : 0;
}
