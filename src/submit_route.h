/* SPDX-License-Identifier: MIT */
/*
 * The submit route's one private header (the interface is submit.h): the
 * types and functions its files share.  submit.c holds the common path in
 * one unit, from admit to leave (the refused, batched, block and entry
 * routes), and the Notes [The submit route], [Capture check] and [Stale
 * identity]; submit_record.c makes an entry and records its event;
 * submit_captured.c the captured route; submit_sync.c the synchronous
 * release; submit_group.c the group route; submit_pluggable.c
 * defer_pluggable_free's request and the short way of a batched free
 * (Note [The short way]).  Only these include it.
 *
 * Threads: everything here runs on the calling thread of a defer call,
 * admitted (between admit and leave, submit.c); a struct target and a
 * struct group_streams live on its stack and are never shared.
 */
#ifndef CUDEFER_SUBMIT_ROUTE_H
#define CUDEFER_SUBMIT_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "cache.h"
#include "capture.h"
#include "cuda.h"
#include "entry.h"
#include "request_args.h"
#include "stream_lane.h"
#include "submit.h"

/* The streams of a group: those the call named, then those its blocks were
 * recorded on (users[i]: streams[i]'s device for a special handle). */
struct group_streams {
    cudaStream_t streams[SUBMIT_MAX_STREAMS];
    struct block_user users[SUBMIT_MAX_STREAMS];
};

/* What a request waits for, resolved once (resolve_one,
 * submit_group_resolve): what choose_route reads and the routes use.  On
 * the caller's stack. */
struct target {
    cudaStream_t handle;         /* the caller's stream */
    const cudaStream_t *streams; /* the streams waited for: &handle, or a
                                    group's */
    const struct block_user *users; /* a group's; NULL for one stream */
    size_t n;                    /* how many streams */
    int current;    /* the caller's current device; -1: not known */
    bool disabled;  /* CUDEFER_DISABLE: release synchronously */
    bool batch;     /* may join a free batch: capture not checked yet */
    bool capturing; /* the streams capture into a graph */
    bool group;     /* a group: one entry per stream */
    bool cached;    /* device and id are from this thread's cache */
    int device;     /* the stream's device and id, once identified */
    unsigned long long id;
    struct block_free_plan plan; /* a single block's free: the cache's
                                    plan (BLOCK_NOT_OURS: none) */
    struct cuda_switch sw;     /* a group's: the caller's device */
};

/* Why no entry could be made: the error, the call that failed, and
 * whether it was the event or the entry that could not be had (then the
 * request is released synchronously instead of refused). */
struct failure {
    cudaError_t err;
    const char *call;
    bool no_event;
};

/* Each function's comment (who may call it, whether it blocks, what it
 * returns) is above its definition: here for the two small ones the
 * common path inlines, else in the file each group is headed with. */

/* Any thread: whether the free a asks for claimed any block (then its
 * entry carries the claims). */
static inline bool submit_any_claimed(const struct request_args *a)
{
    for (size_t i = 0; a->claims != NULL && i < a->nptrs; i++)
        if (a->claims[i].block != NULL)
            return true;
    return false;
}

/* Any thread, admitted: the capture check of t's streams (Note [Capture
 * check], submit.c): one cudaStreamIsCapturing a stream, never blocks.
 * cudaSuccess (t->capturing says), or the refusal. */
static inline cudaError_t submit_check_capture(const struct request_args *a,
                                               struct target *t)
{
    const char *call = NULL;
    cudaError_t err = capture_status(t->streams, t->n, &t->capturing, &call);
    return err == cudaSuccess ? err : submit_reject(a, call, err);
}

/* ---- submit.c ----------------------------------------------------------- */

/* A stream's identity (Note [Stale identity]). */
cudaError_t submit_identify_again(cudaStream_t stream, int *device,
                                  unsigned long long *id, const char **failed);
cudaError_t submit_identify_usable(cudaStream_t stream, bool exact,
                                   int current, int *device,
                                   unsigned long long *id, bool *cached,
                                   const char **failed);
/* The common path's steps that the short way of a batched free
 * (submit_pluggable.c) shares: a plan's claim taken, a parked block joining
 * its batch, and the common path's rest where the short way ends. */
bool submit_plan_claim(const void *ptr, const struct block_free_plan *plan,
                       bool said, size_t said_bytes, int said_device,
                       struct block_claim *claim);
void submit_join_batch(const char *what, struct cuda_switch *lazy,
                       int current, int device, cudaStream_t handle,
                       unsigned long long id, const struct block_claim *claim);
void submit_target_planned(struct target *t, const struct request_args *a,
                           cudaStream_t stream, int device,
                           unsigned long long id,
                           const struct block_free_plan *plan);
cudaError_t submit_after_plan(struct request_args *a, struct target *t,
                              struct block_claim *one, bool claimed);

/* ---- submit_record.c ---------------------------------------------------- */

/* An entry made, recorded on its stream, or given back unpushed. */
bool submit_record_pointers(struct entry *e, const struct request_args *a);
struct entry *submit_record(const struct request_args *a, cudaStream_t stream,
                            int device, unsigned long long id,
                            enum lane_share lane, struct failure *f);
void submit_record_discard(struct entry *e);

/* ---- submit_captured.c -------------------------------------------------- */

/* ROUTE_CAPTURED: an entry tied to the graph the streams capture into, or
 * the refusal. */
cudaError_t submit_captured_route(const struct request_args *a,
                                  const struct target *t);

/* ---- submit_sync.c ------------------------------------------------------ */

/* No entry could be had: released synchronously, or refused; and
 * ROUTE_SYNCHRONOUS. */
cudaError_t submit_sync_no_entry(const struct request_args *a,
                                 struct target *t, const struct failure *f);
cudaError_t submit_sync_route(const struct request_args *a, struct target *t);

/* ---- submit_group.c ----------------------------------------------------- */

/* A group's streams gathered; ROUTE_GROUP. */
cudaError_t submit_group_resolve(const struct request_args *a,
                                 const cudaStream_t *given, size_t n,
                                 struct group_streams *g, struct target *t);
cudaError_t submit_group_route(const struct request_args *a,
                               struct target *t);

/* Any thread: a's refusal because its streams and those its blocks were
 * recorded on are more than SUBMIT_MAX_STREAMS in all, a stream counted
 * once (every route counts so): said, counted; cudaErrorInvalidValue. */
cudaError_t submit_group_refuse_too_many(const struct request_args *a);

#endif
