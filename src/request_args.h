/* SPDX-License-Identifier: MIT */
/* What a defer call asks for, before it becomes an entry: the entry
 * points (api.c, alloc.c; defer_pluggable_free's: submit_pluggable.c)
 * build it, submit.c routes it, the cache
 * (cache_claim.c) fills in a free's claims.  On the calling thread's
 * stack. */
#ifndef CUDEFER_REQUEST_ARGS_H
#define CUDEFER_REQUEST_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#include "cache.h"
#include "entry.h"

struct cuda_switch; /* cuda.h */
struct line_end;   /* report.h */

struct request_args {
    const char *what; /* the public function, for messages */
    /* The end of a refusal's line (report.h) where the entry point's
     * caller hears nothing else (defer_pluggable_free: "PTR stays
     * allocated"); NULL: "nothing was deferred". */
    const struct line_end *end;
    enum entry_kind kind;
    enum entry_caller caller; /* the free call, for its entry (entry.h) */
    void *const *ptrs; /* the caller's; ptrs[0..nptrs), none NULL */
    size_t nptrs;
    void (*fn)(void *arg);
    void *arg;
    /* A free's claims (cache.h), one per pointer (block NULL: no
     * block), filled in as its blocks are claimed; NULL when the block
     * cache was not in use at the call (no pointer can be a block). */
    struct block_claim *claims;
    /* The caller's current device, when known (current_known: the
     * pluggable entry points made it current), so that a special stream
     * handle's look-up need not ask for it again. */
    bool current_known;
    int current_device;
    /* defer_pluggable_free (caller ENTRY_BY_PLUGGABLE; unused otherwise):
     * the size PyTorch says the block has (0 fits any block) and its
     * device, checked against the block (a mismatch is reported; the block
     * is freed all the same). */
    size_t said_bytes;
    int said_device;
    /* The device of ptrs[0]'s block if it is one, when the entry point
     * knows it (block_known: defer_pluggable_free on a special handle), so
     * that the free's plan need not look it up before the device's lock
     * (the look-up under the lock decides). */
    bool block_known;
    int block_device;
    /* defer_pluggable_free of a block on the legacy stream, which may join
     * a free batch (free_batch.h): current_device is the device the handle
     * names, not yet made current.  submit makes it current through
     * *lazy_switch (the caller's, which switches back) before the first
     * CUDA call of the request; a batched free that seals nothing makes
     * none, so it never asks for the current device.  NULL: current_device,
     * when known, is current already. */
    struct cuda_switch *lazy_switch;
};

#endif
