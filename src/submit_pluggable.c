/* SPDX-License-Identifier: MIT */
/* defer_pluggable_free's request (submit.h), and the short way most of
 * PyTorch's frees take: Note [The short way]. */
#include "submit.h"
#include "submit_route.h"

#include "cache.h"
#include "lifecycle.h"
#include "stream_identity.h"

/*
 * Note [The short way]
 *
 * Most frees PyTorch makes are of a block of the cache on the legacy
 * stream, and join its device's free batch (free_batch.h): the request is
 * admitted, the stream's identity comes from this thread's cache, the
 * cache's plan claims and parks the block, and the claim joins the batch;
 * no CUDA call.  The common path (Note [The submit route], submit.c) builds
 * a struct request_args, copies it at admission and fills a struct target
 * for every request: on that free, a sixth of its instructions and a tenth
 * of the cache lines a cold call touches
 * (bench/results/fake-cold-calls-short-free.txt).  So such a free takes the
 * same steps with only what they need on the stack:
 *
 *   - anything that would take it elsewhere before the plan (a refused
 *     admission excepted: said and counted as the common path says it):
 *     the block cache not in use, CUDEFER_DISABLE, no identity cached, a
 *     failed device: it leaves the gate and takes the common path from the
 *     start, having changed nothing;
 *   - a plan that did not park the block (not live, inside another block,
 *     recorded on other streams, not a block at all): the request and the
 *     target are built as resolve_one would have them after its plan, and
 *     the common path goes on from there (submit_after_plan).
 *
 * Either way the result is the common path's: the same refusals, counts,
 * lines and CUDA calls.
 */

static const char what[] = "defer_pluggable_free";

/* Any thread: f's request, into *a. */
static void request_of(const struct pluggable_free *f, struct request_args *a)
{
    *a = (struct request_args){.what = what, .end = f->end,
                               .kind = ENTRY_FREE_DEVICE,
                               .caller = ENTRY_BY_PLUGGABLE, .ptrs = &f->ptr,
                               .nptrs = 1, .current_known = f->current >= 0,
                               .current_device = f->current,
                               .said_bytes = f->said_bytes,
                               .said_device = f->said_device,
                               .block_known = f->block_known,
                               .block_device = f->block_device,
                               .lazy_switch = f->lazy};
}

/* Any thread, admitted: the common path's rest for f after a plan that
 * did not park its block (Note [The short way]); one the claim that
 * plan made, if claimed.  Leaves the gate.  Blocks where the route taken
 * does.  cudaSuccess, or the refusal. */
static cudaError_t after_plan(const struct pluggable_free *f, int device,
                              unsigned long long id,
                              const struct block_free_plan *plan,
                              struct block_claim *one, bool claimed)
    FRAME_OF_ITS_OWN;
static cudaError_t after_plan(const struct pluggable_free *f, int device,
                              unsigned long long id,
                              const struct block_free_plan *plan,
                              struct block_claim *one, bool claimed)
{
    struct request_args a;
    request_of(f, &a);
    a.claims = one;
    struct target t;
    submit_target_planned(&t, &a, f->stream, device, id, plan);
    return submit_after_plan(&a, &t, one, claimed);
}

/* Any thread, not admitted: f's request on the common path from the start
 * (Note [The short way]).  Blocks where submit does.  cudaSuccess, or the
 * refusal. */
static cudaError_t common(const struct pluggable_free *f) FRAME_OF_ITS_OWN;
static cudaError_t common(const struct pluggable_free *f)
{
    struct request_args a;
    request_of(f, &a);
    return submit(&a, f->stream);
}

/* Any thread, admitted, f a block's free on the legacy stream with its
 * identity (device, id) from this thread's cache: the cache's plan, then
 * the batch or the common path's rest (Note [The short way]).  Leaves the
 * gate.  Blocks where the route taken does.  cudaSuccess, or the refusal. */
static cudaError_t planned(const struct pluggable_free *f, int device,
                           unsigned long long id)
{
    struct block_free_plan plan;
    cache_claim_plan_on(f->ptr, f->block_device, device, id, true, &plan);
    struct block_claim one = {NULL, 0};
    bool claimed = submit_plan_claim(f->ptr, &plan, true, f->said_bytes,
                                     f->said_device, &one);
    if (plan.parked) {
        submit_join_batch(what, f->lazy, f->current, device, f->stream, id,
                          &one);
        lifecycle_leave();
        return cudaSuccess;
    }
    return after_plan(f, device, id, &plan, &one, claimed);
}

/* Any thread (submit.h). */
cudaError_t submit_pluggable_free(const struct pluggable_free *f)
{
    int device;
    unsigned long long id;
    /* f->lazy: a block on the legacy stream that may join a batch
     * (alloc.c), current its device. */
    if (f->lazy != NULL) {
        cudaError_t err = lifecycle_enter_ending(what, f->end); /* admit's */
        if (err != cudaSuccess)
            return err;
        if (cache_active() && !lifecycle_disabled() &&
            stream_identity_cached_special(f->stream, f->current, &device,
                                           &id) &&
            lifecycle_device_error(device) == cudaSuccess)
            return planned(f, device, id);
        lifecycle_leave();
    }
    return common(f);
}
