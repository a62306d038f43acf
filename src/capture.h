/* SPDX-License-Identifier: MIT */
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
 * their launches have completed.
 *
 * The work enqueued on the streams before the capture began may still use
 * the memory then (the graph need never have run on those streams), so
 * the entry waits for it too: once a stream's capture
 * has ended (cudaStreamIsCapturing says so; no call may ask a capturing
 * stream), the reclaimer records an event on it, and the entry is complete
 * when the graph is gone and those events have completed.  A stream
 * destroyed before its capture's end was seen cannot be waited for: the
 * entry then fails (reported), never released early.
 *
 * Ownership: capture_defer pushes the entry to the reclaimer, which keeps
 * it in a list (not counted by flushes) and takes it in as complete when
 * it is ready.  The destructor (which may not call CUDA) only marks it dead
 * (GRAPH_LIVE to GRAPH_DEAD) and wakes the reclaimer.  A reclaimer that
 * stops first marks the live ones abandoned; their destructor then reports
 * them (quietly once exit() has begun), counts them as failed and frees
 * them.  A graph that dies while shutdown or exit drains is released by
 * the drain.
 */
#ifndef CUDEFER_CAPTURE_H
#define CUDEFER_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "entry.h"

/* Any thread, between lifecycle_enter and lifecycle_leave.  Whether the n
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

/* Any thread, between lifecycle_enter and lifecycle_leave, once
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

/* Reclaimer only.  Takes e, pushed by capture_defer (e->captured), into
 * the list of graph entries that wait for their graph to die and for the
 * work their streams had before the capture began: an event is recorded
 * on each stream once its capture has ended (cudaStreamIsCapturing says
 * so; a new capture begun meanwhile is waited out too). */
void capture_take(struct entry *e);

/* Reclaimer only, each pass.  Records and queries those events; an entry
 * whose graph died and whose streams' earlier work is done is taken in
 * (reclaimer_take_in, captured false) as complete; one whose stream was destroyed
 * before its capture's end was seen fails (reported: that work cannot be
 * waited for).  No CUDA call when nothing moved.  True while some stream
 * still needs polling. */
bool capture_poll(void);

/* Reclaimer only: whether capture_poll has work: a graph died since the
 * last poll (the destructor then wakes the reclaimer), an entry came, or a
 * stream needs polling.  The reclaimer naps rather than sleep then. */
bool capture_news(void);

/* Reclaimer only, when it stops: whether a dead graph's entry waits for
 * streams whose work from before the capture has its event recorded (none
 * still captures, none was lost): the drain waits for it, as for any
 * entry's event, before capture_stop.  No CUDA call. */
bool capture_dead_pending(void);

/* Reclaimer only, when it stops.  Entries whose graph lives are handed to
 * their destructor (it reports them, counted as failed).  A dead graph's
 * streams are looked at again: ready, it is taken in; with an event
 * recorded on each stream not done, it keeps waiting (Note [A graph dead
 * at the stop], capture.c); with a stream capturing again (or no event to
 * be had) or lost, it fails (said).  Returns how many it took in or keeps
 * waiting: the reclaimer makes more passes for them (0: it may stop). */
size_t capture_stop(void);

#endif
