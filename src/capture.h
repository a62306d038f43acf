/*
 * Graph capture: defer calls on streams that are being captured into a CUDA
 * graph.
 *
 * An event recorded on a capturing stream would become a node of the graph,
 * not a point in the stream's work; and the memory is used by every launch
 * of every executable graph made from the capture, for as long as any of
 * them exists.  So such a call records no event.  Its entry (event NULL,
 * calloc'ed, never pooled) is handed to a CUDA user object that the
 * capture's graph owns; every executable graph instantiated from the graph
 * takes a reference too.  CUDA runs the object's destructor, on a thread of
 * its own, once the graph and all those executable graphs are destroyed and
 * their launches have completed.  The destructor (which may not call CUDA)
 * pushes the entry to the reclaimer, which takes it as complete on arrival
 * and releases it as its policy says.
 *
 * Until then the entry is counted as pending, but it is not the reclaimer's:
 * defer_flush and defer_shutdown do not wait for graphs.  If the graph dies
 * after defer_shutdown, its entry cannot be released (no CUDA call from the
 * destructor, no reclaimer): it is reported and counted as failed.  After
 * exit() has begun, it is dropped quietly (the process is ending).
 */
#ifndef CUDEFER_CAPTURE_H
#define CUDEFER_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "entry.h"

/* Any thread, between reclaimer_enter and reclaimer_leave.  Whether the n
 * streams capture: *capturing false (none does: the normal path) or true
 * (all do, and capture_defer takes the call).  One cudaStreamIsCapturing
 * call per stream.  Otherwise the error, with *call naming what failed:
 * cudaStreamIsCapturing's own error; cudaErrorStreamCaptureInvalidated for
 * a capture already invalidated; cudaErrorStreamCaptureUnsupported when
 * only some of the streams capture. */
cudaError_t capture_status(const cudaStream_t *streams, size_t n,
                           bool *capturing, const char **call);

/* Any thread.  A zeroed entry for capture_defer (event NULL, a group of
 * one), or NULL when out of memory.  The caller fills in kind, fn, arg and
 * the pointers (ptrs/nptrs, an array owned by the entry for several). */
struct entry *capture_entry_new(void);

/* Any thread.  Frees an entry from capture_entry_new that was never handed
 * to capture_defer, its pointer array included. */
void capture_entry_discard(struct entry *e);

/* Any thread, between reclaimer_enter and reclaimer_leave, once
 * capture_status said the n streams capture.  Ties e (from
 * capture_entry_new, filled in) to the graph they capture into; what is the
 * public function, for messages.  Returns cudaSuccess (e is the graph's;
 * counted in stats.deferred), or the error with *call naming what failed
 * (e is freed; nothing was deferred): cudaErrorStreamCaptureUnsupported if
 * the streams capture into different graphs, a failed device's error, or
 * that of cudaStreamGetCaptureInfo, cudaGetDevice (a callback),
 * cudaUserObjectCreate or cudaGraphRetainUserObject. */
cudaError_t capture_defer(const char *what, struct entry *e,
                          const cudaStream_t *streams, size_t n,
                          const char **call);

#endif
