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

/* Counters since the reclaimer started.  A snapshot: fields are read one by
 * one, so under load they may disagree by the entries in flight. */
struct defer_stats {
    uint64_t deferred;       /* entries accepted by defer_free/_host/defer_call */
    uint64_t released;       /* entries released (or callbacks run) successfully */
    uint64_t pending;        /* accepted and not yet released or failed */
    uint64_t failed;         /* entries whose release returned an error, or that
                                were abandoned (fork child, runtime unloading) */
    uint64_t rejected;       /* defer calls refused (bad stream, after shutdown...) */
    uint64_t sync_releases;  /* entries released synchronously on the caller
                                (no event could be had) */
    uint64_t event_queries;  /* cudaEventQuery calls made by the reclaimer */
    uint64_t wakeups;        /* times the reclaimer thread woke up */
    uint64_t batches;        /* release batches (one per pass that released) */
    uint64_t largest_batch;  /* most entries released in one batch */
    uint64_t events_created; /* CUDA events created for the event pool */
    uint64_t events_in_pool; /* idle events held in the pool now */
};

/*
 * defer_free: cudaFree(ptr) once all work enqueued on stream so far is done.
 * Thread-safe; never blocks on the GPU.  The event is recorded on the calling
 * thread, so stream 0 and cudaStreamPerThread mean the caller's stream.
 * Returns cudaSuccess (ptr now belongs to cudefer), or the error of recording
 * the event (ptr still belongs to the caller; nothing was queued), or
 * cudaErrorNotPermitted after defer_shutdown or in a forked child.
 * defer_free(NULL, s) does nothing and returns cudaSuccess.
 */
CUDEFER_API cudaError_t defer_free(void *ptr, cudaStream_t stream);

/* defer_free_host: cudaFreeHost(ptr) once stream's work so far is done.
 * Same contract as defer_free. */
CUDEFER_API cudaError_t defer_free_host(void *ptr, cudaStream_t stream);

/*
 * defer_call: run fn(arg) on the reclaimer thread once all work enqueued on
 * stream so far is done.  fn may call CUDA; it must not call defer_flush or
 * defer_shutdown (they return cudaErrorNotPermitted there).  Callbacks of one
 * stream run in the order they were deferred.  A NULL fn is
 * cudaErrorInvalidValue.  Otherwise same contract as defer_free.
 */
CUDEFER_API cudaError_t defer_call(void (*fn)(void *arg), void *arg,
                                   cudaStream_t stream);

/*
 * defer_flush: block until everything deferred before this call (by any
 * thread, as far as this thread can see) has been released or has failed.
 * Returns cudaSuccess, cudaErrorNotPermitted on the reclaimer thread (inside
 * a callback) or after defer_shutdown, or the sticky error of a device whose
 * entries cannot complete.
 */
CUDEFER_API cudaError_t defer_flush(void);

/*
 * defer_shutdown: flush, then stop and join the reclaimer and destroy its
 * events.  Later defer_* calls return cudaErrorNotPermitted.  Calling it again
 * returns cudaSuccess.  Blocks.  Not from inside a callback.
 */
CUDEFER_API cudaError_t defer_shutdown(void);

/* defer_stats_get: copy the counters into *out.  Never blocks. */
CUDEFER_API void defer_stats_get(struct defer_stats *out);

/* defer_version: "MAJOR.MINOR.PATCH" of the library in use. */
CUDEFER_API const char *defer_version(void);

#ifdef __cplusplus
}
#endif

#endif /* CUDEFER_H */
