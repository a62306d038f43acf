/*
 * fake_memory.c — memory and the oracle.  Device memory (cudaMalloc),
 * stream-ordered pool memory (cudaMallocAsync / cudaFreeAsync) and pinned
 * host memory (cudaMallocHost / cudaHostAlloc) get fake addresses from a
 * counter that never goes back.  The oracle checks every release against
 * the work that uses the allocation and counts violations; a test checks
 * each allocation cudefer hands out with fake_oracle_handout.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE          ((uintptr_t)4096u)
#define MAX_ALLOC     ((size_t)1 << 46)             /* larger: out of memory */

static atomic_long violation_count;

/* Record a violation: count it, remember it, print it as a TAP comment. */
void fake_violation(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fake.last_violation, sizeof fake.last_violation, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&violation_count, 1);
    printf("# fake oracle: %s\n", fake.last_violation);
    fflush(stdout);
}

/* At exit: fail the process if violations were not forgiven. */
void fake_oracle_at_exit(void)
{
    long v = atomic_load(&violation_count);

    if (v > 0) {
        fflush(stdout);
        printf("# fake oracle: %ld violation(s)\n", v);
        fflush(stdout);
        _exit(1);
    }
}

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

/* Register a new allocation; returns its address. */
static void *add_alloc(size_t size, int dev, enum alloc_kind kind)
{
    struct falloc *a;

    fake.allocs = fake_grow(fake.allocs, fake.nallocs, &fake.capallocs,
                                  sizeof *fake.allocs);
    a = &fake.allocs[fake.nallocs++];
    memset(a, 0, sizeof *a);
    a->addr = fake.next_addr;
    a->size = size;
    a->dev = dev;
    a->kind = kind;
    fake.next_addr += (size + PAGE - 1) / PAGE * PAGE + PAGE;  /* + a gap */
    fake.live_allocs++;
    if (kind != A_HOST)
        fake.devused[dev] += size;
    return (void *)a->addr;
}

/* Note that w uses the allocation containing p (if any). */
void fake_alloc_add_use(struct fake_work *w, const void *p)
{
    struct falloc *a = fake_alloc_find(p, 0);
    size_t i, n;

    if (a == NULL)
        return;
    if (a->released) {
        fake_violation("work #%llu launched on stream id %llu uses %p, which "
                       "was already released", w->id, w->stream->id, p);
        return;
    }
    if (a->nusers == a->capusers) {     /* drop users known to be done */
        for (i = n = 0; i < a->nusers; i++)
            if (!a->users[i]->done)
                a->users[n++] = a->users[i];
        a->nusers = n;
    }
    a->users = fake_grow(a->users, a->nusers, &a->capusers, sizeof *a->users);
    a->users[a->nusers++] = w;
}


/* Release p for function fn (host: cudaFreeHost; async: the stream of a
 * cudaFreeAsync), with the oracle's checks.  Lock held. */
static cudaError_t release(const char *fn, void *p, int host,
                           struct fstream *async)
{
    struct falloc *a;
    struct fgraph *x;
    int64_t now = fake_now_ns(), hint = INF_NS;
    size_t i;

    if (p == NULL)
        return cudaSuccess;
    a = fake_alloc_find(p, 1);
    if (a == NULL) {
        fake.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    if (a->released) {
        fake_violation("double release of %p (%s)", p, fn);
        return cudaErrorInvalidValue;
    }
    if ((a->kind == A_HOST) != host) {
        fake.invalid_releases++;
        return cudaErrorInvalidValue;
    }
    for (i = 0; i < a->nusers; i++) {
        struct fake_work *u = a->users[i];

        if (fake_work_completed(u, now, &hint))
            continue;
        if (async != NULL && fake_work_ordered_before(u, async, async->tail, 0))
            continue;
        fake_violation("premature release of %p (%s): work #%llu on stream id "
                       "%llu still pending", p, fn, u->id, u->stream->id);
        break;
    }
    if (i == a->nusers && (x = fake_graph_using(a->addr)) != NULL)
        fake_violation("premature release of %p (%s): %s #%llu, which uses it, "
                       "can still be launched", p, fn,
                       x->exec ? "executable graph" : "graph", x->id);
    a->released = 1;
    free(a->users);
    a->users = NULL;
    a->nusers = a->capusers = 0;
    fake.live_allocs--;
    if (a->kind != A_HOST)
        fake.devused[a->dev] -= a->size;
    if (a->own_pool)
        fake.pool_used[a->dev] -= a->size;
    return cudaSuccess;
}

/* The reason the work of user u would be a hazard for a block handed out
 * for stream s, or NULL if none: u has completed, or is ordered before s's
 * future work (on s itself, unless s captures, or before a barrier of s
 * from cudaStreamWaitEvent).  Lock held. */
static const char *handout_hazard(struct fake_work *u, struct fstream *s,
                                  int64_t now, int64_t *hint)
{
    if (fake_work_completed(u, now, hint))
        return NULL;
    if (s->capture != NULL)     /* captured work runs wherever the graph is
                                   launched: ordered after nothing */
        return "still pending, and the stream captures";
    if (u->stream == s || fake_work_ordered_before(u, s, s->tail, 0))
        return NULL;
    return "still pending on another stream, not ordered before the "
           "stream's later work";
}

/* Check a block an allocator handed out for stream h (fake_cuda.h): one
 * violation for the first hazard found.  Any thread; does not block. */
void fake_oracle_handout(const void *ptr, cudaStream_t h)
{
    struct fstream *s;
    struct falloc *a;
    struct fgraph *x;
    int64_t now, hint = INF_NS;
    size_t i;

    if (ptr == NULL)
        return;
    fake_lock();
    now = fake_now_ns();
    s = fake_stream_resolve(h);
    a = fake_alloc_find(ptr, 0);
    if (s == NULL) {
        fake_violation("fake_oracle_handout: %p handed out for %p, which is "
                       "not a live stream", ptr, (void *)h);
    } else if (a == NULL) {
        fake_violation("fake_oracle_handout: %p handed out for stream id "
                       "%llu is not in any allocation of the fake", ptr,
                       s->id);
    } else if (a->released) {
        fake_violation("premature reuse of %p (handed out for stream id "
                       "%llu): its allocation was already released", ptr,
                       s->id);
    } else {
        for (i = 0; i < a->nusers; i++) {
            struct fake_work *u = a->users[i];
            const char *why = handout_hazard(u, s, now, &hint);

            if (why != NULL) {
                fake_violation("premature reuse of %p (handed out for stream "
                               "id %llu): work #%llu on stream id %llu %s",
                               ptr, s->id, u->id, u->stream->id, why);
                break;
            }
        }
        if (i == a->nusers && (x = fake_graph_using(a->addr)) != NULL)
            fake_violation("premature reuse of %p (handed out for stream id "
                           "%llu): %s #%llu, which uses it, can still be "
                           "launched", ptr, s->id,
                           x->exec ? "executable graph" : "graph", x->id);
    }
    fake_unlock();
}

/* The oracle queries of the control API (fake_cuda.h).  Any thread. */
long fake_violations(void) { return atomic_load(&violation_count); }

void fake_oracle_forgive(void) { atomic_store(&violation_count, 0); }

char *fake_last_violation(char *buf, size_t len)
{
    if (len == 0)
        return buf;
    fake_lock();
    snprintf(buf, len, "%s", fake.last_violation);
    fake_unlock();
    return buf;
}

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

/* ---- cudart: memory --------------------------------------------------- */

/* Device allocation on dev if it fits.  Lock held. */
static cudaError_t device_alloc(void **p, size_t size, int dev,
                                enum alloc_kind kind)
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
    *p = add_alloc(size, dev, kind);
    return cudaSuccess;
}

/* Allocate device memory on the current device. */
cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    ENTER(FAKE_MALLOC);
    UNSAFE_CALL();
    fake_touch(fake_thread.dev);
    return fake_leave(device_alloc(devPtr, size, fake_thread.dev, A_DEVICE));
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
    return fake_leave(device_alloc(devPtr, size, s->dev, A_POOL));
}

/* Memory pools: a pool is only its device (the handle encodes it); its
 * allocations are pool memory like cudaMallocAsync's.  Attributes are
 * accepted; reading them gives the pool's used and reserved bytes (the
 * reserved memory grows with use and shrinks on a trim only, as with the
 * release threshold cudefer sets; no fragmentation is modeled), 0 for the
 * others. */
#define FAKE_POOL_BASE 0x7e000

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool,
                              const struct cudaMemPoolProps *props)
{
    if (pool == NULL || props == NULL ||
        props->location.type != cudaMemLocationTypeDevice ||
        props->location.id < 0 || props->location.id >= fake.ndev)
        return cudaErrorInvalidValue;
    *pool = (cudaMemPool_t)(uintptr_t)(FAKE_POOL_BASE + props->location.id);
    return cudaSuccess;
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
    return pool_device(pool) >= 0 ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool,
                                    enum cudaMemPoolAttr attr, void *value)
{
    (void)attr;
    return pool_device(pool) >= 0 && value != NULL ? cudaSuccess
                                                   : cudaErrorInvalidValue;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool,
                                    enum cudaMemPoolAttr attr, void *value)
{
    if (pool_device(pool) < 0 || value == NULL)
        return cudaErrorInvalidValue;
    int dev = pool_device(pool);
    fake_lock();
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

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t minBytesToKeep)
{
    int dev = pool_device(pool);
    if (dev < 0)
        return cudaErrorInvalidValue;
    fake_lock();
    size_t keep = minBytesToKeep > fake.pool_used[dev] ? minBytesToKeep
                                                       : fake.pool_used[dev];
    if (fake.pool_reserved[dev] > keep)
        fake.pool_reserved[dev] = keep;
    fake_unlock();
    return cudaSuccess;
}

/* Allocate pool memory from pool (its device), ordered on hStream; counted
 * as cudaMallocAsync. */
cudaError_t cudaMallocFromPoolAsync(void **devPtr, size_t size,
                                    cudaMemPool_t pool, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_MALLOC_ASYNC);
    int dev = pool_device(pool);
    if (dev < 0)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return fake_leave(fake_capture_invalidate(s));
    cudaError_t err = device_alloc(devPtr, size, dev, A_POOL);
    if (err == cudaSuccess && size > 0) {
        fake_alloc_find(*devPtr, 1)->own_pool = 1;
        fake.pool_used[dev] += size;
        if (fake.pool_reserved[dev] < fake.pool_used[dev])
            fake.pool_reserved[dev] = fake.pool_used[dev];
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
    *pHost = size ? add_alloc(size, fake_thread.dev, A_HOST) : NULL;
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
    ENTER(FAKE_FREE);
    UNSAFE_CALL();
    return fake_leave(release("cudaFree", devPtr, 0, NULL));
}

/* Release pinned host memory (oracle-checked). */
cudaError_t cudaFreeHost(void *ptr)
{
    ENTER(FAKE_FREE_HOST);
    UNSAFE_CALL();
    return fake_leave(release("cudaFreeHost", ptr, 1, NULL));
}

/* Release device memory in stream order: work ordered before the free on
 * hStream may still be pending. */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    struct fstream *s;

    ENTER(FAKE_FREE_ASYNC);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* memory nodes are not modeled */
        return fake_leave(fake_capture_invalidate(s));
    UNSAFE_CALL();
    return fake_leave(release("cudaFreeAsync", devPtr, 0, s));
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
