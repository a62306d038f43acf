/* The group path: defer_free_streams, defer_free_host_streams and
 * defer_call_streams, and a free whose blocks were recorded on other
 * streams (defer_record_stream), which waits for all of them. */
#include "api.h"
#include "cache.h"
#include "capture.h"
#include "config.h"
#include "cuda.h"
#include "cudefer.h"
#include "lifecycle.h"
#include "report.h"
#include "stats.h"

/* The group path (defer_*_streams), admitted: one entry per stream, all
 * recorded before any is pushed, so a failure leaves nothing behind.  The
 * first stream's entry is the payload; the others are members that count
 * down the payload's group. */
cudaError_t api_group_submit(const struct request_args *a,
                             const cudaStream_t *given, size_t n)
{
    /* The streams its blocks were recorded on join the group: users[i]
     * says on which device streams[i] is (given ones: as they are). */
    cudaStream_t streams[64];
    struct block_user users[64];
    for (size_t i = 0; i < n; i++) {
        streams[i] = given[i];
        users[i] = (struct block_user){given[i], 0, -1};
    }
    struct block_user recorded[64];
    size_t nrec = cache_users_of_free(a, recorded);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    for (size_t i = 0; i < nrec; i++) {
        bool seen = false;
        for (size_t j = 0; j < n && !seen && i < 64; j++)
            seen = cache_user_same(&recorded[i], &users[j], &sw);
        if (!seen && (i >= 64 || n == 64)) {
            stats_add(&stats.rejected, 1);
            report("%s: with the streams its blocks were recorded on, more "
                   "than 64 streams: refused", a->what);
            return cudaErrorInvalidValue;
        }
        if (!seen) {
            users[n] = recorded[i];
            streams[n++] = recorded[i].handle;
        }
    }
    bool capturing = false;
    const char *call = NULL;
    cudaError_t err = capture_status(streams, n, &capturing, &call);
    if (err != cudaSuccess)
        return api_reject(a->what, call, err);
    if (capturing)
        return api_submit_captured(a, streams, n);
    if (lifecycle_disabled()) {
        const char *failed = "cudaStreamSynchronize";
        for (size_t i = 1; i < n && err == cudaSuccess; i++)
            if ((err = cache_user_enter(&users[i], &sw, &failed)) ==
                cudaSuccess)
                err = cudaStreamSynchronize(streams[i]);
        cuda_switch_back(&sw, a->what);
        if (err != cudaSuccess)
            return api_reject(a->what, failed, err);
        return api_release_synchronously(a, streams[0]);
    }
    struct entry *parts[64] = {NULL};
    size_t made = 0;
    struct request_args member = {.what = a->what, .kind = ENTRY_MEMBER};
    for (; made < n; made++) {
        int device;
        unsigned long long id;
        bool no_event = false, cached = false;
        /* A recorded special handle: on the device it named. */
        if ((err = cache_user_enter(&users[made], &sw, &call)) !=
            cudaSuccess)
            break;
        /* Callbacks are ordered per stream: never a stale identity. */
        bool exact = a->kind == ENTRY_CALL;
        if ((err = api_identify_usable(streams[made], exact, -1, &device, &id,
                                       &cached, &call)) != cudaSuccess)
            break;
        const struct request_args *part = made == 0 ? a : &member;
        enum lane_share lane = stream_lane_share_of(a->kind); /* the group's */
        parts[made] = api_record(part, streams[made], device, id, lane, &err,
                                 &call, &no_event);
        if (parts[made] == NULL && cached &&
            err == cudaErrorInvalidResourceHandle) {
            /* The cached identity may be stale: look again, once, as the
             * single-stream path does (issue 12, item 9). */
            if ((err = api_identify_again(streams[made], &device, &id,
                                          &call)) != cudaSuccess)
                break;
            if ((err = lifecycle_device_error(device)) != cudaSuccess) {
                call = "an earlier CUDA call on this device";
                break;
            }
            parts[made] = api_record(part, streams[made], device, id, lane,
                                     &err, &call, &no_event);
        }
        if (parts[made] == NULL)
            break;
    }
    cuda_switch_back(&sw, a->what);
    if (made < n) {
        while (made-- > 0) /* the newest first (stream_lane_uncommit) */
            api_discard_recorded(parts[made]);
        return api_reject(a->what, call, err);
    }
    parts[0]->group_remaining = (uint32_t)n;
    for (size_t i = 1; i < n; i++)
        parts[i]->group = parts[0];
    stats_count_deferred();
    /* Any order would do: the payload completes only once every part has,
     * whichever the reclaimer takes in first (a mutant pushing it first
     * passed every test). */
    for (size_t i = n; i-- > 0;)
        lifecycle_push(parts[i]);
    return cudaSuccess;
}

/* Checks shared by the defer_*_streams calls, then the group path. */
static cudaError_t submit_group(const struct request_args *given,
                                const cudaStream_t *streams, size_t n)
{
    if (streams == NULL || n == 0 || n > 64) {
        stats_add(&stats.rejected, 1);
        report("%s: %zu streams%s: refused (expected 1..64 streams)",
               given->what, n, streams == NULL ? " (NULL)" : "");
        return cudaErrorInvalidValue;
    }
    struct block_claim one;
    struct request_args a;
    cudaError_t err = api_begin(given, &a, &one);
    if (err != cudaSuccess)
        return err;
    bool claimed = false; /* a refused claim claimed nothing */
    if ((err = cache_claim_all(&a, &claimed)) == cudaSuccess)
        err = api_group_submit(&a, streams, n);
    return api_end(&a, &one, claimed, err);
}

cudaError_t defer_free_streams(void *ptr, const cudaStream_t *streams,
                               size_t n)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free_streams",
                             .kind = ENTRY_FREE_DEVICE, .ptrs = &ptr,
                             .nptrs = 1};
    return submit_group(&a, streams, n);
}

cudaError_t defer_free_host_streams(void *ptr, const cudaStream_t *streams,
                                    size_t n)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free_host_streams",
                             .kind = ENTRY_FREE_HOST, .ptrs = &ptr,
                             .nptrs = 1};
    return submit_group(&a, streams, n);
}

cudaError_t defer_call_streams(void (*fn)(void *arg), void *arg,
                               const cudaStream_t *streams, size_t n)
{
    if (fn == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_call_streams: fn is NULL: refused");
        return cudaErrorInvalidValue;
    }
    struct request_args a = {.what = "defer_call_streams", .kind = ENTRY_CALL,
                             .fn = fn, .arg = arg};
    return submit_group(&a, streams, n);
}
