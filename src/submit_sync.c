/* SPDX-License-Identifier: MIT */
/* The synchronous release (submit_route.h): a request's streams waited for
 * on the calling thread and its memory or callback released there, for
 * ROUTE_SYNCHRONOUS (CUDEFER_DISABLE) and for a request that could have no
 * event.  Note [The submit route], submit.c. */
#include "submit_route.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "cache.h"
#include "cuda.h"
#include "entry.h"
#include "lifecycle.h"
#include "release.h"
#include "report.h"
#include "stats.h"
#include "stream_identity.h"
#include "thread_shard.h"

/* Any thread, admitted: a callback whose streams[0..n) the caller has
 * just synchronized, when no event could be had: queued with no event in
 * each stream's FIFO (the first entry the payload, the others members of
 * its group, as the group route makes them), so that it runs on the
 * reclaimer thread after the earlier callbacks of every one of its
 * streams, and waited for, so that it has run when the call returns, as a
 * synchronous release has.  Blocks until it ran.  False when it could not
 * be queued (the caller runs it); else true, *err the wait's
 * (lifecycle_requests_push_and_wait). */
static bool queue_synced_call(const struct request_args *a,
                              const cudaStream_t *streams, size_t n,
                              cudaError_t *err)
{
    struct entry *parts[SUBMIT_MAX_STREAMS] = {NULL};
    size_t made = 0;
    for (; made < n; made++) {
        int device;
        unsigned long long id;
        bool cached;
        const char *call;
        if (stream_identity_lookup(streams[made], true, &device, &id, &cached,
                                   &call) != cudaSuccess)
            break;
        /* event NULL: freed when done */
        struct entry *e = parts[made] = calloc(1, sizeof *e);
        if (e == NULL)
            break;
        e->kind = made == 0 ? ENTRY_CALL : ENTRY_MEMBER;
        e->device = device;
        e->stream_id = id;
        e->synced = true;
        e->ptrs = &e->one_ptr;
        e->group = made == 0 ? NULL : parts[0];
    }
    if (made < n) {
        while (made-- > 0)
            free(parts[made]);
        return false;
    }
    parts[0]->fn = a->fn;
    parts[0]->arg = a->arg;
    parts[0]->group_remaining = (uint32_t)n;
    parts[0]->group_err = cudaSuccess;
    lifecycle_count_deferred(); /* after a wait: exit may have given up */
    stats_add(&stats.sync_releases, 1);
    for (size_t i = n; i-- > 1;)
        lifecycle_push(parts[i]);
    *err = lifecycle_requests_push_and_wait(parts[0]);
    return true;
}

/* Any thread, admitted, CUDEFER_CHECK: a free whose stream (device, id)
 * and recorded streams the caller has just synchronized, when no event
 * could be had: queued with no event in its stream's FIFO and waited for,
 * so that the reclaimer checks its pointers against the pending set (the
 * set is the reclaimer's alone) before it releases them: a pointer still
 * pending from an earlier free is dropped there, never released under
 * that free's work nor twice.  Released at once (release_policy.h: its
 * caller waits), when the call returns but on the reclaimer thread (a
 * callback), where it is released after the callback.  False when it
 * could not be queued (the caller releases it); else true, *err the
 * wait's (lifecycle_requests_push_and_wait). */
static bool queue_synced_free(const struct request_args *a, int device,
                              unsigned long long id, cudaError_t *err)
{
    /* A block's entry ends settling a parked block; a synced free's block
     * is only claimed (route_block). */
    assert(a->kind != ENTRY_BLOCK);
    struct entry *e = calloc(1, sizeof *e); /* event NULL: freed when done */
    if (e == NULL)
        return false;
    entry_begin(e, a->kind, id);
    e->caller = a->caller;
    e->device = device;
    e->synced = true;
    if (!submit_record_pointers(e, a)) {
        free(e);
        return false;
    }
    lifecycle_count_deferred(); /* after a wait: exit may have given up */
    stats_add(&stats.sync_releases, 1);
    *err = lifecycle_requests_push_and_wait(e);
    return true;
}

/* Any thread, admitted: wait for each of users[0..n), each on its device
 * (sw: the caller's device, restored before the return), each checked not
 * to capture by its request, so waited for relaxed (cuda.h).  Blocks.
 * cudaSuccess, or the refusal of a's call naming the call that failed. */
static cudaError_t wait_for_users(const struct request_args *a,
                                  const struct block_user *users, size_t n,
                                  struct cuda_switch *sw)
{
    cudaError_t err = cudaSuccess;
    const char *failed = "cudaStreamSynchronize";
    for (size_t i = 0; i < n && err == cudaSuccess; i++)
        if ((err = cache_users_enter(&users[i], sw, &failed)) == cudaSuccess)
            err = cuda_stream_synchronize_relaxed(users[i].handle);
    cuda_switch_back(sw, a->what);
    return err == cudaSuccess ? cudaSuccess
                              : submit_reject(a, failed, err);
}

/* Any thread, admitted: wait for t's first stream (and the streams a's
 * blocks were recorded on; a group's others the caller waited for) here
 * and release at once.  Blocks.  Callbacks run on the calling thread, but
 * for one that can be queued behind the earlier callbacks of each of t's
 * streams (queue_synced_call).  The stream is looked up first,
 * as for any route that uses it: a device that failed refuses the call
 * before any wait.  Memory is released with its device current, as the
 * reclaimer releases it, so that a sticky error the release meets is that
 * device's: it fails the device, said once with its number.  Returns
 * cudaSuccess once accepted (a failed release is counted and reported;
 * cudaErrorCudartUnloading where it was queued and exit gave up its
 * drain meanwhile: never released), else the refusal. */
static cudaError_t release_synchronously(const struct request_args *a,
                                         const struct target *t)
{
    cudaStream_t stream = t->streams[0];
    int device;
    unsigned long long id;
    bool cached;
    const char *call = NULL;
    cudaError_t err = submit_identify_usable(stream, true, -1, &device, &id,
                                             &cached, &call);
    if (err != cudaSuccess)
        return submit_reject(a, call, err);
    if ((err = cuda_stream_synchronize_relaxed(stream)) != cudaSuccess)
        return submit_reject_on(a, device, "cudaStreamSynchronize", err);
    /* stream and the recorded ones, each once, are SUBMIT_MAX_STREAMS at
     * most, as a group of the other routes holds (submit_group_resolve):
     * a free is refused alike whether CUDEFER_DISABLE is set or not. */
    struct block_user recorded[SUBMIT_MAX_STREAMS];
    size_t nrec = cache_users_of_free(a, recorded);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    bool own_recorded = false;
    const struct block_user own = {stream, 0, -1};
    for (size_t i = 0; i < nrec && i < SUBMIT_MAX_STREAMS && !own_recorded;
         i++)
        own_recorded = cache_users_same(&recorded[i], &own, &sw);
    if (nrec > SUBMIT_MAX_STREAMS ||
        (nrec == SUBMIT_MAX_STREAMS && !own_recorded)) {
        cuda_switch_back(&sw, a->what);
        return submit_group_refuse_too_many(a);
    }
    if ((err = wait_for_users(a, recorded, nrec, &sw)) != cudaSuccess)
        return err;
    if (a->kind == ENTRY_CALL && !lifecycle_disabled() &&
        queue_synced_call(a, t->streams, t->n, &err))
        return err;
    if (a->kind != ENTRY_CALL && !lifecycle_disabled() &&
        lifecycle_config()->check && queue_synced_free(a, device, id, &err))
        return err;
    struct entry e = {.kind = a->kind, .caller = a->caller,
                      .device = device, .fn = a->fn,
                      .arg = a->arg, .nptrs = a->nptrs,
                      .ptrs = (void **)a->ptrs,
                      .claims = submit_any_claimed(a) ? a->claims : NULL};
    lifecycle_count_deferred(); /* after a wait: exit may have given up */
    stats_add(&stats.sync_releases, 1);
    /* Memory is released on its device; where the switch fails, on the
     * caller's instead. */
    struct cuda_switch to_device = CUDA_SWITCH_NONE;
    if (a->kind != ENTRY_CALL)
        cuda_switch_device(&to_device, device, NULL);
    struct release_report out = {0};
    /* Memory waited for is in no capture: released in the relaxed mode, as
     * the reclaimer releases it (cudaFree and cudaFreeHost are refused as
     * the wait is); a callback runs in the caller's own mode. */
    struct cuda_capture_mode mode = {cudaStreamCaptureModeRelaxed, false};
    if (a->kind != ENTRY_CALL)
        mode = cuda_capture_mode_relax();
    thread_here.releasing++;
    err = release_entry(&e, NULL, NULL, &out);
    thread_here.releasing--;
    cuda_capture_mode_put_back(mode);
    /* A refused release is said and counted, the call accepted: not an
     * error for the application's next cudaGetLastError to find. */
    cuda_forget_failure(err);
    cuda_switch_back(&to_device, a->what);
    lifecycle_count_finished(err == cudaSuccess, 1);
    if (cuda_error_is_sticky(err)) /* the device's error, not ptr's */
        lifecycle_fail_device(a->what, device, out.failed_call, err);
    return cudaSuccess; /* accepted; a failed release is counted, reported */
}

/* Any thread, admitted: no entry could be made for a on t's stream, or on
 * one of a group's (f; the group's entries made so far discarded).
 * Without an event, wait for the stream (every stream of a group, each on
 * its device) and release here (blocks); else the refusal.  Returns what
 * release_synchronously, submit_sync_route or submit_reject does. */
cudaError_t submit_sync_no_entry(const struct request_args *a,
                                 struct target *t, const struct failure *f)
{
    if (!f->no_event)
        /* A group's failure may be of any of its streams' devices. */
        return submit_reject_on(a, t->group ? -1 : t->device, f->call,
                                f->err);
    cuda_report_failure(a->what, f->call, f->err,
                        t->group ? "; waiting for the streams and releasing "
                                   "synchronously"
                                 : "; waiting for the stream and releasing "
                                   "synchronously");
    /* The call is accepted: no error of its for the application's next
     * cudaGetLastError (the runtime's event creation leaves one). */
    cuda_forget_failure_left(f->err);
    return t->group ? submit_sync_route(a, t)
                    : release_synchronously(a, t);
}

/* Any thread, admitted: ROUTE_SYNCHRONOUS: a group's other streams waited
 * for first (each on its device), then release_synchronously on the
 * first.  Blocks.  Returns as release_synchronously does. */
cudaError_t submit_sync_route(const struct request_args *a, struct target *t)
{
    cudaError_t err = t->n > 1 /* else users is NULL */
                          ? wait_for_users(a, t->users + 1, t->n - 1, &t->sw)
                          : cudaSuccess;
    if (err != cudaSuccess)
        return err;
    return release_synchronously(a, t);
}
