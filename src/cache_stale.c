/* SPDX-License-Identifier: MIT */
/* Stale blocks (Note [Stale blocks]): blocks of the cache whose memory
 * the application gave back with cudaFree behind cudefer's back, found
 * when CUDA hands the address out again and cache_add files the new
 * memory.  Each is dropped with the rest of its segment, said in one line,
 * and forgotten once nothing names it.  cache.c's cache_add is the only
 * caller. */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache_block.h"
#include "report.h"
#include "stats.h"

/*
 * Note [Stale blocks]
 *
 * cache_add may find a block already filed under the address of memory
 * that upstream just gave out: the application freed that block's memory
 * with cudaFree instead of defer_free, and CUDA gave the address out again.
 * The stale block is dropped, and with it every block of its segment (CUDA
 * releases an allocation whole, pieces and all): out of every list of its
 * device's cache and of the address map, out of the byte counts, hand-out
 * 0 so that no claim or entry matches it; it is reported, and freed once
 * nothing names it (a claim's let-go, the reclaimer's settle, or cache_add
 * itself when nothing does).  A stale
 * block of another device is dropped under that device's lock before the
 * new one is filed (drop_other_device); a MERGED part is no block of its
 * own (its bytes count in the block that absorbed it), so it is only
 * taken out of the map, and forgotten when its entries are done.  New
 * memory that starts inside a segment, where none of its blocks starts, or
 * covers one, is as sure a sign: that segment is dropped whole too
 * (drop_overlapped_locked), also another device's (drop_overlapped_elsewhere,
 * under that device's lock before the new block is filed).
 */

/* Any thread, under c's lock (c: b's device's): b, a block of a segment
 * whose memory is gone, leaves every list of c and the address map, out
 * of the byte counts, hand-out 0 (Note [Stale blocks]).  Joins *forget
 * (through lru_next: the caller forgets it once the lock is let go) when
 * no entry or claim names it, itself or through a part merged into it;
 * else the last of them forgets it. */
static void drop_one_locked(struct device_cache *c, struct cache_block *b,
                            struct cache_block **forget)
{
    if (b->state == BLOCK_PENDING)
        cache_stream_unlink(c, b);
    else if (b->state == BLOCK_FREE)
        free_unlink(c, b);
    bool was_free = b->state == BLOCK_PENDING || b->state == BLOCK_FREE;
    stats_device_left(b->device, b->size, was_free);
    if (b->upstream) /* its memory went back behind cudefer's back too */
        cache_upstream_forget(b->device, b->size);
    cache_map_remove(b); /* unless a new block took its address */
    b->seg_prev = b->seg_next = NULL;
    b->state = BLOCK_LIVE;
    b->handout = 0; /* no entry's hand-out matches it any more */
    if (block_dropped_unnamed(b)) {
        b->lru_next = *forget;
        *forget = b;
    }
}

/* Any thread, under c's lock (c: stale's device's): stale is dropped
 * (drop_one_locked), and so is every other block of its segment: CUDA
 * released the allocation whole, so the blocks cut from it went with it
 * (left in the bins, a FREE one would be handed out over the memory just
 * allocated at stale's address; a live one, freed, would go back to
 * them).  Returns how many other blocks were dropped; *start: the
 * segment's start (its first block keeps it). */
static size_t drop_stale_locked(struct device_cache *c,
                                struct cache_block *stale,
                                struct cache_block **forget,
                                const void **start)
{
    struct cache_block *first = stale;
    while (first->seg_prev != NULL)
        first = first->seg_prev;
    *start = first->ptr;
    size_t others = 0;
    for (struct cache_block *b = first, *next; b != NULL; b = next) {
        next = b->seg_next;
        others += b != stale;
        drop_one_locked(c, b, forget);
    }
    return others;
}

/* The free that goes with what, the allocation call the user made: the
 * one its blocks should have gone back through. */
static const char *free_of(const char *what)
{
    return strncmp(what, "defer_pluggable_", 16) == 0 ? "defer_pluggable_free"
                                                      : "defer_free";
}

/* Any thread: says, in the words of what (the call the user made), that
 * the block of size bytes at ptr was freed with cudaFree instead of its
 * free, and that it is dropped with the others (other blocks cut from its
 * allocation). */
static void report_stale(const char *what, const void *ptr, size_t size,
                         size_t others)
{
    if (others == 0)
        report("%s: CUDA gave out %p as new memory, which cudefer still "
               "counted as its block of %zu bytes: that block was freed "
               "with cudaFree instead of %s; its record is dropped", what,
               ptr, size, free_of(what));
    else
        report("%s: CUDA gave out %p as new memory, which cudefer still "
               "counted as its block of %zu bytes: that block was freed "
               "with cudaFree instead of %s; its record is dropped, with "
               "the %zu other block%s cut from its allocation", what, ptr,
               size, free_of(what), others, others == 1 ? "" : "s");
}

/* Any thread, under c's lock (c: device's), before memory at [ptr, ptr +
 * size) is filed, on device or on another: each segment of c's that it
 * overlaps, but one starting at ptr (the map's insert finds that one's
 * block; drop_other_device another device's), is stale:
 * its memory went back behind cudefer's back and CUDA gave part of it out
 * again, at an address where none of its blocks may start.  Its blocks are
 * dropped (drop_stale_locked; left, a FREE one would be handed out over
 * the new memory) and its range leaves the index.  Returns how many
 * segments; *blocks: how many blocks they held, *first: the first's
 * start. */
static size_t drop_overlapped_locked(struct device_cache *c, int device,
                                     const void *ptr, size_t size,
                                     struct cache_block **forget,
                                     size_t *blocks, const void **first)
{
    size_t n = 0;
    const void *old, *start;
    *blocks = 0;
    while ((old = cache_segments_overlap(c, ptr, size)) != NULL) {
        if (n++ == 0)
            *first = old;
        /* A segment's first block keeps its start (cache_segments.c). */
        struct cache_block *b = cache_map_find(old);
        if (b != NULL && b->device == device && b->state != BLOCK_MERGED)
            *blocks += drop_stale_locked(c, b, forget, &start) + 1;
        cache_segments_unfile(c, old);
    }
    return n;
}

/* Any thread: says, in the words of what, that memory just allocated at
 * ptr overlaps segments (blocks blocks, the first segment at first) that
 * cudefer still counted, freed with cudaFree instead of their free, and
 * that they are dropped. */
static void report_overlapped(const char *what, const void *ptr,
                              size_t segments, size_t blocks,
                              const void *first)
{
    report("%s: CUDA gave out new memory at %p, which overlaps %zu "
           "allocation%s that cudefer still counted (the first at %p, %zu "
           "block%s in all): freed with cudaFree instead of %s; their "
           "records are dropped", what, ptr, segments,
           segments == 1 ? "" : "s", first, blocks, blocks == 1 ? "" : "s",
           free_of(what));
}

/* Any thread: forgets the blocks of forget (linked by lru_next). */
static void forget_list(struct cache_block *forget)
{
    for (struct cache_block *next; forget != NULL; forget = next) {
        next = forget->lru_next;
        cache_forget(forget);
    }
}

/* Any thread holding no device's lock, before it files memory of device at
 * ptr: a stale block of another device's filed under ptr is dropped under
 * that device's lock with its segment, taken out of the map and reported
 * (Note [Stale blocks]) in the words of what.  A block of device itself is
 * left to the caller's hold. */
static void drop_other_device(const char *what, const void *ptr, int device)
{
    struct device_cache *o;
    struct cache_block *x = cache_find_locked(ptr, &o);
    if (x == NULL)
        return;
    if (x->device == device) { /* the caller's own hold drops it */
        pthread_mutex_unlock(&o->lock);
        return;
    }
    if (x->state == BLOCK_MERGED) {
        /* No block of its own: out of the map, forgotten when its
         * entries are done. */
        cache_map_remove(x);
        pthread_mutex_unlock(&o->lock);
        return;
    }
    size_t size = x->size;
    struct cache_block *forget = NULL;
    const void *start;
    size_t others = drop_stale_locked(o, x, &forget, &start);
    /* Its range too (a block of this device's at ptr replaces the range
     * when it is filed; this one is of another device): a free in what is
     * left of it would be refused as a pointer inside a block. */
    cache_segments_unfile(o, start);
    pthread_mutex_unlock(&o->lock);
    report_stale(what, ptr, size, others);
    forget_list(forget);
}

/* Any thread holding no device's lock, before it files memory of device at
 * [ptr, ptr + size): the segments of every other device's that the range
 * overlaps are stale (one address space for all devices: CUDA gave part of
 * one's released range to device), dropped under that device's lock and
 * said in the words of what, as drop_overlapped_locked does for device's
 * own.  One starting at ptr went with drop_other_device. */
static void drop_overlapped_elsewhere(const char *what, int device,
                                      const void *ptr, size_t size)
{
    if (cache_one_device())
        return;
    struct device_cache *o;
    for (int d = 0; (o = cache_device(d)) != NULL; d++) {
        if (d == device)
            continue;
        struct cache_block *forget = NULL;
        size_t blocks = 0;
        const void *first = NULL;
        cache_lock(o);
        size_t n = drop_overlapped_locked(o, d, ptr, size, &forget, &blocks,
                                          &first);
        pthread_mutex_unlock(&o->lock);
        if (n > 0)
            report_overlapped(what, ptr, n, blocks, first);
        forget_list(forget);
    }
}

/* ---- cache_add's steps -------------------------------------------------- */

void cache_stale_before_filing(const char *what, int device, const void *ptr,
                               size_t size)
{
    drop_other_device(what, ptr, device);
    drop_overlapped_elsewhere(what, device, ptr, size);
}

void cache_stale_overlapped_locked(struct device_cache *c, int device,
                                   size_t size, struct cache_stale *st)
{
    st->overlapped = drop_overlapped_locked(c, device, st->ptr, size,
                                            &st->forget, &st->overlapped_blocks,
                                            &st->overlapped_first);
}

void cache_stale_drop_locked(struct device_cache *c, struct cache_block *stale,
                             struct cache_stale *st)
{
    const void *start;
    st->stale_size = stale->size;
    st->stale = true;
    st->others = drop_stale_locked(c, stale, &st->forget, &start);
}

void cache_stale_said(struct cache_stale *st)
{
    if (st->overlapped > 0)
        report_overlapped(st->what, st->ptr, st->overlapped,
                          st->overlapped_blocks, st->overlapped_first);
    if (st->stale)
        report_stale(st->what, st->ptr, st->stale_size, st->others);
    forget_list(st->forget); /* the others: the last entry naming each */
    st->forget = NULL;
}
