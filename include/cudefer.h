/*
 * cudefer — free CUDA memory without stalling the threads that launch GPU work.
 *
 * Call defer_free(ptr, stream) right after launching the work that uses ptr.
 * cudefer records a CUDA event on stream (on the calling thread) and hands
 * (ptr, event) to its reclaimer thread, which releases ptr once the event has
 * completed.  The launching thread never waits.
 *
 * All functions are thread-safe.  Errors are returned as cudaError_t; errors
 * that are cudefer's own (a call after defer_shutdown, a call from the wrong
 * thread) are also explained on stderr with a line starting "cudefer: ".
 */
#ifndef CUDEFER_H
#define CUDEFER_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#if defined(_WIN32)
#  define CUDEFER_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define CUDEFER_API __attribute__((visibility("default")))
#else
#  define CUDEFER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* How completed device and pinned memory is released. */
enum defer_policy {
    /* Hold completed entries and release them in batches: when the device
     * has been quiet for idle_us, when more than max_pending_bytes are held,
     * when the oldest is older than max_delay_ms, or on flush/trim. */
    DEFER_POLICY_BATCHED = 0,
    /* Release each entry as soon as its work completes. */
    DEFER_POLICY_EAGER = 1,
};

/*
 * Every knob; each has a CUDEFER_* environment variable, which overrides the
 * value given here.  The variable is the field's name in capitals
 * (CUDEFER_POLL_US, CUDEFER_POLICY, ...) except for four:
 * max_pending_bytes is CUDEFER_MAX_PENDING, event_pool_max is
 * CUDEFER_EVENT_POOL, print_stats is CUDEFER_STATS and split_min_bytes is
 * CUDEFER_SPLIT_MIN.
 *
 * The struct only grows, at its end (see "Structs that grow" below).
 */
struct defer_config {
    uint32_t poll_us;           /* first wait between polls (1 us .. 1 s) */
    uint32_t poll_max_us;       /* backed-off wait while nothing completes
                                   (poll_us .. 1 s); a stream whose oldest
                                   entry has waited T longer than 16 x this
                                   is polled every T/16, unless a flush or
                                   trim waits */
    uint32_t idle_us;           /* quiet time before an idle-time release (0 .. 10 s) */
    uint64_t max_pending_bytes; /* held completed bytes above which they are
                                   released even while busy; 0: a quarter of
                                   the device's memory */
    uint32_t max_delay_ms;      /* completed entries older than this are released
                                   anyway (0: no limit; .. 1 h) */
    enum defer_policy policy;
    uint32_t event_pool_max;    /* idle events kept per device, and idle
                                   entries (0 .. 1048576); from 15 on, an
                                   entry (about 240 bytes) is mapped with
                                   up to 255 others and the 60 KiB stay
                                   mapped while any of them is in use or
                                   idle */
    int disable;                /* 1: every defer call waits for its stream and releases at once */
    int verbose;                /* 1: print the configuration in force at start-up */
    int print_stats;            /* 1: print the statistics at exit */
    int check;                  /* 1: report a pointer deferred again while
                                   still pending (costs the reclaimer a hash
                                   lookup per pointer) */
    uint32_t cache_keep_ms;     /* a block of defer_alloc's, freed and not
                                   reused for this long, is released
                                   (0: kept until defer_trim; .. 1 h) */
    uint64_t split_min_bytes;   /* defer_alloc cuts requests of at least this
                                   many bytes from larger cached blocks and
                                   merges freed neighbours (default 1 MiB;
                                   0: never; see defer_alloc) */
    uint32_t free_batch;        /* blocks of defer_alloc's freed on the
                                   legacy stream that share one event
                                   (default 32; 1: an event per free;
                                   .. 4096; see defer_alloc) */
    uint32_t round_divisions;   /* a new block of defer_alloc's is rounded
                                   up to one of this many sizes per power
                                   of two (a power of two, 1 .. 256;
                                   default 16; see defer_alloc) */
    int driver_calls;           /* 1 (default): the launching thread's
                                   capture check, event record, event
                                   creation and current device through the
                                   driver's entry points, cheaper than the
                                   runtime's wrappers; 0: the runtime's
                                   calls (an escape hatch, and the A/B of
                                   bench-call-parts) */
};

/* Counters since the reclaimer started.  A snapshot: fields are read one by
 * one, so under load they may disagree by the entries in flight.  Every
 * field is a uint64_t; the struct only grows, at its end (see "Structs that
 * grow" below). */
struct defer_stats {
    uint64_t deferred;       /* entries accepted by the defer_* calls */
    uint64_t released;       /* entries released (or callbacks run) successfully */
    uint64_t pending;        /* accepted and not yet released or failed */
    uint64_t failed;         /* entries whose release returned an error, or that
                                were abandoned (failed device, fork child, exit) */
    uint64_t rejected;       /* defer calls refused (bad stream, after shutdown...) */
    uint64_t sync_releases;  /* entries whose stream the caller waited for
                                (no event could be had, or CUDEFER_DISABLE) */
    uint64_t event_queries;  /* cudaEventQuery calls cudefer made: the
                                reclaimer's, and a launching thread's own
                                query of its stream's newest event when it
                                found no idle one */
    uint64_t wakeups;        /* times the reclaimer thread woke up */
    uint64_t batches;        /* passes of the reclaimer that released something */
    uint64_t largest_batch;  /* most entries released in one pass */
    uint64_t events_created; /* CUDA events created for the event pool */
    uint64_t events_in_pool; /* idle events held for reuse (not those kept
                                for the streams a thread defers on) */
    uint64_t held;           /* completed entries the release policy holds now */
    uint64_t held_bytes;     /* their bytes */
    uint64_t idle_releases;  /* entries released because the application was quiet */
    uint64_t cap_releases;   /* ... because a device held more than its cap */
    uint64_t age_releases;   /* ... because they were older than max_delay_ms */
    uint64_t demand_releases;/* ... because of defer_flush, defer_trim or shutdown */
    uint64_t latency_p50_us; /* completion (as the reclaimer saw it) to release:
                                median, as a power-of-two upper bound */
    uint64_t latency_max_us; /* ... and the largest */
    uint64_t leaked_at_exit; /* entries still pending when the process exited */
    uint64_t reused;         /* blocks handed out again by defer_alloc */
    uint64_t reused_same_stream; /* ... of them, before their work was done, to
                                the stream they were freed on */
    uint64_t cache_bytes;    /* bytes of the blocks defer_alloc made and
                                cudefer has not released (live or free) */
    uint64_t cache_free_bytes; /* ... of them, freed and waiting for reuse */
    uint64_t cache_mallocs;  /* new blocks defer_alloc made (from its pool,
                                or cudaMalloc where no pool could be made) */
    uint64_t cache_releases; /* blocks released (not reused for cache_keep_ms,
                                or defer_trim, or shutdown) */
};

/*
 * defer_free: cudaFree(ptr) once all work enqueued on stream so far is done.
 * Thread-safe; never blocks on the GPU.  The event is recorded on the calling
 * thread, so stream 0 and cudaStreamPerThread mean the caller's stream
 * (built with --default-stream per-thread, 0 is the per-thread stream:
 * see the end of this header).
 * Returns cudaSuccess (ptr now belongs to cudefer), or an error, with ptr
 * still the caller's and nothing queued: the error of recording the event
 * (or of reading the stream), the sticky error of a device that failed,
 * cudaErrorMemoryAllocation (no entry could be had), at the first call
 * the error of starting (cudaGetDeviceCount's, or cudaErrorOperatingSystem
 * when no thread could be started), cudaErrorNotPermitted after
 * defer_shutdown or in a forked child, or cudaErrorInvalidValue for a
 * block of defer_alloc already freed or a pointer inside one (those are
 * not the caller's to give: see defer_alloc).
 * defer_free(NULL, s) does nothing and returns cudaSuccess.
 *
 * On a capturing stream (CUDA graph capture) no event is recorded: the call
 * belongs to the graph being captured.  ptr is released once that graph
 * and every executable graph instantiated from it have been destroyed and
 * all their launches have completed (CUDA runs the destructor of a user
 * object the graph holds, on a thread of its own; it tells the
 * reclaimer), and the work enqueued on stream before the capture began is
 * done too (the reclaimer records an event on stream once it sees the
 * capture end; while stream captures again, it waits).  Until then it
 * counts as pending, but defer_flush does not wait for it, nor
 * defer_shutdown unless the graph is dead already and only that earlier
 * work is left (an event, waited for as any other).  If the graph dies
 * after defer_shutdown, or a stream of the capture
 * is destroyed before the reclaimer saw its capture end (that work can
 * then not be waited for), ptr is never released (reported, counted as
 * failed); limit: one whose handle a new stream got before the reclaimer
 * looked (within a poll interval, CUDEFER_POLL_MAX_US) is taken for that
 * stream.  Limit: a capture of cudaStreamPerThread (stream 0 in a program
 * built for per-thread default streams) is refused with
 * cudaErrorStreamCaptureUnsupported, the capture intact: the reclaimer,
 * on a thread of its own, could not wait for the work this thread enqueued
 * on it before the capture.  A capture already invalidated gives
 * cudaErrorStreamCaptureInvalidated; CUDEFER_DISABLE does not apply (a
 * capture cannot be waited for).
 */
CUDEFER_API cudaError_t defer_free(void *ptr, cudaStream_t stream);

/* defer_free_host: cudaFreeHost(ptr) once stream's work so far is done.
 * Same contract as defer_free. */
CUDEFER_API cudaError_t defer_free_host(void *ptr, cudaStream_t stream);

/*
 * defer_free_n: cudaFree each of the n pointers once stream's work so far is
 * done, with one event for all of them.  NULL pointers are skipped; n == 0
 * does nothing.  ptrs is copied (the caller may reuse the array at once).
 * Same contract as defer_free; cudaErrorInvalidValue for a NULL ptrs, and
 * for a pointer named more than once (reported, counted in rejected,
 * nothing deferred: it would be released twice).
 */
CUDEFER_API cudaError_t defer_free_n(void *const *ptrs, size_t n,
                                     cudaStream_t stream);

/*
 * defer_alloc: *ptr = a block of device memory of at least bytes for use on
 * stream (on stream's device).  As with cudaMallocAsync, the block may still
 * be in use by work enqueued on stream before the call (its previous
 * owner's): use it on another stream, or free it on one, only once that
 * stream waits for stream (cudaStreamWaitEvent after the call), never
 * earlier.  Blocks come from cudefer's block cache:
 *   - a block freed with defer_free on the SAME stream is handed out again
 *     at once, before its work is done: work enqueued later on that stream
 *     runs after the work that used it (the stream-ordered rule of
 *     cudaMallocAsync and of PyTorch's caching allocator).  Stream means the
 *     stream itself (cudaStreamGetId), not the handle: the per-thread
 *     default stream is a different stream on every thread; the legacy
 *     stream is one stream per device;
 *   - a block freed on another stream, with defer_free_streams or
 *     defer_free_n of several pointers, recorded on other streams (defer_record_stream), or of
 *     another device's stream, is handed out only once all its work is done;
 *   - otherwise a new block of bytes rounded up to one of round_divisions
 *     sizes per power of two (CUDEFER_ROUND_DIVISIONS, 16 by default: at
 *     most 6.25 % more; finer stops at 512-byte steps, so below 512 x
 *     round_divisions bytes sizes round as at 16; a rounded size beyond
 *     the device's memory is rounded to 512 only.  32 reserved 2 % less
 *     for a ResNet-class training trace replayed on the fake runtime, the
 *     same for a GPT-like one), from a memory pool of cudefer's
 *     own on the device (cudaMemPoolCreate, release threshold the maximum;
 *     cudaMallocFromPoolAsync on stream), or cudaMalloc where no pool can
 *     be made.  Before it, when the pool lacks the memory, cached blocks
 *     go back to it, the largest first, free ones or ones freed on stream
 *     (cudaFreeAsync on stream, no device drain), as many as it lacks, so
 *     their memory serves the request whatever its size and the pool does
 *     not grow while the cache holds memory nobody asks for.  Out of
 *     memory, cudefer releases what it holds (defer_trim, which also trims
 *     the pool) and tries again, then with bytes rounded up to 512 only
 *     where that is less.
 *     A request for more than the device's whole memory
 *     (cudaGetDeviceProperties, asked at the device's first miss) is out
 *     of memory at once,
 *     unreported, with nothing handed back or trimmed.
 * Splitting: a request of at least split_min_bytes (CUDEFER_SPLIT_MIN,
 * 1 MiB by default) that no cached block fits is cut from the end of a
 * larger one (free, or freed on stream), and freed neighbours merge again
 * (a block freed on a stream at once with those freed on it and with free
 * ones: the merged block is then reusable on that stream at once, on
 * others once all its parts' work is done), so memory freed as activations
 * serves gradients of other sizes (H100 training: peak 1.013x and 1.001x
 * native, 1.167x and 1.204x with splitting off).  Limits: only whole
 * allocations go back to the pool, so a request too small to be cut that
 * misses takes back only whole ones (t/alloc_steady_split: the pool at
 * 1.08-1.16x the trace's live peak, up to 13 misses in 164 requests a
 * step).  A block cut from a larger one cannot be released with cudaFree:
 * blocks still live at defer_shutdown stay allocated until the process
 * exits.  A block freed again once its first free's work is done and it
 * merged with a free neighbour is no block any more, yet still the
 * cache's memory: that second free is refused at the call like any
 * pointer inside the cache's memory where no block starts, an interior
 * pointer included (cudaErrorInvalidValue, reported, counted in rejected;
 * looked up only when no block starts at the pointer, so a block's own
 * free costs nothing more).  Once the whole allocation went back to the
 * pool or to CUDA the memory is no longer cudefer's, cut or not: a free
 * then is taken for other memory and its release fails (reported).
 * With split_min_bytes 0 (never), a program
 * whose requests of every size add up to more than its live peak (a
 * training step whose gradients and workspaces have sizes no activation
 * has) keeps about the sum of each size's most-live count cached (1.44x
 * the live peak of a ResNet-50 step), or misses the cache on some requests
 * every step, each miss a cudaFreeAsync and a cudaMallocFromPoolAsync
 * (t/alloc_steady: 27 of 164 requests a step, the pool at 1.01x the live
 * peak).
 * Blocks still live at defer_shutdown stay the application's (cudaFree
 * them, unless split).
 * Free batches: blocks freed with defer_free on the legacy stream (stream
 * 0 or cudaStreamLegacy, PyTorch's default) share one event per free_batch
 * frees (CUDEFER_FREE_BATCH, 32) or per 1 to 11 ms (a millisecond on the
 * kernel's coarse clock), whichever comes first,
 * recorded by the free that fills the batch: the others make no
 * cudaEventRecord and push nothing (H100, PyTorch training: about 2.5 us
 * a free before).  Limit: until its batch's event is recorded, a block is
 * reusable on the legacy stream only, not by another stream, nor released:
 * at most free_batch - 1 blocks per device wait so, until the batch fills,
 * the first such free 1 to 11 ms after the oldest, or defer_flush,
 * defer_trim, defer_shutdown or exit, which seal every batch (an event on
 * the legacy stream of each device, made current for it and the caller's
 * device current again after: limit, a thread that never chose a device
 * and seals another device's batch so makes device 0 current, which
 * creates its primary context with CUDA 12 or later).  While another
 * thread captures a blocking stream in the global mode, the legacy stream
 * cannot take an event (it would invalidate that capture): a batch then
 * waits, and a flush, trim or shutdown meanwhile says so, does not wait
 * for it and returns cudaErrorStreamCaptureImplicit (at shutdown its
 * blocks are lost to the cache).  Frees on other streams, and
 * those a callback makes, record an event each (a created stream may be
 * destroyed before a later free could seal its batch), shared as
 * defer_call's are: once a thread has 8 events pending on a stream, or
 * some and no idle one at hand, its next frees of blocks there record the
 * newest again instead of making one (H100, 8 threads each freeing on its
 * own stream behind the GPU: 6,600-7,800 events made in a run, and one
 * free a run waited 4-135 ms for the driver's lock, which making an event
 * takes behind the other threads' launches).  Limit: such a block is
 * handed to another stream, released or trimmed when the newest record of
 * its event completes (and that of the blocks freed before it on the
 * stream), after the work its stream was given until an older event
 * completed or the reclaimer made more (at most 4096 frees of the thread
 * there later; with CUDEFER_EVENT_POOL=0 as callbacks do), not as soon
 * as its own work is done (never earlier); on its own stream it is reused
 * at once as before.
 * A request takes the smallest cached block of at least bytes and at most
 * 1/8 above the rounded size.  A freed block that nobody takes for
 * cache_keep_ms (CUDEFER_CACHE_KEEP_MS, 10 s) is released with cudaFree at
 * the next quiet moment (no work cudefer tracks pending, no defer call for
 * CUDEFER_IDLE_US), or after 4 x cache_keep_ms anyway; every free block is
 * released on defer_trim and defer_shutdown.  Only memory defer_alloc made is
 * ever reused; pointers cudefer did not allocate are released as before.
 * Return a block with defer_free (or defer_free_n, defer_free_streams),
 * never with cudaFree: a block freed twice, by any of them, is refused from
 * the moment the first free is accepted (cudaErrorInvalidValue, reported,
 * counted in rejected; a defer_free_n naming it defers none of its
 * pointers), as is defer_record_stream of it.
 * On a stream being captured into a graph it is refused with
 * cudaErrorStreamCaptureUnsupported, the capture left intact: allocate
 * before the capture begins.  Thread-safe; blocks only in the allocation
 * and the trim.  Returns cudaSuccess, the allocation's error, cudaErrorInvalidValue
 * for a NULL ptr (bytes == 0 gives NULL and cudaSuccess, after defer_shutdown too),
 * cudaErrorMemoryAllocation when out of memory (not reported: the caller
 * hears it) or for more than 2^62 bytes (said), another error of the
 * allocation (reported, the runtime's last error cleared), the error of
 * cudaStreamGetDevice for a bad stream, a failed device's error, or
 * cudaErrorNotPermitted after defer_shutdown; every refusal is counted in
 * the stats' rejected.
 */
CUDEFER_API cudaError_t defer_alloc(void **ptr, size_t bytes,
                                    cudaStream_t stream);

/*
 * defer_record_stream: tell cudefer that the block ptr (from defer_alloc or
 * defer_pluggable_alloc, not yet freed) is also used by stream, so that when
 * it is freed it waits for the work enqueued on stream up to its free too:
 * the block is then never handed out again, not even on its free stream,
 * before that work is done (PyTorch's Tensor.record_stream).  Call it once
 * the other stream uses the block; recording a stream twice is once; at
 * most 63 streams per block.  The stream must outlive the block's free (its
 * event is recorded then).  cudaStreamPerThread is refused (the thread
 * that frees could not name it); stream 0 (or cudaStreamLegacy) means the
 * legacy stream of the device current at this call, also when the block is
 * freed with another device current (the free then makes that device
 * current for its event, and the caller's again).  Every way of freeing
 * the block waits for them (defer_free, defer_free_n, defer_free_streams,
 * CUDEFER_DISABLE; a free whose blocks were recorded on more than 64
 * streams in all is refused, cudaErrorInvalidValue);
 * freeing it into a graph capture is refused
 * (cudaErrorStreamCaptureUnsupported: the capture could not wait for them).
 * Returns cudaSuccess, cudaErrorInvalidValue (reported) when ptr is not the
 * start of a live block of cudefer's, cudaErrorNotSupported (reported) when
 * it has 63 streams already or for cudaStreamPerThread (not InvalidValue:
 * the PyTorch hook takes that for memory that is not cudefer's and carries
 * on), cudaErrorStreamCaptureUnsupported on a
 * capturing stream, cudaErrorMemoryAllocation, or the errors of
 * defer_free.  Thread-safe; never blocks on the GPU.
 */
CUDEFER_API cudaError_t defer_record_stream(void *ptr, cudaStream_t stream);

/*
 * The two entry points of PyTorch's pluggable allocator:
 *   torch.cuda.memory.CUDAPluggableAllocator(path_to_libcudefer,
 *       "defer_pluggable_alloc", "defer_pluggable_free")
 * defer_pluggable_alloc is defer_alloc on device (the caller's current
 * device is left as it was, unless the switch back to it fails: said, the
 * block still handed out, device then current (t/switch_errors); a
 * device it cannot switch to, or a created
 * stream of another device, is refused: reported, counted in rejected,
 * cudaErrorInvalidDevice for the latter); NULL when out of memory or on another error,
 * reported.  Limit: PyTorch 2.11 does not check the pointer a pluggable
 * allocator loaded this way returns: out of memory gives a tensor at
 * address 0 (an illegal address at its first use), not
 * torch.OutOfMemoryError.  python/cudefer_torch.py's enable() avoids it:
 * with its C++ hook (the default) it installs defer_pluggable_alloc_status
 * behind a function that raises torch.OutOfMemoryError (other errors:
 * RuntimeError); only enable(record_stream=False) loads the two entry
 * points above.  (Shown off the GPU: t/alloc_limits on the fake runtime,
 * the hook against PyTorch 2.11's libraries; not yet on a GPU.)
 * defer_pluggable_alloc_status is defer_pluggable_alloc returning the
 * error: cudaSuccess with *ptr set (NULL for size 0),
 * cudaErrorMemoryAllocation when out of memory as defer_alloc is (not
 * reported: the caller raises it; a size above 2^62 is said), or another
 * error, reported (a failed device switch names
 * defer_pluggable_alloc_status, the allocation's own refusals
 * defer_alloc), with *ptr NULL; cudaErrorInvalidValue for a NULL ptr.
 * defer_pluggable_free is defer_free of ptr on stream; PyTorch passes the
 * stream of the allocation, so a block used on other streams must be
 * recorded with defer_record_stream (python/cudefer_torch.py wires
 * Tensor.record_stream to it).  size and device are checked against the
 * block (a mismatch is reported; the block is still freed, on its own
 * device where device is one cudefer cannot switch to).
 */
CUDEFER_API void *defer_pluggable_alloc(size_t size, int device,
                                        cudaStream_t stream);
CUDEFER_API cudaError_t defer_pluggable_alloc_status(void **ptr, size_t size,
                                                   int device,
                                                   cudaStream_t stream);
CUDEFER_API void defer_pluggable_free(void *ptr, size_t size, int device,
                                      cudaStream_t stream);

/*
 * defer_free_streams: cudaFree(ptr) once the work enqueued so far on ALL n
 * streams (1..64) is done — memory used by several streams, without making
 * the streams wait for each other.  One event per stream, recorded on the
 * calling thread; if any cannot be recorded, nothing is deferred and the
 * caller keeps ptr.  defer_free_host_streams and defer_call_streams likewise
 * (the callback runs once, after all the streams' work).  Otherwise the
 * contract of defer_free; cudaErrorInvalidValue for a NULL streams or an n
 * out of range.  Streams that all capture into one graph: as defer_free on
 * a capturing stream; some capturing and some not, or captures into
 * different graphs: cudaErrorStreamCaptureUnsupported.
 */
CUDEFER_API cudaError_t defer_free_streams(void *ptr,
                                           const cudaStream_t *streams,
                                           size_t n);
CUDEFER_API cudaError_t defer_free_host_streams(void *ptr,
                                                const cudaStream_t *streams,
                                                size_t n);
CUDEFER_API cudaError_t defer_call_streams(void (*fn)(void *arg), void *arg,
                                           const cudaStream_t *streams,
                                           size_t n);

/*
 * defer_call: run fn(arg) on the reclaimer thread once all work enqueued on
 * stream so far is done.  fn may call CUDA and the other defer calls
 * (defer_free, defer_call, ...), also while defer_shutdown or process exit
 * drains (what fn defers is drained too; at exit within the drain's 2 s);
 * defer_flush, defer_trim and defer_shutdown
 * would wait for fn itself and return cudaErrorNotPermitted there.  There is
 * one reclaimer thread: while fn runs, nothing else is polled or released,
 * so keep it short.  fn finds the thread's CUDA last error clear
 * (cudaGetLastError: its own calls' errors only, or a sticky one).  A NULL
 * fn is cudaErrorInvalidValue.  Otherwise same contract as defer_free.
 *
 * Order: callbacks deferred on one stream run in the order deferred (by
 * any threads), also when one of them found no event and waited for its
 * stream (it is then queued behind the earlier ones).  A callback deferred
 * on several streams (defer_call_streams) runs after the callbacks
 * deferred before it on each of them; one deferred after it on one of
 * those streams with defer_call does not wait for the other streams, so it
 * may run first.  Under CUDEFER_DISABLE every callback runs on the calling
 * thread, in the order of the calls.
 *
 * Limit: a thread keeps at most 8 events pending per stream for its
 * callbacks (the driver's cudaEventCreate costs microseconds a call, and
 * on a GPU running behind it waits for the driver's lock behind other
 * threads' launches: W6's slowest calls on an H100 took 78-105 ms so).  A
 * callback it defers on a stream where all 8 are pending, or some and no
 * idle event is at hand (the reclaimer then makes more; while fewer than
 * 4096 records of the newest are not seen complete), records the newest
 * of them again: that event is shared, and every callback on it (the one
 * that took it and those deferred after it on the event) runs once the
 * work enqueued before its newest record, that of the last of them, is
 * done: possibly later than its own work, never earlier, still in order
 * (t/shared_events).  Limit: a callback takes an idle event or makes one
 * on the calling thread, and so may wait for the driver's lock, when it
 * is the first the thread defers on its stream (the device's first defer
 * call makes up to 2,048 idle events, half of CUDEFER_EVENT_POOL, in 1-2
 * ms on an idle H100, and a quarter of the pool, 1,024 at most and no
 * more than half of those made, is kept for such first callbacks: W6 on
 * an H100, 64 threads starting on 16 new streams each, waited 87-349 ms
 * at a thread's 5th-15th call before, 6-24 ms at most since;
 * bench/results/2026-11-26-h100-w6-stock.txt; past those, such a call
 * makes its event), when 4096 records of its stream's newest event are
 * not yet seen complete, while a defer_flush waits on any thread (nothing
 * shares then), when the thread has deferred on so many streams
 * since (more than 64; fewer where their identities collide) that it let
 * go of this stream's events, and always with CUDEFER_EVENT_POOL=0 (no
 * event is ever idle), up to the 8.  defer_trim runs a callback only once
 * its event completed.  defer_flush waits for such a callback; while a
 * flush waits no callback shares a pending event, so it waits at most for
 * the work of defer calls made before it began or racing with its start,
 * never for work deferred later, and cannot hang.  Memory is never delayed
 * so, but for defer_alloc's blocks (see there): other frees have events of
 * their own and wait apart from callbacks (defer_trim's promise holds for
 * them).
 *
 * On a capturing stream fn runs (on the reclaimer thread) once the graph
 * being captured and every executable graph made from it are destroyed and
 * their launches are done, as for defer_free; never if that happens after
 * defer_shutdown.  Its order relative to other callbacks is not kept.
 */
CUDEFER_API cudaError_t defer_call(void (*fn)(void *arg), void *arg,
                                   cudaStream_t stream);

/*
 * defer_flush: block until everything deferred before this call (by any
 * thread, as far as this thread can see) has been released or has failed.
 * Returns cudaSuccess, cudaErrorNotPermitted inside a defer_call callback
 * (on the reclaimer thread, or on the calling thread when the callback ran
 * synchronously), after defer_shutdown or in a forked child, or the
 * sticky error of a device
 * whose entries cannot complete, or cudaErrorStreamCaptureImplicit (or the
 * error of the CUDA call that failed) when blocks freed on the legacy
 * stream could not get their batch's event (see Free batches under
 * defer_alloc: they wait on, said).  A release that failed for its pointer
 * alone (a host pointer given to defer_free: reported, counted in failed)
 * is not the flush's error.
 */
CUDEFER_API cudaError_t defer_flush(void);

/*
 * defer_trim: release every completed entry now, whatever the policy — what
 * an application calls when cudaMalloc fails, before it retries.  Blocks
 * while the reclaimer polls every stream once and releases what completed
 * (each pending free, not only each stream's oldest: two threads' frees on
 * one stream may reach it in another order than their events were
 * recorded; a query per pending event, so a trim behind 20,000 frees
 * waiting on a busy stream took 3.4-6.1 ms on an H100); does not wait for
 * work still running.  *released_bytes (if not NULL) gets
 * the bytes of device and pinned memory released (pool memory is released as
 * soon as it completes and is not counted).  Errors as for defer_flush.  A
 * callback that shares an event completes when the event's newest record
 * does, which may be after its own work (defer_call's limit); memory
 * completes with its own work, but for blocks of defer_alloc's that share
 * an event (see defer_alloc: free batches and shared events).
 */
CUDEFER_API cudaError_t defer_trim(size_t *released_bytes);

/*
 * defer_shutdown: flush, then stop and join the reclaimer and destroy its
 * events; it stops even when the flush returns an error, and returns that
 * error.  Later defer_* calls return cudaErrorNotPermitted.  Calling it again
 * returns cudaSuccess (in a forked child: cudaErrorNotPermitted).  Blocks.  Inside a defer_call callback it would wait
 * for the callback itself: cudaErrorNotPermitted there.
 */
CUDEFER_API cudaError_t defer_shutdown(void);

/*
 * Structs that grow.  struct defer_config and struct defer_stats gain fields
 * (knobs, counters) in later versions, always at their end.  The calls that
 * take them are macros that pass the size of the struct this header
 * declares, so a program built against it keeps working with a later
 * library: fields the program's struct lacks are never read nor written
 * (the library uses its defaults for the knobs, and keeps the counters).
 * The functions behind the macros are the *_sized ones; call them directly
 * with sizeof(struct ...) where the macro cannot be used (a function
 * pointer, dlsym, ctypes).
 *
 * The plain symbols (defer_config_defaults, defer_configure,
 * defer_stats_get) are those of cudefer 0.1.0, for programs built against
 * it: they read and write only the fields 0.1.0 had (defer_config through
 * check, defer_stats through reused).  Reached without the macro, e.g.
 * (defer_stats_get)(&s), they give the newer fields nothing: the defaults
 * for the knobs, no value for the counters.
 */

/*
 * defer_config_defaults_sized: fill the size bytes of *cfg with the
 * built-in defaults (bytes that are no field of this library's are
 * zeroed).  A NULL cfg does nothing; a size smaller than cudefer 0.1.0's
 * fields (through check) writes nothing and is reported.  Never blocks.
 */
CUDEFER_API void defer_config_defaults_sized(struct defer_config *cfg,
                                             size_t size);
/* defer_config_defaults(cfg): fill *cfg with the built-in defaults. */
CUDEFER_API void defer_config_defaults(struct defer_config *cfg);
#define defer_config_defaults(cfg) \
    defer_config_defaults_sized((cfg), sizeof(struct defer_config))

/*
 * defer_configure_sized: use *cfg, of size bytes (then the CUDEFER_*
 * environment on top), when the reclaimer starts.  Only before the first
 * defer call and before defer_shutdown: afterwards it returns
 * cudaErrorNotPermitted and changes nothing.  A value out of range is
 * cudaErrorInvalidValue (reported on stderr, nothing changed).  The knobs
 * that do not fit in size bytes keep their defaults; past this library's
 * struct (a program built against a later header) they are ignored.  A
 * NULL cfg, or a size smaller than cudefer 0.1.0's fields (through check),
 * is cudaErrorInvalidValue (reported, nothing changed).  A bad CUDEFER_*
 * value is reported and ignored: that knob keeps the value given here.
 * Thread-safe; never blocks on the GPU.
 */
CUDEFER_API cudaError_t defer_configure_sized(const struct defer_config *cfg,
                                              size_t size);
/* defer_configure(cfg): defer_configure_sized with this header's struct. */
CUDEFER_API cudaError_t defer_configure(const struct defer_config *cfg);
#define defer_configure(cfg) \
    defer_configure_sized((cfg), sizeof(struct defer_config))

/*
 * defer_stats_get_sized: copy the counters into *out, of size bytes: the
 * fields that fit, no byte more (bytes past this library's struct, for
 * counters it does not keep, are set to 0).  A NULL out does nothing; a
 * size smaller than cudefer 0.1.0's struct (through reused) writes nothing
 * and is reported.  Never blocks.
 */
CUDEFER_API void defer_stats_get_sized(struct defer_stats *out, size_t size);
/* defer_stats_get(out): defer_stats_get_sized with this header's struct. */
CUDEFER_API void defer_stats_get(struct defer_stats *out);
#define defer_stats_get(out) \
    defer_stats_get_sized((out), sizeof(struct defer_stats))

/* defer_version: "MAJOR.MINOR.PATCH" of the library in use. */
CUDEFER_API const char *defer_version(void);

/*
 * A program built with nvcc --default-stream per-thread (or that defines
 * CUDA_API_PER_THREAD_DEFAULT_STREAM) means its per-thread default stream
 * by stream 0.  cudefer, built apart, would take 0 for the legacy stream
 * (safe, as that waits for the per-thread stream, but a device-wide
 * barrier).  In such a program these calls pass cudaStreamPerThread for a
 * stream 0.  The *_streams calls take arrays: pass cudaStreamPerThread in
 * them yourself.  Define CUDEFER_NO_STREAM_MACROS to call the functions
 * as they are.
 */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) && \
    !defined(CUDEFER_NO_STREAM_MACROS)
static inline cudaStream_t cudefer_per_thread_(cudaStream_t stream)
{
    return stream == 0 ? cudaStreamPerThread : stream;
}
#define defer_free(ptr, stream) defer_free((ptr), cudefer_per_thread_(stream))
#define defer_free_host(ptr, stream) \
    defer_free_host((ptr), cudefer_per_thread_(stream))
#define defer_free_n(ptrs, n, stream) \
    defer_free_n((ptrs), (n), cudefer_per_thread_(stream))
#define defer_alloc(ptr, bytes, stream) \
    defer_alloc((ptr), (bytes), cudefer_per_thread_(stream))
#define defer_record_stream(ptr, stream) \
    defer_record_stream((ptr), cudefer_per_thread_(stream))
#define defer_call(fn, arg, stream) \
    defer_call((fn), (arg), cudefer_per_thread_(stream))
#endif

#ifdef __cplusplus
}
#endif

#endif /* CUDEFER_H */
