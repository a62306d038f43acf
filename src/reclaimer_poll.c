/* SPDX-License-Identifier: MIT */
/* The reclaimer's poll: which pending entries' events completed, stream by
 * stream (stream_table.h), and the entries of devices that failed meanwhile.
 * Reclaimer thread only. */
#include "reclaimer_state.h"

#include <stdatomic.h>

#include "clock.h"
#include "cuda.h"
#include "event_pool.h"
#include "stats.h"
#include "stream_lane.h"
#include "stream_table.h"

/* Drop every pending entry of failed devices, as failed (their held ones:
 * reclaimer_held_release, later in the same pass). */
static void abandon_failed_devices(void)
{
    for (size_t i = 0; i < rs.streams.count;) {
        struct stream_fifo *f = rs.streams.fifos[i];
        cudaError_t err = device_error(f->device);
        if (err == cudaSuccess) {
            i++;
            continue;
        }
        /* Popping the last entry removes f and moves another FIFO to i. */
        while (rs.streams.count > i && rs.streams.fifos[i] == f) {
            rs.incomplete--;
            reclaimer_event_done(stream_table_pop(&rs.streams, f, now_ns()),
                                 err, now_ns());
        }
    }
}

/* Reclaimer only.  Whether e's work is done, as far as its event says:
 * cudaSuccess, cudaErrorNotReady, or the error of its query (never
 * completion).  e has an event; a query is made only when no query of its
 * event since e's record was seen complete. */
static cudaError_t query_entry(const struct entry *e)
{
    struct shared_event *ev = e->ev;
    if (e->label <= atomic_load_explicit(&ev->completed, memory_order_relaxed))
        return cudaSuccess;
    cudaError_t err = cuda_event_query(ev->event);
    stats_add(&stats.event_queries, 1);
    /* Every entry of ev taken in so far was recorded before this query:
     * their records completed too.  Raised, never lowered: the lane's
     * thread may have raised it past taken meanwhile and recorded ev again
     * (stream_lane.c); lowering it would make entries whose work is done
     * wait for that later work. */
    if (err == cudaSuccess)
        stream_lane_raise_completed(ev, ev->taken);
    else if (err == cudaErrorNotReady &&
             e->label <= atomic_load_explicit(&ev->completed,
                                              memory_order_acquire))
        err = cudaSuccess; /* its lane saw it complete */
    return err;
}

/* Reclaimer only, in a pass that serves a trim, for a FIFO of frees (of
 * memory, or of blocks of the cache) whose head was just found incomplete:
 * the entries behind the head whose own work is done complete now.  Two
 * threads' records on one stream need not reach the reclaimer in the order
 * they were made (one thread records, another records later and pushes
 * first), so a free whose work is done may wait behind a later one, and
 * defer_trim releases every completed free and every free block
 * (t/requests).  A block's entry may complete out of its FIFO's order: the
 * cache counts the entries naming a block, and turns it FREE only on its
 * own hand-out's (cache_block.h).  Not callbacks, which keep their order.  An entry sharing its event with the head waits
 * with it (the event's newest record decides).  Costs a query per entry
 * behind the head (one per event: entries that share one ask once), once
 * per trim.  Returns how many completed. */
static size_t trim_behind_head(struct stream_fifo *f, uint64_t now)
{
    size_t done = 0;
    const struct shared_event *not_ready = f->head->ev;
    for (struct entry *prev = f->head;
         prev->fifo_next != NULL && !reclaimer_abandoned();) {
        struct entry *e = prev->fifo_next;
        cudaError_t err = e->ev == NULL || e->ev == not_ready
                              ? cudaErrorNotReady
                              : query_entry(e);
        if (err == cudaErrorNotReady) {
            not_ready = e->ev;
            prev = e;
            continue;
        }
        if (err != cudaSuccess) {
            reclaimer_fail_device(f->device, "cudaEventQuery", err);
            break;
        }
        rs.incomplete--;
        done++;
        reclaimer_event_done(stream_table_unlink_next(f, prev), cudaSuccess,
                             now);
    }
    return done;
}

/* Poll the oldest entries of every stream whose head is due (stream_table.h:
 * a head that stayed incomplete backs off); returns how many completed.  An
 * entry is queried only once every entry before it on its stream was seen
 * complete, so a pass costs one query per due stream plus one per entry
 * that completed (a trim's pass more: trim_behind_head). */
size_t reclaimer_poll_streams(uint64_t now)
{
    size_t done = 0;
    bool any_failed = false, demand = reclaimer_demand_now();
    /* Each entry completed may run a callback, or a cudaFree that blocks:
     * once exit gave up meanwhile, nothing more is queried. */
    for (size_t i = 0; i < rs.streams.count && !reclaimer_abandoned();) {
        struct stream_fifo *f = rs.streams.fifos[i];
        bool emptied = false;
        if (!stream_table_due(f, now)) {
            i++;
            continue;
        }
        while (!emptied && !reclaimer_abandoned() &&
               device_error(f->device) == cudaSuccess &&
               reclaimer_use_device(f->device)) {
            /* A synced entry (no event) is complete once it heads its FIFO. */
            cudaError_t err = f->head->ev == NULL ? cudaSuccess
                                                  : query_entry(f->head);
            if (err == cudaErrorNotReady) {
                stream_table_backoff(f, now, rs.cfg.poll_us,
                                     rs.cfg.poll_max_us, demand);
                if (rs.trims != NULL && f->kind != FIFO_CALLBACKS)
                    done += trim_behind_head(f, now);
                break;
            }
            if (err != cudaSuccess) {
                /* Never completion: a sticky error poisons the device. */
                reclaimer_fail_device(f->device, "cudaEventQuery", err);
                break;
            }
            emptied = f->head == f->tail;
            rs.incomplete--;
            done++;
            reclaimer_event_done(stream_table_pop(&rs.streams, f, now),
                                 cudaSuccess, now);
        }
        any_failed |= device_error(f->device) != cudaSuccess;
        if (!emptied)
            i++;
    }
    if (any_failed)
        abandon_failed_devices();
    return done;
}

