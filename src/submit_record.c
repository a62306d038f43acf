/* SPDX-License-Identifier: MIT */
/* A request's entry (submit_route.h): made from the pool, its pointers and
 * claims copied in, its event recorded on the stream; or given back
 * unpushed.  On the calling thread of a defer call, admitted. */
#include "submit_route.h"

#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "entry.h"
#include "event_pool.h"
#include "release.h"
#include "stream_lane.h"

/* Any thread: copies a's pointers and claims into e (arrays, owned by e,
 * only for several).  Blocks only in malloc.  False when out of memory
 * (e then carries none). */
bool submit_record_pointers(struct entry *e, const struct request_args *a)
{
    e->nptrs = a->nptrs;
    e->ptrs = &e->one_ptr;
    e->claims = NULL;
    if (submit_any_claimed(a) && a->nptrs == 1) {
        e->one_claim = a->claims[0];
        e->claims = &e->one_claim;
    } else if (submit_any_claimed(a)) {
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

/* Any thread, admitted: a pooled entry for a on stream (device, id), its
 * event from the thread's lane of kind lane (stream_lane.h), recorded on
 * the stream.  Never blocks but where the lane makes an event.  The entry,
 * or NULL with f->err and f->call, and f->no_event set when it was the
 * event or the entry that could not be had (f->no_event is never cleared
 * here). */
struct entry *submit_record(const struct request_args *a,
                            cudaStream_t stream, int device,
                            unsigned long long id, enum lane_share lane,
                            struct failure *f)
{
    struct lane_pick pick;
    if ((f->err = stream_lane_pick(device, id, lane, &pick, &f->call)) !=
        cudaSuccess) {
        f->no_event = true;
        return NULL;
    }
    struct entry *e = event_pool_take_entry(device, &f->err, &f->call);
    if (e == NULL) {
        stream_lane_cancel(&pick);
        f->no_event = true;
        return NULL;
    }
    entry_begin(e, a->kind, id);
    e->caller = a->caller;
    e->fn = a->fn;
    e->arg = a->arg;
    if (!submit_record_pointers(e, a)) {
        stream_lane_cancel(&pick);
        event_pool_give_unused(e);
        f->err = cudaErrorMemoryAllocation;
        f->call = "malloc";
        return NULL;
    }
    if ((f->err = cuda_event_record(pick.ev->event, stream)) !=
        cudaSuccess) {
        stream_lane_cancel(&pick);
        release_forget_pointers(e);
        event_pool_give_unused(e);
        f->call = "cudaEventRecord";
        return NULL;
    }
    stream_lane_commit(&pick, e);
    return e;
}

/* Any thread: a recorded entry that will not be pushed after all: its
 * reference to its event goes, and it goes back to the pool.  Never
 * blocks. */
void submit_record_discard(struct entry *e)
{
    release_forget_pointers(e);
    stream_lane_uncommit(e);
    event_pool_give_unused(e);
}
