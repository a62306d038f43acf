/* The public API.  Each defer call, on the launching thread, finds its
 * stream's device and identity, takes a pooled entry with an event, records
 * the event and pushes the entry: one CUDA call (cudaEventRecord) in the
 * steady state for a created stream, no lock, no allocation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cache.h"
#include "capture.h"
#include "config.h"
#include "cuda.h"
#include "cudefer.h"
#include "entry.h"
#include "event_pool.h"
#include "free_batch.h"
#include "lifecycle.h"
#include "release.h"
#include "request_args.h"
#include "report.h"
#include "stats.h"
#include "stream_identity.h"
#include "stream_lane.h"

/* The caller was refused: say why (call failed with err), count it. */
cudaError_t api_reject(const char *what, const char *call, cudaError_t err)
{
    stats_add(&stats.rejected, 1);
    cuda_report_failure(what, call, err,
                        "; nothing was deferred (the caller keeps ownership)");
    return err;
}

/* The identity of stream, looked up afresh (a cached one proved stale). */
cudaError_t api_identify_again(cudaStream_t stream, int *device,
                               unsigned long long *id, const char **failed)
{
    bool cached;
    stream_identity_forget(stream);
    return stream_identity_lookup(stream, false, device, id, &cached, failed);
}

/* Device and id of stream, on a device that has not failed (else its
 * sticky error, *failed naming it).  A cached identity whose device failed
 * is looked up again first: the handle may now name a stream of a healthy
 * device (issue 12, item 13). */
cudaError_t api_identify_usable(cudaStream_t stream, bool exact,
                                int current, int *device,
                                unsigned long long *id, bool *cached,
                                const char **failed)
{
    cudaError_t err = stream_identity_lookup_on(stream, exact, current,
                                                device, id, cached, failed);
    if (err == cudaSuccess && *cached &&
        lifecycle_device_error(*device) != cudaSuccess) {
        *cached = false;
        err = api_identify_again(stream, device, id, failed);
    }
    if (err == cudaSuccess &&
        (err = lifecycle_device_error(*device)) != cudaSuccess)
        *failed = "an earlier CUDA call on this device";
    return err;
}

/* Whether the free a asks for claimed any block (then its entry carries
 * the claims). */
static bool any_claimed(const struct request_args *a)
{
    for (size_t i = 0; a->claims != NULL && i < a->nptrs; i++)
        if (a->claims[i].block != NULL)
            return true;
    return false;
}

/* Copy the request's pointers and claims into e (arrays only for
 * several). */
static bool set_pointers(struct entry *e, const struct request_args *a)
{
    e->nptrs = a->nptrs;
    e->ptrs = &e->one_ptr;
    e->claims = NULL;
    if (any_claimed(a) && a->nptrs == 1) {
        e->one_claim = a->claims[0];
        e->claims = &e->one_claim;
    } else if (any_claimed(a)) {
        e->claims = malloc(a->nptrs * sizeof *e->claims);
        if (e->claims == NULL) {
            e->nptrs = 0;
            return false;
        }
        memcpy(e->claims, a->claims, a->nptrs * sizeof *e->claims);
    }
    if (a->nptrs == 1) {
        e->one_ptr = a->ptrs[0];
    } else if (a->nptrs > 1) {
        e->ptrs = malloc(a->nptrs * sizeof *e->ptrs);
        if (e->ptrs == NULL) {
            e->ptrs = &e->one_ptr;
            e->nptrs = 0;
            if (e->claims != &e->one_claim)
                free(e->claims);
            e->claims = NULL;
            return false;
        }
        memcpy(e->ptrs, a->ptrs, a->nptrs * sizeof *e->ptrs);
    }
    return true;
}

/* A callback whose stream the caller has just synchronized, when no event
 * could be had: queued in its stream's FIFO with no event, so it runs on
 * the reclaimer thread after the stream's earlier callbacks (issue 12,
 * item 8), and waited for, so that it has run when the call returns, as a
 * synchronous release has.  False when it could not be queued (out of
 * memory: the caller runs it). */
static bool queue_synced_call(const struct request_args *a,
                              cudaStream_t stream)
{
    int device;
    unsigned long long id;
    bool cached;
    const char *call;
    if (stream_identity_lookup(stream, true, &device, &id, &cached, &call) !=
        cudaSuccess)
        return false;
    struct entry *e = calloc(1, sizeof *e); /* event NULL: freed when done */
    if (e == NULL)
        return false;
    e->kind = ENTRY_CALL;
    e->device = device;
    e->stream_id = id;
    e->synced = true;
    e->fn = a->fn;
    e->arg = a->arg;
    e->ptrs = &e->one_ptr;
    e->group_remaining = 1;
    e->group_err = cudaSuccess;
    stats_count_deferred();
    stats_add(&stats.sync_releases, 1);
    lifecycle_push_and_wait(e);
    return true;
}

/* Wait for stream here and release at once: no event could be had, or
 * CUDEFER_DISABLE.  Callbacks then run on the calling thread, but for one
 * with no event, which is queued behind its stream's earlier callbacks.
 * The stream's device is looked up first, as an asynchronous call's is: a
 * device that failed refuses the call (before any wait).  Memory is
 * released with that device current, as the reclaimer releases it, so
 * that a sticky error the release meets is that device's: it fails the
 * device, said once with its number. */
cudaError_t api_release_synchronously(const struct request_args *a,
                                      cudaStream_t stream)
{
    int device;
    unsigned long long id;
    bool cached;
    const char *call = NULL;
    cudaError_t err = api_identify_usable(stream, true, -1, &device, &id,
                                          &cached, &call);
    if (err != cudaSuccess)
        return api_reject(a->what, call, err);
    if ((err = cudaStreamSynchronize(stream)) != cudaSuccess)
        return api_reject(a->what, "cudaStreamSynchronize", err);
    struct block_user recorded[64];
    size_t nrec = cache_users_of_free(a, recorded);
    if (nrec > 64) { /* only 64 could be waited for */
        stats_add(&stats.rejected, 1);
        report("%s: its blocks were recorded on more than 64 streams: "
               "refused", a->what);
        return cudaErrorInvalidValue;
    }
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *failed = "cudaStreamSynchronize";
    for (size_t i = 0; i < nrec && err == cudaSuccess; i++)
        if ((err = cache_user_enter(&recorded[i], &sw, &failed)) ==
            cudaSuccess)
            err = cudaStreamSynchronize(recorded[i].handle);
    cuda_switch_back(&sw, a->what);
    if (err != cudaSuccess)
        return api_reject(a->what, failed, err);
    if (a->kind == ENTRY_CALL && !lifecycle_disabled() &&
        queue_synced_call(a, stream))
        return cudaSuccess;
    struct entry e = {.kind = a->kind, .device = device, .fn = a->fn,
                      .arg = a->arg, .nptrs = a->nptrs,
                      .ptrs = (void **)a->ptrs,
                      .claims = any_claimed(a) ? a->claims : NULL};
    stats_count_deferred();
    stats_add(&stats.sync_releases, 1);
    /* Memory is released on its device; where the switch fails, on the
     * caller's instead. */
    struct cuda_switch to_device = CUDA_SWITCH_NONE;
    if (a->kind != ENTRY_CALL)
        cuda_switch_device(&to_device, device, NULL);
    err = release_entry(&e, NULL);
    cuda_switch_back(&to_device, a->what);
    stats_add(err == cudaSuccess ? &stats.released : &stats.failed, 1);
    if (cuda_error_is_sticky(err)) /* the device's error, not ptr's */
        lifecycle_fail_device(a->what, device,
                              a->kind == ENTRY_FREE_HOST ? "cudaFreeHost"
                                                         : "cudaFree",
                              err);
    return cudaSuccess; /* accepted; a failed release is counted, reported */
}

/* Streams being captured: the entry waits for the capture's graph, not for
 * an event (capture.h). */
cudaError_t api_submit_captured(const struct request_args *a,
                                const cudaStream_t *streams, size_t n)
{
    if (cache_users_of_free(a, NULL) > 0) {
        stats_add(&stats.rejected, 1);
        report("%s: a block recorded on other streams (defer_record_stream) "
               "cannot be freed into a graph capture, which would not wait "
               "for them: refused (the caller keeps ownership)", a->what);
        return cudaErrorStreamCaptureUnsupported;
    }
    /* The reclaimer records on each stream of the capture once it ended,
     * to wait for the work enqueued before it: there cudaStreamPerThread
     * would name the reclaimer's own stream, and that work would not be
     * waited for (found by a review helper). */
    for (size_t i = 0; i < n; i++)
        if (streams[i] == cudaStreamPerThread) {
            stats_add(&stats.rejected, 1);
            report("%s: a capture of cudaStreamPerThread: refused (the "
                   "reclaimer could not wait for the work this thread "
                   "enqueued on it before the capture; capture a created "
                   "stream; the caller keeps ownership, the capture is "
                   "intact)", a->what);
            return cudaErrorStreamCaptureUnsupported;
        }
    struct entry *e = capture_entry_new();
    if (e == NULL)
        return api_reject(a->what, "calloc", cudaErrorMemoryAllocation);
    e->kind = a->kind;
    e->fn = a->fn;
    e->arg = a->arg;
    if (!set_pointers(e, a)) {
        capture_entry_discard(e);
        return api_reject(a->what, "malloc", cudaErrorMemoryAllocation);
    }
    const char *call = NULL;
    cudaError_t err = capture_defer(a->what, e, streams, n, &call);
    return err == cudaSuccess ? cudaSuccess : api_reject(a->what, call, err);
}

/* Take an entry for device, fill it in and record its event on stream,
 * from the thread's lane of that sharing (stream_lane.h: callbacks and
 * blocks, on their stream's exact identity, may share a pending event;
 * api.h). */
struct entry *api_record(const struct request_args *a, cudaStream_t stream,
                         int device, unsigned long long id,
                         enum lane_share lane, cudaError_t *err,
                         const char **call, bool *no_event)
{
    struct lane_pick pick;
    if ((*err = stream_lane_pick(device, id, lane, &pick, call)) !=
        cudaSuccess) {
        *no_event = true;
        return NULL;
    }
    struct entry *e = event_pool_take_entry(device, err, call);
    if (e == NULL) {
        stream_lane_cancel(&pick);
        *no_event = true;
        return NULL;
    }
    entry_begin(e, a->kind, id);
    e->fn = a->fn;
    e->arg = a->arg;
    if (!set_pointers(e, a)) {
        stream_lane_cancel(&pick);
        event_pool_give_unused(e);
        *err = cudaErrorMemoryAllocation;
        *call = "malloc";
        return NULL;
    }
    if ((*err = cuda_event_record(pick.ev->event, stream)) !=
        cudaSuccess) {
        stream_lane_cancel(&pick);
        release_forget_pointers(e);
        event_pool_give_unused(e);
        *call = "cudaEventRecord";
        return NULL;
    }
    stream_lane_commit(&pick, e);
    return e;
}

/* A recorded entry that will not be pushed after all: its reference to
 * its event goes, and it goes back to the pool. */
void api_discard_recorded(struct entry *e)
{
    release_forget_pointers(e);
    stream_lane_uncommit(e);
    event_pool_give_unused(e);
}

/* The path every defer call takes, admitted by the reclaimer's gate.  A
 * block of the cache (block_cache.h) freed on a stream of its device becomes
 * an ENTRY_BLOCK, reusable on that stream at once; one recorded on other
 * streams waits for all of them (a group).  *claimed: blocks of a's were
 * claimed (the caller gives them back if this fails). */
static cudaError_t submit_admitted(const struct request_args *a,
                                   cudaStream_t stream, bool *claimed)
{
    bool capturing = false;
    const char *call = NULL;
    /* A block freed on the legacy stream may join a free batch, which
     * makes no CUDA call on the stream: the capture check (a legacy stream
     * cannot capture, only be barred by another thread's capture) waits
     * until the free takes another path (free_batch_add checks before it
     * seals). */
    bool batchable = a->kind == ENTRY_FREE_DEVICE && a->nptrs == 1 &&
                     a->claims != NULL && free_batch_takes(stream) &&
                     !lifecycle_disabled();
    cudaError_t err = cudaSuccess;
    int current = a->current_known ? a->current_device : -1;
    if (batchable && current < 0 &&
        (err = cuda_get_device(&current)) != cudaSuccess)
        return api_reject(a->what, "cudaGetDevice", err);
    /* A first look-up asks the stream itself (cudaStreamGetId): checked
     * first, as any stream is. */
    if (batchable && !stream_identity_known(stream, current))
        batchable = false;
    if (!batchable &&
        (err = capture_status(&stream, 1, &capturing, &call)) != cudaSuccess)
        return api_reject(a->what, call, err);
    bool single = a->nptrs == 1 && !capturing && !lifecycle_disabled();
    if (!single && (err = cache_claim_all(a, claimed)) != cudaSuccess)
        return err;
    if (capturing) /* even with CUDEFER_DISABLE: a capture cannot be waited for */
        return api_submit_captured(a, &stream, 1);
    if (lifecycle_disabled())
        return api_release_synchronously(a, stream);
    if (a->nptrs > 1 && *claimed && cache_users_of_free(a, NULL) > 0)
        return api_group_submit(a, &stream, 1);
    int device;
    unsigned long long id;
    bool cached = false;
    /* Exact for callbacks (their order per stream) and for frees once the
     * block cache is in use: a stale identity would park a block as pending
     * on the destroyed stream whose handle this stream got. */
    bool exact = a->kind == ENTRY_CALL ||
                 (a->kind == ENTRY_FREE_DEVICE && cache_active());
    err = api_identify_usable(stream, exact, current, &device, &id, &cached,
                              &call);
    if (err != cudaSuccess)
        return api_reject(a->what, call, err);
    struct request_args block_args;
    struct block_free_plan plan = {.path = BLOCK_NOT_OURS};
    if (a->kind == ENTRY_FREE_DEVICE && a->nptrs == 1 && a->claims != NULL) {
        /* A batched free parks its block in the same lock hold. */
        (batchable ? cache_plan_free_parked : cache_plan_free)(
            a->ptrs[0], device, id, &plan);
        if (plan.path == BLOCK_NOT_LIVE)
            return cache_refuse_freed(a, a->ptrs[0]);
        if (plan.path == BLOCK_INSIDE)
            return cache_refuse_inside(a, a->ptrs[0]);
        *claimed = plan.path != BLOCK_NOT_OURS;
        if (*claimed) /* the entry carries it to the release */
            a->claims[0] = (struct block_claim){plan.block, plan.handout};
        /* Its size when claimed (a parked block may have merged since,
         * and be another thread's to cut); its device never changes. */
        if (*claimed && a->said_bytes > 0 &&
            (plan.size < a->said_bytes ||
             plan.device != a->said_device))
            report("defer_pluggable_free: %p is a block of %zu bytes on "
                   "device %d, freed as %zu bytes on device %d: freed all "
                   "the same", a->ptrs[0], plan.size, plan.device,
                   a->said_bytes, a->said_device);
        if (plan.parked) {
            /* No event of its own: its batch's (free_batch.h). */
            stats_count_deferred();
            free_batch_add(device, stream, id, &a->claims[0]);
            return cudaSuccess;
        }
        /* Another path: the legacy stream's capture check, skipped above. */
        if (batchable && (err = capture_status(&stream, 1, &capturing,
                                               &call)) != cudaSuccess)
            return api_reject(a->what, call, err);
        if (plan.path == BLOCK_AFTER_STREAMS) /* the group adds them */
            return api_group_submit(a, &stream, 1);
        if (plan.path == BLOCK_STREAM_ORDERED) {
            block_args = *a;
            block_args.kind = ENTRY_BLOCK;
            a = &block_args;
        }
    }
    bool no_event = false;
    /* Callbacks and blocks freed on their stream (exact identity for both:
     * see identify_usable above) may share a pending event. */
    enum lane_share lane = stream_lane_share_of(a->kind);
    struct entry *e =
        api_record(a, stream, device, id, lane, &err, &call, &no_event);
    if (e == NULL && cached && err == cudaErrorInvalidResourceHandle) {
        /* The cached identity may be stale: look again, once. */
        if ((err = api_identify_again(stream, &device, &id, &call)) !=
            cudaSuccess)
            return api_reject(a->what, call, err);
        e = api_record(a, stream, device, id, lane, &err, &call, &no_event);
    }
    if (e != NULL && e->kind == ENTRY_BLOCK &&
        e->device != plan.device) {
        /* A stale identity hid another device: a plain free, with an event
         * of its own (defer_trim's promise).  Only the stream-ordered path
         * makes ENTRY_BLOCK, in block_args. */
        api_discard_recorded(e);
        block_args.kind = ENTRY_FREE_DEVICE;
        e = api_record(&block_args, stream, device, id, LANE_SOLO, &err, &call,
                       &no_event);
    }
    if (e == NULL && no_event) {
        cuda_report_failure(a->what, call, err,
                            "; waiting for the stream and releasing "
                            "synchronously");
        return api_release_synchronously(a, stream);
    }
    if (e == NULL)
        return api_reject(a->what, call, err);
    if (e->kind == ENTRY_BLOCK) {
        if (!cache_park(&plan, id)) {
            api_discard_recorded(e);
            return cache_refuse_freed(a, a->ptrs[0]);
        }
    }
    stats_count_deferred();
    lifecycle_push(e);
    return cudaSuccess;
}

cudaError_t api_begin(const struct request_args *given,
                      struct request_args *a, struct block_claim *one)
{
    cudaError_t err = lifecycle_enter(given->what);
    if (err != cudaSuccess)
        return err;
    if (!cache_claims_make(given, a, one)) {
        lifecycle_leave();
        return api_reject(given->what, "calloc", cudaErrorMemoryAllocation);
    }
    return cudaSuccess;
}

cudaError_t api_end(struct request_args *a, struct block_claim *one,
                    bool claimed, cudaError_t err)
{
    if (err != cudaSuccess && claimed)
        cache_unclaim_all(a);
    cache_claims_free(a, one);
    lifecycle_leave();
    return err;
}

/* Every single-stream defer call. */
static cudaError_t submit(const struct request_args *given,
                          cudaStream_t stream)
{
    struct block_claim one;
    struct request_args a;
    cudaError_t err = api_begin(given, &a, &one);
    if (err != cudaSuccess)
        return err;
    bool claimed = false;
    err = submit_admitted(&a, stream, &claimed);
    return api_end(&a, &one, claimed, err);
}

cudaError_t api_free_on(void *ptr, cudaStream_t stream, int current)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free", .kind = ENTRY_FREE_DEVICE,
                             .ptrs = &ptr, .nptrs = 1,
                             .current_known = current >= 0,
                             .current_device = current};
    return submit(&a, stream);
}

cudaError_t api_free_pluggable(void *ptr, size_t bytes, int device,
                               cudaStream_t stream, int current)
{
    struct request_args a = {.what = "defer_free", .kind = ENTRY_FREE_DEVICE,
                             .ptrs = &ptr, .nptrs = 1,
                             .current_known = current >= 0,
                             .current_device = current,
                             .said_bytes = bytes, .said_device = device};
    return submit(&a, stream);
}

cudaError_t defer_free(void *ptr, cudaStream_t stream)
{
    return api_free_on(ptr, stream, -1);
}

cudaError_t defer_free_host(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free_host", .kind = ENTRY_FREE_HOST,
                             .ptrs = &ptr, .nptrs = 1};
    return submit(&a, stream);
}

static int compare_pointers(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a,
              y = (uintptr_t) * (void *const *)b;
    return (x > y) - (x < y);
}

/* Any thread; blocks only in malloc.  A pointer that appears more than
 * once among the n in p, or NULL; *err gets cudaErrorMemoryAllocation
 * when a long list could not be copied to be sorted.  A short list is
 * compared pair by pair (no allocation on the common path). */
static void *repeated_pointer(void *const *p, size_t n, cudaError_t *err)
{
    *err = cudaSuccess;
    if (n <= 32) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (p[i] == p[j])
                    return p[i];
        return NULL;
    }
    void **sorted = malloc(n * sizeof *sorted);
    if (sorted == NULL) {
        *err = cudaErrorMemoryAllocation;
        return NULL;
    }
    memcpy(sorted, p, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_pointers);
    void *twice = NULL;
    for (size_t i = 1; i < n && twice == NULL; i++)
        if (sorted[i] == sorted[i - 1])
            twice = sorted[i];
    free(sorted);
    return twice;
}

cudaError_t defer_free_n(void *const *ptrs, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    if (ptrs == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_free_n: ptrs is NULL with n = %zu: refused", n);
        return cudaErrorInvalidValue;
    }
    /* NULL pointers are no-ops, like cudaFree(NULL): leave them out. */
    size_t live = 0;
    for (size_t i = 0; i < n; i++)
        live += ptrs[i] != NULL;
    if (live == 0)
        return cudaSuccess;
    void **copy = NULL;
    if (live != n) {
        if ((copy = malloc(live * sizeof *copy)) == NULL)
            return api_reject("defer_free_n", "malloc",
                              cudaErrorMemoryAllocation);
        for (size_t i = 0, k = 0; i < n; i++)
            if (ptrs[i] != NULL)
                copy[k++] = ptrs[i];
    }
    /* A pointer named twice would be released twice: the second cudaFree
     * could free another thread's new allocation at that address (a block
     * of cudefer's named twice was refused already, plain memory was
     * not). */
    cudaError_t err;
    void *twice = repeated_pointer(copy != NULL ? copy : ptrs, live, &err);
    if (err != cudaSuccess || twice != NULL) {
        free(copy);
        if (err != cudaSuccess)
            return api_reject("defer_free_n", "malloc", err);
        stats_add(&stats.rejected, 1);
        report("defer_free_n: %p is named more than once: refused; nothing "
               "was deferred", twice);
        return cudaErrorInvalidValue;
    }
    struct request_args a = {.what = "defer_free_n", .kind = ENTRY_FREE_DEVICE,
                             .ptrs = copy != NULL ? copy : ptrs, .nptrs = live};
    err = submit(&a, stream);
    free(copy);
    return err;
}

cudaError_t defer_call(void (*fn)(void *arg), void *arg, cudaStream_t stream)
{
    if (fn == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_call: fn is NULL: refused");
        return cudaErrorInvalidValue;
    }
    /* Callbacks are ordered per stream: their stream's identity is checked
     * (stream_identity_lookup, exact), since a cached one may name a
     * destroyed stream whose handle was reused. */
    struct request_args a = {.what = "defer_call", .kind = ENTRY_CALL,
                             .fn = fn, .arg = arg};
    return submit(&a, stream);
}

cudaError_t defer_flush(void)
{
    return lifecycle_flush();
}

cudaError_t defer_trim(size_t *released_bytes)
{
    return lifecycle_trim(released_bytes);
}

cudaError_t defer_shutdown(void)
{
    return lifecycle_shutdown();
}

const char *defer_version(void)
{
    return PACKAGE_VERSION;
}
