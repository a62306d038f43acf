/* SPDX-License-Identifier: MIT */
/* One request's route: from the checked arguments of a defer_* call (api.c,
 * alloc.c) to an entry on the reclaimer's queue, a free batch, a graph's
 * user object, or a release made on the calling thread (submit.c, Note [The
 * submit route] there). */
#ifndef CUDEFER_SUBMIT_H
#define CUDEFER_SUBMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

#include "request_args.h"

/* Marks a function off the common path of defer_pluggable_alloc and
 * defer_pluggable_free (a miss, a refusal, the full route of a free)
 * whose locals (text buffers, a request's structs, an array of blocks)
 * would, inlined, widen the frame of every such call: each cache line of
 * the stack a call touches is a miss when PyTorch's own work ran between
 * two calls (cache_block.h, Note [Cache lines]; an allocation's frame
 * spanned 1.3 KiB, for a hit too). */
#define FRAME_OF_ITS_OWN __attribute__((noinline))

/* The most streams one request waits for: those a defer_*_streams call
 * names, with the streams its blocks were recorded on. */
#define SUBMIT_MAX_STREAMS 64

/* Any thread, once the call's arguments were checked.  Admits the request
 * given on stream (lifecycle_enter), resolves the stream, chooses the route
 * and takes it.  Blocks only where the route does: a synchronous release
 * (CUDEFER_DISABLE, or no event could be had) waits for the stream.
 * Returns cudaSuccess once deferred (or released), else the refusal, said
 * and counted: nothing was deferred and the caller keeps ownership. */
cudaError_t submit(const struct request_args *given, cudaStream_t stream);

/* The same on streams[0..n) (1 <= n <= SUBMIT_MAX_STREAMS, checked by the
 * caller; not NULL): one entry per stream, all recorded before any is
 * pushed, so that a refusal leaves nothing behind. */
cudaError_t submit_streams(const struct request_args *given,
                           const cudaStream_t *streams, size_t n);

/* defer_pluggable_free's arguments, checked (alloc.c): its request. */
struct pluggable_free {
    void *ptr;           /* not NULL */
    cudaStream_t stream; /* PyTorch's; a special handle names current */
    int current;         /* the device a special handle names (current, or
                            made so through lazy); -1: a created stream */
    size_t said_bytes;   /* the size and device PyTorch says (checked
                            against the block's) */
    int said_device;
    bool block_known;    /* block_device: ptr's block's (a look-up) */
    int block_device;
    const struct line_end *end; /* its refusals' line end */
    /* A block on the legacy stream, which may join its device's free
     * batch: the caller's switch to current, made only before a CUDA call
     * (request_args.lazy_switch); NULL: current is current already. */
    struct cuda_switch *lazy;
};

/* Any thread, current made current unless f->lazy says otherwise:
 * defer_pluggable_free's request, submitted as submit does, a free that
 * joins a free batch the short way (submit_pluggable.c, Note [The short
 * way]).  Blocks where submit does.  cudaSuccess, or the refusal (said and
 * counted): the caller keeps the pointer. */
cudaError_t submit_pluggable_free(const struct pluggable_free *f);

/* Any thread: request a (only its what and end are read) is refused
 * because call failed with err: said in one line naming a->what, which
 * ends with a->end's text (report.h) or, for a NULL end, "nothing was
 * deferred"; counted in rejected.  Never blocks.  Returns err. */
cudaError_t submit_reject(const struct request_args *a, const char *call,
                          cudaError_t err);

/* As submit_reject, for a call that failed on device (-1: not known): a
 * sticky error there (a fault of the device's, not the call's) fails the
 * device too, said once, as the reclaimer's calls fail it, so that later
 * calls on it and defer_flush return it where nothing was pending. */
cudaError_t submit_reject_on(const struct request_args *a, int device,
                             const char *call, cudaError_t err);

#endif
