/* SPDX-License-Identifier: MIT */
/*
 * event_watcher — the least any event-polling reclaimer must do, kept in
 * bench/ as the bound row malloc-record-query (bench/README.md):
 *   - each launching thread (a lane) records, once an iteration, the next
 *     event of its own ring of events, created before timing, and publishes
 *     how many it recorded;
 *   - one thread queries each lane's recorded events in order, each until it
 *     completed, and sleeps poll_us after each pass (1.43 queries an event
 *     in W4 on an H100, where cudefer's reclaimer makes 1.02: an estimate
 *     of what polling costs, not a strict lower bound).
 * No memory is released, no list is locked and no event is created while
 * timed: what is left is the records and the queries themselves.
 */
#ifndef CUDEFER_BENCH_EVENT_WATCHER_H
#define CUDEFER_BENCH_EVENT_WATCHER_H

#include <stdint.h>
#include <sys/types.h>
#include <cuda_runtime_api.h>

struct event_watcher;

struct watcher_stats {
    uint64_t recorded;     /* events recorded, all lanes */
    uint64_t seen;         /* of them, queried complete (or failed) */
    uint64_t failed;       /* of them, whose query failed (said on stderr) */
    uint64_t queries;      /* cudaEventQuery calls */
    uint64_t passes;       /* passes over the lanes */
    uint64_t ring_waits;   /* records that waited for a full ring */
};

/* Main thread, with the device current.  Creates lanes rings of events and
 * starts the watching thread (named "event-watcher").  Returns 0, or -1 with
 * a message on stderr (nothing left behind). */
int watcher_start(struct event_watcher **out, int lanes, unsigned poll_us);

/* Lane lane's own thread only (one thread a lane).  Records the lane's next
 * event on stream; while the ring holds only events not yet seen complete
 * it yields first.  Returns cudaEventRecord's result. */
cudaError_t watcher_record(struct event_watcher *w, int lane,
                           cudaStream_t stream);

/* Any thread.  Blocks until every event recorded before the call was seen
 * complete (or failed). */
void watcher_drain(struct event_watcher *w);

/* Any thread; ring_waits counts only lanes whose thread has been joined. */
void watcher_stats_get(struct event_watcher *w, struct watcher_stats *out);

/* Any thread.  The watching thread's kernel thread id. */
pid_t watcher_tid(struct event_watcher *w);

/* Main thread, after every lane's thread was joined.  Drains, stops the
 * thread, destroys the events. */
void watcher_stop(struct event_watcher *w);

#endif
