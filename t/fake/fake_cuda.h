/* SPDX-License-Identifier: MIT */
/*
 * fake_cuda.h — a fake CUDA runtime for testing cudefer without a GPU.
 *
 * The t/fake/fake_*.c files DEFINE the cudart functions cudefer calls
 * (cudaEventRecord, cudaFree, ...) with the exact prototypes of
 * <cuda_runtime_api.h>; a test links the library's objects with them
 * (t/libcudefer-fake.la) instead of -lcudart.  This header adds the control
 * and inspection API tests use.  Where each part lives: streams, work and
 * events on the simulated clock in fake_stream.c; memory in fake_memory.c;
 * the oracle in fake_oracle.c; capture, graphs and user objects in
 * fake_graph.c; devices in fake_device.c; driver and _ptsz entry points in
 * fake_driver.c; reset, failure injection and latencies in fake_control.c
 * (fake_internal.h, their shared state, says more).
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
 *   cudaErrorInvalidResourceHandle, unless fake_stream_create_reusing
 *   gave a destroyed stream's handle to a new stream.
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
 *   counter that never goes back, so no address is reused, unless
 *   fake_set_address_reuse or FAKE_ADDRESS_REUSE asks for reuse as CUDA
 *   does.  Device
 *   memory is limited per device (80 GiB unless fake_set_device_memory).
 *   An async allocation (cudaMallocAsync, cudaMallocFromPoolAsync) on a
 *   stream is ordered after the work enqueued on it so far, as in CUDA
 *   (its memory may be what that work freed): the oracle counts that work
 *   as a use of it for another stream and for cudaFreeAsync, not for
 *   cudaFree, which waits for the device.  A cudaFreeAsync runs in stream
 *   order, after the work enqueued on its stream so far, and takes no time
 *   unless fake_set_free_async_us gives it a duration (an item of its own
 *   on the stream); pool memory it gives back stays the pool's (used, kept
 *   by cudaMemPoolTrimTo) until it ran, except for a later allocation from
 *   the pool on that stream, which stream order lets take it.  cudaMalloc
 *   memory given to cudaFreeAsync stays in the device's use (cudaMemGetInfo)
 *   until its stream, or its device, is synchronized or the stream
 *   destroyed, as an H200 does (bench/results/h200-probes.txt).
 *
 *   Graphs: cudaStreamBeginCapture starts capturing a stream into a new
 *   graph.  While it captures, fake_launch and fake_launch_held on it do
 *   not run: they add their work to the graph (timed work adds its
 *   duration; held work adds none) and return a handle that never
 *   completes.  cudaStreamEndCapture returns the graph;
 *   cudaGraphInstantiate(WithFlags) makes an executable graph of it;
 *   cudaGraphLaunch enqueues the whole graph on a stream as ONE timed item
 *   (the sum of the captured durations) that uses every allocation the
 *   captured work used, and fake_graph_launch_held as one held item.
 *   cudaStreamSynchronize or cudaStreamQuery on a capturing stream
 *   invalidates its capture (cudaErrorStreamCaptureUnsupported), and
 *   cudaStreamEndCapture of an invalidated capture destroys its graph and
 *   returns cudaErrorStreamCaptureInvalidated.  fake_capture_join makes
 *   another stream join a capture (what an event recorded on the capturing
 *   stream and waited for on the other one does in CUDA).  While a
 *   blocking stream captures (one created without cudaStreamNonBlocking,
 *   or a per-thread default stream), in any thread and mode,
 *   cudaStreamIsCapturing and cudaStreamGetCaptureInfo on its device's
 *   legacy stream return cudaErrorStreamCaptureImplicit, the capture left
 *   intact, as CUDA documents; other uses of the legacy stream then are
 *   not refused (CUDA's implicit dependency on the capture is not
 *   modeled).  Not modeled (the call returns an error):
 *   cudaStreamWaitEvent, cudaMallocAsync, cudaFreeAsync and
 *   cudaGraphLaunch on a capturing stream.
 *
 *   What may be called during a capture, as measured on an H200 with CUDA
 *   13.0 (each refusal returns cudaErrorStreamCaptureUnsupported and
 *   invalidates the captures it conflicts with):
 *     - cudaStreamGetDevice and cudaStreamGetId on a capturing stream:
 *       refused, whatever the thread and its mode;
 *     - cudaDeviceSynchronize: refused while any stream of the device
 *       captures, whatever the modes;
 *     - the "potentially unsafe" cudaFree, cudaFreeHost, cudaFreeAsync,
 *       cudaEventQuery, cudaEventSynchronize, cudaStreamQuery,
 *       cudaStreamSynchronize, cudaMalloc, cudaMallocHost/cudaHostAlloc,
 *       and the memory pool's cudaMemPoolCreate, cudaMemPoolDestroy,
 *       cudaMemPoolSetAttribute, cudaMemPoolGetAttribute,
 *       cudaMemPoolSetAccess, cudaMemPoolTrimTo and cudaMallocFromPoolAsync
 *       (bench/probes/capture_unsafe.cu, on a stream of the caller's own
 *       that does not capture):
 *       refused unless the calling thread's mode
 *       (cudaThreadExchangeStreamCaptureMode; Global by default) is
 *       Relaxed, when the thread has a capture of its own not begun Relaxed,
 *       or (the thread's mode Global) another thread has one begun Global;
 *     - everything else is allowed (cudaGetDevice, cudaSetDevice,
 *       cudaEventCreate, cudaEventRecord on other streams, cudaMemGetInfo,
 *       cudaPointerGetAttributes, cudaStreamIsCapturing, ...).
 *
 *   User objects: cudaUserObjectCreate, cudaUserObjectRelease and
 *   cudaGraphRetainUserObject (with or without cudaGraphUserObjectMove)
 *   count references.  A graph's references are also taken by every
 *   executable graph instantiated from it.  cudaGraphDestroy drops the
 *   graph's; cudaGraphExecDestroy drops the executable graph's once every
 *   launch of it has completed.  When an object has no reference left its
 *   destructor runs, asynchronously, on the fake's own thread (named
 *   "fake-cuda-uobj"), never on the caller's and never under the fake's
 *   lock, as CUDA runs it on an internal thread.
 *
 * THE ORACLE
 *   Work declares the allocations (or blocks of them) it uses.  Every release (cudaFree,
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
 *   Graphs add three: releasing an allocation that a graph or an executable
 *   graph not yet destroyed uses (it can still be launched); cudaEventRecord
 *   on a capturing stream ("event recorded into a capture": cudefer must
 *   never do it; the call returns cudaErrorStreamCaptureUnsupported and
 *   records nothing; tests join streams with fake_capture_join instead);
 *   and any CUDA call made from a user object's destructor.
 *   Reuse: the fake cannot see an allocator hand memory out again (the
 *   allocation stays live), so a test tells it with
 *   fake_oracle_handout_range right after cudefer's defer_alloc returned a
 *   block for a stream; a block handed out while other work may still use
 *   any of its bytes is a violation ("premature reuse", see
 *   fake_oracle_handout_range, which also says how work on one block of an
 *   allocation split by the allocator is told from work on another).
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
 *   fake_set_free_async_us makes each cudaFreeAsync take time on its
 *   stream, not on the caller's thread (a trim must wait for the frees).
 *   The environment variable FAKE_JITTER_US=N makes one call in four, at
 *   random, sleep up to N microseconds as it enters and as it leaves
 *   (outside the lock): a run of the suite under it shows the tests that
 *   rely on one thread's timing against another's (.ci/flakes).
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

/* Throw away all state (streams, events, work, allocations, graphs, user
 * objects (their destructors are not run), counters, failure injections,
 * latencies, violations) and create ndevices devices (1..FAKE_MAX_DEVICES;
 * anything else aborts).  Every thread's current device becomes 0 and its
 * capture mode Global.  Handles and fake_work pointers from before are
 * stale. */
void fake_reset(int ndevices);

/* Create a new user stream on the current device whose handle is that of
 * the destroyed stream `destroyed` (as CUDA may hand a destroyed stream's
 * handle value to a new stream); returns that handle, which names the new
 * stream from now on (its own id, device and work).  Aborts unless
 * `destroyed` is a destroyed user stream whose handle was not reused yet. */
cudaStream_t fake_stream_create_reusing(cudaStream_t destroyed);

/* Set the memory of device dev (cudaMemGetInfo total, cudaMalloc limit). */
void fake_set_device_memory(int dev, size_t bytes);

/* Whether device dev has memory pools (1, the default): without them its
 * cudaDevAttrMemoryPoolsSupported is 0 and cudaFreeAsync on its streams
 * answers cudaErrorNotSupported, as on a device without them. */
void fake_set_memory_pools(int dev, int on);

/* Make every pool reserve memory in multiples of bytes (1 after
 * fake_reset: a pool reserves exactly what it lends at most).  A real pool
 * maps memory in granules (2 MiB, the driver's allocation granularity, is
 * assumed: bench/replay-trace's default), so it has room beyond what it
 * lends; with exact reservations the H100 LM trace missed 255 requests a
 * step in the replay, 0 on the H100 and with 2 MiB granules. */
void fake_set_pool_granularity(size_t bytes);

/* on != 0: from now on a new allocation takes the address of a released
 * one when it can, as real allocators do (after fake_reset: off unless the
 * environment has FAKE_ADDRESS_REUSE).  It takes the lowest released address of its kind
 * (device and pool memory share addresses, pinned host memory has its
 * own) whose allocation was as large and whose release is done (a
 * cudaFreeAsync once its stream reached the free; for a stream-ordered
 * allocation on that very stream, at once, as a real pool hands it out).
 * Addresses are reused whole (no allocation starts inside an old one, but
 * after fake_set_reuse_inside, or spans two), and pool and cudaMalloc addresses mix, which a real pool
 * with cudefer's release threshold does only after a trim.  Then the old
 * allocation is forgotten: fake_is_released and a second release of that
 * address concern the new one, as with CUDA. */
void fake_set_address_reuse(int on);

/* Under fake_set_address_reuse: the next allocation that reuses a released
 * one starts offset bytes inside it (offset a multiple of 512, the old one
 * at least offset bytes larger than the new one), as CUDA may hand out an
 * address inside memory released before; once, then whole addresses
 * again.  0: whole addresses (the default). */
void fake_set_reuse_inside(size_t offset);

/* How many allocations took a released address since fake_reset.  The
 * environment variable FAKE_ADDRESS_REUSE (any value) turns reuse on at
 * every fake_reset, so that a whole test runs with it. */
size_t fake_addresses_reused(void);

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

/* The calling thread: the event its last successful cudaEventRecord
 * recorded since the last call of this (NULL: none), so a test can tell
 * which event a defer call used (t/stress: callbacks sharing one). */
cudaEvent_t fake_take_last_recorded(void);

/* ---- Oracle ----------------------------------------------------------- */

/* Violations counted so far. */
long fake_violations(void);

/* Reset the violation count (for tests that provoke them on purpose). */
void fake_oracle_forgive(void);

/* Copy the message of the last violation (without the "# fake oracle: "
 * prefix) into buf; "" if none since fake_reset.  Returns buf. */
char *fake_last_violation(char *buf, size_t len);

/* Check that the block [ptr, ptr + bytes), just handed out by an allocator
 * (cudefer's defer_alloc or defer_pluggable_alloc; bytes: what was asked
 * for) for use on stream, is free of other work: call it right after the
 * allocation returned, on the thread that asked (stream 0 and
 * cudaStreamPerThread mean what they mean for that thread).  The block may
 * be any part of an allocation (an allocator may cut several blocks from
 * one cudaMalloc).  Counts and prints one violation, "# fake oracle:
 * premature reuse of PTR (handed out for stream id N, B bytes): ...", when
 * bytes of the block:
 *   - are used by work that has not completed, was enqueued on a stream
 *     other than stream, and is not ordered before stream's later work
 *     (stream has not waited, with cudaStreamWaitEvent, on an event
 *     recorded after that work); work still pending on stream itself is
 *     fine: stream order runs it before anything enqueued on stream later;
 *   - or, when stream captures, are used by any work not completed (the
 *     graph will run wherever it is launched, ordered after nothing);
 *   - or are used by a graph or executable graph not yet destroyed (it can
 *     still be launched);
 *   - or were already released (their allocation was).
 * Also a violation: the block ends past the end of its allocation (an
 * allocator's mistake); and a test's mistakes: stream not a live stream,
 * ptr in no allocation of the fake, bytes 0.  NULL ptr: nothing is
 * checked.  Blocks only on the fake's lock.
 * Which work uses which bytes: the oracle remembers every block handed out
 * (a newer one replaces the older ones it overlaps: the allocator got them
 * back).  Work (fake_launch, a graph's capture) that names a pointer uses
 * the whole block containing it, or the whole allocation when no block
 * handed out contains it (memory the test allocated itself).  So work on
 * one block does not hold up handing out another block of the same
 * allocation, but does hold up any block over its bytes.  A release
 * (cudaFree, cudaFreeAsync) gives back the whole allocation: all its work
 * counts. */
void fake_oracle_handout_range(const void *ptr, size_t bytes,
                               cudaStream_t stream);

/* fake_oracle_handout_range of the bytes from ptr to the end of its
 * allocation (an allocator that hands out whole allocations). */
void fake_oracle_handout(const void *ptr, cudaStream_t stream);

/* The handle cudaMemPoolCreate gives every pool of device dev (the fake
 * models one pool a device: cudefer's own, src/cache_upstream.c), for
 * reading its attributes with cudaMemPoolGetAttribute: ReservedMemCurrent
 * (the most it lent since the last cudaMemPoolTrimTo) and UsedMemCurrent
 * (what it lends now, with what cudaFreeAsync gave back before its free
 * ran: see fake_set_free_async_us).  NULL when dev is no device.  Any thread. */
cudaMemPool_t fake_mem_pool(int dev);

/* Whether cudaMemPoolSetAccess let device peer use device dev's pool (0
 * for a device's own pool: its access is not listed).  Any thread. */
int fake_mem_pool_access(int dev, int peer);

/* Allocations (all kinds) not yet released. */
size_t fake_live_allocations(void);

/* Releases rejected because the pointer was unknown or of the wrong kind. */
size_t fake_invalid_releases(void);

/* 1 if p (the start of an allocation) was released, 0 if live, -1 if the
 * fake never returned p. */
int fake_is_released(const void *p);

/* Allocations by identity, which survives address reuse
 * (fake_set_address_reuse).  fake_allocation_serial(p): the serial number
 * of the allocation starting at p now (live, or the last one released
 * there; 0 if none): exact while that allocation is live.
 * fake_my_allocation_serial(p): of the latest allocation at p the calling
 * thread made among its last 256, else as fake_allocation_serial: exact
 * for a pointer the thread allocated itself, even once another thread's
 * allocation took its address.  fake_serial_released says whether that
 * allocation was released: 1, 0 if live, -1 for a serial the fake never
 * gave (serials start again at fake_reset). */
unsigned long long fake_allocation_serial(const void *p);
unsigned long long fake_my_allocation_serial(const void *p);
int fake_serial_released(unsigned long long serial);

/* The allocation containing p (any byte of it): its start in *base and
 * its size in *size (either may be NULL); 1 if it is live, 0 if it was
 * released, -1 (NULL and 0) if the fake never allocated p. */
int fake_allocation_of(const void *p, void **base, size_t *size);

/* Events created and not yet destroyed. */
size_t fake_live_events(void);

/* The driver calls cudefer makes on the launching thread's path, handed out
 * by cudaGetDriverEntryPointByVersion: how many the fake answered since the
 * process began (a test takes differences); while the calling thread has
 * set fake_set_no_context(1) they answer CUDA_ERROR_INVALID_CONTEXT, as on
 * a thread with no current context, and are not counted. */
unsigned long fake_driver_calls(void);
void fake_set_no_context(int on);

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
    FAKE_MEM_POOL_CREATE,       /* cudaMemPoolCreate: when it fails, cudefer
                                   takes blocks from cudaMalloc */
    FAKE_MEM_POOL_TRIM,         /* cudaMemPoolTrimTo */
    FAKE_NCALLS
};

/* After skip more calls of c are let through (whatever they return), fail
 * the next count calls with err (count < 0: all later calls; count 0:
 * disarm).  Replaces any earlier injection for c. */
void fake_fail(enum fake_call c, cudaError_t err, long skip, long count);

/* Disarm all failure injections. */
void fake_fail_clear(void);

/* Whether the calling thread is inside the fake now (holds its lock): a
 * test that fails the library's host allocations spares the fake's own
 * (t/host_alloc_sweep.h).  Anyone. */
int fake_in_call(void);

/* Calls of c since fake_reset, failed ones included. */
unsigned long fake_calls(enum fake_call c);

/* As fake_calls, but only those the calling thread made (so a test can
 * tell a library's calls on its thread from its reclaimer's). */
unsigned long fake_thread_calls(enum fake_call c);

/* Calls of c begun since fake_reset: as fake_calls, but counted before
 * their latency (fake_set_latency), so a test can wait until another thread
 * is inside a slow call. */
unsigned long fake_entered(enum fake_call c);

/* The cudart name of c ("cudaEventQuery"; "?" if out of range). */
const char *fake_call_name(enum fake_call c);

/* Make every call of c busy-wait ns nanoseconds, outside the fake's lock
 * (0: no latency). */
void fake_set_latency(enum fake_call c, unsigned ns);

/* Make every later cudaFreeAsync enqueue on its stream, after the work
 * there, a timed item of us microseconds: the free itself, which runs on
 * the device while the call returns at once (0, after fake_reset: no
 * item; the free runs when the stream's earlier work is done).  Until that
 * item completed, the memory a free gives back to a pool stays the pool's
 * (UsedMemCurrent; cudaMemPoolTrimTo keeps it reserved) and its address
 * is not reused by another stream: so a trim must wait for the frees
 * (cudaStreamSynchronize) to release what they gave back. */
void fake_set_free_async_us(unsigned us);

/* Make cudaStreamGetId report id for stream s from now on (the per-thread
 * and legacy handles: the calling thread's stream on the current device).
 * Real ids are unique only within a device's context, as far as cudefer
 * may assume: so two streams of two devices can be given one id, and a
 * test sees whether cudefer tells them apart by device.  Returns 0, or -1
 * when s is no stream. */
int fake_set_stream_id(cudaStream_t s, unsigned long long id);

/* Have fn(c, r, arg) called on the calling thread each time a call of c
 * returns r, after the fake's lock is released (fn may call CUDA); NULL:
 * none.  How a test holds a thread between a call and what it does next
 * (t/event_stock: the reclaimer between its query and its use of it).
 * fn and arg are set together (under the fake's lock); a call that
 * returned just before still calls the pair it read.  Calls that end
 * without fake_leave (cuPointerGetAttributes) never call it.  fake_reset
 * clears it. */
typedef void (*fake_return_hook)(enum fake_call c, cudaError_t r, void *arg);
void fake_set_return_hook(enum fake_call c, fake_return_hook fn, void *arg);

/* ---- Graphs ----------------------------------------------------------- */

/* The graph calls, for failure injection and counting (an enum of their
 * own: enum fake_call is left as it was). */
enum fake_graph_call {
    FAKE_STREAM_BEGIN_CAPTURE,
    FAKE_STREAM_END_CAPTURE,
    FAKE_STREAM_GET_CAPTURE_INFO,
    FAKE_GRAPH_INSTANTIATE,     /* cudaGraphInstantiate, ...WithFlags */
    FAKE_GRAPH_LAUNCH,          /* cudaGraphLaunch, fake_graph_launch_held */
    FAKE_GRAPH_DESTROY,
    FAKE_GRAPH_EXEC_DESTROY,
    FAKE_USER_OBJECT_CREATE,
    FAKE_USER_OBJECT_RELEASE,
    FAKE_GRAPH_RETAIN_USER_OBJECT,
    FAKE_THREAD_EXCHANGE_CAPTURE_MODE, /* cudaThreadExchangeStreamCaptureMode */
    FAKE_GRAPH_NCALLS
};

/* fake_fail, fake_calls and fake_call_name for the graph calls (fake_reset
 * and fake_fail_clear disarm these too). */
void fake_graph_fail(enum fake_graph_call c, cudaError_t err, long skip,
                     long count);
unsigned long fake_graph_calls(enum fake_graph_call c);
const char *fake_graph_call_name(enum fake_graph_call c);

/* Launch exec on stream s as one held item (see THE MODEL): it completes
 * once fake_complete(w) was called.  NULL if exec or s is invalid (or the
 * injected failure of FAKE_GRAPH_LAUNCH). */
fake_work *fake_graph_launch_held(cudaGraphExec_t exec, cudaStream_t s);

/* Make stream s join the capture of stream capturing.  cudaSuccess, or
 * cudaErrorIllegalState if capturing does not capture or s already does,
 * cudaErrorInvalidResourceHandle for an invalid stream. */
cudaError_t fake_capture_join(cudaStream_t s, cudaStream_t capturing);

/* User objects whose destructor has not returned yet. */
size_t fake_live_user_objects(void);

/* Graphs and executable graphs not yet destroyed. */
size_t fake_live_graphs(void);

#ifdef __cplusplus
}
#endif

#endif /* CUDEFER_FAKE_CUDA_H */
