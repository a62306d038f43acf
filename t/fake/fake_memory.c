/* SPDX-License-Identifier: MIT */
/*
 * fake_memory.c — memory.  Device memory (cudaMalloc), stream-ordered pool
 * memory (cudaMallocAsync / cudaFreeAsync) and pinned host memory
 * (cudaMallocHost / cudaHostAlloc) get fake addresses from a counter that
 * never goes back, unless fake_set_address_reuse asked for addresses to be
 * reused as a real allocator does.  Every release is checked by the oracle
 * (fake_oracle.c) against the work that uses the allocation.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <stdlib.h>
#include <string.h>

#define PAGE          ((uintptr_t)4096u)
#define MAX_ALLOC     ((size_t)1 << 46)             /* larger: out of memory */

/* The allocation containing p (exact: starting at p), or NULL. */
struct falloc *fake_alloc_find(const void *p, int exact)
{
    uintptr_t v = (uintptr_t)p;
    size_t lo = 0, hi = fake.nallocs;

    while (lo < hi) {           /* first allocation with addr > v */
        size_t mid = lo + (hi - lo) / 2;

        if (fake.allocs[mid].addr <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    {
        struct falloc *a = &fake.allocs[lo - 1];

        if (exact ? a->addr == v : v - a->addr < a->size)
            return a;
    }
    return NULL;
}

/* Under fake_set_address_reuse: the released allocation of the lowest
 * address whose memory may serve a new one of size bytes of kind (device
 * and pool memory share addresses, host memory has its own): as large, and
 * released for good (a cudaFreeAsync once its stream reached the free), or
 * pool memory freed on the very stream s a pool allocation is ordered on
 * (stream order: the new one is used after the old one's work, as a real
 * pool hands it out; fake_alloc_ordered then keeps it from other streams
 * until that work is done).  NULL if none.  Lock held. */
static struct falloc *reusable(size_t size, enum alloc_kind kind,
                               const struct fstream *s)
{
    int64_t now = fake_now_ns(), hint = INF_NS;

    for (size_t i = 0; i < fake.nallocs; i++) {
        struct falloc *a = &fake.allocs[i];
        if (a->released && a->size >= size + fake.reuse_offset &&
            (a->kind == A_HOST) == (kind == A_HOST) &&
            (a->freed_after == NULL ||
             (s != NULL && kind == A_POOL && a->kind == A_POOL &&
              a->freed_after->stream == s) ||
             fake_work_completed(a->freed_after, now, &hint)))
            return a;
    }
    return NULL;
}

/* Register a new allocation (ordered on stream s when not NULL); returns
 * its address. */
static void *add_alloc(size_t size, int dev, enum alloc_kind kind,
                       const struct fstream *s)
{
    struct falloc *a = fake.reuse_addresses ? reusable(size, kind, s) : NULL;

    if (a != NULL) {
        /* The old record gives way (its users and blocks went with its
         * release); a smaller size keeps it clear of its neighbours, and
         * so does a start inside it (fake_set_reuse_inside): the records
         * stay sorted by address. */
        uintptr_t addr = a->addr + fake.reuse_offset;
        memset(a, 0, sizeof *a);
        a->addr = addr;
        fake.reuse_offset = 0;
        fake.addresses_reused++;
    } else {
        fake.allocs = fake_grow(fake.allocs, fake.nallocs, &fake.capallocs,
                                sizeof *fake.allocs);
        a = &fake.allocs[fake.nallocs++];
        memset(a, 0, sizeof *a);
        a->addr = fake.next_addr;
        fake.next_addr += (size + PAGE - 1) / PAGE * PAGE + PAGE; /* + a gap */
    }
    a->size = size;
    a->dev = dev;
    a->kind = kind;
    if (fake.nserials == 0) /* serial 0 is none */
        fake.nserials = 1;
    fake.released_by_serial =
        fake_grow(fake.released_by_serial, fake.nserials, &fake.capserials, 1);
    fake.released_by_serial[fake.nserials] = 0;
    a->serial = fake.nserials++;
    unsigned slot = fake_thread.nrecent++ % FAKE_RECENT_ALLOCS;
    fake_thread.recent[slot].addr = a->addr;
    fake_thread.recent[slot].serial = a->serial;
    fake.live_allocs++;
    if (kind != A_HOST)
        fake.devused[dev] += size;
    return (void *)a->addr;
}

/* A release of p already released is a violation, reported before the
 * call's failure injection (an injected error must not hide it); whether it
 * was reported.  Takes the lock. */
static int double_release(const char *fn, const void *p)
{
    struct falloc *a;
    int twice;

    fake_lock();
    a = p != NULL ? fake_alloc_find(p, 1) : NULL;
    twice = a != NULL && a->released;
    if (twice)
        fake_violation("double release of %p (%s)", p, fn);
    fake_unlock();
    return twice;
}

/* Release p for function fn (host: cudaFreeHost; async: the stream of a
 * cudaFreeAsync), with the oracle's checks; reported: double_release
 * said p was released already.  Lock held. */
static cudaError_t release(const char *fn, void *p, int host,
                           struct fstream *async, int reported)
{
    struct falloc *a;

    if (p == NULL)
        return cudaSuccess;
    a = fake_alloc_find(p, 1);
    if (a == NULL) {
        fake.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    if (a->released) {
        if (!reported) /* another thread's release came in between */
            fake_violation("double release of %p (%s)", p, fn);
        return cudaErrorInvalidValue;
    }
    if ((a->kind == A_HOST) != host) {
        fake.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    fake_oracle_release(a, p, fn, async);
    a->released = 1;
    fake.released_by_serial[a->serial] = 1;
    if (async != NULL && fake.free_async_us > 0) {
        /* The free itself, in stream order (fake_set_free_async_us). */
        struct fake_work *w = fake_work_new(async, W_TIMED);
        w->duration_ns = (int64_t)fake.free_async_us * 1000;
        a->freed_after = w;
    } else {
        a->freed_after =
            async != NULL && async->tail != NULL && !async->tail->done
                ? async->tail
                : NULL;
    }
    fake.live_allocs--;
    if (a->kind == A_DEVICE && async != NULL)
        async->unmapping[a->dev] += a->size; /* fake_unmap_settle */
    else if (a->kind != A_HOST)
        fake.devused[a->dev] -= a->size;
    if (a->own_pool && a->freed_after != NULL) {
        /* Still the pool's until the free ran (pool_frees_settle). */
        fake.pool_frees = fake_grow(fake.pool_frees, fake.npool_frees,
                                    &fake.cappool_frees,
                                    sizeof *fake.pool_frees);
        fake.pool_frees[fake.npool_frees++] = (struct fpool_free){
            .until = a->freed_after, .stream = async, .dev = a->dev,
            .bytes = a->size};
    } else if (a->own_pool) {
        fake.pool_used[a->dev] -= a->size;
    }
    return cudaSuccess;
}

/* Pool memory given back with cudaFreeAsync leaves its pool's use
 * (fake.pool_used) once its free ran (the item it waits for completed).
 * With s (a new allocation of bytes on stream s from device dev's pool),
 * so does memory freed on s whose free has not run yet, up to bytes, oldest
 * first: stream order hands it to that allocation, as a real pool does (it
 * counts again as the allocation's).  Called by cudaMemPoolGetAttribute,
 * cudaMemPoolTrimTo and cudaMallocFromPoolAsync; lock held. */
static void pool_frees_settle(const struct fstream *s, int dev, size_t bytes)
{
    int64_t now = fake_now_ns(), hint = INF_NS;
    size_t kept = 0;

    for (size_t i = 0; i < fake.npool_frees; i++) {
        struct fpool_free f = fake.pool_frees[i];
        size_t take = f.bytes;

        if (!fake_work_completed(f.until, now, &hint)) {
            take = 0;
            if (s != NULL && f.stream == s && f.dev == dev) {
                take = f.bytes < bytes ? f.bytes : bytes;
                bytes -= take;
            }
        }
        fake.pool_used[f.dev] -= take;
        f.bytes -= take;
        if (f.bytes > 0)
            fake.pool_frees[kept++] = f;
    }
    fake.npool_frees = kept;
}

/* The memory queries of the control API (fake_cuda.h).  Any thread. */
size_t fake_live_allocations(void)
{
    size_t n;

    fake_lock();
    n = fake.live_allocs;
    fake_unlock();
    return n;
}

size_t fake_invalid_releases(void)
{
    size_t n;

    fake_lock();
    n = fake.invalid_releases;
    fake_unlock();
    return n;
}

int fake_is_released(const void *p)
{
    struct falloc *a;
    int r;

    fake_lock();
    a = fake_alloc_find(p, 1);
    r = a ? a->released : -1;
    fake_unlock();
    return r;
}

unsigned long long fake_allocation_serial(const void *p)
{
    fake_lock();
    struct falloc *a = fake_alloc_find(p, 1);
    unsigned long long serial = a != NULL ? a->serial : 0;
    fake_unlock();
    return serial;
}

unsigned long long fake_my_allocation_serial(const void *p)
{
    unsigned long long serial = 0;

    fake_lock();
    unsigned n = fake_thread.nrecent < FAKE_RECENT_ALLOCS
                     ? fake_thread.nrecent
                     : FAKE_RECENT_ALLOCS;
    for (unsigned i = 0; i < n && serial == 0; i++) {
        unsigned slot = (fake_thread.nrecent - 1 - i) % FAKE_RECENT_ALLOCS;
        if (fake_thread.recent[slot].addr == (uintptr_t)p)
            serial = fake_thread.recent[slot].serial;
    }
    fake_unlock();
    return serial != 0 ? serial : fake_allocation_serial(p);
}

int fake_serial_released(unsigned long long serial)
{
    int r;

    fake_lock();
    r = serial > 0 && serial < fake.nserials ? fake.released_by_serial[serial]
                                             : -1;
    fake_unlock();
    return r;
}

int fake_allocation_of(const void *p, void **base, size_t *size)
{
    struct falloc *a;
    int r;

    fake_lock();
    a = fake_alloc_find(p, 0);
    r = a ? !a->released : -1;
    if (base != NULL)
        *base = a ? (void *)a->addr : NULL;
    if (size != NULL)
        *size = a ? a->size : 0;
    fake_unlock();
    return r;
}

/* ---- cudart: memory --------------------------------------------------- */

/* Device allocation on dev if it fits.  Lock held. */
static cudaError_t device_alloc(void **p, size_t size, int dev,
                                enum alloc_kind kind, const struct fstream *s)
{
    if (p == NULL)
        return cudaErrorInvalidValue;
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    if (size > MAX_ALLOC || fake.devused[dev] > fake.devmem[dev] ||
        size > fake.devmem[dev] - fake.devused[dev])
        return cudaErrorMemoryAllocation;
    *p = add_alloc(size, dev, kind, s);
    return cudaSuccess;
}

/* Allocate device memory on the current device. */
cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    ENTER(FAKE_MALLOC);
    UNSAFE_CALL();
    fake_touch(fake_thread.dev);
    return fake_leave(device_alloc(devPtr, size, fake_thread.dev, A_DEVICE, NULL));
}

/* Allocate pool memory on the stream's device. */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_MALLOC_ASYNC);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return fake_leave(fake_capture_invalidate(s));
    cudaError_t err = device_alloc(devPtr, size, s->dev, A_POOL, s);
    if (err == cudaSuccess && size > 0)
        fake_alloc_ordered(fake_alloc_find(*devPtr, 1), s);
    return fake_leave(err);
}

/* Memory pools: a pool is only its device (the handle encodes it); its
 * allocations are pool memory like cudaMallocAsync's.  Attributes are
 * accepted; reading them gives the pool's used and reserved bytes (the
 * reserved memory grows with use and shrinks on a trim only, as with the
 * release threshold cudefer sets; no fragmentation is modeled; memory
 * given back with cudaFreeAsync counts as used until its free ran:
 * pool_frees_settle), 0 for the others. */
#define FAKE_POOL_BASE 0x7e000

/* The memory pool calls below that take no ENTER of their own: "potentially
 * unsafe" (THE MODEL), refused by the thread's mode as cudaMalloc is.
 * cudaSuccess when allowed. */
static cudaError_t pool_call_allowed(void)
{
    fake_lock();
    cudaError_t err = fake_capture_unsafe_call();
    if (err != cudaSuccess)
        fake_thread.last_error = err;
    fake_unlock();
    return err;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool,
                              const struct cudaMemPoolProps *props)
{
    ENTER(FAKE_MEM_POOL_CREATE);
    UNSAFE_CALL();
    if (pool == NULL || props == NULL ||
        props->location.type != cudaMemLocationTypeDevice ||
        props->location.id < 0 || props->location.id >= fake.ndev)
        return fake_leave(cudaErrorInvalidValue);
    if (fake.no_pools[props->location.id]) /* fake_set_memory_pools */
        return fake_leave(cudaErrorNotSupported);
    *pool = (cudaMemPool_t)(uintptr_t)(FAKE_POOL_BASE + props->location.id);
    return fake_leave(cudaSuccess);
}

/* The device of a fake pool handle, or -1. */
static int pool_device(cudaMemPool_t pool)
{
    uintptr_t v = (uintptr_t)pool;
    return v >= FAKE_POOL_BASE && v < FAKE_POOL_BASE + (uintptr_t)fake.ndev
               ? (int)(v - FAKE_POOL_BASE)
               : -1;
}

/* The handle of device dev's pool (fake_cuda.h), NULL for no device. */
cudaMemPool_t fake_mem_pool(int dev)
{
    int ndev;

    fake_lock();
    ndev = fake.ndev;
    fake_unlock();
    return dev >= 0 && dev < ndev
               ? (cudaMemPool_t)(uintptr_t)(FAKE_POOL_BASE + dev)
               : NULL;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool)
{
    cudaError_t err = pool_call_allowed();
    if (err != cudaSuccess)
        return err;
    return pool_device(pool) >= 0 ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool,
                                    enum cudaMemPoolAttr attr, void *value)
{
    (void)attr;
    cudaError_t err = pool_call_allowed();
    if (err != cudaSuccess)
        return err;
    return pool_device(pool) >= 0 && value != NULL ? cudaSuccess
                                                   : cudaErrorInvalidValue;
}

/* Access from other devices: remembered per pool (fake_mem_pool_access);
 * a device's own access is always there and not listed. */
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool,
                                 const struct cudaMemAccessDesc *map,
                                 size_t count)
{
    int dev = pool_device(pool);
    cudaError_t err = pool_call_allowed();
    if (err != cudaSuccess)
        return err;
    if (dev < 0 || (map == NULL && count > 0))
        return cudaErrorInvalidValue;
    fake_lock();
    for (size_t i = 0; i < count; i++) {
        int peer = map[i].location.id;
        if (map[i].location.type != cudaMemLocationTypeDevice || peer < 0 ||
            peer >= fake.ndev) {
            fake_unlock();
            return cudaErrorInvalidDevice;
        }
    }
    for (size_t i = 0; i < count; i++) {
        unsigned bit = 1u << map[i].location.id;
        if (map[i].location.id == dev)
            continue;
        if (map[i].flags == cudaMemAccessFlagsProtNone)
            fake.pool_access[dev] &= ~bit;
        else
            fake.pool_access[dev] |= bit;
    }
    fake_unlock();
    return cudaSuccess;
}

int fake_mem_pool_access(int dev, int peer)
{
    int on;

    fake_lock();
    on = dev >= 0 && dev < fake.ndev && peer >= 0 && peer < fake.ndev &&
         (fake.pool_access[dev] >> peer & 1u);
    fake_unlock();
    return on;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool,
                                    enum cudaMemPoolAttr attr, void *value)
{
    cudaError_t err = pool_call_allowed();
    if (err != cudaSuccess)
        return err;
    if (pool_device(pool) < 0 || value == NULL)
        return cudaErrorInvalidValue;
    int dev = pool_device(pool);
    fake_lock();
    pool_frees_settle(NULL, dev, 0);
    switch (attr) {
    case cudaMemPoolAttrReservedMemCurrent:
        *(uint64_t *)value = fake.pool_reserved[dev];
        break;
    case cudaMemPoolAttrUsedMemCurrent:
        *(uint64_t *)value = fake.pool_used[dev];
        break;
    case cudaMemPoolAttrReleaseThreshold:
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:
        *(uint64_t *)value = 0;
        break;
    default:
        *(int *)value = 0;
        break;
    }
    fake_unlock();
    return cudaSuccess;
}

/* Lock held.  bytes rounded up to the pools' granularity. */
static size_t pool_round(size_t bytes)
{
    size_t g = fake.pool_granularity > 0 ? fake.pool_granularity : 1;
    return (bytes + g - 1) / g * g;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep)
{
    int dev = pool_device(pool);
    ENTER(FAKE_MEM_POOL_TRIM);
    UNSAFE_CALL();
    if (dev < 0)
        return fake_leave(cudaErrorInvalidValue);
    pool_frees_settle(NULL, dev, 0); /* what is freed but not run stays */
    size_t used = pool_round(fake.pool_used[dev]);
    size_t keep = minBytesToKeep > used ? minBytesToKeep : used;
    if (fake.pool_reserved[dev] > keep)
        fake.pool_reserved[dev] = keep;
    return fake_leave(cudaSuccess);
}

/* Allocate pool memory from pool (its device), ordered on hStream; counted
 * as cudaMallocAsync. */
cudaError_t cudaMallocFromPoolAsync(void **devPtr, size_t size,
                                    cudaMemPool_t pool, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_MALLOC_ASYNC);
    UNSAFE_CALL();
    int dev = pool_device(pool);
    if (dev < 0)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return fake_leave(fake_capture_invalidate(s));
    cudaError_t err = device_alloc(devPtr, size, dev, A_POOL, s);
    if (err == cudaSuccess && size > 0) {
        fake_alloc_find(*devPtr, 1)->own_pool = 1;
        fake_alloc_ordered(fake_alloc_find(*devPtr, 1), s);
        pool_frees_settle(s, dev, size);
        fake.pool_used[dev] += size;
        if (fake.pool_reserved[dev] < fake.pool_used[dev])
            fake.pool_reserved[dev] = pool_round(fake.pool_used[dev]);
    }
    return fake_leave(err);
}

/* Allocate pinned host memory (a fake address too: never dereference). */
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    ENTER(FAKE_MALLOC_HOST);
    if (pHost == NULL)
        return fake_leave(cudaErrorInvalidValue);
    UNSAFE_CALL();
    if (size > MAX_ALLOC)
        return fake_leave(cudaErrorMemoryAllocation);
    fake_touch(fake_thread.dev);
    *pHost = size ? add_alloc(size, fake_thread.dev, A_HOST, NULL) : NULL;
    return fake_leave(cudaSuccess);
}

/* Same as cudaHostAlloc with no flags. */
cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, 0);
}

/* Release device or pool memory (oracle-checked). */
cudaError_t cudaFree(void *devPtr)
{
    int twice = double_release("cudaFree", devPtr);
    ENTER(FAKE_FREE);
    UNSAFE_CALL();
    return fake_leave(release("cudaFree", devPtr, 0, NULL, twice));
}

/* Release pinned host memory (oracle-checked). */
cudaError_t cudaFreeHost(void *ptr)
{
    int twice = double_release("cudaFreeHost", ptr);
    ENTER(FAKE_FREE_HOST);
    UNSAFE_CALL();
    return fake_leave(release("cudaFreeHost", ptr, 1, NULL, twice));
}

/* Release device memory in stream order: work ordered before the free on
 * hStream may still be pending.  The free runs after it (with
 * fake_set_free_async_us, as an item of its own on hStream); pool memory
 * stays in its pool's use until then. */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    struct fstream *s;
    int twice = double_release("cudaFreeAsync", devPtr);

    ENTER(FAKE_FREE_ASYNC);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return fake_leave(fake_capture_invalidate(s));
    if (fake.no_pools[s->dev])
        return fake_leave(cudaErrorNotSupported);
    UNSAFE_CALL();
    return fake_leave(release("cudaFreeAsync", devPtr, 0, s, twice));
}

/* Free and total memory of the current device. */
cudaError_t cudaMemGetInfo(size_t *freeMem, size_t *totalMem)
{
    ENTER(FAKE_MEM_GET_INFO);
    if (freeMem == NULL || totalMem == NULL)
        return fake_leave(cudaErrorInvalidValue);
    fake_touch(fake_thread.dev);
    *totalMem = fake.devmem[fake_thread.dev];
    *freeMem = fake.devmem[fake_thread.dev] > fake.devused[fake_thread.dev]
                   ? fake.devmem[fake_thread.dev] -
                         fake.devused[fake_thread.dev]
                   : 0;
    return fake_leave(cudaSuccess);
}

/* Device or host attributes of a live allocation; an unknown or released
 * pointer is cudaMemoryTypeUnregistered (cudaSuccess, as CUDA 11+). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                     const void *ptr)
{
    struct falloc *a;

    ENTER(FAKE_POINTER_GET_ATTRIBUTES);
    if (attributes == NULL)
        return fake_leave(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    a = fake_alloc_find(ptr, 0);
    if (a == NULL || a->released) {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
        attributes->hostPointer = (void *)ptr;
    } else if (a->kind == A_HOST) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = a->dev;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
    } else {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = a->dev;
        attributes->devicePointer = (void *)ptr;
    }
    return fake_leave(cudaSuccess);
}

void fake_unmap_settle(struct fstream *s)
{
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        fake.devused[d] -= s->unmapping[d];
        s->unmapping[d] = 0;
    }
}
