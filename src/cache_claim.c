/* SPDX-License-Identifier: MIT */
/* A free's claim on blocks of the cache (cache.h says which file holds
 * what): the plan a free on one stream makes for one block (claim, and
 * park it PENDING on that stream when stream order allows), the claim a
 * free of several pointers makes on each, letting a claim go, and a
 * request's claims with their refusals (freed twice, an interior pointer).
 * A claim is made and let go under the block's device lock; the states it
 * moves a block through are in cache_block.h, Note [Block states]. */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>

#include "cache_block.h"
#include "report.h"
#include "request_args.h"
#include "stats.h"

/* ---- a free's plan and claim ------------------------------------------- */

bool cache_claim_inside_live(const void *ptr)
{
    bool live = false;
    return cache_inside_segment(ptr, &live) && live;
}

/* cache_claim_plan's work; park: a BLOCK_STREAM_ORDERED block is parked in
 * the same lock hold (plan->parked). */
static void plan_free(void *ptr, int block_device, int stream_device,
                      unsigned long long stream_id, bool park,
                      struct block_free_plan *plan)
{
    plan->path = BLOCK_NOT_OURS;
    plan->block = NULL;
    plan->nstreams = 0;
    plan->parked = false;
    struct device_cache *c;
    struct cache_block *b = cache_find_locked_on(ptr, block_device, &c);
    if (b == NULL) {
        bool live;
        if (cache_inside_segment(ptr, &live))
            plan->path = BLOCK_INSIDE;
        return;
    }
    plan->block = b;
    plan->handout = b->handout;
    plan->size = b->size; /* parked, it may grow by merging at once */
    plan->device = b->device;
    if (b->state != BLOCK_LIVE) {
        plan->path = BLOCK_NOT_LIVE;
    } else {
        b->state = BLOCK_FREEING; /* this free's: a second one is refused */
        b->events++;              /* the claim names it */
        plan->nstreams = 1; /* the caller's */
        for (uint32_t i = 0; i < b->nusers; i++)
            if (b->users[i].id != stream_id ||
                b->users[i].device != stream_device)
                plan->nstreams++;
    }
    if (plan->path == BLOCK_NOT_LIVE) {
        /* said */
    } else if (plan->nstreams > 1) {
        plan->path = BLOCK_AFTER_STREAMS;
    } else {
        plan->path = b->device == stream_device ? BLOCK_STREAM_ORDERED
                                                : BLOCK_AFTER_EVENT;
    }
    if (park && plan->path == BLOCK_STREAM_ORDERED) {
        cache_park_locked(c, b, stream_id);
        plan->parked = true;
    }
    pthread_mutex_unlock(&c->lock);
}

void cache_claim_plan(void *ptr, int stream_device,
                      unsigned long long stream_id,
                      struct block_free_plan *plan)
{
    plan_free(ptr, -1, stream_device, stream_id, false, plan);
}

void cache_claim_plan_parked(void *ptr, int stream_device,
                             unsigned long long stream_id,
                             struct block_free_plan *plan)
{
    plan_free(ptr, -1, stream_device, stream_id, true, plan);
}

void cache_claim_plan_on(void *ptr, int block_device, int stream_device,
                         unsigned long long stream_id, bool park,
                         struct block_free_plan *plan)
{
    plan_free(ptr, block_device, stream_device, stream_id, park, plan);
}

bool cache_claim_park(const struct block_free_plan *plan,
                      unsigned long long stream_id)
{
    struct cache_block *b = plan->block;
    struct device_cache *c = cache_device(b->device);
    cache_lock(c);
    bool mine = b->state == BLOCK_FREEING && b->handout == plan->handout;
    if (mine)
        cache_park_locked(c, b, stream_id);
    pthread_mutex_unlock(&c->lock);
    return mine;
}

/* cache_claim's work; a claimed block's size and device (neither changes
 * while it is FREEING), read in the same lock hold, go to *size and
 * *device (0 and -1 when nothing was claimed). */
static enum block_free_path claim_one(void *ptr, struct block_claim *claim,
                                      size_t *size, int *device)
{
    claim->block = NULL;
    claim->handout = 0;
    *size = 0;
    *device = -1;
    struct device_cache *c;
    struct cache_block *b = cache_find_locked(ptr, &c);
    bool inside_live;
    if (b == NULL)
        return cache_inside_segment(ptr, &inside_live) ? BLOCK_INSIDE
                                                 : BLOCK_NOT_OURS;
    bool live = b->state == BLOCK_LIVE;
    if (live) {
        b->state = BLOCK_FREEING;
        b->events++; /* the claim names it */
        claim->block = b;
        claim->handout = b->handout;
        *size = b->size;
        *device = b->device;
    }
    pthread_mutex_unlock(&c->lock);
    return live ? BLOCK_AFTER_EVENT : BLOCK_NOT_LIVE;
}

enum block_free_path cache_claim(void *ptr, struct block_claim *claim)
{
    size_t size;
    int device;
    return claim_one(ptr, claim, &size, &device);
}

void *cache_claim_ptr(const struct block_claim *claim)
{
    return claim->block->ptr;
}

void cache_claim_undo(const struct block_claim *claim)
{
    struct cache_block *b = claim->block;
    if (b == NULL)
        return;
    struct device_cache *c = cache_device(b->device);
    cache_lock(c);
    if (b->state == BLOCK_FREEING && b->handout == claim->handout)
        b->state = BLOCK_LIVE;
    bool forget = block_claim_let_go(b);
    pthread_mutex_unlock(&c->lock);
    if (forget)
        cache_forget(b);
}

/* ---- a request's claims ------------------------------------------------- */

bool cache_claim_room(const struct request_args *given, struct request_args *a,
                      struct block_claim *one)
{
    *a = *given;
    a->claims = NULL;
    if (given->kind != ENTRY_FREE_DEVICE || !cache_active())
        return true;
    *one = (struct block_claim){NULL, 0};
    a->claims = given->nptrs == 1 ? one
                                  : calloc(given->nptrs, sizeof *a->claims);
    return a->claims != NULL;
}

void cache_claim_room_free(struct request_args *a, struct block_claim *one)
{
    if (a->claims != one)
        free(a->claims);
    a->claims = NULL;
}

cudaError_t cache_claim_refuse_freed(const struct request_args *a,
                                     const void *ptr)
{
    stats_add(&stats.rejected, 1);
    report("%s: %p is a block of cudefer's that is already free or being "
           "freed (freed twice?): refused; nothing was deferred",
           a->what, ptr);
    return cudaErrorInvalidValue;
}

/* Refused at the call, where its release would only fail later: either
 * inside a live block (an interior pointer) or inside free memory (a block
 * freed twice, its first free's work done and the block merged with a free
 * neighbour since). */
cudaError_t cache_claim_refuse_inside(const struct request_args *a,
                                      const void *ptr)
{
    stats_add(&stats.rejected, 1);
    if (cache_claim_inside_live(ptr))
        report("%s: %p points inside a live block of cudefer's, not at "
               "its start (an interior pointer): refused; nothing was "
               "deferred",
               a->what, ptr);
    else
        report("%s: %p points inside memory of cudefer's that is free or "
               "being freed, where no block starts (freed twice, after its "
               "first free's work was done and the block merged with a free "
               "neighbour?): refused; nothing was deferred", a->what, ptr);
    return cudaErrorInvalidValue;
}

void cache_claim_undo_all(const struct request_args *a)
{
    for (size_t i = 0; a->claims != NULL && i < a->nptrs; i++) {
        cache_claim_undo(&a->claims[i]);
        a->claims[i] = (struct block_claim){NULL, 0};
    }
}

void cache_claim_report_said(const void *ptr, size_t size, int device,
                             size_t said_bytes, int said_device)
{
    report("defer_pluggable_free: %p is a block of %zu bytes on device %d, "
           "freed as %zu bytes on device %d: freed all the same",
           ptr, size, device, said_bytes, said_device);
}

cudaError_t cache_claim_all(const struct request_args *a, bool *claimed)
{
    *claimed = false;
    if (a->kind != ENTRY_FREE_DEVICE || a->claims == NULL)
        return cudaSuccess;
    for (size_t i = 0; i < a->nptrs; i++) {
        size_t size;
        int device;
        enum block_free_path path =
            claim_one(a->ptrs[i], &a->claims[i], &size, &device);
        if (path == BLOCK_NOT_LIVE || path == BLOCK_INSIDE) {
            cache_claim_undo_all(a);
            *claimed = false;
            return path == BLOCK_INSIDE
                       ? cache_claim_refuse_inside(a, a->ptrs[i])
                       : cache_claim_refuse_freed(a, a->ptrs[i]);
        }
        /* Only defer_pluggable_free (one pointer) says a size and device. */
        if (path != BLOCK_NOT_OURS && a->caller == ENTRY_BY_PLUGGABLE)
            cache_claim_check_said(a->ptrs[i], size, device, a->said_bytes,
                                   a->said_device);
        *claimed |= path != BLOCK_NOT_OURS;
    }
    return cudaSuccess;
}
