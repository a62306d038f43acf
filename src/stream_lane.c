/* SPDX-License-Identifier: MIT */
/* Stream lanes: consecutive entries of a stream share events (see the
 * header). */
#include "stream_lane.h"

#include "cuda.h"
#include "event_pool.h"
#include "stats.h"

/* How many defer_flush calls (and callbacks queued with no event) wait now:
 * while any does, no lane records a pending event again (see the header). */
static _Atomic int waiters;

void stream_lane_waiter(int delta)
{
    atomic_fetch_add_explicit(&waiters, delta, memory_order_seq_cst);
}

/* The set of (device, stream id): the top bits of a multiplicative hash. */
static unsigned set_of(int device, unsigned long long id)
{
    uint64_t h = ((uint64_t)id ^ ((uint64_t)(unsigned)device << 56)) *
                 UINT64_C(0x9e3779b97f4a7c15);
    return (unsigned)(h >> 60) & (LANE_SETS - 1);
}

bool stream_lane_event_put(struct shared_event *ev)
{
    return atomic_fetch_sub_explicit(&ev->refs, 1, memory_order_acq_rel) == 1;
}

/* The lane lets go of slot's event: it adds the references of every entry
 * it gave the event (one per label; the reclaimer took one off per entry
 * done), and gives it back if they are all done. */
static void let_go_slot(struct lane_slot *slot)
{
    int64_t labels = (int64_t)slot->label;
    if (atomic_fetch_add_explicit(&slot->ev->refs, labels,
                                  memory_order_acq_rel) + labels == 0)
        event_pool_give_event(slot->ev);
    slot->ev = NULL;
}

/* Whether every record of slot's event has completed (as far as the
 * reclaimer has seen), or every entry given the event is finished (the
 * reclaimer took one reference off each: refs is minus the labels while
 * the lane holds it).  The second covers entries finished without a query
 * of the event (refused by CUDEFER_CHECK on arrival, waited for with
 * cudaEventSynchronize when out of memory): no entry waits for the
 * event's records any more, so it may be let go of or recorded again;
 * else the lane would keep it for good, a slot fewer, and full at last. */
static bool slot_done(const struct lane_slot *slot)
{
    if (atomic_load_explicit(&slot->ev->completed, memory_order_acquire) >=
        slot->label)
        return true;
    return atomic_load_explicit(&slot->ev->refs, memory_order_acquire) ==
           -(int64_t)slot->label;
}

static struct lane_slot *slot_at(struct lane *l, unsigned i)
{
    return &l->ring[(l->oldest + i) % LANE_EVENTS];
}

static void let_go_lane(struct lane *l)
{
    for (unsigned i = 0; i < l->count; i++)
        let_go_slot(slot_at(l, i));
    l->count = 0;
    l->oldest = 0;
    l->valid = false;
}

/* The lane of (device, id, share), made if needed (letting go of the set's
 * round-robin victim).  Callbacks and blocks have lanes apart: a block's
 * record never makes a callback's event complete later than the
 * callbacks' own sharing does (include/cudefer.h, defer_call's limit). */
static struct lane *lane_of(struct lane_table *t, int device,
                            unsigned long long id, enum lane_share share)
{
    unsigned s = set_of(device, id);
    struct lane *set = t->set[s];
    for (int w = 0; w < LANE_WAYS; w++)
        if (set[w].valid && set[w].stream_id == id &&
            set[w].device == device && set[w].share == share)
            return &set[w];
    struct lane *l = &set[t->next[s]];
    t->next[s] = (unsigned char)((t->next[s] + 1) % LANE_WAYS);
    if (l->valid)
        let_go_lane(l);
    l->stream_id = id;
    l->device = device;
    l->share = (unsigned char)share;
    l->ask_wait = l->ask_skip = 0;
    l->asked_ev = NULL;
    l->valid = true;
    return l;
}

/* Events complete in stream order: l lets go of its completed oldest ones
 * (the newest stays, to be recorded again). */
static void let_go_done(struct lane *l)
{
    while (l->count > 1 && slot_done(slot_at(l, 0))) {
        let_go_slot(slot_at(l, 0));
        l->oldest = (unsigned char)((l->oldest + 1) % LANE_EVENTS);
        l->count--;
    }
}

/* An idle event of device for a sharing lane, or NULL.  When the pools
 * have none, the thread's other lanes first let go of their completed
 * events: a lane lets go only when its stream gets its next entry, so the
 * events of streams the thread no longer defers on (gone idle, destroyed)
 * would stay parked there while a new stream's lane, finding none idle,
 * shares one event (t/shared_events).  On the first miss after a take,
 * then once per SWEEP_EVERY misses in a row: a sweep reads every lane
 * (LANE_SETS x LANE_WAYS), and while the reclaimer has made none the
 * lanes' next completions are what a sweep can find. */
#define SWEEP_EVERY 64
static struct shared_event *take_idle(struct lane_table *t, int device)
{
    struct shared_event *ev = event_pool_take_idle_event(device);
    if (ev == NULL && t->misses++ % SWEEP_EVERY == 0) {
        for (int s = 0; s < LANE_SETS; s++)
            for (int w = 0; w < LANE_WAYS; w++)
                if (t->set[s][w].valid)
                    let_go_done(&t->set[s][w]);
        ev = event_pool_take_idle_event(device);
    }
    if (ev != NULL)
        t->misses = 0; /* a take: the next miss sweeps */
    return ev;
}

/* The calling thread, for its lane's newest slot, when no idle event is at
 * hand: whether every record of its event has completed, by a query of
 * its own (without it, on an H100 in W5, a thread freeing on an idle
 * stream before the reclaimer had looked made 3,000-5,000 events in
 * 20,000 frees, each with the driver's lock taken for writing and its
 * page faults: the slow calls).  True: the event's completed label is
 * raised to the slot's (every record of a lane is its thread's, on one
 * stream).  A not-ready query leaves no error behind on the thread
 * (cuda_event_query_relaxed). */
static bool newest_done_now(struct lane_slot *slot)
{
    /* Relaxed: in the thread's own mode the query could invalidate
     * another thread's capture (t/event_stock). */
    cudaError_t err = cuda_event_query_relaxed(slot->ev->event);
    stats_add(&stats.event_queries, 1);
    if (err != cudaSuccess)
        return false; /* not ready; or the reclaimer's query meets the
                         error and says so */
    stream_lane_raise_completed(slot->ev, slot->label);
    return true;
}

void stream_lane_raise_completed(struct shared_event *ev, uint64_t label)
{
    uint64_t seen = atomic_load_explicit(&ev->completed, memory_order_relaxed);
    while (seen < label &&
           !atomic_compare_exchange_weak_explicit(&ev->completed, &seen, label,
                                                  memory_order_release,
                                                  memory_order_relaxed)) {
    }
}

/* The calling thread: whether l's newest has completed, by a query of its
 * own (newest_done_now), unless the same newest record was found not
 * complete within the last ask_wait picks; the wait doubles, up to
 * ASK_WAIT_MAX, while it stays so (on an H100 in W5-busy, a not-ready
 * query before each event made puts defer_free's p50 at 1.01 us, 0.75
 * without). */
#define ASK_WAIT_MAX 64
static bool ask_newest(struct lane *l)
{
    struct lane_slot *newest = slot_at(l, l->count - 1u);
    bool same = l->asked_ev == newest->ev && l->asked_label == newest->label;
    if (same && l->ask_skip > 0) {
        l->ask_skip--;
        return false;
    }
    if (newest_done_now(newest)) {
        l->ask_wait = 0;
        l->asked_ev = NULL;
        return true;
    }
    l->ask_wait = !same || l->ask_wait == 0 ? 1
                  : l->ask_wait >= ASK_WAIT_MAX / 2 ? ASK_WAIT_MAX
                                                     : l->ask_wait * 2;
    l->ask_skip = l->ask_wait;
    l->asked_ev = newest->ev;
    l->asked_label = newest->label;
    return false;
}

cudaError_t stream_lane_pick(int device, unsigned long long id,
                             enum lane_share share, struct lane_pick *pick,
                             const char **call)
{
    struct lane_table *t = event_pool_lanes();
    struct lane *l = lane_of(t, device, id, share);
    let_go_done(l);
    *pick = (struct lane_pick){.lane = l};
    if (l->count > 0) {
        struct lane_slot *newest = slot_at(l, l->count - 1u);
        /* Shared only while nobody waits (the seq_cst load pairs with
         * stream_lane_waiter's add, made before the waiter's push). */
        bool may_share = share != LANE_SOLO && l->count == LANE_EVENTS &&
                         atomic_load_explicit(&waiters,
                                              memory_order_seq_cst) == 0;
        if (slot_done(newest) || may_share) {
            pick->ev = newest->ev;
            return cudaSuccess;
        }
        pick->solo = l->count == LANE_EVENTS;
        /* Sharing picks never make an event while the lane holds one: an
         * idle one, else the newest again (the reclaimer makes more: see
         * the header), while fewer than LANE_REUSE_MAX of its records are
         * not seen complete (those made while the stream was idle do not
         * count), so an entry waits for a bounded amount of later work
         * even where no event comes (events that cannot be made). */
        if (share != LANE_SOLO && !pick->solo && event_pool_keeps_idle() &&
            newest->label - atomic_load_explicit(&newest->ev->completed,
                                                 memory_order_acquire) <
                LANE_REUSE_MAX &&
            atomic_load_explicit(&waiters, memory_order_seq_cst) == 0) {
            pick->ev = take_idle(t, device);
            pick->fresh = pick->ev != NULL;
            if (pick->ev == NULL)
                pick->ev = newest->ev;
            return cudaSuccess;
        }
    }
    cudaError_t err = cudaSuccess;
    if ((pick->ev = event_pool_take_pooled_event(device)) == NULL) {
        /* None idle at hand: before making one, ask whether the newest's
         * records have all completed (the reclaimer may not have looked
         * yet); then it is recorded again, as when the reclaimer saw it
         * (no entry waits longer). */
        if (l->count > 0 && ask_newest(l)) {
            pick->ev = slot_at(l, l->count - 1u)->ev;
            pick->solo = false;
            return cudaSuccess;
        }
        pick->ev = event_pool_make_event(device, &err, call);
    }
    pick->fresh = true;
    return pick->ev != NULL ? cudaSuccess : err;
}

void stream_lane_commit(const struct lane_pick *pick, struct entry *e)
{
    struct lane *l = pick->lane;
    if (pick->solo) { /* the entry's reference alone */
        atomic_store_explicit(&pick->ev->refs, 1, memory_order_relaxed);
        e->ev = pick->ev;
        e->label = 1;
        return;
    }
    if (pick->fresh) {
        *slot_at(l, l->count) = (struct lane_slot){.ev = pick->ev};
        l->count++;
    }
    struct lane_slot *newest = slot_at(l, l->count - 1u);
    e->ev = pick->ev;
    e->label = ++newest->label;
}

void stream_lane_cancel(const struct lane_pick *pick)
{
    if (pick->fresh)
        event_pool_give_event(pick->ev);
}

void stream_lane_uncommit(struct entry *e)
{
    /* Its reference goes, as an entry done's does; its label stays taken.
     * A label names one record of its event for good, never given to a
     * later record: the lane's own query (newest_done_now) may already
     * have raised completed to it, seeing the discarded record done, and a
     * label given again would then count a later record, behind work still
     * pending, as complete.  The lane does not wait for the discarded
     * record: refs then reaches minus the slot's label once every entry
     * pushed with the event is done (slot_done), and its letting go adds
     * every label, this one included (t/lane_lifetimes).  While the lane
     * holds the event refs is at most 0, so this put is never its last;
     * after the lane let go of it, it may be. */
    if (stream_lane_event_put(e->ev))
        event_pool_give_event(e->ev);
    e->ev = NULL;
}

void stream_lane_let_go_all(struct lane_table *t)
{
    for (int s = 0; s < LANE_SETS; s++)
        for (int w = 0; w < LANE_WAYS; w++)
            if (t->set[s][w].valid)
                let_go_lane(&t->set[s][w]);
}
