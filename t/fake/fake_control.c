/* SPDX-License-Identifier: MIT */
/*
 * fake_control.c — the fake CUDA runtime's state and the test control API:
 * the lock every call takes, fake_reset, fork safety, and the accounting of
 * calls with failure injection (fake_fail) and latencies (fake_set_latency)
 * applied as each cudart call enters, and the duration of a free on its
 * stream (fake_set_free_async_us).  See fake_cuda.h for the model.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fake_state fake = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .next_stream_id = 1,
    .next_event_id = 1, .next_graph_id = 1, .next_exec_id = 1,
    .next_uobj_id = 1, .next_capture_id = 1, .next_addr = ADDR_BASE };

_Thread_local struct fake_thread_state fake_thread;

/* Busy-wait of each call kind, read outside the lock (fake_set_latency). */
static _Atomic unsigned call_latency_ns[NCALLS];
/* Calls of each kind begun, counted before their busy-wait (fake_entered). */
static _Atomic unsigned long call_entered[NCALLS];
/* fake_set_return_hook's, read outside the lock. */
static _Atomic(fake_return_hook) return_hook[FAKE_NCALLS];
static void *_Atomic return_hook_arg[FAKE_NCALLS];
static pthread_once_t init_once_flag = PTHREAD_ONCE_INIT;
/* FAKE_JITTER_US's bound, read once (jitter). */
static pthread_once_t jitter_once = PTHREAD_ONCE_INIT;
static unsigned jitter_max_us;

/* Print "fake_cuda: msg" and abort.  Anyone. */
void fake_die(const char *msg)
{
    fprintf(stderr, "fake_cuda: %s\n", msg);
    abort();
}

/* Make room for one more element in a dynamic array. */
void *fake_grow(void *arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return arr;
    *cap = *cap ? *cap * 2 : 16;
    arr = realloc(arr, *cap * elem);
    if (arr == NULL)
        fake_die("out of memory");
    return arr;
}

/* Throw away all state and create ndev devices.  Lock held. */
static void reset_locked(int ndev)
{
    size_t i;
    int d;

    if (ndev < 1 || ndev > FAKE_MAX_DEVICES)
        fake_die("fake_reset: ndevices must be 1..16");
    for (i = 0; i < fake.nstreams; i++)
        free(fake.streams[i]);
    for (i = 0; i < fake.nworks; i++)
        free(fake.works[i]);
    for (i = 0; i < fake.nallocs; i++) {
        free(fake.allocs[i].users);
        free(fake.allocs[i].blocks);
    }
    for (i = 0; i < fake.ngraphs + fake.nexecs; i++) {
        struct fgraph *x = i < fake.ngraphs ? fake.graphs[i]
                                            : fake.execs[i - fake.ngraphs];

        free(x->uses);
        free(x->refs);
        free(x->launches);
        free(x);
    }
    for (i = 0; i < fake.nuobjs; i++)
        free(fake.uobjs[i]);
    free(fake.graphs);
    free(fake.execs);
    free(fake.uobjs);
    fake.graphs = fake.execs = NULL;
    fake.uobjs = NULL;
    fake.ngraphs = fake.capgraphs = fake.nexecs = fake.capexecs = 0;
    fake.nuobjs = fake.capuobjs = fake.live_uobjs = 0;
    fake.graph_base = fake.next_graph_id;
    fake.exec_base = fake.next_exec_id;
    fake.uobj_base = fake.next_uobj_id;
    free(fake.streams);
    free(fake.works);
    free(fake.allocs);
    free(fake.released_by_serial);
    fake.released_by_serial = NULL;
    fake.nserials = fake.capserials = 0;
    free(fake.events);
    fake.streams = NULL;
    fake.works = NULL;
    fake.allocs = NULL;
    fake.events = NULL;
    fake.nstreams = fake.capstreams = fake.nworks = fake.capworks = 0;
    fake.nallocs = fake.capallocs = fake.nevents = fake.capevents = 0;
    fake.live_allocs = fake.invalid_releases = fake.live_events = 0;
    fake.stream_base = fake.next_stream_id;
    fake.event_base = fake.next_event_id;
    fake.gen++;
    fake.ndev = ndev;
    memset(fake.touched, 0, sizeof fake.touched);
    memset(fake.app_touched, 0, sizeof fake.app_touched);
    memset(fake.devused, 0, sizeof fake.devused);
    memset(fake.pool_used, 0, sizeof fake.pool_used);
    memset(fake.pool_reserved, 0, sizeof fake.pool_reserved);
    memset(fake.pool_access, 0, sizeof fake.pool_access);
    fake.pool_granularity = 1;
    free(fake.pool_frees);
    fake.pool_frees = NULL;
    fake.npool_frees = fake.cappool_frees = 0;
    fake.free_async_us = 0;
    fake.reuse_addresses = getenv("FAKE_ADDRESS_REUSE") != NULL;
    fake.reuse_offset = 0;
    fake.addresses_reused = 0;
    memset(fake.inj, 0, sizeof fake.inj);
    memset(fake.calls, 0, sizeof fake.calls);
    memset(fake.legacy, 0, sizeof fake.legacy);
    fake.last_violation[0] = '\0';
    for (d = 0; d < FAKE_MAX_DEVICES; d++)
        fake.devmem[d] = FAKE_DEFAULT_DEVICE_MEMORY;
    for (d = 0; d < ndev; d++)
        fake.legacy[d] = fake_stream_new(d, S_LEGACY);
    for (i = 0; i < NCALLS; i++) {
        atomic_store(&call_latency_ns[i], 0);
        atomic_store(&call_entered[i], 0);
    }
    for (i = 0; i < FAKE_NCALLS; i++) {
        atomic_store(&return_hook[i], NULL);
        atomic_store(&return_hook_arg[i], NULL);
    }
    fake_oracle_forgive();
    pthread_cond_broadcast(&fake.cond);
}

/* Make fake.cond wait on CLOCK_MONOTONIC.  At first use and in a fork child. */
static void init_cond(void)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fake.cond, &ca);
    pthread_condattr_destroy(&ca);
}

/* fork() while another thread (the reclaimer) holds the lock must not leave
 * the child with a lock nobody will release: hold it across the fork. */
static void fork_prepare(void) { pthread_mutex_lock(&fake.lock); }
static void fork_parent(void) { pthread_mutex_unlock(&fake.lock); }
static void fork_child(void)
{
    init_cond();                /* its waiters do not exist in the child */
    fake.uobj_thread = 0;          /* nor does the destructor thread */
    pthread_mutex_unlock(&fake.lock);
}

/* First use of the fake (through pthread_once): the condition, the exit and
 * fork handlers, and one device. */
static void init_once(void)
{
    init_cond();
    if (atexit(fake_oracle_at_exit) != 0 ||
        pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
        fake_die("cannot register exit or fork handlers");
    reset_locked(1);
}

/* Lock held: the calling thread's state as a reset leaves it. */
static void thread_state_reset_locked(void)
{
    fake_thread.gen = fake.gen;
    fake_thread.dev = 0;
    fake_thread.mode = cudaStreamCaptureModeGlobal;
    fake_thread.last_error = cudaSuccess;
    fake_thread.nrecent = 0;
    fake_thread.last_recorded = NULL;
    memset(fake_thread.pts, 0, sizeof fake_thread.pts);
    memset(fake_thread.calls, 0, sizeof fake_thread.calls);
}

/* Take the lock (initialising lazily) and bring the thread's state up to
 * date with the last reset. */
/* Whether the thread holds the lock (fake_in_call): apart from
 * fake_thread, which a reset of the fake clears. */
static _Thread_local int holding;

void fake_lock(void)
{
    pthread_once(&init_once_flag, init_once);
    pthread_mutex_lock(&fake.lock);
    holding = 1;
    if (fake_thread.gen != fake.gen)
        thread_state_reset_locked();
}

/* Release the lock taken by fake_lock. */
void fake_unlock(void)
{
    holding = 0;
    pthread_mutex_unlock(&fake.lock);
}

int fake_in_call(void) { return holding; }

static const char *call_name(int c);

/* Start a cudart call of kind c (an enum fake_call, or GCALL of an enum
 * fake_graph_call): emulate its latency, take the lock, count it and apply
 * failure injection.  On an injected error the lock is released and the
 * error returned; otherwise cudaSuccess, lock held. */
static void jitter_read(void)
{
    const char *v = getenv("FAKE_JITTER_US");
    jitter_max_us = v != NULL ? (unsigned)strtoul(v, NULL, 10) : 0;
}

/* Under FAKE_JITTER_US=N (fake_cuda.h): one call in four sleeps up to N
 * microseconds, outside the lock, so that the library's threads and the
 * test's interleave in orders a quiet machine rarely shows.  Anyone. */
static void jitter(void)
{
    static _Thread_local uint64_t x;
    pthread_once(&jitter_once, jitter_read);
    if (jitter_max_us == 0)
        return;
    if (x == 0) { /* each thread its own sequence */
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        x = ((uint64_t)t.tv_nsec << 20) ^ (uint64_t)(uintptr_t)&x ^ 1;
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    if ((x & 3) != 0)
        return;
    struct timespec d = {0, (long)((x >> 8) % jitter_max_us) * 1000};
    nanosleep(&d, NULL);
}

cudaError_t fake_enter(int c)
{
    unsigned lat = atomic_load(&call_latency_ns[c]);
    struct injection *in;

    jitter();
    atomic_fetch_add(&call_entered[c], 1);
    fake_thread.call_begun = c + 1;
    if (lat != 0) {
        int64_t end = fake_now_ns() + lat;

        while (fake_now_ns() < end)
            ;
    }
    fake_lock();
    if (fake_thread.in_destructor)
        fake_violation("a user object's destructor called %s (destructors may "
                       "not call CUDA)", call_name(c));
    fake.calls[c]++;
    fake_thread.calls[c]++;
    in = &fake.inj[c];
    if (in->count != 0) {
        if (in->skip > 0) {
            in->skip--;
        } else {
            cudaError_t err = in->err;

            if (in->count > 0)
                in->count--;
            return fake_leave(err);
        }
    }
    return cudaSuccess;
}

/* Finish a call: note a failure as the thread's last error (as CUDA
 * does; "not ready" is no failure), release the lock, return r. */
cudaError_t fake_leave(cudaError_t r)
{
    int c = fake_thread.call_begun - 1;
    fake_return_hook hook = NULL;
    void *arg = NULL;

    if (r != cudaSuccess && r != cudaErrorNotReady)
        fake_thread.last_error = r;
    fake_thread.call_begun = 0;
    if (c >= 0 && c < FAKE_NCALLS) { /* a pair set under the lock */
        hook = atomic_load(&return_hook[c]);
        arg = atomic_load(&return_hook_arg[c]);
    }
    fake_unlock();
    if (hook != NULL)
        hook((enum fake_call)c, r, arg);
    jitter();
    return r;
}

#define ENTER(c) do { cudaError_t e_ = fake_enter(c); \
                      if (e_ != cudaSuccess) return e_; } while (0)

/* The control API below is documented in fake_cuda.h; any thread may call
 * it, and none of it blocks except on the lock. */
void fake_reset(int ndevices)
{
    fake_lock();
    reset_locked(ndevices);
    thread_state_reset_locked();
    fake_unlock();
}

/* Arm failure injection for c (fake_cuda.h). */
void fake_fail(enum fake_call c, cudaError_t err, long skip, long count)
{
    if ((unsigned)c >= FAKE_NCALLS)
        return;
    fake_lock();
    fake.inj[c].err = err;
    fake.inj[c].skip = skip > 0 ? skip : 0;
    fake.inj[c].count = count;
    fake_unlock();
}

/* Disarm every failure injection, graph calls included. */
void fake_fail_clear(void)
{
    fake_lock();
    memset(fake.inj, 0, sizeof fake.inj);
    fake_unlock();
}

unsigned long fake_thread_calls(enum fake_call c)
{
    unsigned long n = 0;

    fake_lock(); /* brings the thread's counts up to date with a reset */
    if ((unsigned)c < FAKE_NCALLS)
        n = fake_thread.calls[c];
    fake_unlock();
    return n;
}

/* Calls of c since fake_reset. */
unsigned long fake_calls(enum fake_call c)
{
    unsigned long n = 0;

    fake_lock();
    if ((unsigned)c < FAKE_NCALLS)
        n = fake.calls[c];
    fake_unlock();
    return n;
}

/* Calls of c begun since fake_reset, those still in their latency
 * included. */
unsigned long fake_entered(enum fake_call c)
{
    return (unsigned)c < FAKE_NCALLS ? atomic_load(&call_entered[c]) : 0;
}

/* The cudart name of graph call c, "?" if out of range. */
const char *fake_graph_call_name(enum fake_graph_call c)
{
    static const char *const names[FAKE_GRAPH_NCALLS] = {
        [FAKE_STREAM_BEGIN_CAPTURE] = "cudaStreamBeginCapture",
        [FAKE_STREAM_END_CAPTURE] = "cudaStreamEndCapture",
        [FAKE_STREAM_GET_CAPTURE_INFO] = "cudaStreamGetCaptureInfo",
        [FAKE_GRAPH_INSTANTIATE] = "cudaGraphInstantiate",
        [FAKE_GRAPH_LAUNCH] = "cudaGraphLaunch",
        [FAKE_GRAPH_DESTROY] = "cudaGraphDestroy",
        [FAKE_GRAPH_EXEC_DESTROY] = "cudaGraphExecDestroy",
        [FAKE_USER_OBJECT_CREATE] = "cudaUserObjectCreate",
        [FAKE_USER_OBJECT_RELEASE] = "cudaUserObjectRelease",
        [FAKE_GRAPH_RETAIN_USER_OBJECT] = "cudaGraphRetainUserObject",
        [FAKE_THREAD_EXCHANGE_CAPTURE_MODE] =
            "cudaThreadExchangeStreamCaptureMode",
    };

    return (unsigned)c < FAKE_GRAPH_NCALLS && names[c] ? names[c] : "?";
}

/* fake_fail for a graph call. */
void fake_graph_fail(enum fake_graph_call c, cudaError_t err, long skip,
                     long count)
{
    if ((unsigned)c >= FAKE_GRAPH_NCALLS)
        return;
    fake_lock();
    fake.inj[GCALL(c)].err = err;
    fake.inj[GCALL(c)].skip = skip > 0 ? skip : 0;
    fake.inj[GCALL(c)].count = count;
    fake_unlock();
}

/* Calls of graph call c since fake_reset. */
unsigned long fake_graph_calls(enum fake_graph_call c)
{
    unsigned long n = 0;

    fake_lock();
    if ((unsigned)c < FAKE_GRAPH_NCALLS)
        n = fake.calls[GCALL(c)];
    fake_unlock();
    return n;
}


/* The name of call c of either enum (see fake_enter). */
static const char *call_name(int c)
{
    return c < FAKE_NCALLS
               ? fake_call_name((enum fake_call)c)
               : fake_graph_call_name((enum fake_graph_call)(c - FAKE_NCALLS));
}

/* The cudart name of c, "?" if out of range. */
const char *fake_call_name(enum fake_call c)
{
    static const char *const names[FAKE_NCALLS] = {
        [FAKE_EVENT_CREATE] = "cudaEventCreate",
        [FAKE_EVENT_RECORD] = "cudaEventRecord",
        [FAKE_EVENT_QUERY] = "cudaEventQuery",
        [FAKE_EVENT_DESTROY] = "cudaEventDestroy",
        [FAKE_EVENT_SYNCHRONIZE] = "cudaEventSynchronize",
        [FAKE_FREE] = "cudaFree",
        [FAKE_FREE_HOST] = "cudaFreeHost",
        [FAKE_FREE_ASYNC] = "cudaFreeAsync",
        [FAKE_SET_DEVICE] = "cudaSetDevice",
        [FAKE_GET_DEVICE] = "cudaGetDevice",
        [FAKE_GET_DEVICE_COUNT] = "cudaGetDeviceCount",
        [FAKE_STREAM_GET_DEVICE] = "cudaStreamGetDevice",
        [FAKE_STREAM_GET_ID] = "cudaStreamGetId",
        [FAKE_STREAM_CREATE] = "cudaStreamCreate",
        [FAKE_STREAM_DESTROY] = "cudaStreamDestroy",
        [FAKE_STREAM_SYNCHRONIZE] = "cudaStreamSynchronize",
        [FAKE_STREAM_IS_CAPTURING] = "cudaStreamIsCapturing",
        [FAKE_POINTER_GET_ATTRIBUTES] = "cudaPointerGetAttributes",
        [FAKE_MEM_GET_INFO] = "cudaMemGetInfo",
        [FAKE_MALLOC] = "cudaMalloc",
        [FAKE_MALLOC_HOST] = "cudaMallocHost",
        [FAKE_MALLOC_ASYNC] = "cudaMallocAsync",
        [FAKE_STREAM_QUERY] = "cudaStreamQuery",
        [FAKE_STREAM_WAIT_EVENT] = "cudaStreamWaitEvent",
        [FAKE_DEVICE_SYNCHRONIZE] = "cudaDeviceSynchronize",
        [FAKE_DRIVER_ENTRY_POINT] = "cudaGetDriverEntryPointByVersion",
        [FAKE_CU_POINTER_GET_ATTRIBUTES] = "cuPointerGetAttributes",
        [FAKE_DEVICE_GET_ATTRIBUTE] = "cudaDeviceGetAttribute",
        [FAKE_DRIVER_GET_VERSION] = "cudaDriverGetVersion",
        [FAKE_RUNTIME_GET_VERSION] = "cudaRuntimeGetVersion",
        [FAKE_MEM_POOL_CREATE] = "cudaMemPoolCreate",
        [FAKE_MEM_POOL_TRIM] = "cudaMemPoolTrimTo",
    };

    return (unsigned)c < FAKE_NCALLS && names[c] ? names[c] : "?";
}

void fake_set_return_hook(enum fake_call c, fake_return_hook fn, void *arg)
{
    if ((unsigned)c < FAKE_NCALLS) {
        fake_lock(); /* fake_leave reads the pair under it */
        atomic_store(&return_hook_arg[c], arg);
        atomic_store(&return_hook[c], fn);
        fake_unlock();
    }
}

/* Make every call of c busy-wait ns nanoseconds (read without the lock). */
void fake_set_latency(enum fake_call c, unsigned ns)
{
    if ((unsigned)c < FAKE_NCALLS)
        atomic_store(&call_latency_ns[c], ns);
}

/* Make every later cudaFreeAsync enqueue a timed item of us microseconds on
 * its stream (0: none), the free itself (read under the lock). */
void fake_set_free_async_us(unsigned us)
{
    fake_lock();
    fake.free_async_us = us;
    fake_unlock();
}

int fake_set_stream_id(cudaStream_t s, unsigned long long id)
{
    struct fstream *f;

    fake_lock();
    f = fake_stream_resolve(s);
    if (f != NULL)
        f->reported_id = id;
    fake_unlock();
    return f != NULL ? 0 : -1;
}
