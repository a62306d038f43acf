/* SPDX-License-Identifier: MIT */
/*
 * An entry: one deferred release (or callback, or request) on its way from a
 * launching thread to the reclaimer.  Entries are recycled (see
 * event_pool.h): taken by a launching thread, owned by the reclaimer from
 * the moment they are pushed, given back when done.  An entry carries a
 * reference to a shared event and the label of the record made after its
 * work (stream_lane.h): consecutive entries of a stream share events.
 */
#ifndef CUDEFER_ENTRY_H
#define CUDEFER_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "cache.h"
#include "queue.h"

enum entry_kind {
    ENTRY_FREE_DEVICE, /* cudaFree (or cudaFreeAsync for pool memory) */
    ENTRY_FREE_HOST,   /* cudaFreeHost */
    ENTRY_CALL,        /* fn(arg) */
    ENTRY_REQUEST,     /* not work: a flush or trim waiting for the reclaimer */
    ENTRY_MEMBER,      /* only an event: one of the streams a group waits for */
    ENTRY_BLOCK,       /* a block of the cache, freed on its stream (see
                          cache.h): FREE once the event completes */
};

/* Which defer call made an entry that frees: with its kind, the name its
 * release's failures are said in (entry_caller_name), the call the user
 * made.  Every other entry is ENTRY_BY_PLAIN. */
enum entry_caller {
    ENTRY_BY_PLAIN,     /* defer_free, defer_free_host */
    ENTRY_BY_N,         /* defer_free_n */
    ENTRY_BY_STREAMS,   /* defer_free_streams, defer_free_host_streams */
    ENTRY_BY_PLUGGABLE, /* defer_pluggable_free */
};

struct request;
struct cache_block;
struct shared_event;
struct entry_slab;

/* The link of a pooled item (event_pool.h).  In a pool's stack of batches
 * (pool_stack.h) a batch's first item also says the next batch and how
 * many items its own has. */
struct pool_link {
    struct pool_link *next;
    struct pool_link *next_batch;
    size_t batch_count;
};

struct entry {
    struct queue_node node; /* first: entries are queue nodes */
    struct entry *fifo_next;
    enum entry_kind kind;
    int device;
    unsigned long long stream_id;
    struct shared_event *ev; /* a reference; NULL for requests, synced
                                entries and entries complete when they
                                arrive */
    uint64_t label;        /* ev's record made after this entry's work */
    struct pool_link link; /* while pooled */
    struct entry_slab *slab; /* pooled: where it lives (entry_slab.h;
                                NULL: calloc'ed) */
    bool pooled;           /* from the pool (else allocated: freed when
                              done) */
    bool captured;         /* tied to a graph (capture.h): waits with the
                              capture's entries until it is complete */
    bool synced;           /* no event, but its stream was synchronized
                              before the push: complete once it heads its
                              stream's FIFO (in order behind the earlier
                              entries; a callback with no event) */
    uint8_t caller;        /* enum entry_caller of a free's entry, set
                              from its request (not by entry_begin: an
                              ENTRY_BLOCK's is left as it was, unused); in
                              padding, so the size stays */
    uint64_t seq;          /* order of arrival at the reclaimer */
    uint64_t completed_ns; /* when the reclaimer saw the event complete */
    uint64_t held_bytes;   /* memory it keeps from the application */
    bool pool;             /* every pointer is stream-ordered pool memory */
    bool cache_blocks;     /* every pointer is a block of the cache: given
                              back to it, never released, never held */
    bool held_here;        /* its held bytes are memory of its own device,
                              part of that device's use (cudaMemGetInfo):
                              not pinned host memory, nor another device's
                              memory freed on this device's streams */
    bool interior;         /* a pointer that is no block lay inside an
                              allocation, not at its start, when the entry
                              was sized: another pointer's release may
                              free its allocation first */
    bool some_pool;        /* some of its pointers, not all, are pool
                              memory: released once its work is done,
                              never held (reclaimer.c, release_pool_part);
                              in padding, so the size stays */
    /* The block each pointer's free claimed (cache.h; block NULL:
     * none), which its release acts on: claims[0..nptrs) of an
     * ENTRY_FREE_DEVICE, NULL when no pointer was a block; &one_claim or
     * an array owned by the entry.  ENTRY_BLOCK: claims[0..nptrs), the
     * blocks it frees on its stream (several: a free batch, free_batch.h),
     * and no pointers (ptrs unused). */
    struct block_claim one_claim;
    struct block_claim *claims;
    size_t nptrs;          /* pointers to free: ptrs[0..nptrs) */
    void **ptrs;           /* &one_ptr, or an array owned by the entry */
    void *one_ptr;
    void (*fn)(void *arg);
    void *arg;
    struct request *request;
    /* A group waits for the events of several entries (defer_*_streams):
     * its payload (the entry that releases) counts the parts still to come,
     * its own event included; each ENTRY_MEMBER points to it.  An ordinary
     * entry is a group of one.  Reclaimer only, but for the set-up. */
    struct entry *group;       /* members: their payload */
    uint32_t group_remaining;  /* payload: parts not done */
    cudaError_t group_err;     /* payload: the first part that failed */
    /* While held (see held.h): the list is doubly linked by fifo_next and
     * held_prev. */
    struct entry *held_prev;
};

/* A blank entry taken from the pool (event_pool.h) for work of kind on
 * stream stream_id: every field a defer call sets, set as for one pointer
 * and no callback, no claim, no group (the caller fills those in), its
 * bytes learned by the reclaimer. */
static inline void entry_begin(struct entry *e, enum entry_kind kind,
                               unsigned long long stream_id)
{
    e->kind = kind;
    e->stream_id = stream_id;
    e->fn = NULL;
    e->arg = NULL;
    e->request = NULL;
    e->held_bytes = 0;
    e->pool = false;
    e->group = NULL;
    e->group_remaining = 1; /* its own event */
    e->group_err = cudaSuccess;
    e->cache_blocks = false;
    e->held_here = false;
    e->one_claim = (struct block_claim){NULL, 0};
    e->claims = NULL;
    e->nptrs = 0;
    e->ptrs = &e->one_ptr;
}

/* On a 64-bit platform an entry is 216 bytes, as cudefer(7) says ("about
 * 220"): caller must stay in padding. */
_Static_assert(sizeof(void *) != 8 || sizeof(struct entry) <= 216,
               "struct entry outgrew the size cudefer(7) gives");

/* The call that made e, a free: the user's words for its release. */
static inline const char *entry_caller_name(const struct entry *e)
{
    bool host = e->kind == ENTRY_FREE_HOST;
    switch ((enum entry_caller)e->caller) {
    case ENTRY_BY_N:
        return "defer_free_n";
    case ENTRY_BY_STREAMS:
        return host ? "defer_free_host_streams" : "defer_free_streams";
    case ENTRY_BY_PLUGGABLE:
        return "defer_pluggable_free";
    case ENTRY_BY_PLAIN:
        break;
    }
    return host ? "defer_free_host" : "defer_free";
}

/* Whether the free of e's pointer i claimed a block (cache.h). */
static inline bool entry_claimed(const struct entry *e, size_t i)
{
    return e->claims != NULL && e->claims[i].block != NULL;
}

static inline struct entry *entry_of_node(struct queue_node *node)
{
    return (struct entry *)node;
}

#endif
