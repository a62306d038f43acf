/* SPDX-License-Identifier: MIT */
/*
 * The reclaimer: one thread that takes every pushed entry at once, keeps it
 * in its stream's FIFO, polls the oldest event of each stream
 * (reclaimer_poll.c), and hands what completed to the release policy, which
 * releases it now or holds it for a better moment.  With nothing pending or
 * held it sleeps on a condition variable until the next push.  Its state
 * is in reclaimer_state.h; its lifecycle (start, the gate, flush, trim,
 * shutdown) is in lifecycle.c (lifecycle.h), exit and fork in
 * lifecycle_hooks.c.
 */
#define _GNU_SOURCE /* pthread_setname_np, pthread_timedjoin_np */
#include "reclaimer_state.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda.h"
#include "cache.h"
#include "capture.h"
#include "config.h"
#include "entry_slab.h"
#include "event_pool.h"
#include "held.h"
#include "lifecycle.h"
#include "pointer_set.h"
#include "queue.h"
#include "release.h"
#include "release_policy.h"
#include "report.h"
#include "stats.h"
#include "stream_lane.h"
#include "stream_table.h"
#include "trace.h"

struct reclaimer_state rs = {
    .wake_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_cond = PTHREAD_COND_INITIALIZER,
    .life_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- the reclaimer thread: requests -------------------------------------- */

static void complete_request(struct request *q)
{
    pthread_mutex_lock(&q->lock);
    q->done = true;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock); /* q may be gone from here on */
}

/* Move a request to the list completed at the end of the pass (so the pass's
 * statistics are in place when its waiter wakes). */
static void request_done(struct request *q)
{
    q->next = rs.done_requests;
    rs.done_requests = q;
}

/* A failed device's error becomes q's, unless q has one: every request
 * hears of it, even one that arrives after its entries were abandoned. */
static void hear_device_errors(struct request *q)
{
    for (int d = 0; d < rs.ndevices && q->err == cudaSuccess; d++)
        q->err = device_error(d);
}

/* Take in a flush (waits for every entry taken in before it) or a trim
 * (served at the end of this pass). */
static void take_request(struct request *q)
{
    /* Graph entries that became complete count as taken in before it. */
    capture_poll();
    hear_device_errors(q);
    /* Someone waits: every stream's head is queried this pass, and backs
     * off no further than poll_max_us while requests wait. */
    stream_table_poll_all_soon(&rs.streams, rs.cfg.poll_max_us);
    if (q->trim) {
        q->next = rs.trims;
        rs.trims = q;
        return;
    }
    q->barrier = rs.next_seq;
    q->remaining = rs.tracked;
    if (q->remaining == 0) {
        request_done(q);
        return;
    }
    q->next = rs.flushes;
    rs.flushes = q;
}

/* ---- the reclaimer thread: entries ---------------------------------------- */

/* Events a pass gives back at once, before its end: a pass that takes in
 * thousands of entries (one thread freeing faster than the reclaimer
 * queries one event per entry) would else keep every one of their events
 * from the pool until it ends, and the thread, finding none idle, queries
 * its stream's newest itself (stream_lane.c): on an H100, W5-idle's p99
 * is 1.62 us with it, 2.26 without; p50 0.73 and 0.83. */
#define RECYCLE_EVENTS 256

/* e's event is of no more use to it (its work is done, or never will be):
 * its reference goes, so an entry the policy holds does not keep an event
 * from the pool; the event goes back to the pool at the end of the pass, or
 * once RECYCLE_EVENTS are chained, when that was its last reference
 * (forgotten, never destroyed, when its device failed: it died with the
 * device's context). */
static void drop_event(struct entry *e)
{
    struct shared_event *ev = e->ev;
    e->ev = NULL;
    if (ev == NULL || !stream_lane_event_put(ev))
        return;
    if (device_error(ev->device) != cudaSuccess) {
        free(ev);
        return;
    }
    struct recycle_chains *r = &rs.recycle[ev->device];
    ev->link.next = r->events;
    r->events = &ev->link;
    if (++r->nevents >= RECYCLE_EVENTS) {
        event_pool_give_chain(ev->device, NULL, r->events);
        r->events = NULL;
        r->nevents = 0;
    }
}

/* A finished entry goes back to the pools at the end of the pass (freed
 * when not from the pool, or when its device failed: entry_slab_free
 * frees an entry calloc'ed outside the pool too, its slab NULL). */
static void recycle(struct entry *e)
{
    drop_event(e);
    e->some_pool = false; /* size_up sets it again, or its device failed */
    if (!e->pooled || device_error(e->device) != cudaSuccess) {
        entry_slab_free(e);
        return;
    }
    struct recycle_chains *r = &rs.recycle[e->device];
    e->link.next = r->entries;
    r->entries = &e->link;
}

/* An entry's work is over (released, run, or failed): count it, recycle it
 * and tell the flushes that wait for it.  Only a device's error (its failure,
 * or a sticky error) is the flushes' error too, as include/cudefer.h says; a
 * failure of the entry's own pointers (a host pointer given to defer_free,
 * one dropped by CUDEFER_CHECK) is reported and counted in failed, not
 * returned to a flush that may be another thread's. */
void reclaimer_finish_entry(struct entry *e, cudaError_t err)
{
    bool device_failed = err != cudaSuccess &&
                         (cuda_error_is_sticky(err) ||
                          err == device_error(e->device));
    if (e->kind == ENTRY_BLOCK) /* the cache checks its blocks itself */
        cache_reclaim_claims_done(e->claims, e->nptrs, err == cudaSuccess, now_ns());
    else if (rs.cfg.check)
        for (size_t i = 0; i < e->nptrs; i++)
            if (!entry_claimed(e, i)) /* blocks are not in the set */
                pointer_set_remove(&rs.deferred, e->ptrs[i]);
    /* Members are not the caller's entries; a free batch is one per block. */
    if (e->kind != ENTRY_MEMBER)
        lifecycle_count_finished(err == cudaSuccess,
                                 e->kind == ENTRY_BLOCK ? e->nptrs : 1);
    rs.tracked--;
    for (struct request **link = &rs.flushes; *link != NULL;) {
        struct request *q = *link;
        if (e->seq < q->barrier) {
            if (device_failed && q->err == cudaSuccess)
                q->err = err;
            if (--q->remaining == 0) {
                *link = q->next;
                request_done(q);
                continue;
            }
        }
        link = &q->next;
    }
    if (e->synced && e->request != NULL) { /* its caller waits for it */
        e->request->err = err;
        request_done(e->request);
    }
    release_forget_pointers(e);
    recycle(e);
}

/* Any thread: mark device failed with err, which call met in who (first
 * error wins) and say so once; a runtime that is unloading (process exit)
 * is not worth a message. */
void reclaimer_fail_device_in(const char *who, int device, const char *call,
                              cudaError_t err)
{
    cudaError_t none = cudaSuccess;
    bool first = atomic_compare_exchange_strong(&rs.device_errors[device],
                                                &none, err);
    atomic_store_explicit(&rs.any_device_failed, true, memory_order_release);
    if (first) {
        char what[96];
        snprintf(what, sizeof what, "%s: device %d", who, device);
        cuda_report_failure(what, call, err,
                            "; its pending entries will not be released, "
                            "and later defer calls on it return this error");
    }
}

void reclaimer_fail_device(int device, const char *call, cudaError_t err)
{
    reclaimer_fail_device_in("reclaimer", device, call, err);
}

/* Make device current on the reclaimer thread; false if that failed. */
bool reclaimer_use_device(int device)
{
    if (rs.current_device == device)
        return true;
    cudaError_t err = cuda_set_device(device);
    if (err != cudaSuccess) {
        reclaimer_fail_device(device, "cudaSetDevice", err);
        return false;
    }
    rs.current_device = device;
    return true;
}

/* Reclaimer thread only, after a callback ran: the callback may have
 * switched the thread's device, so learn which one is current (a cheap
 * cudaGetDevice) rather than forget it, which cost a cudaSetDevice before
 * the next query or callback: one per callback in a drain of callbacks
 * (W6).  Unknown (-1) if even that fails, or if exit gave up while the
 * callback ran (no CUDA call then).  The callback may have changed the
 * thread's capture mode too: relaxed again (a thread-local exchange), or
 * the reclaimer's next query, while another thread captures in the
 * global mode, would be refused and invalidate that capture.  Never
 * blocks. */
static void settle_after_callback(void)
{
    int device;
    bool abandoned = reclaimer_abandoned();
    if (!abandoned)
        cuda_relax_capture_mode();
    rs.current_device = !abandoned &&
                                cuda_get_device_runtime(&device) == cudaSuccess
                            ? device
                            : -1;
}

/* Reclaimer only, after a callback returned with err: in the child of a
 * fork() the callback made (the child's one thread is this one), its
 * entry, which the child left pending, ends here, counted released (it
 * ran), as the synchronous route counts it there (Note [Running entries],
 * lifecycle_hooks.c): reclaimer_finish_entry counts nothing in that child
 * (rs.abandoned), nor does anything else.  In the parent, nothing.  Never
 * blocks. */
static void count_forked_callback(cudaError_t err)
{
    if (atomic_load(&rs.state) == STATE_FORKED)
        stats_add(err == cudaSuccess ? &stats.released : &stats.failed, 1);
}

/* Reclaimer only: reclaimer_abandoned, for the release loops that ask
 * between their CUDA calls (release_entry, cache_reclaim_release). */
static bool abandoned(void)
{
    return reclaimer_abandoned();
}

cudaError_t reclaimer_release_now(struct entry *e, uint64_t now)
{
    /* Exit gave up its drain while this pass was under way (in a callback
     * that outlasted it, say) and counted e failed, left unreleased, as it
     * said: neither released (a free, a callback run, while the process
     * and the CUDA runtime end) nor finished; the thread ends at its next
     * look at the abandon (reclaimer_abandoned), its pass unfinished. */
    if (reclaimer_abandoned())
        return cudaErrorCudartUnloading;
    cudaError_t err = device_error(e->device);
    struct release_report out = {0};
    if (err == cudaSuccess && reclaimer_use_device(e->device)) {
        trace_push(e->kind == ENTRY_CALL ? "cudefer: callback"
                                         : "cudefer: release");
        /* A callback finds its own CUDA errors on this thread, not the
         * reclaimer's (a failed cudaFree, a probe of a stream the
         * application destroyed; PyTorch's launch checks read it). */
        if (e->kind == ENTRY_CALL)
            cuda_clear_last_error();
        err = release_entry(e, reclaimer_frees_stream_of(e), abandoned,
                            &out);
        reclaimer_frees_queued(e->device, out.queued);
        /* Its pool memory's release, made before (release_pool_part),
         * failed: e failed (its other pointers released all the same). */
        if (err == cudaSuccess)
            err = e->group_err;
        trace_pop();
        if (e->kind == ENTRY_CALL) {
            settle_after_callback();
            count_forked_callback(err);
        }
        if (cuda_error_is_sticky(err))
            reclaimer_fail_device(e->device, out.failed_call, err);
        stats_record_latency(now - e->completed_ns);
    } else {
        err = device_error(e->device);
    }
    if (err == cudaSuccess) { /* batches: passes that released something */
        rs.pass_released++;
        rs.pass_released_bytes += e->held_bytes;
    } else if (!cuda_error_is_sticky(err) &&
               device_error(e->device) == cudaSuccess) {
        /* Failed for some of its pointers (counted once, in failed):
         * the others were given back, and a trim counts their bytes
         * (release_report, failed_bytes).  After a device's error nothing
         * is known given back. */
        rs.pass_released_bytes += e->held_bytes > out.failed_bytes
                                      ? e->held_bytes - out.failed_bytes
                                      : 0;
    }
    reclaimer_finish_entry(e, err);
    return err;
}

/* A completed entry of several pointers, some of them blocks of the cache:
 * the blocks go back to the cache now (reusable at once), the rest stays in
 * e for the policy.  False when nothing is left in e. */
static bool give_back_blocks(struct entry *e)
{
    size_t kept = 0;
    for (size_t i = 0; i < e->nptrs; i++) {
        if (!entry_claimed(e, i)) {
            release_move_pointer(e, i, kept++);
            continue;
        }
        cache_reclaim_adopt(&e->claims[i], entry_caller_name(e));
    }
    e->nptrs = kept;
    return kept > 0;
}

/* Pointers i and j of e (and their claims) trade places. */
static void swap_pointers(struct entry *e, size_t i, size_t j)
{
    void *p = e->ptrs[i];
    e->ptrs[i] = e->ptrs[j];
    e->ptrs[j] = p;
    if (e->claims != NULL) {
        struct block_claim c = e->claims[i];
        e->claims[i] = e->claims[j];
        e->claims[j] = c;
    }
}

/* A completed entry of several pointers, some of them pool memory
 * (cudaMallocAsync's) and some not (some_pool): the pool memory is
 * released now, with cudaFreeAsync as defer_free releases it (as soon as
 * its work is done, never held: size_up left its bytes out of held_bytes),
 * the rest stays in e for the policy.  Pool memory is told apart by asking
 * CUDA again, only for such entries.  A release that failed is e's
 * failure: kept in group_err (done with once e completed) for e's end to
 * count, and a sticky one fails the device.  False when nothing is left
 * in e. */
static bool release_pool_part(struct entry *e)
{
    if (reclaimer_abandoned() || device_error(e->device) != cudaSuccess ||
        !reclaimer_use_device(e->device))
        return true; /* released, or failed, with the rest */
    size_t kept = 0;
    for (size_t i = 0; i < e->nptrs; i++) {
        struct cuda_allocation info;
        if (entry_claimed(e, i) ||
            !cuda_allocation_of(e->ptrs[i], true, &info) || !info.pool)
            swap_pointers(e, i, kept++);
    }
    if (kept == e->nptrs)
        return true;
    /* The pool pointers, e->ptrs[kept..nptrs), none a block. */
    struct entry part = *e;
    part.ptrs = e->ptrs + kept;
    part.nptrs = e->nptrs - kept;
    part.claims = NULL;
    part.pool = true;
    part.held_bytes = 0;
    struct release_report out = {0};
    cudaError_t err = release_entry(&part, reclaimer_frees_stream_of(&part),
                                    abandoned, &out);
    reclaimer_frees_queued(e->device, out.queued);
    if (rs.cfg.check) /* finishing e takes out only what e still holds */
        for (size_t i = 0; i < part.nptrs; i++)
            pointer_set_remove(&rs.deferred, part.ptrs[i]);
    e->nptrs = kept;
    if (err != cudaSuccess && e->group_err == cudaSuccess)
        e->group_err = err;
    if (cuda_error_is_sticky(err))
        reclaimer_fail_device(e->device, out.failed_call, err);
    return kept > 0;
}

/* A completed entry: released at once or held, as the policy says. */
static void completed(struct entry *e, uint64_t now)
{
    e->completed_ns = now;
    if (e->kind == ENTRY_BLOCK || /* FREE in the cache from now */
        (e->kind == ENTRY_FREE_DEVICE && !e->cache_blocks && e->nptrs > 1 &&
         e->claims != NULL && !give_back_blocks(e))) {
        /* Counted as released counts them: a free batch's blocks each. */
        rs.pass_released += e->kind == ENTRY_BLOCK ? e->nptrs : 1;
        reclaimer_finish_entry(e, cudaSuccess);
        return;
    }
    if (e->kind == ENTRY_FREE_DEVICE && e->some_pool &&
        !release_policy_release_at_once(&rs.cfg, e) && !release_pool_part(e)) {
        rs.pass_released += e->group_err == cudaSuccess;
        reclaimer_finish_entry(e, e->group_err);
        return;
    }
    if (release_policy_release_at_once(&rs.cfg, e)) {
        reclaimer_release_now(e, now);
        return;
    }
    struct held_list *h = &rs.held[e->device];
    held_lock(h);
    held_push_locked(h, e);
    held_unlock(h);
}

/* One part of payload p's group is done (err: it failed, never completed).
 * When the last part is done, p completes, or fails if any part failed. */
static void part_done(struct entry *p, cudaError_t err, uint64_t now)
{
    if (err != cudaSuccess && p->group_err == cudaSuccess)
        p->group_err = err;
    if (--p->group_remaining > 0)
        return;
    if (p->group_err != cudaSuccess)
        reclaimer_finish_entry(p, p->group_err);
    else
        completed(p, now);
}

/* Entry e's event completed (err == cudaSuccess) or never will (err). */
void reclaimer_event_done(struct entry *e, cudaError_t err, uint64_t now)
{
    drop_event(e);
    if (e->kind == ENTRY_MEMBER) {
        struct entry *payload = e->group;
        reclaimer_finish_entry(e, err);
        part_done(payload, err, now);
    } else {
        part_done(e, err, now);
    }
}

/* Move every pushed entry into its stream's FIFO; returns how many came. */
static size_t take_pushed(void)
{
    /* The batch lives in r, not on this stack: a fork child (which has no
     * reclaimer thread) can still see the entries it holds. */
    struct queue_batch *batch = &rs.batch;
    size_t arrived = 0;
    if (!queue_take_all_sc(&rs.queue, batch))
        return 0;
    struct queue_node *node = batch->first;
    /* An entry taken in may run a callback: exit may give up meanwhile,
     * and the rest is then left as it is. */
    while (node != NULL && !reclaimer_abandoned()) {
        /* Read the link first: a completed request may be gone. */
        struct queue_node *next = queue_batch_next(batch, node);
        struct entry *e = entry_of_node(node);
        node = next;
        if (e->kind == ENTRY_REQUEST) {
            take_request(e->request);
            continue;
        }
        if (e->captured) { /* waits for its graph and streams (capture.h) */
            capture_take(e);
            continue;
        }
        arrived++;
        reclaimer_take_in(e);
    }
    return arrived;
}

/* Whether someone waits for the reclaimer (a flush, a trim, the stop). */
bool reclaimer_demand_now(void)
{
    return rs.flushes != NULL || rs.trims != NULL || atomic_load(&rs.stop);
}

struct policy_view reclaimer_view_now(uint64_t now)
{
    return (struct policy_view){
        .now_ns = now,
        .last_activity_ns = rs.last_activity_ns,
        .work_pending = rs.incomplete > 0,
        .demand = reclaimer_demand_now(),
    };
}

/* End of a pass: recycle entries, publish counts, wake finished waiters. */
static void end_pass(void)
{
    uint64_t held = 0, held_bytes = 0;
    for (int d = 0; d < rs.ndevices; d++) {
        event_pool_give_chain(d, rs.recycle[d].entries, rs.recycle[d].events);
        rs.recycle[d] = (struct recycle_chains){0};
        held_lock(&rs.held[d]);
        held += rs.held[d].count;
        held_bytes += rs.held[d].bytes;
        held_unlock(&rs.held[d]);
    }
    if (lifecycle_counting_begin()) { /* none once exit abandoned them */
        stats_set(&stats.held, held);
        stats_set(&stats.held_bytes, held_bytes);
        lifecycle_counting_end();
    }
    reclaimer_frees_sync(); /* before the requests: the memory back now */
    if (rs.pass_released > 0)
        stats_record_batch(rs.pass_released);
    while (rs.trims != NULL) {
        struct request *q = rs.trims;
        rs.trims = q->next;
        q->bytes = rs.pass_released_bytes;
        /* A device that failed during the pass that served it too (a
         * flush hears of that in finish_entry). */
        hear_device_errors(q);
        request_done(q);
    }
    while (rs.done_requests != NULL) {
        struct request *q = rs.done_requests;
        rs.done_requests = q->next;
        if (rs.pass_sync_failed) /* found after its entries finished */
            hear_device_errors(q);
        complete_request(q);
    }
    rs.pass_sync_failed = false;
    rs.pass_released = 0;
    rs.pass_released_bytes = 0;
}

#define NS_PER_MS UINT64_C(1000000)

/* Reclaimer thread only.  Releases the block cache's FREE segments that
 * nobody took for cache_keep_ms, at a quiet moment (or once 4 x
 * cache_keep_ms passed, quiet or not), and every one on a trim and when
 * stopping: a batch per device, then the device's pool's unused memory
 * (a pool segment handed back stays reserved by the pool, whose release
 * threshold is the maximum, until it is trimmed: an expiry that left it
 * there would give the device nothing).  Blocks are reused in the steady
 * state, so these batches are rare: each segment is released at most
 * once. */
static void release_cache_blocks(uint64_t now, bool stopping)
{
    bool all = rs.trims != NULL || stopping;
    struct policy_view view = reclaimer_view_now(now);
    uint64_t keep_ns = (uint64_t)rs.cfg.cache_keep_ms * NS_PER_MS;
    if (!release_policy_quiet(&rs.cfg, &view))
        keep_ns *= 4;
    if (!all && (keep_ns == 0 || now <= keep_ns))
        return;
    uint64_t before = all ? UINT64_MAX : now - keep_ns;
    /* A release may block (cudaFree, the wait for the frees): once exit
     * gave up meanwhile, no other device's is made. */
    for (int d = 0; d < rs.ndevices && !reclaimer_abandoned(); d++) {
        uint64_t oldest = cache_reclaim_oldest_free_ns(d);
        bool blocks = oldest != UINT64_MAX && oldest <= before;
        bool upstream = (all || blocks) && cache_upstream_exists(d);
        if ((!blocks && !upstream) || device_error(d) != cudaSuccess ||
            !reclaimer_use_device(d))
            continue;
        trace_push(all ? "cudefer: cache trim" : "cudefer: cache expiry");
        cudaStream_t async = reclaimer_frees_stream(d);
        rs.pass_released_bytes +=
            cache_reclaim_release(d, before, async, reclaimer_fail_device,
                                  abandoned);
        /* The pool's unused memory back to CUDA too, once the segments
         * handed back on async reached it: that wait fails as the wait
         * after a pass's frees does (a sticky error fails the device). */
        if (upstream && !reclaimer_abandoned()) {
            reclaimer_frees_wait(d);
            if (device_error(d) == cudaSuccess)
                rs.pass_released_bytes +=
                    cache_upstream_trim(d, reclaimer_fail_device);
        }
        trace_pop();
    }
}

void *reclaimer_main(void *unused)
{
    (void)unused;
    thread_here.reclaimer = true;
    pthread_setname_np(pthread_self(), "cudefer-reclaim");
    /* The reclaimer's queries and frees must never invalidate a capture
     * that another thread runs in the global mode (the default). */
    cuda_relax_capture_mode();
    rs.nap_us = rs.cfg.poll_us;
    bool stop_seen = false;
    for (;;) {
        if (reclaimer_abandoned())
            goto abandoned;
        /* Read once, first: the pass that ends the loop has seen it all
         * through (the cache is emptied only by a pass that knew). */
        bool stopping = atomic_load(&rs.stop);
        if (stopping && !stop_seen) /* the drain waits: look at once */
            stream_table_poll_all_soon(&rs.streams, rs.cfg.poll_max_us);
        stop_seen = stopping;
        capture_poll();
        size_t arrived = take_pushed();
        uint64_t now = now_ns();
        if (arrived > 0)
            rs.last_activity_ns = now;
        size_t done = rs.incomplete > 0 ? reclaimer_poll_streams(now) : 0;
        /* Between the stages: a callback run, or a CUDA call that blocked,
         * may have outlasted exit's drain. */
        if (reclaimer_abandoned())
            goto abandoned;
        reclaimer_held_release(now);
        if (reclaimer_abandoned())
            goto abandoned;
        release_cache_blocks(now, stopping);
        cache_reclaim_collect();
        if (reclaimer_abandoned())
            goto abandoned;
        if (!stopping)
            event_pool_refill(); /* what the lanes found missing */
        if (reclaimer_abandoned())
            goto abandoned;
        end_pass();
        /* Graph entries still waiting are given up, but for dead graphs
         * whose streams' earlier work has its event (recorded by a pass
         * or by capture_stop): waited for in more passes, as any entry's,
         * as are those capture_stop took in. */
        if (rs.tracked == 0 && stopping && queue_is_empty(&rs.queue) &&
            !capture_dead_pending() && capture_stop() == 0)
            break;
        reclaimer_wait_for_work(arrived + done > 0, now);
        stats_add(&stats.wakeups, 1);
    }
    /* The last pass may have outlasted exit's join: no stream nor event
     * destroyed then. */
    if (reclaimer_abandoned())
        goto abandoned;
    reclaimer_frees_destroy();
    event_pool_destroy_all();
    return NULL;
abandoned:
    /* Exit gave up on the drain and counted what is left as failed:
     * nothing more is released, no CUDA call made, the pass under way
     * left unfinished (reclaimer_abandoned).  Nobody joins this thread
     * (exit's join, if it tried, had timed out before the abandon), so it
     * detaches itself: a thread that ends unjoined and undetached is a
     * leak to the thread sanitizer.  But for a shutdown on another
     * thread that took the join first (exit gave up while it joined):
     * it joins this thread, and a detach would leave it joining a thread
     * that is gone (rs.reaper). */
    {
        int none = REAPER_NONE; /* a label takes no declaration in C11 */
        if (atomic_compare_exchange_strong(&rs.reaper, &none,
                                           REAPER_DETACHED))
            pthread_detach(pthread_self());
    }
    return NULL;
}

