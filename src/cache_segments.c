/* SPDX-License-Identifier: MIT */
/* The block cache's segments (cache.h says which file holds what): a
 * request cut from a larger block, freed neighbours merged again, and the
 * index of each device's segments by address.  A segment is one allocation
 * from upstream; its blocks are linked in address order (seg_prev,
 * seg_next).  Every function is called with the device's lock held; none
 * makes a CUDA call or blocks. */
#include "cache_block.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The least a block keeps when a request is cut from it. */
#define SPLIT_MIN_REST MIN_BLOCK

/* ---- cutting ------------------------------------------------------------ */

/* Whether a request of piece bytes may be cut from b: sizes and addresses
 * stay multiples of 512 and the rest is a block. */
static bool may_split(const struct cache_block *b, size_t piece)
{
    return b->size >= piece + SPLIT_MIN_REST && b->size % MIN_BLOCK == 0 &&
           (uintptr_t)b->ptr % MIN_BLOCK == 0;
}

/* The smallest block to cut piece bytes from, FREE or PENDING on own, in
 * the bins from lo up (size for size own's first); NULL when none. */
static struct cache_block *split_candidate(struct device_cache *c,
                                           struct stream_bins *own, int lo,
                                           size_t piece)
{
    const struct bins *lists[2] = {own != NULL ? &own->bins : NULL, &c->free};
    for (int bin = lo; (bin = bins_next_either(c, own, bin, NBINS - 1)) >= 0;
         bin++) {
        struct cache_block *best = NULL;
        for (int i = 0; i < 2; i++)
            for (struct cache_block *b = lists[i] ? lists[i]->head[bin] : NULL;
                 b != NULL; b = b->next)
                if (may_split(b, piece) &&
                    (best == NULL || b->size < best->size))
                    best = b;
        if (best != NULL)
            return best;
    }
    return NULL;
}

struct cache_block *cache_segments_split(struct device_cache *c,
                                         struct stream_bins *own, int lo,
                                         size_t piece, bool *same_stream)
{
    struct cache_block *b = split_candidate(c, own, lo, piece);
    if (b == NULL)
        return NULL;
    struct cache_block *p = cache_reclaim_reuse(c);
    if (p == NULL)
        return NULL;
    p->ptr = (char *)b->ptr + (b->size - piece);
    p->size = piece;
    p->device = b->device;
    p->bin = block_bin_of(piece);
    p->upstream = b->upstream;
    struct cache_block *stale = NULL, *there = cache_map_find(p->ptr);
    /* Inside a segment only MERGED blocks are filed (another would be
     * memory freed behind cudefer's back): never replace one.  A MERGED
     * one stays for its entries, unfiled: its address is p's now, as a
     * block's is its next owner's once handed out again. */
    if ((there != NULL && there->state != BLOCK_MERGED) ||
        !cache_map_insert(p, &stale)) {
        cache_reclaim_retire(c, p);
        return NULL;
    }
    /* b keeps the rest, refiled for its new size: a piece now, linked to
     * p before it is refiled, so that a FREE one leaves the age list (a
     * whole segment's place: expiry would release the allocation under
     * p). */
    *same_stream = b->state == BLOCK_PENDING;
    if (*same_stream)
        bins_unlink(&own->bins, b);
    else
        free_unlink(c, b);
    b->size -= piece;
    b->bin = block_bin_of(b->size);
    p->seg_prev = b;
    p->seg_next = b->seg_next;
    if (p->seg_next != NULL)
        p->seg_next->seg_prev = p;
    b->seg_next = p;
    if (*same_stream)
        bins_push(&own->bins, b);
    else
        free_link(c, b);
    return p;
}

/* ---- merging ------------------------------------------------------------ */

/* keep, out of its lists, takes in the memory of gone, its right
 * neighbour: its size, its bin, its place in the segment. */
static void grow_over(struct cache_block *keep, const struct cache_block *gone)
{
    keep->size += gone->size;
    keep->bin = block_bin_of(keep->size);
    keep->seg_next = gone->seg_next;
    if (keep->seg_next != NULL)
        keep->seg_next->seg_prev = keep;
}

/* FREE keep absorbs FREE gone, its right neighbour that no entry names;
 * gone is retired (Note [Spare blocks]). */
static void absorb(struct device_cache *c, struct cache_block *keep,
                   struct cache_block *gone)
{
    free_unlink(c, keep);
    free_unlink(c, gone);
    grow_over(keep, gone);
    if (gone->freed_ns > keep->freed_ns)
        keep->freed_ns = gone->freed_ns;
    cache_map_remove(gone);
    cache_reclaim_retire(c, gone);
    free_link(c, keep);
}

/* Whether FREE b may be absorbed: no entry, nor a part merged into it,
 * still names it (an entry would find its block gone). */
static bool absorbable(const struct cache_block *b)
{
    return b->state == BLOCK_FREE && b->events == 0 && b->outstanding == 0;
}

void cache_segments_merge_free(struct device_cache *c,
                               struct cache_block *b)
{
    struct cache_block *right = b->seg_next, *left = b->seg_prev;
    if (right != NULL && absorbable(right))
        absorb(c, b, right);
    if (left != NULL && left->state == BLOCK_FREE && absorbable(b))
        absorb(c, left, b);
}

/* PENDING keep absorbs gone, its right neighbour PENDING on the same
 * stream s: gone is MERGED into keep and stays filed under its address
 * until its entries are done, so that freeing it again meanwhile is still
 * refused as a second free. */
static void absorb_pending(struct stream_bins *s, struct cache_block *keep,
                           struct cache_block *gone)
{
    /* keep stays in s, so s is never emptied here. */
    bins_unlink(&s->bins, gone);
    bins_unlink(&s->bins, keep);
    grow_over(keep, gone);
    bins_push(&s->bins, keep);
    gone->stream = NULL;
    gone->seg_prev = gone->seg_next = NULL;
    gone->state = BLOCK_MERGED;
    gone->merged_into = keep;
    keep->outstanding++;
}

/* PENDING keep absorbs gone, its FREE right neighbour that nothing names:
 * gone's memory is keep's, PENDING on s with it; gone is retired. */
static void absorb_free(struct device_cache *c, struct stream_bins *s,
                        struct cache_block *keep, struct cache_block *gone)
{
    free_unlink(c, gone);
    bins_unlink(&s->bins, keep);
    grow_over(keep, gone);
    cache_map_remove(gone);
    cache_reclaim_retire(c, gone);
    bins_push(&s->bins, keep);
}

/* FREE b that nothing names becomes PENDING on s, its own work done
 * (ready): it goes FREE again once what it absorbs is done. */
static void pend(struct device_cache *c, struct stream_bins *s,
                 struct cache_block *b)
{
    free_unlink(c, b);
    b->state = BLOCK_PENDING;
    b->stream = s;
    b->ready = true;
    bins_push(&s->bins, b);
}

/*
 * Note [Merging at once]
 *
 * A block just freed on stream S merges at once with its neighbours
 * PENDING on S, and with FREE ones that nothing names, not only once its
 * work is done: a program whose GPU runs a step behind then finds its
 * freed memory in one piece again (a request on S may use it all: its work
 * runs after theirs); apart, memory freed in pieces stayed in two blocks
 * whenever one piece's work completed before the next was freed, and a
 * request of their combined size missed (on the replay of a language
 * model's trace, the GPU a step behind, the pool held 1.154x the live peak
 * apart and 1.022x merged at once).
 *
 * The left block absorbs the right one, so every block keeps its address:
 * b absorbs a right neighbour, and a left one absorbs b.  An absorbed
 * PENDING block is MERGED, still filed under its address (a second free of
 * it is refused), and waits for its entry and for the parts it absorbed
 * itself; then it tells the block it was merged into (merged_into,
 * outstanding), which goes FREE only after every part's work is done (other
 * streams wait for all of it).  A FREE left neighbour first becomes PENDING
 * on S, its own work done (ready); a FREE right one is simply taken in.
 */
void cache_segments_merge_pending(struct device_cache *c,
                                  struct cache_block *b)
{
    struct stream_bins *s = b->stream;
    if (s == NULL) /* no bins for its stream: it waits for its event */
        return;
    struct cache_block *right = b->seg_next, *left = b->seg_prev;
    if (right != NULL && right->state == BLOCK_PENDING && right->stream == s)
        absorb_pending(s, b, right);
    else if (right != NULL && absorbable(right))
        absorb_free(c, s, b, right);
    if (left != NULL && absorbable(left))
        pend(c, s, left);
    if (left != NULL && left->state == BLOCK_PENDING && left->stream == s)
        absorb_pending(s, left, b);
}

/* ---- the segment index ------------------------------------------------- */

/*
 * Note [Segment index]
 *
 * defer_free looks a pointer up by its exact address (the address map);
 * one that misses is either memory cudefer does not own (the ordinary
 * release) or lies inside a segment where no block starts: an interior
 * pointer, or a block freed again after its first free merged it with a
 * free neighbour.  Each device keeps its segments' ranges sorted and
 * disjoint; the index tells the two apart on a miss only, so the look-up
 * of a live block costs nothing more.
 */

/* The index of the first range of x that starts above p (x->count if
 * none). */
static size_t first_above(const struct segment_index *x, uintptr_t p)
{
    size_t lo = 0, hi = x->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->ranges[mid].start > p)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

bool cache_segments_file(struct device_cache *c, const void *ptr,
                         size_t size)
{
    struct segment_index *x = &c->segments;
    if (x->count == x->room) {
        size_t room = x->room ? x->room * 2 : 16;
        struct segment_range *r = realloc(x->ranges, room * sizeof *r);
        if (r == NULL)
            return false;
        x->ranges = r;
        x->room = room;
    }
    /* The ranges are sorted and disjoint, so those [start, end) overlaps
     * are one run: the last starting at or below start, if it reaches
     * past it, and those starting below end.  A binary search finds it,
     * one move closes it (a scan of every range cost 40 times the
     * instructions a filing). */
    uintptr_t start = (uintptr_t)ptr, end = start + size;
    size_t at = first_above(x, start), lo = at, hi = at;
    if (lo > 0 && x->ranges[lo - 1].end > start)
        lo--;
    while (hi < x->count && x->ranges[hi].start < end)
        hi++;
    memmove(&x->ranges[lo + 1], &x->ranges[hi],
            (x->count - hi) * sizeof *x->ranges);
    x->ranges[lo] = (struct segment_range){start, end};
    x->count = x->count - (hi - lo) + 1;
    return true;
}

const void *cache_segments_overlap(const struct device_cache *c,
                                   const void *ptr, size_t size)
{
    const struct segment_index *x = &c->segments;
    uintptr_t start = (uintptr_t)ptr, end = start + size;
    size_t at = first_above(x, start);
    if (at > 0 && x->ranges[at - 1].end > start)
        at--;
    for (; at < x->count && x->ranges[at].start < end; at++)
        if (x->ranges[at].start != start)
            return (const void *)x->ranges[at].start;
    return NULL;
}

void cache_segments_unfile(struct device_cache *c, const void *ptr)
{
    struct segment_index *x = &c->segments;
    size_t at = first_above(x, (uintptr_t)ptr);
    if (at == 0 || x->ranges[at - 1].start != (uintptr_t)ptr)
        return;
    memmove(&x->ranges[at - 1], &x->ranges[at],
            (x->count - at) * sizeof *x->ranges);
    x->count--;
}

bool cache_segments_holds(struct device_cache *c, const void *ptr,
                          struct cache_block **block)
{
    const struct segment_index *x = &c->segments;
    uintptr_t p = (uintptr_t)ptr;
    size_t at = first_above(x, p);
    *block = NULL;
    if (at == 0 || p >= x->ranges[at - 1].end)
        return false;
    /* A segment's first block keeps its start: pieces are cut from the
     * end, and a left neighbour absorbs its right one. */
    for (struct cache_block *b =
             cache_map_find((const void *)x->ranges[at - 1].start);
         b != NULL; b = b->seg_next)
        if (p >= (uintptr_t)b->ptr && p - (uintptr_t)b->ptr < b->size) {
            *block = b;
            break;
        }
    return true;
}

void cache_segments_index_free(struct device_cache *c)
{
    free(c->segments.ranges);
    c->segments = (struct segment_index){NULL, 0, 0};
}
