/* SPDX-License-Identifier: MIT */
/*
 * cudefer — free CUDA memory without stalling the threads that launch GPU work.
 *
 * defer_free(ptr, stream) records a CUDA event on stream, on the calling
 * thread, and hands (ptr, event) to cudefer's reclaimer thread, which
 * releases ptr once the event has completed: the caller never waits.
 * defer_alloc hands such memory out again, stream-ordered.  This header
 * states the contract; how batches, the release policy, the block cache,
 * size rounding and free batches work is told in man cudefer (cudefer(7)).
 *
 * Rules for every call:
 * - Any thread may call any function, concurrently.  A defer_call callback
 *   may call all but defer_flush, defer_trim and defer_shutdown (they would
 *   wait for the callback itself: cudaErrorNotPermitted).
 * - The first call that defers, allocates or records (or defer_peer_access)
 *   starts the reclaimer; it fails with cudaGetDeviceCount's error,
 *   cudaErrorMemoryAllocation (no host memory) or cudaErrorOperatingSystem;
 *   the next call tries again.
 * - A defer call that returns cudaSuccess owns the pointer from then on;
 *   one that fails leaves it with the caller and queues nothing.
 * - After defer_shutdown, and in the child of a fork() made once cudefer
 *   began to start, all calls but defer_config_defaults, defer_stats_get,
 *   defer_set_oom_handler, defer_device_stats_get,
 *   defer_device_stats_reset_peaks and defer_version return
 *   cudaErrorNotPermitted (but for what has nothing to do: a NULL free, a
 *   0-byte defer_alloc, a second defer_shutdown); the child never releases
 *   what the parent had pending (counted as failed), but for the callback
 *   that called fork(), which goes on in the child and counts as released
 *   when it returns.  A child forked by a callback on the reclaimer thread
 *   ends when the callback returns.
 * - After a sticky error on a device (a kernel fault), its pending entries
 *   are abandoned (counted as failed); later calls on it and defer_flush
 *   return that error.
 * - At exit, pending entries are drained for at most 2 s; the rest is never
 *   released (leaked_at_exit, failed): a graph's entries too, the graph
 *   not yet destroyed (the drain does not wait for a graph; after
 *   defer_shutdown too), but not the call that runs exit() itself from a
 *   callback; exit() from a callback on the reclaimer thread drains
 *   nothing (no thread is left to release).  A callback or a free
 *   (cudaFree) still running then is left to end, and after it cudefer
 *   releases nothing and makes no CUDA call; a call of another thread
 *   that waits for the reclaimer (defer_flush, defer_trim, a call with no
 *   event) returns cudaErrorCudartUnloading.  A first call still starting
 *   the reclaimer (its cudaGetDeviceCount) is waited for as long; it
 *   returns cudaErrorNotPermitted and starts nothing.
 * - Each refusal of cudefer's own is also said on stderr: "cudefer: ...",
 *   but for defer_alloc's out of memory (the caller's to handle).
 * - Stream 0 is the legacy stream, cudaStreamPerThread the calling thread's
 *   (but see the end for --default-stream per-thread).
 * - Limit: on a thread with no current CUDA context (one that never chose a
 *   device), a call that makes a CUDA call leaves the context of the
 *   thread's runtime device (device 0 unless it set one) current, as the
 *   runtime's own calls do; cudaGetDevice answers as before.
 * - A call that makes another device current for its work there (an event
 *   for that device's stream, a free batch sealed, memory of its pool)
 *   makes the caller's device current again after it, on every path.
 *   Limit: a cudaSetDevice that fails on that way back is said, and leaves
 *   the other device current.
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

/* When completed device and pinned memory is released. */
enum defer_policy {
    DEFER_POLICY_BATCHED = 0, /* held; released in batches at cheap moments */
    DEFER_POLICY_EAGER = 1,   /* released as soon as its work completes */
};

/* Every knob.  Its CUDEFER_* environment variable (the field's name in
 * capitals, but CUDEFER_MAX_PENDING, CUDEFER_EVENT_POOL, CUDEFER_STATS and
 * CUDEFER_SPLIT_MIN) overrides it; meanings, defaults and ranges: cudefer(7),
 * ENVIRONMENT.  The struct only grows, at its end ("Structs that grow"). */
struct defer_config {
    uint32_t poll_us;           /* first wait between polls */
    uint32_t poll_max_us;       /* longest wait while nothing completes */
    uint32_t idle_us;           /* quiet time before an idle-time release
                                   (0: once no deferred work is pending) */
    uint64_t max_pending_bytes; /* held bytes above which a busy device
                                   releases (0: auto, cudefer(7)) */
    uint32_t max_delay_ms;      /* completed entries this old are released */
    enum defer_policy policy;
    uint32_t event_pool_max;    /* idle events (and entries) per device,
                                   plus up to 64 (this many at most) in
                                   each live thread that defers there */
    int disable;                /* 1: each call waits, releases at once */
    int verbose;                /* 1: print the configuration at start-up */
    int print_stats;            /* 1: print the statistics at exit */
    int check;                  /* 1: report a pointer deferred twice */
    uint32_t cache_keep_ms;     /* free blocks unused this long are released */
    uint64_t split_min_bytes;   /* least request defer_alloc cuts from a
                                   larger block (0: none) */
    uint32_t free_batch;        /* legacy-stream block frees per event */
    uint32_t round_divisions;   /* new block sizes per power of two */
    int driver_calls;           /* 1: driver entry points; 0: the runtime's */
};

/* Counters since the reclaimer started: a snapshot, read field by field,
 * so under load they may disagree by the entries in flight.  An accepted
 * call is one entry, however many pointers it names, and ends counted
 * once: in failed when the release of any of its pointers failed.  A
 * block of defer_alloc's released with cudaFreeAsync (expired, trim, a
 * miss's hand-back) whose cudaFreeAsync fails goes with cudaFree (said),
 * but after a sticky error.  A block whose release fails (that cudaFree,
 * or the cudaFreeAsync with a sticky error) is said and counted in
 * cache_release_failures, never in cache_releases nor in failed (its entry
 * ended released when the block went back to the cache); it has left the
 * cache, its memory not given back.  The struct only
 * grows, at its end ("Structs that grow"). */
struct defer_stats {
    uint64_t deferred;       /* entries accepted by the defer_* calls */
    uint64_t released;       /* entries released (or callbacks run) */
    uint64_t pending;        /* accepted, not yet released or failed */
    uint64_t failed;         /* entries whose release failed, or abandoned */
    uint64_t rejected;       /* calls refused (any call), each said but
                              * defer_alloc's out of memory */
    uint64_t sync_releases;  /* entries whose stream the caller waited for */
    uint64_t event_queries;  /* cudaEventQuery calls made */
    uint64_t wakeups;        /* times the reclaimer thread woke up */
    uint64_t batches;        /* reclaimer passes that released something */
    uint64_t largest_batch;  /* most entries released in one pass */
    uint64_t events_created; /* CUDA events created */
    uint64_t events_in_pool; /* idle events kept for reuse */
    uint64_t held;           /* completed entries the policy holds now */
    uint64_t held_bytes;     /* their bytes */
    /* Of the entries the policy held (not those released at once: the
     * eager policy, cudaMallocAsync memory, callbacks, sync_releases). */
    uint64_t idle_releases;  /* entries released as the program was quiet */
    uint64_t cap_releases;   /* ... as a device held more than its cap */
    uint64_t age_releases;   /* ... as they were older than max_delay_ms */
    uint64_t demand_releases;/* ... by defer_flush, defer_trim or shutdown */
    uint64_t latency_p50_us; /* completion to release, median (2^k bound,
                              * at most latency_max_us) */
    uint64_t latency_max_us; /* ... and the largest */
    uint64_t leaked_at_exit; /* entries still pending at process exit */
    uint64_t reused;         /* blocks handed out again by defer_alloc */
    uint64_t reused_same_stream; /* ... of them on their stream, work undone */
    uint64_t cache_bytes;    /* bytes of defer_alloc's blocks, live or free */
    uint64_t cache_free_bytes; /* ... of them free, waiting for reuse */
    uint64_t cache_mallocs;  /* new blocks defer_alloc made */
    uint64_t cache_releases; /* blocks released: expired, trim, shutdown */
    uint64_t cache_release_failures; /* ... whose release failed: lost */
};

/* Devices 0 .. DEFER_STATS_MAX_DEVICES - 1 have counters of their own
 * (struct defer_device_stats). */
#define DEFER_STATS_MAX_DEVICES 64

/* One device's share of defer_alloc's blocks and of the held memory, since
 * the reclaimer started; each peak since then or the last
 * defer_device_stats_reset_peaks of the device.  A snapshot read field by
 * field, as struct defer_stats.  The held bytes are those of the frees
 * deferred on the device's streams: pinned host memory of defer_free_host
 * there counts too.  The struct only grows, at its end ("Structs that
 * grow"). */
struct defer_device_stats {
    uint64_t cache_bytes;      /* bytes of defer_alloc's blocks, live or free */
    uint64_t cache_bytes_peak; /* ... the most there were */
    uint64_t live_bytes;       /* of them handed out, not back in the cache */
    uint64_t live_bytes_peak;  /* ... the most there were */
    uint64_t cache_free_bytes; /* of them free, waiting for reuse */
    uint64_t held_bytes;       /* completed frees' bytes the policy holds */
    uint64_t held_bytes_peak;  /* ... the most there were */
    uint64_t cache_mallocs;    /* new blocks defer_alloc made */
    uint64_t cache_releases;   /* blocks released: expired, trim, shutdown */
    uint64_t allocs;           /* requests defer_alloc served with a block */
    uint64_t reused;           /* ... of them with a block from the cache */
    uint64_t cache_release_failures; /* blocks whose release failed: lost */
};

/* defer_free: cudaFree(ptr) once all work enqueued on stream so far is done.
 * Never blocks on the GPU but where no event or entry can be had (no
 * event made, no host memory for its entry: said) or under CUDEFER_DISABLE;
 * it then waits for stream and releases at once.  Memory
 * of cudaMalloc is released under the release policy, of cudaMallocAsync
 * as soon as its work is done, both with cudaFreeAsync on the reclaimer's
 * own stream (no device drain; cudaFree on a device without memory pools
 * and when the call releases at once); a block of defer_alloc's goes back
 * to its cache.  defer_free(NULL, s) does nothing.  Errors: the error of
 * recording the event or reading the stream; cudaErrorMemoryAllocation
 * when no host memory could be had for the call's own records (its
 * pointers' list, a capture's); cudaErrorInvalidValue for a block of
 * defer_alloc's already freed, or a pointer inside one.  A host pointer
 * is accepted: its release fails (reported, counted in failed).
 * On a capturing stream the call belongs to the graph: ptr is released once
 * that graph and every executable graph made from it are destroyed, their
 * launches done, and the stream's work from before the capture is done;
 * defer_flush does not wait for it.  A capture already invalidated is
 * cudaErrorStreamCaptureInvalidated.
 * Limit: by default a device holds a sixth of its use at most (512 MiB
 * min, a quarter of the device max: the max wins on a small device).
 * Limit: giving a cudaMalloc buffer back holds up other threads' cudaMalloc
 * and cudaFree (not their launches) for about 20 us.
 * Limit: a graph destroyed after defer_shutdown never releases ptr.
 * Limit: a stream of the capture destroyed before the reclaimer saw the
 * capture end leaves ptr never released (reported, counted as failed).
 * Limit: such a stream whose handle a new stream took within a poll
 * interval is taken for that new stream: ptr then waits for the new
 * stream's work, not for the destroyed one's.
 * Limit: a new capture of that stream begun just as the reclaimer, its
 * graph gone, looks up the stream's device (a window of microseconds) is
 * invalidated: CUDA refuses that look-up on a capturing stream.  ptr then
 * waits for the new capture's end.
 * Limit: a capture of cudaStreamPerThread is refused, the capture left
 * intact (cudaErrorStreamCaptureUnsupported). */
CUDEFER_API cudaError_t defer_free(void *ptr, cudaStream_t stream);

/* defer_free_host: cudaFreeHost(ptr), with the contract of defer_free. */
CUDEFER_API cudaError_t defer_free_host(void *ptr, cudaStream_t stream);

/* defer_free_n: defer_free of each of the n pointers, with one event.  NULL
 * pointers are skipped; ptrs is copied, the caller may reuse it at once.
 * cudaErrorInvalidValue for a NULL ptrs (n > 0), or a pointer named twice;
 * on any error none of the pointers is deferred. */
CUDEFER_API cudaError_t defer_free_n(void *const *ptrs, size_t n,
                                     cudaStream_t stream);

/* defer_alloc: *ptr = a block of at least bytes on stream's device, for use
 * on stream.  As with cudaMallocAsync, work enqueued on stream before the
 * call may still use it: another stream may use or free it only once it
 * waits for stream.  A block freed with defer_free on the same stream (the
 * stream cudaStreamGetId names, not the handle) may come back at once,
 * before its work is done; one freed otherwise (another stream or device,
 * several streams or pointers, recorded streams) only once all its work is
 * done.  Only blocks defer_alloc made are reused, on their own device.
 * Return a block with defer_free (or defer_free_n, defer_free_streams,
 * defer_pluggable_free), never with cudaFree.  A free block not taken for
 * cache_keep_ms is released, and every free block by defer_trim and
 * defer_shutdown; live blocks stay the application's (cudaFree frees a
 * whole one; a piece cut from a larger block, split_min_bytes, cannot be
 * freed alone: its allocation stays until exit).  Blocks only to
 * allocate and, out of memory, to trim before one retry (not in a
 * callback, which cannot wait for the trim), then in the out-of-memory
 * handler (defer_set_oom_handler).  bytes == 0 gives
 * *ptr = NULL and cudaSuccess.  Errors (each counted in rejected):
 * cudaErrorInvalidValue for a NULL ptr; cudaErrorMemoryAllocation when out
 * of memory (not reported, and, unlike cudaMalloc's, not left as the
 * thread's last error: cudaGetLastError answers cudaSuccess after it, an
 * error pending before gone); cudaErrorStreamCaptureUnsupported on a
 * capturing stream (allocate before the capture); a bad stream's error;
 * another allocation error (reported).
 * Limit: a request above the device's memory is out of memory at once.
 * Limit: a block cut from a larger one (split_min_bytes) is no allocation
 * of CUDA's: live at defer_shutdown, it stays allocated until exit.
 * Limit: a second free of a block is refused (cudaErrorInvalidValue) only
 * until the block is handed out again, and a pointer inside one only until
 * its memory goes back to CUDA (its release then fails, reported).
 * Limit: a block freed on the legacy stream serves only that stream until
 * its free batch is sealed: full (free_batch), at the first free there a
 * millisecond after the oldest (1 to 11 ms on the coarse clock), or at
 * defer_flush, defer_trim or shutdown.
 * Limit: a block freed on a created stream may share its event with the
 * same thread's later frees there: other streams then get it once their
 * work is done too, never before its own.
 * Limit: the cache has no cap; freed blocks stay until they expire. */
CUDEFER_API cudaError_t defer_alloc(void **ptr, size_t bytes,
                                    cudaStream_t stream);

/* The out-of-memory handler: fn(bytes, device, arg) is told that a
 * request of bytes on device failed, and returns nonzero to have it tried
 * again, 0 to let it fail with cudaErrorMemoryAllocation. */
typedef int (*defer_oom_handler)(size_t bytes, int device, void *arg);

/* The most calls of the handler for one request. */
#define DEFER_OOM_MAX_CALLS 16

/* defer_set_oom_handler: from now on fn(bytes, device, arg) is called when
 * a request of defer_alloc, defer_pluggable_alloc or
 * defer_pluggable_alloc_status runs out of memory after cudefer's own trim
 * and retry; a NULL fn removes the handler.  *prev_fn and *prev_arg (each
 * if not NULL) get the pair it replaces (NULL, NULL if none), to chain to.
 * One pair for the process, read as a pair: a call that sets it while
 * others allocate gives each failed request the old pair or the new one,
 * never a mix.  Returns cudaSuccess; it never blocks on the GPU and may be
 * called at any time, the handler included, also after defer_shutdown.
 * The handler runs on the allocating thread (the reclaimer, for a
 * defer_call callback: a callback's rules apply), with no lock of cudefer's
 * held, so it may call any defer_* function, defer_alloc too; the device
 * current before it is made current again after it.  Nonzero: the whole
 * request is tried again (the cache, where a block the handler freed on the
 * request's stream serves it at once; then a new block, out of memory
 * after a trim), and if that fails the handler is called again.  Memory it
 * frees with defer_free comes back once its work is done (defer_flush in
 * the handler waits for that).  Not called for a request above the
 * device's memory, nor for another error.  bytes is what was asked for,
 * device the one the block would be on (the current device for a special
 * stream handle).
 * Limit: at most DEFER_OOM_MAX_CALLS calls for one request; then it fails
 * with cudaErrorMemoryAllocation (said): wait inside the handler rather
 * than return nonzero at once.
 * Limit: an allocation made inside the handler on the same thread never
 * calls it: out of memory there, it fails as with no handler.
 * Limit: the handler must return: one that leaves by longjmp or a C++
 * exception is never called again on that thread.
 * Limit: a request that read the pair just before a set may call the old
 * handler after the set returned, and a set does not wait for a handler
 * running: free the old arg once the allocations under way then are done. */
CUDEFER_API cudaError_t defer_set_oom_handler(defer_oom_handler fn, void *arg,
                                              defer_oom_handler *prev_fn,
                                              void **prev_arg);

/* defer_record_stream: the live block ptr (of defer_alloc's) is also used by
 * stream.  Every free of the block then waits for stream's work up to the
 * free too, and no stream, not even its free stream, gets the block before
 * that work is done (Tensor.record_stream).  Recording a stream twice is
 * once; stream 0 means the legacy stream of the device current now; stream
 * must exist until the block is freed.  Never blocks on the GPU.
 * Errors: cudaErrorInvalidValue when ptr is not the start of a live block;
 * cudaErrorNotSupported for cudaStreamPerThread (the freeing thread could
 * not name it) or a 64th stream; cudaErrorStreamCaptureUnsupported on a
 * capturing stream; those of defer_free.
 * Limit: a block takes at most 63 streams.
 * Limit: a recorded stream destroyed before the free has the free refused
 * (cudaErrorInvalidResourceHandle, said), the block still the caller's,
 * until a new stream takes its handle: the free then waits for that one.
 * Limit: a free that would wait for over 64 streams in all, its own (or
 * the _streams call's) and those its blocks were recorded on, each counted
 * once, is refused (cudaErrorInvalidValue), also under CUDEFER_DISABLE;
 * a free of a recorded block into a graph capture is refused too
 * (cudaErrorStreamCaptureUnsupported), and so is one while a stream it was
 * recorded on captures (free it once that capture ends). */
CUDEFER_API cudaError_t defer_record_stream(void *ptr, cudaStream_t stream);

/* PyTorch's pluggable allocator: CUDAPluggableAllocator(path_to_libcudefer,
 * "defer_pluggable_alloc", "defer_pluggable_free").
 * defer_pluggable_alloc: defer_alloc of size bytes on device, the current
 * device left as it was; NULL on any error (reported).  A device it cannot
 * switch to is refused, and so is a created stream of another device
 * (cudaErrorInvalidDevice).  defer_pluggable_alloc_status: the same, with
 * the error returned (out of memory not reported) and *ptr NULL on error;
 * cudaErrorInvalidValue for a NULL ptr.
 * Limit: a failed switch back is reported and leaves device current.
 * Limit: PyTorch does not check the pointer a pluggable allocator returns:
 * NULL becomes a tensor at address 0, not torch.OutOfMemoryError.
 * defer_pluggable_free: defer_free of ptr on stream (0: the legacy stream
 * of device).  PyTorch passes the allocation's stream: record the others
 * with defer_record_stream.  A size or device that does not match the block
 * is reported, the block freed all the same (size 0 fits any block; the
 * device is checked whatever the size); a block that cannot be freed is
 * reported and stays allocated. */
CUDEFER_API void *defer_pluggable_alloc(size_t size, int device,
                                        cudaStream_t stream);
CUDEFER_API cudaError_t defer_pluggable_alloc_status(void **ptr, size_t size,
                                                   int device,
                                                   cudaStream_t stream);
CUDEFER_API void defer_pluggable_free(void *ptr, size_t size, int device,
                                      cudaStream_t stream);

/* defer_peer_access: lets device peer's kernels and copies use the blocks
 * defer_alloc makes on device, live and future: they come from a memory
 * pool of cudefer's own (cudaMemPoolCreate), which peer access
 * (cudaDeviceEnablePeerAccess) does not reach, so call it where peer
 * access is enabled (PyTorch's enablePeerAccess).  cudaSuccess also where
 * device's blocks come from cudaMalloc (no pool: peer access covers them)
 * and for peer == device.  Starts cudefer as an allocation does.  Never
 * blocks on the GPU.
 * Errors: cudaErrorInvalidDevice for a device or peer that does not exist;
 * cudaErrorPeerAccessUnsupported where peer cannot access device
 * (cudaDeviceCanAccessPeer); cudaMemPoolSetAccess's error. */
CUDEFER_API cudaError_t defer_peer_access(int device, int peer);

/* defer_free_streams, defer_free_host_streams, defer_call_streams: as
 * defer_free, defer_free_host and defer_call, once the work enqueued so far
 * on all n streams is done, without making them wait for each other (one
 * event each; the callback runs once).  A handle given twice is one
 * stream (one event), counted once.  cudaErrorInvalidValue for a NULL
 * streams.  Streams that all capture into one graph: as one capturing
 * stream; a mix, or several graphs: cudaErrorStreamCaptureUnsupported.
 * Limit: n is 1 .. 64 (cudaErrorInvalidValue otherwise). */
CUDEFER_API cudaError_t defer_free_streams(void *ptr,
                                           const cudaStream_t *streams,
                                           size_t n);
CUDEFER_API cudaError_t defer_free_host_streams(void *ptr,
                                                const cudaStream_t *streams,
                                                size_t n);
CUDEFER_API cudaError_t defer_call_streams(void (*fn)(void *arg), void *arg,
                                           const cudaStream_t *streams,
                                           size_t n);

/* defer_call: run fn(arg) on the reclaimer thread, signals blocked, the
 * CUDA last error clear and the thread's capture mode relaxed (a mode fn
 * sets ends with it), once all work enqueued on stream so far is done,
 * whatever the policy; otherwise the contract of defer_free.  A NULL fn is
 * cudaErrorInvalidValue.  fn may defer more, also while shutdown or exit
 * drains (that is drained too).  Callbacks on one stream run in the order
 * deferred, by any threads; one of defer_call_streams runs after those
 * deferred before it on each of its streams, but a callback deferred after
 * it on some of its streams only does not wait for the others and may run
 * first.  Where the call waits for its
 * stream (no event, CUDEFER_DISABLE) fn runs before the call returns.  On a
 * capturing stream fn runs once the graph is gone, in no set order (never
 * if that is after defer_shutdown).
 * Limit: there is one reclaimer thread: while fn runs nothing is released.
 * Limit: a callback may share its event with the same thread's later ones
 * on its stream, and then runs once their work is done too (never earlier,
 * still in order); while a defer_flush waits, nothing shares.
 * Limit: a thread's first callback on a stream may create an event, and so
 * wait for the driver's lock behind other threads' launches. */
CUDEFER_API cudaError_t defer_call(void (*fn)(void *arg), void *arg,
                                   cudaStream_t stream);

/* defer_flush: block until everything deferred before this call (as far as
 * this thread can see) has been released or has failed, whatever the
 * policy; blocks of defer_alloc's are back in the cache.  Errors: a device's
 * sticky error; cudaErrorStreamCaptureImplicit (or the failed call's error)
 * when a free batch could not get its event on the legacy stream because
 * a blocking stream of its device captures, in any thread or mode (said;
 * the batch waits on); cudaErrorCudartUnloading where another thread's
 * exit() gave up its drain meanwhile.  A release that failed for its
 * pointer alone is no flush error.
 * Limit: a thread with no device chosen that seals another device's free
 * batch is left with device 0 current. */
CUDEFER_API cudaError_t defer_flush(void);

/* defer_trim: release every completed entry and every free block now,
 * whatever the policy, and trim cudefer's pools: call it when cudaMalloc
 * fails, before retrying.  Blocks for one reclaimer pass, not for running
 * work.  *released_bytes (if not NULL) gets the bytes that pass gave back
 * to CUDA, cudaMallocAsync memory not counted: trims served by one pass
 * each get its total.  Errors as for defer_flush.
 * Limit: what shares an event completes when its newest record does.
 * Limit: only whole allocations go back: a free block cut from a larger
 * one (split_min_bytes) stays cached while another piece of its
 * allocation is live or its work pending. */
CUDEFER_API cudaError_t defer_trim(size_t *released_bytes);

/* defer_shutdown: flush, release the free blocks, stop and join the
 * reclaimer; it stops even when the flush fails, and returns that error.
 * Called again: cudaSuccess (in a child forked while cudefer ran:
 * cudaErrorNotPermitted; forked after the shutdown: cudaSuccess).
 * Where another thread's exit() gives up its drain meanwhile (the work
 * waited for outlasts it), cudaErrorCudartUnloading: what was left is
 * never released, as at exit.
 * Limit: a free batch it cannot seal (another thread's capture bars the
 * legacy stream, its device cannot be made current, or its event cannot be
 * recorded and the wait for the stream that replaces it fails too) is
 * lost to the cache: its blocks stay allocated until exit (said, counted
 * as failed). */
CUDEFER_API cudaError_t defer_shutdown(void);

/* Structs that grow: struct defer_config, struct defer_stats and struct
 * defer_device_stats gain fields at their end.  The calls that take them
 * are macros passing this header's sizeof, so fields a program's struct
 * lacks are never read nor written.
 * Call the *_sized functions directly where no macro can be used (dlsym,
 * ctypes).  The plain symbols are cudefer 0.1.0's, which know its fields
 * only (through check; through reused); later knobs keep their defaults. */

/* defer_config_defaults_sized: fill size bytes of *cfg with the defaults.
 * NULL does nothing; a size below 0.1.0's struct writes nothing (said). */
CUDEFER_API void defer_config_defaults_sized(struct defer_config *cfg,
                                             size_t size);
/* defer_config_defaults(cfg): fill *cfg with the built-in defaults. */
CUDEFER_API void defer_config_defaults(struct defer_config *cfg);
#define defer_config_defaults(cfg) \
    defer_config_defaults_sized((cfg), sizeof(struct defer_config))

/* defer_configure_sized: use *cfg, of size bytes (knobs past it keep their
 * defaults), with the CUDEFER_* environment on top, when the reclaimer
 * starts.  Errors, each reported, nothing changed: cudaErrorNotPermitted
 * once the reclaimer started (the first call that defers, allocates or
 * records, or defer_peer_access; a start that failed leaves it open) or
 * after defer_shutdown;
 * cudaErrorInvalidValue for a value out of range, a poll_max_us below
 * poll_us, a NULL cfg or a size below 0.1.0's struct.  A bad CUDEFER_*
 * value is reported and ignored (a CUDEFER_POLL_MAX_US below poll_us is
 * raised to it, said).  Never blocks on the GPU. */
CUDEFER_API cudaError_t defer_configure_sized(const struct defer_config *cfg,
                                              size_t size);
/* defer_configure(cfg): defer_configure_sized with this header's struct. */
CUDEFER_API cudaError_t defer_configure(const struct defer_config *cfg);
#define defer_configure(cfg) \
    defer_configure_sized((cfg), sizeof(struct defer_config))

/* defer_stats_get_sized: copy the counters that fit in size bytes (bytes
 * past this library's struct get 0).  NULL does nothing; a size below
 * 0.1.0's struct writes nothing (said).  Never blocks. */
CUDEFER_API void defer_stats_get_sized(struct defer_stats *out, size_t size);
/* defer_stats_get(out): defer_stats_get_sized with this header's struct. */
CUDEFER_API void defer_stats_get(struct defer_stats *out);
#define defer_stats_get(out) \
    defer_stats_get_sized((out), sizeof(struct defer_stats))

/* defer_device_stats_get_sized: copy device's counters that fit in size
 * bytes (whole fields; bytes past this library's struct get 0).  A device
 * cudefer never used reads all 0; so does every device before the first
 * defer call.  Its cache_bytes, cache_free_bytes, cache_mallocs,
 * cache_releases, cache_release_failures and reused add up over the
 * devices to defer_stats' fields of those names; held_bytes is current,
 * where defer_stats' is published once a reclaimer pass.  live_bytes
 * counts a freed block until it is back in the cache: at once for a free
 * on its own stream, once the work is done for one that waits for other
 * streams.  Takes no lock, makes
 * no CUDA call, never blocks; works before the first call, after
 * defer_shutdown and in a fork child.  Errors (said, nothing written):
 * cudaErrorInvalidValue for a NULL out, a size that holds no field, or a
 * device below 0 or from DEFER_STATS_MAX_DEVICES on.
 * Limit: a device from DEFER_STATS_MAX_DEVICES (64) on is counted in
 * defer_stats only. */
CUDEFER_API cudaError_t
defer_device_stats_get_sized(int device, struct defer_device_stats *out,
                             size_t size);
/* defer_device_stats_get(device, out): defer_device_stats_get_sized with
 * this header's struct. */
#define defer_device_stats_get(device, out) \
    defer_device_stats_get_sized((device), (out),  \
                                 sizeof(struct defer_device_stats))

/* defer_device_stats_reset_peaks: each peak of device (-1: of every device)
 * becomes its current value.  An allocation or free on another thread
 * meanwhile may land before or after the reset.  Takes no lock, makes no
 * CUDA call, never blocks; the errors of defer_device_stats_get_sized for
 * a device other than -1.
 * Limit: a reset racing frees and new blocks on the device may leave a
 * peak up to those blocks' sizes above any value its counter had since,
 * until the next reset. */
CUDEFER_API cudaError_t defer_device_stats_reset_peaks(int device);

/* defer_version: "MAJOR.MINOR.PATCH" of the library in use. */
CUDEFER_API const char *defer_version(void);

/* A program built with nvcc --default-stream per-thread (which defines
 * CUDA_API_PER_THREAD_DEFAULT_STREAM) means its per-thread stream by 0:
 * these macros pass cudaStreamPerThread for it (put it in *_streams arrays
 * yourself).  CUDEFER_NO_STREAM_MACROS turns them off. */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) && \
    !defined(CUDEFER_NO_STREAM_MACROS)
static inline cudaStream_t cudefer_per_thread_(cudaStream_t stream)
{
    return !stream ? cudaStreamPerThread : stream;
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
