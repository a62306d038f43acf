/* SPDX-License-Identifier: MIT */
/*
 * Event pool: the launching threads' recycled resources, per device.
 *
 * Two kinds are pooled: entries (entry.h) and shared events (a CUDA event,
 * cudaEventDisableTiming, that entries of one stream share: stream_lane.h
 * says how).  An entry owns no event of its own: under load thousands of
 * entries of a stream share a few events, so the driver's event creation,
 * W6's cost on an H100, is paid a few times per stream, not once
 * per entry.
 *
 * Each device has a pool of each kind (a stack under a lock that guards
 * only the stack: no CUDA call is made while it is held).  Each launching
 * thread keeps a small cache of each kind per device, filled from and
 * drained to the pool in batches, so the steady state takes no lock at all.
 * The reclaimer gives back in batches.  Each thread's cache also holds the
 * thread's stream lanes (stream_lane.h), so that a thread's exit and
 * shutdown let go of the events they hold.
 */
#ifndef CUDEFER_EVENT_POOL_H
#define CUDEFER_EVENT_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "entry.h"

struct lane_table;

/* Items moved between a thread's cache and a pool at once (to measure its
 * effect: ./configure CPPFLAGS=-DEVENT_POOL_BATCH=N). */
#ifndef EVENT_POOL_BATCH
#define EVENT_POOL_BATCH 32
#endif
/* The most idle items of each kind a thread's cache keeps per device (two
 * batches; no more than CUDEFER_EVENT_POOL): on top of the pool's, for the
 * caches are not counted against it (Note [Idle bound] in event_pool.c). */
#define EVENT_POOL_CACHE_MAX (2 * EVENT_POOL_BATCH)

/* A CUDA event shared by consecutive entries of one stream (stream_lane.h).
 * Each record of it gets a label, 1, 2, ...; an entry carries the label of
 * the record made after its work.  Records are made by one thread (the
 * lane's) on one stream, so once a record has completed, every record with
 * a smaller label has too. */
struct shared_event {
    struct pool_link link; /* in a pool or cache; not while in use */
    cudaEvent_t event;
    int device;
    /* The reclaimer's alone: the highest label taken in. */
    uint64_t taken;
    /* Every record with a label up to this one completed: written by the
     * reclaimer after its query (release), raised by the lane's thread
     * after a query of its own (stream_lane.c), read by both. */
    _Alignas(64) _Atomic uint64_t completed;
    /* References: the entries that carry it, and its lane while it holds
     * it.  The lane adds its entries all at once when it lets go
     * (stream_lane.c), the reclaimer takes one off per entry finished: the
     * count is 0 only once both are done, and whoever brings it to 0 gives
     * the event back. */
    _Atomic int64_t refs;
};

/* Start-up only (one thread, before any other call).  ndevices pools of
 * each kind, each keeping at most max_idle idle items (beyond that they
 * are freed, events destroyed); each thread's cache keeps up to
 * EVENT_POOL_CACHE_MAX more per device, max_idle at most (0 keeps none
 * idle anywhere).  Events of a device for which
 * device_failed(device) is true (a sticky error, said once where it
 * surfaced) are only forgotten, never destroyed: destroying them would
 * fail and say it again.  Returns cudaSuccess or
 * cudaErrorMemoryAllocation. */
cudaError_t event_pool_init(int ndevices, size_t max_idle,
                            bool (*device_failed)(int device));

/* Any thread.  A blank entry for device (from the thread's cache, refilled
 * from the pool, or allocated).  NULL when out of memory, with *err and
 * *call. */
struct entry *event_pool_take_entry(int device, cudaError_t *err,
                                    const char **call);

/* Any thread.  Gives back an entry taken by this thread and not pushed
 * (its event reference, if any, already dropped). */
void event_pool_give_unused(struct entry *e);

/* Any thread: a lane that holds no event, or a free that never shares.
 * An idle event of device nobody references (refs 0, nothing completed,
 * nothing taken): from the thread's cache or the pool (its reserve too).
 * NULL when there is none; never makes one. */
struct shared_event *event_pool_take_pooled_event(int device);

/* Any thread, when event_pool_take_pooled_event found none: an event of
 * device made now (with the thread's current device switched to device
 * and back; at the device's first such call up to 2,048 more are made
 * into its pool, half of CUDEFER_EVENT_POOL at most but a batch (32) at
 * least, never more than the pool keeps, until 5 ms have passed, one at
 * least).  NULL when it could not be made, with *err and
 * *call (the call that failed). */
struct shared_event *event_pool_make_event(int device, cudaError_t *err,
                                           const char **call);

/* Any thread: a sharing lane that holds an event.  As
 * event_pool_take_pooled_event, but not of the pool's
 * reserve (a quarter of CUDEFER_EVENT_POOL, 1,024 at most), which is kept
 * for lanes that hold none: NULL when the thread's cache has none and the
 * pool none above its reserve, and then the reclaimer is asked to make
 * some (event_pool_refill).  Never makes a CUDA call: on a GPU, creating
 * an event waits for the driver's lock behind every launch that waits for
 * room in its queue (tens of ms; stream_lane.h). */
struct shared_event *event_pool_take_idle_event(int device);

/* Any thread: whether the pools keep idle events at all (CUDEFER_EVENT_POOL
 * above 0); without, none is ever idle to take. */
bool event_pool_keeps_idle(void);

/* The reclaimer, each pass.  For every device whose idle events a
 * launching thread found missing (event_pool_take_idle_event), makes a
 * few (REFILL) into its pool (cudaEventCreateWithFlags, the thread's
 * current device switched and back): few, for each may wait for the
 * driver's lock behind the launching threads' launches, which is better
 * the reclaimer's wait than theirs, and each makes the launching threads'
 * records wait (the lock is taken for writing): making the pool up to its
 * stock whenever a thread left it low put W5-busy's p99 at 17 us from 4.3,
 * the launching thread blocked 1,500-2,200 times in 20,000 calls (on an
 * H100).  Holds no lock of
 * cudefer's meanwhile.  Returns how many it made. */
size_t event_pool_refill(void);

/* A launching thread, or anyone once the library stopped: gives back an
 * event whose references reached 0. */
void event_pool_give_event(struct shared_event *ev);

/* The reclaimer.  Gives back entries and events of device, each chained by
 * their pool_link (either may be NULL). */
void event_pool_give_chain(int device, struct pool_link *entries,
                           struct pool_link *events);

/* Any thread: the calling thread's stream lanes (registered with its
 * cache, so that its exit and shutdown let go of their events). */
struct lane_table *event_pool_lanes(void);

/* The reclaimer, at shutdown, once no launching thread is inside cudefer
 * and every entry is done: lets go of every lane's events and destroys
 * every idle event, the threads' caches included (a failed device's
 * only forgotten, as everywhere). */
void event_pool_destroy_all(void);

/* Start-up failure or shutdown: forgets the (empty) pools without any CUDA
 * call. */
void event_pool_abandon(void);

/* Fork child only: makes the pools' locks usable again; no CUDA call. */
void event_pool_after_fork(void);

/* Any thread; never blocks.  Idle events now: in the pools and the threads'
 * caches (only those in the pools while another thread holds the registry
 * of caches: a thread exiting destroys events under it).  The events the
 * threads' lanes hold for their streams are not idle: the next entry of
 * the stream records one of them. */
size_t event_pool_idle_count(void);

#endif
