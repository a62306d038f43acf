/*
 * Stream lanes: how a launching thread's consecutive entries of one stream
 * share events (issue 13: W6's cost on an H100 is the driver's event
 * creation, one event per pending entry).
 *
 * Stream order makes sharing sound: once an event recorded on stream S
 * after entry E's work has completed, E's work has.  So a thread keeps, per
 * stream it defers on (a lane, keyed by device and stream id), the events it
 * recorded there whose records may still be pending, oldest first, at most
 * LANE_EVENTS of them.  A new entry on S
 *   - records the lane's newest event again when every record of it has
 *     completed (an idle stream: no event taken, no pool traffic);
 *   - else takes a fresh event while the lane holds fewer than LANE_EVENTS
 *     pending ones;
 *   - else records the newest event again: it is shared.  Once an older
 *     event completes the next entry takes a fresh one, so the shared event
 *     stops being recorded again and completes; an entry waits at most for
 *     the work its stream was given until the oldest event of its lane
 *     completed.
 * Each record of an event gets the next label; the entry carries it, and
 * the reclaimer, once a query says the event completed, knows that every
 * label it had taken in by then completed (event_pool.h: struct
 * shared_event).  Sharing a pending event needs the stream's exact
 * identity: a stale one (a destroyed stream whose handle now names another
 * stream) would put records of two streams on one event.  Recording a
 * completed event again needs nothing: no entry waits on its records.
 *
 * Several threads on one stream (the legacy stream, a shared created
 * stream) each have their own lane, so their records never share an
 * event: a stream has at most LANE_EVENTS events per thread that defers on
 * it.  A thread keeps LANE_SETS x LANE_WAYS lanes; a thread that defers on
 * more streams than that, round robin, lets go of a lane per call and
 * shares little (each call then takes an event, as before sharing).
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
#define LANE_SETS 16
#define LANE_WAYS 4

struct shared_event;

struct lane_slot {
    struct shared_event *ev;
    uint64_t label; /* its newest record's label (0: none yet) */
};

struct lane {
    unsigned long long stream_id;
    int device;
    bool valid;
    unsigned char oldest, count; /* the ring of slots */
    struct lane_slot ring[LANE_EVENTS];
};

struct lane_table {
    struct lane set[LANE_SETS][LANE_WAYS];
    unsigned char next[LANE_SETS]; /* the way replaced next (round robin) */
};

/* What a new entry records: chosen by stream_lane_pick, then
 * stream_lane_commit (recorded) or stream_lane_cancel (not). */
struct lane_pick {
    struct lane *lane;
    struct shared_event *ev;
    bool fresh; /* taken from the pool for this entry */
};

/* The calling thread.  Chooses the event of a new entry on stream id of
 * device (see above).  exact: the identity is exact (stream_identity.h);
 * when it is not and only sharing would do, returns cudaSuccess with
 * *need_exact set and nothing chosen (look the stream up exactly, then
 * ask again).  Otherwise cudaSuccess and *pick, or the error of the event
 * that could not be had, with *call.  Never blocks (but for creating an
 * event). */
cudaError_t stream_lane_pick(int device, unsigned long long id, bool exact,
                             struct lane_pick *pick, bool *need_exact,
                             const char **call);

/* The calling thread, right after pick->ev was recorded for e: e carries a
 * reference to it and the record's label. */
void stream_lane_commit(const struct lane_pick *pick, struct entry *e);

/* The calling thread, when pick->ev could not be recorded. */
void stream_lane_cancel(const struct lane_pick *pick);

/* The calling thread: e was committed but will not be pushed; its
 * reference is dropped (and its label, when it is still its lane's
 * newest, so the lane does not wait for a record nobody takes in). */
void stream_lane_uncommit(struct entry *e);

/* Any thread: one of ev's entries is done (or will never be pushed).  True
 * when that was ev's last reference: the caller gives ev back to the pool
 * (event_pool.h). */
bool stream_lane_event_put(struct shared_event *ev);

/* The table's thread, at its exit, or the reclaimer at shutdown (see
 * above): every lane lets go of its events; those whose entries are all
 * done go back to the pool. */
void stream_lane_let_go_all(struct lane_table *t);

#endif
