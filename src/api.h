/* Internal entry points of the public API (api.c) for the library's own
 * callers. */
#ifndef CUDEFER_API_H
#define CUDEFER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "entry.h"
#include "request_args.h"
#include "stream_lane.h"

/* defer_free(ptr, stream) from a caller that knows the current device
 * (current >= 0; the pluggable entry point made it current), which the
 * look-up of a special stream handle then does not ask for again; -1:
 * defer_free itself.  Any thread; blocks where defer_free does. */
cudaError_t api_free_on(void *ptr, cudaStream_t stream, int current);

/* api_free_on for defer_pluggable_free, which says the block's size and
 * device (checked against the block's record once it is found: a
 * mismatch is reported, the block freed all the same). */
cudaError_t api_free_pluggable(void *ptr, size_t bytes, int device,
                               cudaStream_t stream, int current);

/* The steps every defer call takes, shared by the single-stream path
 * (api.c) and the group path (api_group.c).  Launching threads, inside
 * lifecycle_enter; none blocks but where its CUDA calls do. */

/* A defer call's start: admitted by the reclaimer's gate (lifecycle_enter)
 * and its request made, *a from given with room for its claims (*one: a
 * single pointer's).  cudaSuccess, or the refusal (said and counted;
 * nothing held).  Every path that began ends with api_end. */
cudaError_t api_begin(const struct request_args *given,
                      struct request_args *a, struct block_claim *one);

/* Its end: a free refused (err) after it claimed blocks of the cache gives
 * them back (LIVE again: the caller keeps them); the claims' room goes,
 * and the call leaves the gate.  Returns err. */
cudaError_t api_end(struct request_args *a, struct block_claim *one,
                    bool claimed, cudaError_t err);

/* The caller was refused: say why (call failed with err), count it;
 * returns err. */
cudaError_t api_reject(const char *what, const char *call, cudaError_t err);

/* The identity of stream, looked up afresh (a cached one proved stale). */
cudaError_t api_identify_again(cudaStream_t stream, int *device,
                               unsigned long long *id, const char **failed);

/* Device and id of stream (exact: asked of the stream, not cached; current:
 * the current device if known, else -1), on a device that has not failed
 * (else its sticky error, *failed naming it).  *cached: the identity came
 * from the thread's cache. */
cudaError_t api_identify_usable(cudaStream_t stream, bool exact,
                                int current, int *device,
                                unsigned long long *id, bool *cached,
                                const char **failed);

/* Wait for stream (and the streams a's blocks were recorded on) here and
 * release at once: no event could be had, or CUDEFER_DISABLE.  Blocks.
 * cudaSuccess once accepted (a failed release is counted and reported),
 * else the refusal. */
cudaError_t api_release_synchronously(const struct request_args *a,
                                      cudaStream_t stream);

/* a deferred into the capture of streams[0..n) (capture.h): waits for the
 * capture's graph, not for an event. */
cudaError_t api_submit_captured(const struct request_args *a,
                                const cudaStream_t *streams, size_t n);

/* A pooled entry for a, its event from the thread's lane of kind lane
 * (stream_lane.h) recorded on stream (device, id).  The entry, or NULL with
 * *err and *call, and *no_event when it was the event (or the entry) that
 * could not be had. */
struct entry *api_record(const struct request_args *a, cudaStream_t stream,
                         int device, unsigned long long id,
                         enum lane_share lane, cudaError_t *err,
                         const char **call, bool *no_event);

/* A recorded entry that will not be pushed after all: its reference to its
 * event goes, and it goes back to the pool. */
void api_discard_recorded(struct entry *e);

/* The group path (api_group.c): a on streams[0..n), admitted by the
 * reclaimer's gate, its blocks claimed; one entry per stream, all recorded
 * before any is pushed, so a failure leaves nothing behind.  cudaSuccess,
 * or the refusal (said and counted). */
cudaError_t api_group_submit(const struct request_args *a,
                             const cudaStream_t *streams, size_t n);

#endif
