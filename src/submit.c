/* SPDX-License-Identifier: MIT */
/* One request's route, on the calling thread (submit.h): admit, resolve the
 * stream once, choose the route once, take it.  Note [The submit route].
 * This file holds the common path, from admit to leave, as one unit for
 * the compiler to inline; the captured route is in submit_captured.c, the
 * synchronous release in submit_sync.c, the group route in submit_group.c,
 * what they share in submit_route.h. */
#include "submit.h"
#include "submit_route.h"

#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cuda.h"
#include "entry.h"
#include "event_pool.h"
#include "free_batch.h"
#include "lifecycle.h"
#include "release.h"
#include "report.h"
#include "stats.h"
#include "stream_identity.h"
#include "stream_lane.h"

/*
 * Note [The submit route]
 *
 * Every defer call that defers something is one request (struct
 * request_args, built by api.c, alloc.c and submit_pluggable.c) and takes
 * one route:
 *
 *   1. admit: the reclaimer's gate (lifecycle_enter), and room for the
 *      claims a free makes on blocks of the cache (cache_claim_room, cache.h);
 *   2. resolve: its stream is looked up once, into a struct target on the
 *      caller's stack: whether it captures, its device and id, and for a
 *      free of one block the cache's plan (which claims the block); a
 *      group gathers its streams there;
 *   3. choose: choose_route picks the route from those facts alone;
 *   4. take it: one function a route; then leave the gate, a refused free
 *      giving back the blocks it claimed.
 *
 * Resolving asks only what the route still depends on, in the order CUDA
 * imposes: the capture check before any other CUDA call on a stream (Note
 * [Capture check]).  A capture, CUDEFER_DISABLE and a group fix the route
 * before the stream's identity is asked: a capturing stream must not be
 * asked at all, and a synchronous release and each stream of a group look
 * their streams up exactly, on their own devices.
 *
 * Nothing here allocates or locks on the common path: the target lives on
 * the stack; the identity comes from the thread's cache (stream_identity.h);
 * the entry and its event from the thread's lane and the device's pool
 * (stream_lane.h, event_pool.h).  A free on a created stream then makes two
 * CUDA calls, the capture check and cudaEventRecord (and cudaStreamGetId
 * where its identity must be exact); a block freed on the legacy stream
 * and batched makes none (free_batch.h).  That free, most of PyTorch's,
 * takes these steps the short way (Note [The short way],
 * submit_pluggable.c): with no request_args or target on the stack.
 *
 *
 * Note [Capture check]
 *
 * An event recorded on a stream that captures into a graph becomes a node
 * of the graph, and cudaStreamGetDevice invalidates the capture: so a
 * request asks capture_status before any other CUDA call on its streams,
 * and a capture takes the captured route (capture.h), which records
 * nothing.
 *
 * One exception: a block of the cache freed on the legacy stream, whose
 * identity this thread has cached (target.batch), may join the device's
 * free batch, which makes no CUDA call on the stream.  The legacy stream
 * cannot capture; it can only be barred by another thread's capture in the
 * global mode, which matters once a call uses the stream.  So that free is
 * checked after the cache's plan, and only when it takes a route that uses
 * the stream; a batch checks before it seals (free_batch_seal).
 *
 * A group checks all its streams once they are gathered, the caller's
 * stream again among them.
 *
 *
 * Note [Stale identity]
 *
 * A destroyed stream's handle may come back for a new stream: this
 * thread's cached identity of the handle is then stale (stream_identity.h).
 * Recording on it fails (cudaErrorInvalidResourceHandle) when the new stream
 * is on another device: the route looks the stream up afresh and records
 * once more.  A block the plan took for one freed on a stream of its own
 * device (ROUTE_BLOCK) may then find its entry on another device: it is
 * freed as a plain free instead, with an event of its own (never shared),
 * so that defer_trim can release it once its own work is done.
 */

/* The routes, one function each (take_route). */
enum route {
    ROUTE_REFUSED,     /* the cache refuses the pointer */
    ROUTE_CAPTURED,    /* the streams capture: the graph's user object */
    ROUTE_SYNCHRONOUS, /* wait for the streams, release here */
    ROUTE_GROUP,       /* an entry on each stream; one is the payload */
    ROUTE_BATCHED,     /* a parked block joins its device's free batch */
    ROUTE_BLOCK,       /* a block freed on its stream: ENTRY_BLOCK */
    ROUTE_ENTRY,       /* an entry and its event on the stream */
};

/* Any thread; never blocks (submit.h). */
cudaError_t submit_reject(const struct request_args *a, const char *call,
                          cudaError_t err)
{
    stats_add(&stats.rejected, 1);
    char tail[64];
    cuda_report_failure(a->what, call, err,
                        a->end != NULL
                            ? report_line_end(a->end, tail, sizeof tail)
                                    : "; nothing was deferred (the caller "
                                      "keeps ownership)");
    return err;
}

cudaError_t submit_reject_on(const struct request_args *a, int device,
                             const char *call, cudaError_t err)
{
    if (device >= 0 && cuda_error_is_sticky(err))
        lifecycle_fail_device(a->what, device, call, err);
    return submit_reject(a, call, err);
}

/* ---- the stream's identity --------------------------------------------- */

/* Any thread: the identity of stream looked up afresh, a cached one having
 * proved stale (Note [Stale identity]).  Never blocks.  cudaSuccess or the
 * look-up's error, *failed naming the call. */
cudaError_t submit_identify_again(cudaStream_t stream, int *device,
                                  unsigned long long *id, const char **failed)
{
    bool cached;
    stream_identity_forget(stream);
    return stream_identity_lookup(stream, false, device, id, &cached, failed);
}

/* Any thread: an identity of stream just looked up (*cached: from the
 * thread's cache) made usable.  A cached identity whose device failed is
 * looked up again first: the handle may now name a stream of a healthy
 * device.  Never blocks.  cudaSuccess, or the error of that look-up or the
 * device's sticky error, *failed naming it. */
static cudaError_t usable(cudaStream_t stream, int *device,
                          unsigned long long *id, bool *cached,
                          const char **failed)
{
    cudaError_t err = lifecycle_device_error(*device);
    if (err != cudaSuccess && *cached) {
        *cached = false;
        if ((err = submit_identify_again(stream, device, id, failed)) !=
            cudaSuccess)
            return err;
        err = lifecycle_device_error(*device);
    }
    if (err != cudaSuccess)
        *failed = "an earlier CUDA call on this device";
    return err;
}

/* Any thread: device and id of stream on a device that has not failed
 * (exact and current: stream_identity_lookup_on).  Never blocks.
 * cudaSuccess, or the error with *failed naming it. */
cudaError_t submit_identify_usable(cudaStream_t stream, bool exact,
                                   int current, int *device,
                                   unsigned long long *id, bool *cached,
                                   const char **failed)
{
    cudaError_t err = stream_identity_lookup_on(stream, exact, current,
                                                device, id, cached, failed);
    return err == cudaSuccess ? usable(stream, device, id, cached, failed)
                              : err;
}

/* ---- entries (submit_record.c makes them) ------------------------------ */

/* Any thread, admitted: the first record on t's stream failed (f): when
 * t's identity was cached and the stream's handle is unknown now, the
 * identity may be stale: looked up afresh and recorded once more, unless
 * the fresh device has failed (an entry there would be abandoned, the call
 * accepted; it is refused as any call on that device is).  Never blocks
 * but as submit_record may.  The entry, or NULL as the second
 * submit_record says (f->no_event cleared first: a failed look-up or a
 * failed device is a refusal). */
static struct entry *record_again(const struct request_args *a,
                                  struct target *t, enum lane_share lane,
                                  struct failure *f)
{
    if (!t->cached || f->err != cudaErrorInvalidResourceHandle)
        return NULL;
    f->no_event = false;
    /* The failed record is cudefer's own: the runtime's (no current
     * context) left its error, which a retry that succeeds must not leave
     * for the application; one that fails leaves its own. */
    cuda_forget_failure_left(f->err);
    if ((f->err = submit_identify_again(t->handle, &t->device, &t->id,
                                        &f->call)) != cudaSuccess)
        return NULL;
    if ((f->err = lifecycle_device_error(t->device)) != cudaSuccess) {
        f->call = "an earlier CUDA call on this device";
        return NULL;
    }
    return submit_record(a, t->handle, t->device, t->id, lane, f);
}

/* Any thread, admitted: a's entry recorded on t's stream (submit_record),
 * once more after a stale cached identity (Note [Stale identity]; t's
 * device and id are then the fresh ones).  Never blocks but as
 * submit_record may.  The entry, or NULL as submit_record says
 * (record_again: a failed fresh look-up or device is a refusal). */
static inline struct entry *record_on(const struct request_args *a,
                                      struct target *t, enum lane_share lane,
                                      struct failure *f)
{
    struct entry *e = submit_record(a, t->handle, t->device, t->id, lane, f);
    return e != NULL ? e : record_again(a, t, lane, f);
}

/* Any thread, admitted: e goes to the reclaimer; the request is deferred.
 * Never blocks.  Returns cudaSuccess. */
static cudaError_t push(struct entry *e)
{
    lifecycle_count_admitted();
    lifecycle_push(e);
    return cudaSuccess;
}

/* ---- resolving ---------------------------------------------------------- */

/* Any thread: *t for a on stream, nothing looked up yet. */
static void target_init(struct target *t, const struct request_args *a,
                        cudaStream_t stream)
{
    t->handle = stream;
    t->streams = &t->handle;
    t->users = NULL;
    t->n = 1;
    t->current = a->current_known ? a->current_device : -1;
    t->disabled = lifecycle_disabled();
    t->batch = t->capturing = t->group = t->cached = false;
    t->plan = (struct block_free_plan){.path = BLOCK_NOT_OURS};
    t->sw = CUDA_SWITCH_NONE;
    t->device = -1; /* not identified yet */
}

/* Any thread, admitted: a's current_device made current where the caller
 * left that to the request (a->lazy_switch, request_args.h), before a CUDA
 * call on its special stream handle; a failure refuses the request (said
 * and counted). */
static cudaError_t resolve_current(const struct request_args *a)
{
    const char *call = NULL;
    cudaError_t err =
        cuda_switch_lazy(a->lazy_switch, a->current_device, &call);
    return err == cudaSuccess ? err : submit_reject(a, call, err);
}

/* Any thread, admitted: whether a, a free of one block of the cache on the
 * legacy stream, may join a free batch (free_batch.h): t->batch, with its
 * identity from this thread's cache, asked without a CUDA call on the
 * stream (Note [Capture check]).  cudaSuccess, or the refusal when the
 * current device could not be had. */
static cudaError_t find_batch(const struct request_args *a, struct target *t)
{
    cudaError_t err;
    if (a->kind != ENTRY_FREE_DEVICE || a->nptrs != 1 || a->claims == NULL ||
        !free_batch_takes(t->handle) || t->disabled)
        return cudaSuccess;
    if (t->current < 0 &&
        (err = cuda_get_device(&t->current)) != cudaSuccess)
        return submit_reject(a, "cudaGetDevice", err);
    t->batch = stream_identity_cached_special(t->handle, t->current,
                                              &t->device, &t->id);
    t->cached = t->batch;
    return cudaSuccess;
}

/* Any thread, admitted: t's device and id, on a device that has not
 * failed.  Exact for callbacks (their order per stream) and for frees once
 * the block cache is in use: a stale identity would park a block as
 * pending on the destroyed stream whose handle this stream got.  Never
 * blocks.  cudaSuccess, or the refusal. */
static cudaError_t identify(const struct request_args *a, struct target *t)
{
    bool exact = a->kind == ENTRY_CALL ||
                 (a->kind == ENTRY_FREE_DEVICE && cache_active());
    const char *call = NULL;
    cudaError_t err = cudaSuccess;
    if (!t->batch) /* else find_batch found it */
        err = stream_identity_lookup_on(t->handle, exact, t->current,
                                        &t->device, &t->id, &t->cached,
                                        &call);
    /* A cached identity on a failed device is looked up afresh (usable),
     * on the stream: its device current first. */
    else if (lifecycle_device_error(t->device) != cudaSuccess)
        err = cuda_switch_lazy(a->lazy_switch, a->current_device, &call);
    if (err == cudaSuccess)
        err = usable(t->handle, &t->device, &t->id, &t->cached, &call);
    return err == cudaSuccess ? err : submit_reject(a, call, err);
}

/* Any thread: whether plan claimed the block at ptr (a live block: not
 * refused, not memory from elsewhere); then *claim carries the claim, and
 * a size or device that defer_pluggable_free says (said: that free's
 * request; no other says one) and the block does not have is reported (it
 * is freed all the same).  Its size is the one when claimed (a parked
 * block may have merged since, and be another thread's to cut); its device
 * never changes.  Never blocks. */
bool submit_plan_claim(const void *ptr, const struct block_free_plan *plan,
                       bool said, size_t said_bytes, int said_device,
                       struct block_claim *claim)
{
    if (plan->path == BLOCK_NOT_LIVE || plan->path == BLOCK_INSIDE ||
        plan->path == BLOCK_NOT_OURS)
        return false;
    *claim = (struct block_claim){plan->block, plan->handout};
    if (said)
        cache_claim_check_said(ptr, plan->size, plan->device, said_bytes,
                               said_device);
    return true;
}

/* Any thread, admitted: the cache's plan for a's one pointer freed on t's
 * stream, which claims a live block (a batch's is parked in the same lock
 * hold); a->claims[0] then carries the claim, *claimed says so.  Never
 * blocks but on the device's mutex. */
static void plan_block(struct request_args *a, struct target *t,
                       bool *claimed)
{
    cache_claim_plan_on(a->ptrs[0], a->block_known ? a->block_device : -1,
                        t->device, t->id, t->batch, &t->plan);
    if (submit_plan_claim(a->ptrs[0], &t->plan,
                          a->caller == ENTRY_BY_PLUGGABLE, a->said_bytes,
                          a->said_device, &a->claims[0]))
        *claimed = true;
}

/* Any thread, admitted: what resolving a free of one pointer asks once the
 * plan is made (t->plan): a free not parked for a batch records on its
 * stream (the device current, the capture checked: a refusal makes no CUDA
 * call), a block recorded on other streams gathers them.  Never blocks.
 * cudaSuccess, or the refusal. */
static cudaError_t after_plan(const struct request_args *a, struct target *t,
                              struct group_streams *g)
{
    cudaError_t err;
    bool refused = t->plan.path == BLOCK_NOT_LIVE ||
                   t->plan.path == BLOCK_INSIDE;
    if (t->batch && !refused && !t->plan.parked &&
        ((err = resolve_current(a)) != cudaSuccess ||
         (err = submit_check_capture(a, t)) != cudaSuccess))
        return err;
    if (t->plan.path == BLOCK_AFTER_STREAMS)
        return submit_group_resolve(a, &t->handle, 1, g, t);
    return cudaSuccess;
}

/* Any thread, admitted: a's stream resolved into *t (Note [The submit
 * route]), g the room for a group's streams.  Blocks of a's free are
 * claimed here (*claimed: the caller gives them back on a refusal), before
 * anything is recorded: a single pointer's by its plan (in the same lock
 * hold as a batch's park), every other free's all at once.  Never blocks
 * on the GPU; takes the device's cache lock for the plan.  cudaSuccess, or
 * the refusal (said and counted). */
static cudaError_t resolve_one(struct request_args *a, cudaStream_t stream,
                               struct group_streams *g, struct target *t,
                               bool *claimed)
{
    target_init(t, a, stream);
    cudaError_t err = find_batch(a, t);
    /* Only a free that may join a batch puts off making its device
     * current: any other asks its stream now. */
    if (err == cudaSuccess && !t->batch &&
        (err = resolve_current(a)) == cudaSuccess)
        err = submit_check_capture(a, t);
    if (err != cudaSuccess)
        return err;
    if ((a->nptrs != 1 || t->capturing || t->disabled) &&
        (err = cache_claim_all(a, claimed)) != cudaSuccess)
        return err;
    if (t->capturing) /* its route asks no more */
        return cudaSuccess;
    /* Blocks recorded on other streams: those streams checked too, before
     * any wait (CUDEFER_DISABLE's included): one that captures or is gone
     * refuses the free, as it does every route, the capture left intact. */
    if ((a->nptrs > 1 || t->disabled) && *claimed &&
        cache_users_of_free(a, NULL) > 0)
        return submit_group_resolve(a, &t->handle, 1, g, t);
    if (t->disabled) /* its route asks no more */
        return cudaSuccess;
    if ((err = identify(a, t)) != cudaSuccess)
        return err;
    if (a->kind == ENTRY_FREE_DEVICE && a->nptrs == 1 && a->claims != NULL)
        plan_block(a, t, claimed);
    return after_plan(a, t, g);
}

/* Any thread, admitted: the group streams[0..n) resolved into *t: every
 * block of a's free claimed first (*claimed: the caller gives them back on
 * a refusal), then submit_group_resolve.  Never blocks.  cudaSuccess, or
 * the refusal. */
static cudaError_t resolve_streams(struct request_args *a,
                                   const cudaStream_t *streams, size_t n,
                                   struct group_streams *g, struct target *t,
                                   bool *claimed)
{
    target_init(t, a, streams[0]);
    cudaError_t err = cache_claim_all(a, claimed);
    return err == cudaSuccess ? submit_group_resolve(a, streams, n, g, t)
                              : err;
}

/* ---- the route ---------------------------------------------------------- */

/* Any thread: the route of a request resolved into t.  Pure. */
static enum route choose_route(const struct target *t)
{
    /* The streams capture into a graph: the entry waits for the graph's
     * end (and the streams' work before the capture), not for an event;
     * even with CUDEFER_DISABLE, for a capture cannot be waited for. */
    if (t->capturing)
        return ROUTE_CAPTURED;
    /* CUDEFER_DISABLE: wait for the streams here and release at once. */
    if (t->disabled)
        return ROUTE_SYNCHRONOUS;
    /* defer_*_streams, or blocks recorded on other streams
     * (defer_record_stream): an entry on each stream, one of them the
     * payload, released once every part's event completed. */
    if (t->group)
        return ROUTE_GROUP;
    switch (t->plan.path) {
    /* A block already free or being freed, or a pointer inside the
     * cache's memory that starts no block: refused at the call. */
    case BLOCK_NOT_LIVE:
    case BLOCK_INSIDE:
        return ROUTE_REFUSED;
    /* A block freed on a stream of its device: reusable there at once.
     * On the legacy stream the plan parked it for the free batch, which
     * records one event for many frees (free_batch.h); else it has an
     * event of its own lane. */
    case BLOCK_STREAM_ORDERED:
        return t->plan.parked ? ROUTE_BATCHED : ROUTE_BLOCK;
    /* Anything else: plain memory, a callback, pinned memory, a block
     * freed on another device's stream (adopted back by the cache once
     * its event completed): an entry with its event. */
    default:
        return ROUTE_ENTRY;
    }
}

/* Any thread, admitted: ROUTE_REFUSED.  Returns the refusal. */
static cudaError_t route_refused(const struct request_args *a,
                                 const struct target *t)
{
    return t->plan.path == BLOCK_INSIDE
               ? cache_claim_refuse_inside(a, a->ptrs[0])
               : cache_claim_refuse_freed(a, a->ptrs[0]);
}

/* Any thread, admitted: a block parked by its plan (claim) joins the
 * free batch of device, whose legacy stream is handle (id); no event of its
 * own, and no CUDA call unless the batch is to be sealed, which first makes
 * current the device through *lazy (request_args.lazy_switch; NULL: it is
 * current).  Blocks only where free_batch_seal does. */
void submit_join_batch(const char *what, struct cuda_switch *lazy,
                       int current, int device, cudaStream_t handle,
                       unsigned long long id, const struct block_claim *claim)
{
    lifecycle_count_admitted();
    bool due, added = free_batch_add(device, id, claim, &due);
    if (added && !due)
        return; /* no CUDA call: the device need not be current */
    /* A seal records on the legacy stream of the device.  Where it cannot
     * be made current (said), the batch waits for a later free or flush,
     * as it does while a capture bars the stream. */
    const char *call = NULL;
    cudaError_t err = cuda_switch_lazy(lazy, current, &call);
    if (err != cudaSuccess)
        cuda_report_failure(what, call, err,
                            "; the free batch waits for a later free or "
                            "flush to seal it");
    free_batch_seal(what, device, handle, id, claim, added, due,
                    err == cudaSuccess);
}

/* Any thread, admitted: ROUTE_BATCHED: submit_join_batch.  Returns
 * cudaSuccess. */
static cudaError_t route_batched(const struct request_args *a,
                                 const struct target *t)
{
    submit_join_batch(a->what, a->lazy_switch, a->current_device, t->device,
                      t->handle, t->id, &a->claims[0]);
    return cudaSuccess;
}

/* Any thread, admitted: ROUTE_BLOCK: an ENTRY_BLOCK recorded on t's stream
 * in a lane that shares events, then the block parked (PENDING on the
 * stream: reusable there at once).  Note [Stale identity] for an entry on
 * another device.  Never blocks but as submit_sync_no_entry may.  cudaSuccess,
 * or the refusal. */
static cudaError_t route_block(const struct request_args *a, struct target *t)
{
    struct request_args block = *a;
    block.kind = ENTRY_BLOCK;
    struct failure f = {cudaSuccess, NULL, false};
    struct entry *e = record_on(&block, t, stream_lane_share_of(ENTRY_BLOCK),
                                &f);
    if (e != NULL && e->device != t->plan.device) {
        submit_record_discard(e);
        block.kind = ENTRY_FREE_DEVICE;
        e = submit_record(&block, t->handle, t->device, t->id, LANE_SOLO, &f);
    }
    if (e == NULL) {
        /* Only claimed, never parked: the block goes back as a claimed
         * block's free does (release_entry adopts the claim), not as a
         * block's entry, whose end settles a parked block. */
        block.kind = ENTRY_FREE_DEVICE;
        return submit_sync_no_entry(&block, t, &f);
    }
    if (e->kind == ENTRY_BLOCK && !cache_claim_park(&t->plan, t->id)) {
        submit_record_discard(e);
        return cache_claim_refuse_freed(&block, block.ptrs[0]);
    }
    return push(e);
}

/* Any thread, admitted: ROUTE_ENTRY: an entry recorded on t's stream
 * (callbacks in a lane that shares events; other frees in one that does
 * not: defer_trim releases a free once its own work is done).  Never
 * blocks but as submit_sync_no_entry may.  cudaSuccess, or the refusal. */
static cudaError_t route_entry(const struct request_args *a, struct target *t)
{
    struct failure f = {cudaSuccess, NULL, false};
    struct entry *e = record_on(a, t, stream_lane_share_of(a->kind), &f);
    return e != NULL ? push(e) : submit_sync_no_entry(a, t, &f);
}

/* Any thread, admitted: takes the route choose_route picks for t.  Blocks
 * where that route does.  cudaSuccess, or the refusal. */
static cudaError_t take_route(struct request_args *a, struct target *t)
{
    switch (choose_route(t)) {
    case ROUTE_REFUSED:
        return route_refused(a, t);
    case ROUTE_CAPTURED:
        return submit_captured_route(a, t);
    case ROUTE_SYNCHRONOUS:
        return submit_sync_route(a, t);
    case ROUTE_GROUP:
        return submit_group_route(a, t);
    case ROUTE_BATCHED:
        return route_batched(a, t);
    case ROUTE_BLOCK:
        return route_block(a, t);
    case ROUTE_ENTRY:
        break;
    }
    return route_entry(a, t);
}

/* ---- admission ---------------------------------------------------------- */

/* Any thread: a request's start: admitted by the reclaimer's gate
 * (lifecycle_enter, which starts the reclaimer on first use) and *a made
 * from given with room for its claims (*one: a single pointer's).
 * cudaSuccess, or the refusal (said and counted, its line ending with
 * given->end's text as every refusal of the request does: a gate closed
 * since the entry point's own check too; nothing held).  Every request
 * that began ends with leave. */
static cudaError_t admit(const struct request_args *given,
                         struct request_args *a, struct block_claim *one)
{
    cudaError_t err = lifecycle_enter_ending(given->what, given->end);
    if (err != cudaSuccess)
        return err;
    if (!cache_claim_room(given, a, one)) {
        lifecycle_leave();
        return submit_reject(given, "calloc", cudaErrorMemoryAllocation);
    }
    return cudaSuccess;
}

/* Any thread, admitted: a request's end: a free refused (err) after it
 * claimed blocks of the cache gives them back (LIVE again: the caller
 * keeps them); the claims' room goes, and the call leaves the gate.  Never
 * blocks.  Returns err. */
static cudaError_t leave(struct request_args *a, struct block_claim *one,
                         bool claimed, cudaError_t err)
{
    if (err != cudaSuccess && claimed)
        cache_claim_undo_all(a);
    cache_claim_room_free(a, one);
    lifecycle_leave();
    return err;
}

/* Any thread: a request's whole way (Note [The submit route]): admit
 * given, resolve its stream (or the group streams[0..n) when streams is
 * not NULL), take the route, leave.  Blocks where the route does.
 * cudaSuccess, or the refusal (said and counted). */
static cudaError_t run(const struct request_args *given, cudaStream_t stream,
                       const cudaStream_t *streams, size_t n)
{
    struct block_claim one;
    struct request_args a;
    cudaError_t err = admit(given, &a, &one);
    if (err != cudaSuccess)
        return err;
    bool claimed = false;
    struct group_streams g; /* a group's streams: written only for one */
    struct target t;
    err = streams == NULL ? resolve_one(&a, stream, &g, &t, &claimed)
                          : resolve_streams(&a, streams, n, &g, &t, &claimed);
    if (err == cudaSuccess)
        err = take_route(&a, &t);
    return leave(&a, &one, claimed, err);
}

/* Any thread, admitted, a's claims room one (a->claims == one): the rest of
 * a free of one pointer on a stream whose plan was made outside resolve_one
 * (t, made as resolve_one would have; *one the claim when claimed):
 * resolved, routed, left, as run does.  Blocks where the route does.
 * cudaSuccess, or the refusal (said and counted). */
cudaError_t submit_after_plan(struct request_args *a, struct target *t,
                              struct block_claim *one, bool claimed)
{
    struct group_streams g;
    cudaError_t err = after_plan(a, t, &g);
    if (err == cudaSuccess)
        err = take_route(a, t);
    return leave(a, one, claimed, err);
}

/* Any thread, admitted: *t for a free a on stream, resolved by its caller
 * as far as its plan (stream's identity device and id, from this thread's
 * cache, the free batch's: submit_pluggable.c). */
void submit_target_planned(struct target *t, const struct request_args *a,
                           cudaStream_t stream, int device,
                           unsigned long long id,
                           const struct block_free_plan *plan)
{
    target_init(t, a, stream);
    t->disabled = false; /* as its caller saw, before the plan */
    t->batch = t->cached = true;
    t->device = device;
    t->id = id;
    t->plan = *plan;
}

/* Any thread; blocks where the route does (submit.h). */
cudaError_t submit(const struct request_args *given, cudaStream_t stream)
{
    return run(given, stream, NULL, 0);
}

/* Any thread; blocks where the route does (submit.h). */
cudaError_t submit_streams(const struct request_args *given,
                           const cudaStream_t *streams, size_t n)
{
    return run(given, streams[0], streams, n);
}
