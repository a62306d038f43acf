/* SPDX-License-Identifier: MIT */
/*
 * The block cache's one private header (the interface is cache.h): the
 * block, its states and their transitions, the per-device cache, the bins
 * (by the size classes of block_size.h), the lock rules, and the functions
 * the module's files share.  Only src/cache*.c include it (and the
 * white-box unit tests of its pure size classes, spare stack and segment
 * index).
 *
 * Vocabulary: a *block* is a struct cache_block, and the memory it
 * describes while it is in the cache; a *segment* is one allocation from
 * upstream, a block or the blocks cut from it; a block's *users* are the
 * streams recorded with defer_record_stream; *upstream* is the
 * stream-ordered memory pool behind the cache (cache_upstream.c); an
 * *entry* or a *claim* names a block until the work of its free is done.
 */
#ifndef CUDEFER_CACHE_BLOCK_H
#define CUDEFER_CACHE_BLOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_size.h"
#include "cache.h"

/*
 * Note [Block states]
 *
 * enum block_state (cache.h) names them.  Every transition is made under
 * the block's device lock (Note [Locks]), by L, a launching thread inside
 * a defer call, or by R, the side that sees a free's work done: the
 * reclaimer, or a launching thread that waited for the work itself (a
 * free batch's fallback, a synchronous release).
 *
 *   new memory (cache_add), a piece cut (cache_segments_split) -> LIVE    L
 *   LIVE      -- a free claims it (cache_claim_plan, cache_claim)
 *                                                          -> FREEING     L
 *   FREEING   -- the free refused after all (cache_claim_undo) -> LIVE       L
 *   FREEING   -- stream-ordered, its event recorded (cache_claim_park)
 *                                                          -> PENDING S   L
 *   FREEING   -- its entry's work done (cache_reclaim_adopt) -> FREE      R
 *   PENDING S -- taken by a request on S (cache_take)      -> LIVE        L
 *   PENDING S -- its work and every merged part's done     -> FREE        R
 *   PENDING S -- absorbed by its left neighbour PENDING on S -> MERGED    L
 *   PENDING S -- handed back upstream by a miss on S       -> GONE        L
 *   FREE      -- taken by a request on any stream          -> LIVE        L
 *   FREE      -- absorbs a neighbour just freed on S       -> PENDING S   L
 *   FREE      -- absorbed by a FREE neighbour (when either goes FREE), or
 *                by one just freed on S                    -> RETIRED     L R
 *   FREE whole segment -- a miss's hand-back               -> RETIRED     L
 *   FREE whole segment -- expiry, trim, shutdown: released, freed         R
 *   MERGED, GONE -- the last entry naming it done          -> RETIRED     R
 *   any       -- its memory freed behind cudefer's back and its address
 *                allocated again (cache_add): dropped      -> LIVE, 0     L
 *   RETIRED   -- reused for a piece (cache_reclaim_reuse)  -> LIVE        L
 *
 * A dropped block (Note [Stale blocks]) is LIVE with hand-out 0, in no
 * list, so no claim or entry matches it any more; it is freed once
 * nothing names it (block_dropped_unnamed).  Only whole segments
 * (is_whole) ever leave the cache; a PENDING block whose own work is done
 * waits (ready) for the parts merged into it (outstanding).
 */

/*
 * Note [Locks]
 *
 * - A device's lock (struct device_cache, lock; taken with cache_lock)
 *   guards its lists and every field of its blocks, but device (fixed for
 *   a struct's life) and ptr while a claim names the block (fixed until
 *   the struct is retired), which are read without it, and the two atomics
 *   of struct device_cache.  Launching threads and the reclaimer both take
 *   it.
 * - No CUDA call is made under it, and no block struct is freed under it
 *   (a free() could wait for another thread's malloc arena: Note [Spare
 *   blocks]); allocating one is allowed.
 * - A thread holds one device's lock at most: a walk over devices takes
 *   each in turn.
 * - The address map's shard locks (cache_map.c) are taken under a
 *   device's lock or alone, never the other way round: every change of
 *   the map is made under the block's device lock as well, so a block
 *   found in the map before that lock is taken is looked up again under
 *   it (cache_find_locked).  With one device, that lock alone keeps the
 *   map still: a free's look-up is made once, under it, without a
 *   shard's lock (cache_map_find_held).
 * - The upstream pool's creation lock (cache_upstream.c) and its trim
 *   lock are the locks of the module under which a CUDA call is made
 *   (cudaMemPoolCreate, once a device; an allocation from a pool, shared,
 *   or a trim's calls, alone); each is taken under no other lock of the
 *   module's.
 */

/*
 * Note [Cache lines]
 *
 * A call under PyTorch costs mostly the cache lines it misses (PyTorch's
 * own work runs between two calls), so the hot data is laid out by line:
 * a block's first 64 bytes are what a hit, a free's look-up and the bins
 * touch; a device cache puts the lock with the hand-out counter (written in
 * the same hold by every hit) and the stream looked up last, then the
 * rest (the spare structs: a merge's or a cut's), then the
 * atomics written outside the lock, the stream buckets and the FREE bins.
 * Aligned block structs cost more in aligned_alloc than they saved, so a
 * block spans at most two lines wherever malloc places it.
 */

/* ---- the block ---------------------------------------------------------- */

struct stream_bins;

struct cache_block {
    /* First line (Note [Cache lines]). */
    void *ptr;                       /* its start: the address map's key */
    size_t size;                     /* bytes (RETIRED, on the spare stack:
                                        the stack's depth) */
    struct cache_block *map_next;    /* its address-map bucket's next */
    struct cache_block *prev, *next; /* its bin (FREE, or PENDING) */
    struct stream_bins *stream;      /* PENDING: its stream's bins (NULL:
                                        none could be made) */
    uint64_t handout;                /* unique per hand-out on its device,
                                        names the owner; 0: dropped */
    int bin;                         /* the largest class not above size */
    enum block_state state;          /* Note [Block states] */
    /* Second line. */
    struct cache_block *lru_prev;    /* FREE whole: the device's age list */
    struct cache_block *lru_next;    /* also a spare stack's or a forget
                                        list's link */
    struct cache_block *seg_prev;    /* its neighbours in address order in
                                        its segment (NULL: none), */
    struct cache_block *seg_next;    /* both NULL: a whole segment */
    uint64_t freed_ns;               /* FREE: when its work was seen done */
    struct cache_block *merged_into; /* MERGED: the block that absorbed it */
    uint32_t outstanding;            /* parts MERGED into it whose entries
                                        are not done */
    uint32_t events;                 /* claims and entries naming it */
    int device;                      /* fixed for the struct's life */
    uint8_t nusers;                  /* users recorded, <= BLOCK_MAX_USERS */
    bool upstream;                   /* from the upstream pool: handed back
                                        with cudaFreeAsync, never cudaFree */
    bool in_lru;                     /* on the device's age list: FREE and
                                        whole */
    bool ready;                      /* PENDING: its own work is done */
    struct block_user *users;        /* read only when nusers > 0; kept by a
                                        RETIRED struct */
};

/* ---- bins and order lists ----------------------------------------------- */

/* A set of bins files blocks by size class, each bin a list, newest first,
 * with a bitmap of the non-empty ones.  Callers hold the device's lock;
 * nothing here allocates or blocks. */
struct bins {
    uint64_t nonempty[NWORDS]; /* first: one cache line, read by every search */
    struct cache_block *head[NBINS]; /* newest first */
};

/* A list in the order blocks joined it, through their lru links: a
 * device's FREE whole segments (oldest free first). */
struct order_list {
    struct cache_block *oldest, *newest;
};

/* File b in its bin of s, first.  A bin's bit is set exactly while its list
 * is non-empty (here and in bins_unlink), so it is set only by the block
 * that makes the bin non-empty: a free into a bin in use leaves the
 * bitmap's line untouched (Note [Cache lines]). */
static inline void bins_push(struct bins *s, struct cache_block *b)
{
    b->prev = NULL;
    b->next = s->head[b->bin];
    if (b->next != NULL)
        b->next->prev = b;
    else
        s->nonempty[b->bin / 64] |= UINT64_C(1) << (b->bin % 64);
    s->head[b->bin] = b;
}

/* Take b out of its bin of s. */
static inline void bins_unlink(struct bins *s, struct cache_block *b)
{
    if (b->prev != NULL)
        b->prev->next = b->next;
    else if ((s->head[b->bin] = b->next) == NULL)
        s->nonempty[b->bin / 64] &= ~(UINT64_C(1) << (b->bin % 64));
    if (b->next != NULL)
        b->next->prev = b->prev;
    b->prev = b->next = NULL;
}

/* Whether s holds no block (its bitmap only: no counter to keep, and no
 * cache line beyond the one a search reads). */
static inline bool bins_empty(const struct bins *s)
{
    for (int w = 0; w < NWORDS; w++)
        if (s->nonempty[w] != 0)
            return false;
    return true;
}

/* The first non-empty bin of s in [lo, hi], or -1. */
static inline int bins_next(const struct bins *s, int lo, int hi)
{
    for (int w = lo / 64; w <= hi / 64; w++) {
        uint64_t bits = s->nonempty[w];
        if (w == lo / 64)
            bits &= ~UINT64_C(0) << (lo % 64);
        if (bits != 0) {
            int bin = w * 64 + __builtin_ctzll(bits);
            return bin <= hi ? bin : -1;
        }
    }
    return -1;
}

/* The last non-empty bin of s at or below hi, or -1. */
static inline int bins_prev(const struct bins *s, int hi)
{
    for (int w = hi / 64; w >= 0; w--) {
        uint64_t bits = s->nonempty[w];
        if (w == hi / 64 && hi % 64 != 63)
            bits &= (UINT64_C(1) << (hi % 64 + 1)) - 1;
        if (bits != 0)
            return w * 64 + 63 - __builtin_clzll(bits);
    }
    return -1;
}

/* A block of bin bin of s with min <= size <= max, or NULL. */
static inline struct cache_block *bins_fit(const struct bins *s, int bin,
                                           size_t min, size_t max)
{
    for (struct cache_block *b = s->head[bin]; b != NULL; b = b->next)
        if (b->size >= min && b->size <= max)
            return b;
    return NULL;
}

/* b joins l, last. */
static inline void order_append(struct order_list *l, struct cache_block *b)
{
    b->lru_next = NULL;
    b->lru_prev = l->newest;
    if (l->newest != NULL)
        l->newest->lru_next = b;
    else
        l->oldest = b;
    l->newest = b;
}

/* b leaves l. */
static inline void order_unlink(struct order_list *l, struct cache_block *b)
{
    if (b->lru_prev != NULL)
        b->lru_prev->lru_next = b->lru_next;
    else
        l->oldest = b->lru_next;
    if (b->lru_next != NULL)
        b->lru_next->lru_prev = b->lru_prev;
    else
        l->newest = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

/* ---- the per-device cache ----------------------------------------------- */

/* Zeroed memory for n bytes (a multiple of 64: the size of a struct with
 * a 64-aligned member) on a cache line boundary, or NULL; free() it. */
static inline void *block_zalloc(size_t n)
{
    void *p = aligned_alloc(64, n);
    if (p != NULL)
        memset(p, 0, n);
    return p;
}

/* The blocks PENDING on one stream of a device, by size. */
struct stream_bins {
    unsigned long long stream_id;
    struct stream_bins *next;
    _Alignas(64) struct bins bins; /* its bitmap on a line of its own */
};

#define STREAM_BUCKETS 64
#define MAX_SPARE_BINS 4

/* The address range of one segment. */
struct segment_range {
    uintptr_t start, end; /* [start, end) */
};

/* A device's segments by address (Note [Segment index]): sorted, disjoint;
 * changed only when a segment is made or handed back. */
struct segment_index {
    struct segment_range *ranges;
    size_t count, room;
};

/* One device's cache.  Its lock guards everything in it but the two
 * atomics; laid out by cache line (Note [Cache lines]; the struct is
 * allocated aligned). */
struct device_cache {
    _Alignas(64) pthread_mutex_t lock;
    uint64_t next_handout; /* unique per hand-out on this device, from 1 */
    /* The bins looked up last (NULL: none) and their stream's id, here so
     * that a hit or a free on that stream reads no line of the bins but
     * the bitmap and a bin (PyTorch works on one stream: no bucket to
     * read either). */
    struct stream_bins *recent;
    unsigned long long recent_id;
    _Alignas(64) struct stream_bins *spare_bins; /* emptied, for reuse */
    int nspare_bins;
    struct cache_block *spare_blocks; /* kept for reuse: Note [Spare blocks] */
    struct order_list lru; /* FREE whole segments, oldest first */
    struct segment_index segments;
    /* Written outside the lock (so on a line of their own): the threads in
     * cache_lock that found it held; the spare blocks retired beyond
     * SPARE_BLOCKS_KEPT, linked by lru_next, which the reclaimer frees
     * outside the lock. */
    _Alignas(64) _Atomic unsigned waiting;
    _Atomic(struct cache_block *) surplus_blocks;
    _Alignas(64) struct stream_bins *streams[STREAM_BUCKETS]; /* PENDING */
    _Alignas(64) struct bins free;                            /* FREE */
};

/* A spinning thread's pause: the sibling hyperthread runs meanwhile. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Any thread; may block: takes c's lock.  A thread that finds it held
 * counts itself in c->waiting until it has it, so that the reclaimer lets
 * it in before its next hold (Note [Letting waiters in]).  An uncontended
 * call costs what pthread_mutex_lock does. */
static inline void cache_lock(struct device_cache *c)
{
    if (pthread_mutex_trylock(&c->lock) == 0)
        return;
    atomic_fetch_add_explicit(&c->waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->lock);
    atomic_fetch_sub_explicit(&c->waiting, 1, memory_order_relaxed);
}

/* Whether b is a whole segment (uncut): the only kind that leaves the
 * cache. */
static inline bool is_whole(const struct cache_block *b)
{
    return b->seg_prev == NULL && b->seg_next == NULL;
}

/* Any thread, under the device's lock.  FREE b leaves c's free bins, and the
 * age list if on it. */
static inline void free_unlink(struct device_cache *c, struct cache_block *b)
{
    bins_unlink(&c->free, b);
    if (b->in_lru) {
        order_unlink(&c->lru, b);
        b->in_lru = false;
    }
}

/* Any thread, under the device's lock.  FREE b joins c's free bins, and when
 * it is a whole segment the age list (only whole segments expire: pieces
 * cannot be released). */
static inline void free_link(struct device_cache *c, struct cache_block *b)
{
    bins_push(&c->free, b);
    if (is_whole(b)) {
        order_append(&c->lru, b);
        b->in_lru = true;
    }
}

/* Any thread, under the device's lock.  The first bin in [lo, hi] non-empty in
 * own (NULL: none) or in c's free bins, or -1. */
static inline int bins_next_either(const struct device_cache *c,
                                   const struct stream_bins *own, int lo,
                                   int hi)
{
    int next_own = own != NULL ? bins_next(&own->bins, lo, hi) : -1;
    int next_free = bins_next(&c->free, lo, hi);
    return next_own < 0 ? next_free
           : next_free < 0 || next_own < next_free ? next_own : next_free;
}

/* Any thread, under the device's lock.  Whether b is to be forgotten: dropped
 * (hand-out 0: Note [Stale blocks]) and named by no entry or claim, itself or
 * through a part. */
static inline bool block_dropped_unnamed(const struct cache_block *b)
{
    return b->handout == 0 && b->events == 0 && b->outstanding == 0;
}

/* Any thread, under the device's lock, a claim on b let go: whether to forget
 * b (block_dropped_unnamed). */
static inline bool block_claim_let_go(struct cache_block *b)
{
    b->events--;
    return block_dropped_unnamed(b);
}

/* ---- cache.c ------------------------------------------------------------ */

/* Any thread: device's cache, or NULL (no such device). */
struct device_cache *cache_device(int device);

/* Any thread holding no device's lock; may block on the locks.  The block
 * at ptr in the address map, with its device's lock taken (*cache: the
 * caller lets it go), or NULL (nothing taken) when the map has none.  A
 * block found in the map before the lock is taken may be retired, and
 * reused for another block, or freed meanwhile (a double free racing a
 * merge): the map is asked again under the lock. */
struct cache_block *cache_find_locked(const void *ptr,
                                      struct device_cache **cache);

/* Any thread holding no device's lock; may block on the locks.
 * cache_find_locked, with device the block's device when the caller looked
 * it up already (-1: not known): then the look-up before the lock is the
 * caller's, and only the one under the lock is made. */
struct cache_block *cache_find_locked_on(const void *ptr, int device,
                                         struct device_cache **cache);

/* Any thread holding no device's lock, once the exact look-up of ptr missed
 * (never before: a live block's free must not pay for it).  Whether ptr
 * lies in a segment of any device's cache; then *live says whether the
 * block holding it is the application's.  Takes each device's lock in
 * turn. */
bool cache_inside_segment(const void *ptr, bool *live);

/* Any thread, under the device's lock: b, claimed (FREEING) by a free on
 * stream_id, becomes PENDING on that stream, named by the free's entry or
 * batch (without bins for the stream, out of memory, it waits for its
 * event like any other block). */
void cache_park_locked(struct device_cache *c, struct cache_block *b,
                       unsigned long long stream_id);

/* Any thread, under the device's lock.  The bins of stream id's PENDING
 * blocks, or NULL. */
struct stream_bins *cache_stream_bins(struct device_cache *c,
                                      unsigned long long id);

/* Any thread, under the device's lock.  PENDING b leaves its stream's bins (an
 * emptied stream leaves the table). */
void cache_stream_unlink(struct device_cache *c, struct cache_block *b);

/* Any thread, under the device's lock.  b's work is done: FREE, filed for any
 * stream, merged with its free neighbours (b may be retired). */
void cache_make_free(struct device_cache *c, struct cache_block *b,
                     uint64_t now);

/* ---- cache_stale.c: blocks cudaFree'd behind cudefer's back ------------ */

/* What cache_add dropped as stale while filing memory at ptr, said and
 * forgotten once its lock is let go (cache_stale_said).  Owned by the
 * cache_add call that fills it; no lock. */
struct cache_stale {
    const char *what;               /* the call the user made (said) */
    const void *ptr;                /* the new memory's start */
    struct cache_block *forget;     /* dropped, to forget (via lru_next) */
    size_t overlapped;              /* segments the new memory overlapped */
    size_t overlapped_blocks;       /* the blocks they held */
    const void *overlapped_first;   /* the first such segment's start */
    bool stale;                     /* a stale block was filed at ptr */
    size_t stale_size, others;      /* its size; its segment's other blocks */
};

/* Any thread holding no device's lock; may block on the locks.  Before
 * memory of device at [ptr, ptr + size) is filed: another device's stale
 * block at ptr, and other devices' segments the range overlaps, are dropped
 * under their own device's lock and said in the words of what, the call
 * the user made. */
void cache_stale_before_filing(const char *what, int device, const void *ptr,
                               size_t size);

/* Any thread, under c's lock (c: device's), before st->ptr is filed: c's
 * segments that [st->ptr, st->ptr + size) overlaps, but one starting at
 * st->ptr, are dropped whole and leave the index; counted in *st. */
void cache_stale_overlapped_locked(struct device_cache *c, int device,
                                   size_t size, struct cache_stale *st);

/* Any thread, under c's lock: stale, the block the new memory replaced in
 * the map (not MERGED), is dropped with its segment; counted in *st. */
void cache_stale_drop_locked(struct device_cache *c, struct cache_block *stale,
                             struct cache_stale *st);

/* Any thread holding no device's lock: says what *st dropped (one line
 * each for overlapped segments and for the stale block) and forgets the
 * dropped blocks nothing names. */
void cache_stale_said(struct cache_stale *st);

/* ---- cache_reclaim.c: spare block structs ------------------------------- */

/* Spare block structs a device keeps at most (Note [Spare blocks]); more go
 * back to malloc (the reclaimer frees them), so that a program that stopped
 * cutting blocks keeps at most 1024 structs of 136 bytes a device, and the
 * users arrays (63 x 24 bytes) of those that had one. */
#define SPARE_BLOCKS_KEPT 1024

/* Any thread, under the device's lock: a zeroed block struct, the last one c
 * kept if any (its device and its users array kept), else a new one from
 * calloc; NULL when out of memory. */
struct cache_block *cache_reclaim_reuse(struct device_cache *c);

/* Any thread, under the device's lock: b, which nothing names any more (out of
 * every list and of the address map), is RETIRED: kept by c for its next
 * piece, or put in c's surplus (for cache_reclaim_collect_spares) when c keeps
 * SPARE_BLOCKS_KEPT already. */
void cache_reclaim_retire(struct device_cache *c, struct cache_block *b);

/* Any thread, under the device's lock: how many spare structs c keeps now. */
size_t cache_reclaim_spares_kept(const struct device_cache *c);

/* Reclaimer only (or any thread not holding c's lock; takes it when there
 * is something to take): frees c's surplus.  Returns how many. */
size_t cache_reclaim_collect_spares(struct device_cache *c);

/* Shutdown (no other thread uses c): the structs c keeps and its surplus
 * go back to malloc. */
void cache_reclaim_free_spares(struct device_cache *c);

/* ---- cache_segments.c --------------------------------------------------- */

/* Any thread, under the device's lock (every function here; none makes a CUDA
 * call or blocks).  A request of piece bytes (a multiple of 512) on the stream
 * whose PENDING blocks are own (NULL: none) that no cached block fits: cut
 * from the end of the smallest block in the bins from lo up, FREE or PENDING
 * on own (size for size own's first), which keeps the rest with its state, its
 * entries and its hand-out.  Returns the piece, in no list (*same_stream: cut
 * from a PENDING block), or NULL (nothing changed) when no block is large
 * enough or no struct could be made. */
struct cache_block *cache_segments_split(struct device_cache *c,
                                         struct stream_bins *own, int lo,
                                         size_t piece, bool *same_stream);

/* FREE b merges with its FREE neighbours nothing names (b may be retired):
 * memory cut for one size serves any size again, and a segment all free
 * is whole. */
void cache_segments_merge_free(struct device_cache *c, struct cache_block *b);

/* b, just PENDING on its stream, merges with its neighbours PENDING on the
 * same stream and with FREE ones nothing names (Note [Merging at once]). */
void cache_segments_merge_pending(struct device_cache *c,
                                  struct cache_block *b);

/* A new segment [ptr, ptr + size) of c's joins c's index, which drops the
 * ranges it overlaps first (their memory was cudaFree'd behind cudefer's
 * back and allocated again).  False (nothing changed) when out of
 * memory. */
bool cache_segments_file(struct device_cache *c, const void *ptr,
                         size_t size);

/* The start of a segment of c's that [ptr, ptr + size) overlaps and that
 * does not start at ptr, or NULL when none does. */
const void *cache_segments_overlap(const struct device_cache *c,
                                   const void *ptr, size_t size);

/* The segment starting at ptr, handed back, leaves c's index. */
void cache_segments_unfile(struct device_cache *c, const void *ptr);

/* Whether ptr lies in one of c's segments; then *block is the block that
 * holds it (NULL if none is linked there, as after a block was dropped).
 * A binary search, then a walk along that segment's blocks. */
bool cache_segments_holds(struct device_cache *c, const void *ptr,
                          struct cache_block **block);

/* Shutdown: c's index goes. */
void cache_segments_index_free(struct device_cache *c);

/* ---- cache_map.c: start address -> block -------------------------------- */

/* The map from the start address of every block to the block, so that
 * defer_free tells in one look-up whether a pointer is one.  Sharded by
 * address, a mutex per shard: launching threads freeing different blocks
 * rarely meet.  No CUDA call is made here. */

/* Any thread.  The block starting at ptr, or NULL.  The struct stays valid
 * while the caller owns the block (it is released only once free). */
struct cache_block *cache_map_find(const void *ptr);

/* Any thread.  As cache_map_find, and *device the block's device, read
 * under the map's lock (a block in the map is not freed: its removal takes
 * that lock).  Only a holder of that device's lock may go on to use the
 * block (cache_find_locked). */
struct cache_block *cache_map_find_device(const void *ptr, int *device);
/* As cache_map_find_device; held (NULL: none) runs while the map's lock is
 * held, after the look-up (tests: cache_test_set_map_hook). */
struct cache_block *cache_map_find_device_held(const void *ptr, int *device,
                                               void (*held)(void));

/* Any thread holding the lock of the one device of a one-device cache
 * (set.ncaches == 1).  As cache_map_find, without the shard's lock: every
 * change of the map is made under a block's device lock too (Note
 * [Locks]), and with one device that is the lock the caller holds, so
 * nothing changes the map meanwhile.  Never with several devices: another
 * device's insert may grow the shard under the caller's feet. */
struct cache_block *cache_map_find_held(const void *ptr);

/* Any thread, holding b's device's lock.  Adds b (keyed by b->ptr); false
 * when out of memory, or when another device's block is filed under that
 * address (only a holder of that device's lock may take it out: Note
 * [Stale blocks]).  A block of b's device filed there is replaced and
 * returned in *stale (the application must have cudaFree'd it behind
 * cudefer's back), else NULL. */
bool cache_map_insert(struct cache_block *b, struct cache_block **stale);

/* Any thread, holding b's device's lock.  Removes b. */
void cache_map_remove(struct cache_block *b);

/* Shutdown, once every admitted call ended: removes every block and hands
 * it to dispose.  A call not yet admitted may still look a pointer up
 * (defer_pluggable_free's device, cache_device_of): each shard is emptied
 * under its lock, so such a look-up sees a block whole, or none. */
void cache_map_clear(void (*dispose)(struct cache_block *b));

/* Fork child: forgets every block (the structs belong to the cache);
 * remakes the locks. */
void cache_map_reset(void);

#endif
