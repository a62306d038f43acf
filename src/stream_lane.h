/* SPDX-License-Identifier: MIT */
/*
 * Stream lanes: how a launching thread's consecutive entries of one stream
 * share events (without them, W6's cost on an H100 is the driver's event
 * creation, one event per pending entry).
 *
 * Stream order makes sharing sound: once an event recorded on stream S
 * after entry E's work has completed, E's work has.  So a thread keeps, per
 * stream it defers on (a lane, keyed by device and stream id), the events it
 * recorded there whose records may still be pending, oldest first, at most
 * LANE_EVENTS of them.  A new entry on S
 *   - records the lane's newest event again when every record of it has
 *     completed (an idle stream: no event taken, no pool traffic);
 *   - else takes a fresh event from the pool while the lane holds fewer
 *     than LANE_EVENTS pending ones; in a sharing lane an idle one only,
 *     else it records the newest again (while fewer than LANE_REUSE_MAX
 *     of its records are not seen complete; not with
 *     CUDEFER_EVENT_POOL=0, where nothing is ever idle) and
 *     the reclaimer makes more (event_pool_refill), for on a GPU creating
 *     an event waits for the driver's lock behind every launch that waits
 *     for room in its queue (H100, W4: 15-220 ms; W6's slowest
 *     callbacks, 78-105 ms, were that wait);
 *   - else, in a sharing lane, records the newest event again: it is
 *     shared.  Once an older event completes the next entry takes a fresh
 *     one, so the shared event stops being recorded again and completes;
 *     an entry waits at most for the work its stream was given until the
 *     oldest event of its lane completed or an idle event reached its
 *     thread (at most LANE_REUSE_MAX entries later);
 *   - else takes an event of its own from the pool, which the lane does
 *     not keep.
 * Where a lane holding events would take a fresh one and none is idle, it
 * first queries its newest itself: if every record of it has completed
 * (the reclaimer had not looked yet), it records that one again, as it
 * would once the reclaimer had seen it; only else does it make one.  A
 * newest found not complete is asked again only after 1, 2, 4 ... 64
 * picks (a busy stream: a query that fails is time lost).
 * Each record of an event gets the next label; the entry carries it, and
 * the reclaimer, once a query says the event completed, knows that every
 * label it had taken in by then completed (event_pool.h: struct
 * shared_event).
 *
 * Callbacks (defer_call, defer_call_streams: W6) and blocks of the cache
 * freed on their stream (ENTRY_BLOCK: defer_alloc's memory, W4) share:
 * sharing makes an entry complete when the newest record of its event
 * does, later than its own work.  Other frees never share: defer_trim must
 * release a free as soon as its work is done (include/cudefer.h).  A block
 * of the cache needs its event only for another stream, a release or a
 * trim, and waits for it at most as a callback does (cudefer.h states the
 * limit).  Both look their stream up exactly (stream_identity.h): a stale
 * identity (a destroyed stream whose handle now names another stream)
 * would put records of two streams on one shared event.  The other frees
 * have lanes of their own, which never share: they only spare the pool
 * traffic on an idle stream.
 *
 * Several threads on one stream (the legacy stream, a shared created
 * stream) each have their own lane, so their records never share an
 * event: a stream has at most LANE_EVENTS shared events per thread that
 * defers on it.  A thread keeps LANE_SETS x LANE_WAYS lanes; a thread that
 * defers on more streams than that, round robin, lets go of a lane per
 * call and shares little (each call then takes an event, as before).
 *
 * Launching threads only, on their own lanes (thread-local); the reclaimer
 * only at shutdown, once no launching thread is inside cudefer.
 */
#ifndef CUDEFER_STREAM_LANE_H
#define CUDEFER_STREAM_LANE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "entry.h"

#define LANE_EVENTS 8

/* Whether callbacks share pending events: on.  Sharing makes a callback
 * run when the newest record of its event completes, later than its own
 * work (include/cudefer.h states that limit of defer_call; t/stress's trim
 * check leaves such callbacks out only while a later record on their
 * stream may be pending), and memory never waits for it: a stream's frees
 * wait in a FIFO apart from its callbacks (stream_table.h).  While a flush
 * waits, nothing is shared (stream_lane_waiter), so a flush never waits
 * for work deferred after it began.  In W6 (where the driver's event
 * creation is the cost on an H100), 10^6 pending callbacks over 1024
 * streams take 8192 events, not 10^6.  To compile it
 * off: ./configure CPPFLAGS=-DLANE_SHARE_CALLBACKS=0. */
#ifndef LANE_SHARE_CALLBACKS
#define LANE_SHARE_CALLBACKS 1
#endif
/* Whether blocks of the cache freed on their stream share pending events:
 * on.  Without it each such free behind a busy stream creates an event: on
 * an H100, W4 cudefer-alloc (8 threads, a created stream each) created
 * 6,600-7,800 events in its timed part, cudaEventCreate took about 110 us
 * at the median when 8 threads created at once (1 us alone), and one
 * defer_free a run stalled for 4-135 ms (bench-event-records):
 * cuEventCreate takes a driver lock for writing, which waits while other
 * threads' launches hold it for reading as they wait for room in their
 * streams' queues.  Sharing,
 * 3-12 events were made, yet one free in 2 of 3 runs still waited 28-114
 * ms, in the few it made: hence a sharing lane that holds an event never
 * makes one (stream_lane_pick, event_pool_refill).  To compile it off:
 * ./configure CPPFLAGS=-DLANE_SHARE_BLOCKS=0. */
#ifndef LANE_SHARE_BLOCKS
#define LANE_SHARE_BLOCKS 1
#endif
/* The most records of one event not seen complete a sharing lane makes
 * while it waits for an idle event (stream_lane_pick); then it makes one,
 * on the launching thread.  Not less: at 256, in W6 on an H100 (64
 * threads, 16 streams each, about 980 callbacks a stream and thread behind
 * a gate) lanes reached it at a thread's 4,096th and 8,192nd call, before
 * the reclaimer's events came, and those calls waited 80-97 ms for the
 * driver's lock.  Records
 * made while the stream was idle (each finding the last completed) do not
 * count: they share no pending work. */
#define LANE_REUSE_MAX 4096
#define LANE_SETS 16
#define LANE_WAYS 4

/* How a lane (a thread's entries of one stream) takes events: whose. */
enum lane_share {
    LANE_SOLO,      /* other frees: never share */
    LANE_CALLBACKS, /* callbacks: share the newest at LANE_EVENTS pending */
    LANE_BLOCKS,    /* blocks of the cache freed on their stream: share, and
                       make no event while the lane holds one */
};

/* The lane for entries of kind (or for a group of such), as compiled. */
static inline enum lane_share stream_lane_share_of(enum entry_kind kind)
{
    if (kind == ENTRY_CALL && LANE_SHARE_CALLBACKS)
        return LANE_CALLBACKS;
    return kind == ENTRY_BLOCK && LANE_SHARE_BLOCKS ? LANE_BLOCKS : LANE_SOLO;
}

struct shared_event;

struct lane_slot {
    struct shared_event *ev;
    uint64_t label; /* its newest record's label (0: none yet) */
};

struct lane {
    unsigned long long stream_id;
    int device;
    unsigned char share; /* enum lane_share */
    bool valid;
    unsigned char oldest, count; /* the ring of slots */
    /* The newest record the thread last found not complete by a query of
     * its own, and how many picks skip asking again (stream_lane.c). */
    unsigned char ask_wait, ask_skip;
    struct shared_event *asked_ev;
    uint64_t asked_label;
    struct lane_slot ring[LANE_EVENTS];
};

struct lane_table {
    struct lane set[LANE_SETS][LANE_WAYS];
    unsigned char next[LANE_SETS]; /* the way replaced next (round robin) */
    unsigned misses; /* idle events found missing (take_idle's sweeps) */
};

/* What a new entry records: chosen by stream_lane_pick, then
 * stream_lane_commit (recorded) or stream_lane_cancel (not). */
struct lane_pick {
    struct lane *lane;
    struct shared_event *ev;
    bool fresh; /* taken from the pool for this entry */
    bool solo;  /* and not tracked by the lane: the entry's alone */
};

/* The calling thread.  Chooses the event of a new entry on stream id of
 * device (see above), in its lane of share (a sharing one only for exact
 * identities: callbacks, blocks of the cache).  cudaSuccess and *pick, or
 * the error of the event that could not be had, with *call.  Never blocks
 * (but for creating an event). */
cudaError_t stream_lane_pick(int device, unsigned long long id,
                             enum lane_share share, struct lane_pick *pick,
                             const char **call);

/* The calling thread, right after pick->ev was recorded for e: e carries a
 * reference to it and the record's label. */
void stream_lane_commit(const struct lane_pick *pick, struct entry *e);

/* The calling thread, when pick->ev could not be recorded. */
void stream_lane_cancel(const struct lane_pick *pick);

/* The calling thread: e was committed but will not be pushed; its
 * reference is dropped, as an entry done drops its own.  Its label is
 * never given again (each label names one record: the lane's own query
 * may have seen that one complete), and the lane does not wait for it:
 * it is counted done (slot_done). */
void stream_lane_uncommit(struct entry *e);

/* Any thread, after a query found ev complete: every record of ev up to
 * label has completed; raises ev's completed label to it (never lowers
 * it: the lane's thread and the reclaimer both raise it). */
void stream_lane_raise_completed(struct shared_event *ev, uint64_t label);

/* Any thread: one of ev's entries is done (or will never be pushed).  True
 * when that was ev's last reference: the caller gives ev back to the pool
 * (event_pool.h). */
bool stream_lane_event_put(struct shared_event *ev);

/* Any thread: a defer_flush (or shutdown's flush, or a callback queued
 * with no event, lifecycle_requests_push_and_wait) begins to wait (delta
 * 1, before it pushes its request) or has stopped (-1).  While any waits, no lane
 * records a pending event again: what it waits for completes with the
 * work deferred before it began, not with work deferred later, but for
 * one record per pick that read no waiter just before the count rose (a
 * call running beside the flush's start).  Never blocks. */
void stream_lane_waiter(int delta);

/* The table's thread, at its exit, or the reclaimer at shutdown (see
 * above): every lane lets go of its events; those whose entries are all
 * done go back to the pool. */
void stream_lane_let_go_all(struct lane_table *t);

#endif
