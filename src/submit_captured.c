/* SPDX-License-Identifier: MIT */
/* The captured route (submit_route.h): a request whose streams capture
 * into a graph is tied to the graph's life (capture.h) and records
 * nothing; or refused, where the graph would not wait for what it must.
 * Note [The submit route] and Note [Capture check], submit.c. */
#include "submit_route.h"

#include "cache.h"
#include "capture.h"
#include "entry.h"
#include "report.h"
#include "stats.h"

/* Any thread: a's refusal by the captured route (submit_captured_route): a
 * block recorded on other streams, or (per_thread) a capture of
 * cudaStreamPerThread; said in one line ending with a->end's text as
 * every refusal of the request does, counted.  Returns
 * cudaErrorStreamCaptureUnsupported. */
static cudaError_t refuse_captured(const struct request_args *a,
                                   bool per_thread) FRAME_OF_ITS_OWN;
static cudaError_t refuse_captured(const struct request_args *a,
                                   bool per_thread)
{
    stats_add(&stats.rejected, 1);
    char tail[64];
    if (per_thread)
        report("%s: a capture of cudaStreamPerThread: refused (the "
               "reclaimer could not wait for the work this thread "
               "enqueued on it before the capture; capture a created "
               "stream; the capture is intact%s)", a->what,
               a->end != NULL ? report_line_end(a->end, tail, sizeof tail)
                              : "; the caller keeps ownership");
    else
        report("%s: a block recorded on other streams (defer_record_stream) "
               "cannot be freed into a graph capture, which would not wait "
               "for them: refused%s", a->what,
               a->end != NULL ? report_line_end(a->end, tail, sizeof tail)
                              : " (the caller keeps ownership)");
    return cudaErrorStreamCaptureUnsupported;
}

/* Any thread, admitted: ROUTE_CAPTURED (capture.h): a's entry is tied to
 * the graph t's streams capture into.  Never blocks.  cudaSuccess, or the
 * refusal: blocks recorded on other streams, which the graph would not
 * wait for; a capture of cudaStreamPerThread, whose earlier work the
 * reclaimer cannot wait for (there it names the reclaimer's own stream). */
cudaError_t submit_captured_route(const struct request_args *a,
                                  const struct target *t)
{
    if (cache_users_of_free(a, NULL) > 0)
        return refuse_captured(a, false);
    for (size_t i = 0; i < t->n; i++)
        if (t->streams[i] == cudaStreamPerThread)
            return refuse_captured(a, true);
    struct entry *e = capture_entry_new();
    if (e == NULL)
        return submit_reject(a, "calloc", cudaErrorMemoryAllocation);
    e->kind = a->kind;
    e->caller = a->caller;
    e->fn = a->fn;
    e->arg = a->arg;
    if (!submit_record_pointers(e, a)) {
        capture_entry_discard(e);
        return submit_reject(a, "malloc", cudaErrorMemoryAllocation);
    }
    const char *call = NULL;
    cudaError_t err = capture_defer(a->what, e, t->streams, t->n, &call);
    return err == cudaSuccess ? cudaSuccess
                              : submit_reject(a, call, err);
}
