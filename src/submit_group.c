/* SPDX-License-Identifier: MIT */
/* The group route (submit_route.h): one entry per stream, all recorded
 * before any is pushed, for the *_streams calls and for blocks recorded on
 * other streams; the group's streams gathered first.  Note [The submit
 * route], submit.c. */
#include "submit_route.h"

#include <stdint.h>

#include "cache.h"
#include "cuda.h"
#include "entry.h"
#include "lifecycle.h"
#include "report.h"
#include "stats.h"
#include "stream_lane.h"

/* Any thread: a's refusal because a stream its blocks were recorded on
 * (defer_record_stream) is no live stream, the streams the caller gave
 * being live: said in those words (cuda_report_failure would say it of "a
 * stream given"), counted.  Returns err. */
static cudaError_t refuse_recorded_gone(const struct request_args *a,
                                        const char *call, cudaError_t err)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_recorded_gone(const struct request_args *a,
                                        const char *call, cudaError_t err)
{
    stats_add(&stats.rejected, 1);
    char tail[64];
    report("%s: a stream its block was recorded on (defer_record_stream) is "
           "not a live stream (destroyed since the record): %s failed: %s "
           "(%s)%s", a->what, call, cudaGetErrorString(err),
           cudaGetErrorName(err),
           a->end != NULL ? report_line_end(a->end, tail, sizeof tail)
                          : "; nothing was deferred (the caller keeps "
                            "ownership)");
    return err;
}

/* Any thread, admitted: a refused because t's given streams (the first
 * ngiven) and the streams its blocks were recorded on do not all capture
 * or all not: said in those words, naming a recorded stream that captures
 * where the given ones do not (the caller gave one stream: "some of the
 * streams" would say nothing it knows), counted.  Returns
 * cudaErrorStreamCaptureUnsupported. */
static cudaError_t refuse_recorded_capture(const struct request_args *a,
                                           const struct target *t,
                                           size_t ngiven,
                                           bool given_capture)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_recorded_capture(const struct request_args *a,
                                           const struct target *t,
                                           size_t ngiven,
                                           bool given_capture)
{
    stats_add(&stats.rejected, 1);
    char tail[64];
    const char *end = a->end != NULL
                          ? report_line_end(a->end, tail, sizeof tail)
                          : " (the caller keeps ownership)";
    cudaStream_t capturing = NULL;
    for (size_t i = ngiven; i < t->n && capturing == NULL && !given_capture;
         i++) {
        bool is = false;
        const char *call;
        if (capture_status(&t->streams[i], 1, &is, &call) == cudaSuccess &&
            is)
            capturing = t->streams[i];
    }
    if (capturing != NULL)
        report("%s: stream %p, which its block was recorded on "
               "(defer_record_stream), is capturing into a graph, whose "
               "work a free cannot wait for: refused; free the block once "
               "that capture ends%s", a->what, (void *)capturing, end);
    else
        report("%s: a block recorded on other streams (defer_record_stream) "
               "cannot be freed into a graph capture, which would not wait "
               "for them: refused%s", a->what, end);
    return cudaErrorStreamCaptureUnsupported;
}

/* Any thread: a's refusal because a stream the caller gave (given[0..n),
 * the caller's array) is no live stream, the capture check's err: said
 * naming the first such one by its place in the array and its handle (the
 * caller may give 64), else as submit_reject says it; counted.  Asks each
 * given stream again, the refusal's path only.  Returns err. */
static cudaError_t refuse_given_gone(const struct request_args *a,
                                     const cudaStream_t *given, size_t n,
                                     const char *call, cudaError_t err)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_given_gone(const struct request_args *a,
                                     const cudaStream_t *given, size_t n,
                                     const char *call, cudaError_t err)
{
    for (size_t i = 0; i < n; i++) {
        bool capturing;
        const char *again = NULL;
        if (capture_status(&given[i], 1, &capturing, &again) !=
            cudaErrorInvalidResourceHandle)
            continue;
        stats_add(&stats.rejected, 1);
        char tail[64];
        report("%s: streams[%zu] (%p) is not a live stream (destroyed, or "
               "never created): %s failed: %s (%s)%s", a->what, i,
               (void *)given[i], call, cudaGetErrorString(err),
               cudaGetErrorName(err),
               a->end != NULL ? report_line_end(a->end, tail, sizeof tail)
                              : "; nothing was deferred (the caller keeps "
                                "ownership)");
        return err;
    }
    return submit_reject(a, call, err);
}

cudaError_t submit_group_refuse_too_many(const struct request_args *a)
{
    stats_add(&stats.rejected, 1);
    report("%s: with the streams its blocks were recorded on, more than 64 "
           "streams: refused", a->what);
    return cudaErrorInvalidValue;
}

/* Any thread, admitted: a's streams gathered into *t (a group, in g): the
 * given[0..count), then those its blocks were recorded on, each once, then
 * their capture check.  Never blocks.  cudaSuccess, or the refusal (more
 * than SUBMIT_MAX_STREAMS in all). */
cudaError_t submit_group_resolve(const struct request_args *a,
                                 const cudaStream_t *given, size_t count,
                                 struct group_streams *g, struct target *t)
{
    /* A handle given twice is one stream: one part, one event, counted
     * once against SUBMIT_MAX_STREAMS, as the header says.  Equal handles
     * are one stream: a special handle among the given names the caller's
     * device, the same for all of them.  (0 and cudaStreamLegacy, two
     * handles of one stream, stay two parts on one lane, which a group
     * allows.)  At most 64 given: a quadratic look costs less than one
     * event record. */
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        bool seen = false;
        for (size_t j = 0; j < n && !seen; j++)
            seen = g->streams[j] == given[i];
        if (!seen) {
            g->streams[n] = given[i];
            g->users[n++] = (struct block_user){given[i], 0, -1};
        }
    }
    const size_t ngiven = n;
    struct block_user recorded[SUBMIT_MAX_STREAMS];
    size_t nrec = cache_users_of_free(a, recorded);
    for (size_t i = 0; i < nrec; i++) {
        bool seen = false;
        for (size_t j = 0; j < n && !seen && i < SUBMIT_MAX_STREAMS; j++)
            seen = cache_users_same(&recorded[i], &g->users[j], &t->sw);
        if (!seen && (i >= SUBMIT_MAX_STREAMS || n == SUBMIT_MAX_STREAMS))
            return submit_group_refuse_too_many(a);
        if (!seen) {
            g->users[n] = recorded[i];
            g->streams[n++] = recorded[i].handle;
        }
    }
    t->streams = g->streams;
    t->users = g->users;
    t->n = n;
    t->group = true;
    const char *call = NULL;
    cudaError_t err = capture_status(t->streams, t->n, &t->capturing, &call);
    if (err == cudaSuccess)
        return err;
    /* An unknown handle among the recorded streams, the given ones live:
     * the caller's streams are fine, a recorded one was destroyed (the
     * given ones, g's first ngiven, asked again, on this error only). */
    bool capturing;
    const char *again = NULL;
    if (err == cudaErrorInvalidResourceHandle && ngiven < n &&
        capture_status(g->streams, ngiven, &capturing, &again) !=
            cudaErrorInvalidResourceHandle)
        return refuse_recorded_gone(a, call, err);
    /* Given streams that agree, and recorded ones that do not agree with
     * them: the records are what the caller must hear of. */
    if (err == cudaErrorStreamCaptureUnsupported && ngiven < n &&
        capture_status(g->streams, ngiven, &capturing, &again) == cudaSuccess)
        return refuse_recorded_capture(a, t, ngiven, capturing);
    /* A given stream unknown, among several given (a caller that gave one
     * knows which): named by its place in the caller's array. */
    if (err == cudaErrorInvalidResourceHandle && count > 1)
        return refuse_given_gone(a, given, count, call, err);
    return submit_reject(a, call, err);
}

/* Any thread, admitted: part (a, or a member) of a group recorded on t's
 * stream i, on the device a recorded special handle named.  Callbacks look
 * their streams up exactly (their order per stream).  A stale cached
 * identity is looked up afresh once (Note [Stale identity], submit.c).  Never
 * blocks.  The entry, or NULL with f->err and f->call. */
static struct entry *record_part(const struct request_args *a,
                                 const struct request_args *part,
                                 struct target *t, size_t i,
                                 enum lane_share lane, struct failure *f)
{
    int device;
    unsigned long long id;
    bool cached = false;
    cudaStream_t stream = t->streams[i];
    if ((f->err = cache_users_enter(&t->users[i], &t->sw, &f->call)) !=
            cudaSuccess ||
        (f->err = submit_identify_usable(stream, a->kind == ENTRY_CALL, -1,
                                         &device, &id, &cached, &f->call)) !=
            cudaSuccess)
        return NULL;
    struct entry *e = submit_record(part, stream, device, id, lane, f);
    if (e != NULL || !cached || f->err != cudaErrorInvalidResourceHandle)
        return e;
    f->no_event = false; /* a failed fresh look-up is a refusal */
    cuda_forget_failure_left(f->err); /* as record_again, submit.c */
    if ((f->err = submit_identify_again(stream, &device, &id, &f->call)) !=
        cudaSuccess)
        return NULL;
    if ((f->err = lifecycle_device_error(device)) != cudaSuccess) {
        f->call = "an earlier CUDA call on this device";
        return NULL;
    }
    return submit_record(part, stream, device, id, lane, f);
}

/* Any thread, admitted: ROUTE_GROUP: one entry per stream of t, all
 * recorded before any is pushed, so that a failure leaves nothing behind.
 * The first stream's entry is the payload; the others are members that
 * count down the payload's group.  Where no event (or entry) could be had
 * for a part, the group is released synchronously, as a single stream's
 * request is (submit_sync_no_entry): the contract of defer_free (no event:
 * wait and release at once) is every free's, a block's recorded streams
 * and the *_streams calls' included.  Never blocks but then.  cudaSuccess,
 * or the refusal. */
cudaError_t submit_group_route(const struct request_args *a,
                               struct target *t)
{
    struct entry *parts[SUBMIT_MAX_STREAMS] = {NULL};
    struct request_args member = {.what = a->what, .kind = ENTRY_MEMBER};
    enum lane_share lane = stream_lane_share_of(a->kind); /* the group's */
    struct failure f = {cudaSuccess, NULL, false};
    size_t made = 0;
    while (made < t->n &&
           (parts[made] = record_part(a, made == 0 ? a : &member, t, made,
                                      lane, &f)) != NULL)
        made++;
    cuda_switch_back(&t->sw, a->what);
    if (made < t->n) {
        while (made-- > 0)
            submit_record_discard(parts[made]);
        return submit_sync_no_entry(a, t, &f);
    }
    parts[0]->group_remaining = (uint32_t)t->n;
    for (size_t i = 1; i < t->n; i++)
        parts[i]->group = parts[0];
    lifecycle_count_admitted();
    /* Any order would do: the payload completes only once every part has,
     * whichever the reclaimer takes in first. */
    for (size_t i = t->n; i-- > 0;)
        lifecycle_push(parts[i]);
    return cudaSuccess;
}
