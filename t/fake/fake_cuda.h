/*
 * fake_cuda.h — a fake CUDA runtime for testing cudefer without a GPU.
 *
 * fake_cuda.c DEFINES the cudart functions cudefer calls (cudaEventRecord,
 * cudaFree, ...) with the exact prototypes of <cuda_runtime_api.h>; a test
 * links the library's objects with fake_cuda.o instead of -lcudart.  This
 * header adds the control and inspection API tests use.
 *
 * THE MODEL
 *   Devices: fake_reset(n) creates n devices (1..FAKE_MAX_DEVICES) and
 *   throws away all other state.  Call it before the first cudefer call;
 *   each test is its own process.  Resetting while other threads (cudefer's
 *   reclaimer) use the fake is the caller's problem.  Until the first
 *   fake_reset the fake behaves as after fake_reset(1).  Each thread has a
 *   current device (default 0).
 *
 *   Streams: user streams are created on the current device.  Handles 0
 *   and cudaStreamLegacy name the legacy stream of the caller's current
 *   device (one per device, shared by all threads); cudaStreamPerThread
 *   names the caller's own stream on its current device.  Streams do not
 *   synchronise with each other implicitly (not even the legacy stream):
 *   the fake is stricter than CUDA, so it never hides a missing dependency.
 *   Handles are opaque numbers, never dereferenced: a destroyed, stale
 *   (from before a fake_reset) or made-up handle gives
 *   cudaErrorInvalidResourceHandle.
 *
 *   Work: the fake has no kernels; a test enqueues simulated work with
 *   fake_launch (completes duration_us after it starts) or fake_launch_held
 *   (completes when the test calls fake_complete).  Each item starts when
 *   the previous item on its stream completes, so completion is strictly in
 *   stream order.  Time is real (CLOCK_MONOTONIC).  An event captures the
 *   work enqueued on a stream so far; cudaStreamWaitEvent makes later work
 *   on a stream wait for an event's captured work.
 *
 *   Memory: allocations get fake addresses (never dereference them) from a
 *   counter that never goes back, so no address is ever reused.  Device
 *   memory is limited per device (80 GiB unless fake_set_device_memory).
 *
 * THE ORACLE
 *   Work declares the allocations it uses.  Every release (cudaFree,
 *   cudaFreeHost, cudaFreeAsync) is checked; a VIOLATION is counted and
 *   printed at once as a TAP comment "# fake oracle: ..." when:
 *     - work using the allocation has not completed (premature release;
 *       for cudaFreeAsync, work ordered before the free on its stream is
 *       fine), or
 *     - the allocation was already released (double release; the call
 *       also returns cudaErrorInvalidValue).
 *   Also a violation: fake_launch of work using an already released
 *   allocation, and a thread named "cudefer-reclaim" calling cudaSetDevice
 *   on a device that no application thread has used.
 *   Not violations (the call returns cudaErrorInvalidValue, the allocation
 *   stays live, fake_invalid_releases() counts it): releasing a pointer
 *   the fake never allocated, or with the wrong function (cudaFree of
 *   host memory, cudaFreeHost of device memory).
 *   At exit, if violations remain, the fake prints "# fake oracle: N
 *   violation(s)" and the process exits with status 1.  A test that
 *   provokes violations on purpose calls fake_oracle_forgive() afterwards.
 *
 * FAILURE INJECTION
 *   fake_fail makes calls of one kind return an error, without any side
 *   effect (a failed free leaves the allocation live, a failed record leaves
 *   the event as it was).  fake_set_latency makes calls of one kind
 *   busy-wait (outside the fake's lock) to emulate their cost.
 *
 * Everything here is thread-safe.
 */
#ifndef CUDEFER_FAKE_CUDA_H
#define CUDEFER_FAKE_CUDA_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_MAX_DEVICES 16
/* Name of cudefer's reclaimer thread (pthread_setname_np). */
#define FAKE_RECLAIMER_THREAD_NAME "cudefer-reclaim"
/* Default memory of each device: 80 GiB. */
#define FAKE_DEFAULT_DEVICE_MEMORY ((size_t)80 << 30)

/* ---- State ------------------------------------------------------------ */

/* Throw away all state (streams, events, work, allocations, counters,
 * failure injections, latencies, violations) and create ndevices devices
 * (1..FAKE_MAX_DEVICES; anything else aborts).  Every thread's current
 * device becomes 0.  Handles and fake_work pointers from before are stale. */
void fake_reset(int ndevices);

/* Set the memory of device dev (cudaMemGetInfo total, cudaMalloc limit). */
void fake_set_device_memory(int dev, size_t bytes);

/* 1 if any thread used device dev (set it current, created a stream, an
 * event or an allocation on it, used its legacy or per-thread stream);
 * 0 if not or dev is out of range. */
int fake_device_touched(int dev);

/* Same, counting only threads not named FAKE_RECLAIMER_THREAD_NAME. */
int fake_device_touched_by_app(int dev);

/* ---- Simulated work --------------------------------------------------- */

typedef struct fake_work fake_work;

/* Enqueue work on stream s that uses the nuses allocations in uses (any
 * pointer inside an allocation names it; others are ignored).  It starts
 * when the previous work on s completes (now, if s is idle) and completes
 * duration_us later.  Returns a handle valid until fake_reset, or NULL if
 * s is invalid.  Using a released allocation is a violation. */
fake_work *fake_launch(cudaStream_t s, unsigned duration_us,
                       void *const *uses, size_t nuses);

/* Same, but the work completes only once fake_complete(w) was called (and
 * all earlier work on s completed). */
fake_work *fake_launch_held(cudaStream_t s, void *const *uses, size_t nuses);

/* Release held work w (no effect on timed work or if already released). */
void fake_complete(fake_work *w);

/* 1 if w has completed, else 0. */
int fake_work_done(const fake_work *w);

/* Sequence number of w (the "#N" of oracle messages; 1, 2, ... since
 * fake_reset), 0 for NULL. */
unsigned long long fake_work_id(const fake_work *w);

/* ---- Oracle ----------------------------------------------------------- */

/* Violations counted so far. */
long fake_violations(void);

/* Reset the violation count (for tests that provoke them on purpose). */
void fake_oracle_forgive(void);

/* Copy the message of the last violation (without the "# fake oracle: "
 * prefix) into buf; "" if none since fake_reset.  Returns buf. */
char *fake_last_violation(char *buf, size_t len);

/* Allocations (all kinds) not yet released. */
size_t fake_live_allocations(void);

/* Releases rejected because the pointer was unknown or of the wrong kind. */
size_t fake_invalid_releases(void);

/* 1 if p (the start of an allocation) was released, 0 if live, -1 if the
 * fake never returned p. */
int fake_is_released(const void *p);

/* Events created and not yet destroyed. */
size_t fake_live_events(void);

/* ---- Failure injection ------------------------------------------------ */

enum fake_call {
    FAKE_EVENT_CREATE,          /* cudaEventCreate, cudaEventCreateWithFlags */
    FAKE_EVENT_RECORD,          /* cudaEventRecord, cudaEventRecordWithFlags */
    FAKE_EVENT_QUERY,
    FAKE_EVENT_DESTROY,
    FAKE_EVENT_SYNCHRONIZE,
    FAKE_FREE,
    FAKE_FREE_HOST,
    FAKE_FREE_ASYNC,
    FAKE_SET_DEVICE,
    FAKE_GET_DEVICE,
    FAKE_GET_DEVICE_COUNT,
    FAKE_STREAM_GET_DEVICE,
    FAKE_STREAM_GET_ID,
    FAKE_STREAM_CREATE,         /* cudaStreamCreate, ...WithFlags, ...WithPriority */
    FAKE_STREAM_DESTROY,
    FAKE_STREAM_SYNCHRONIZE,
    FAKE_STREAM_IS_CAPTURING,
    FAKE_POINTER_GET_ATTRIBUTES,
    FAKE_MEM_GET_INFO,
    FAKE_MALLOC,
    FAKE_MALLOC_HOST,           /* cudaMallocHost, cudaHostAlloc */
    FAKE_MALLOC_ASYNC,
    FAKE_STREAM_QUERY,
    FAKE_STREAM_WAIT_EVENT,
    FAKE_DEVICE_SYNCHRONIZE,
    FAKE_DEVICE_GET_ATTRIBUTE,
    FAKE_DRIVER_GET_VERSION,
    FAKE_RUNTIME_GET_VERSION,
    FAKE_DRIVER_ENTRY_POINT,    /* cudaGetDriverEntryPointByVersion */
    FAKE_CU_POINTER_GET_ATTRIBUTES, /* the driver's cuPointerGetAttributes,
                                   as returned by the entry-point query */
    FAKE_NCALLS
};

/* After skip more calls of c are let through (whatever they return), fail
 * the next count calls with err (count < 0: all later calls; count 0:
 * disarm).  Replaces any earlier injection for c. */
void fake_fail(enum fake_call c, cudaError_t err, long skip, long count);

/* Disarm all failure injections. */
void fake_fail_clear(void);

/* Calls of c since fake_reset, failed ones included. */
unsigned long fake_calls(enum fake_call c);

/* The cudart name of c ("cudaEventQuery"; "?" if out of range). */
const char *fake_call_name(enum fake_call c);

/* Make every call of c busy-wait ns nanoseconds, outside the fake's lock
 * (0: no latency). */
void fake_set_latency(enum fake_call c, unsigned ns);

#ifdef __cplusplus
}
#endif

#endif /* CUDEFER_FAKE_CUDA_H */
