/*
 * Block bins: the block cache's size classes, lists and per-device state
 * (block_cache.c, block_done.c, block_segments.c), header-only.  A set of bins files
 * blocks by size class (16 classes per power of two from 512 bytes), each
 * bin a list, newest first, with a bitmap of the non-empty ones; an order
 * list keeps blocks in the order they joined it, through their lru links.
 * Callers hold the device's mutex; nothing here allocates or blocks.
 */
#ifndef CUDEFER_BLOCK_BINS_H
#define CUDEFER_BLOCK_BINS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_cache.h"

#define MIN_SHIFT 9  /* 512 bytes: the smallest block */
#define MAX_SHIFT 40 /* classes up to 2^40 bytes */
#define STEPS_SHIFT 4 /* 16 classes per power of two */
#define STEPS (1 << STEPS_SHIFT)
#define OVERFLOW_BIN ((MAX_SHIFT - MIN_SHIFT) * STEPS + 1)
#define NBINS (OVERFLOW_BIN + 1)
#define NWORDS ((NBINS + 63) / 64)
#define MIN_BLOCK ((size_t)1 << MIN_SHIFT)

struct bins {
    uint64_t nonempty[NWORDS]; /* first: one cache line, read by every search */
    struct cache_block *head[NBINS]; /* newest first */
};

/* A list in the order blocks joined it, through their lru links: a
 * device's FREE blocks (oldest free first), a stream's PENDING ones (oldest
 * freed first).  A block is on one such list at most. */
struct order_list {
    struct cache_block *oldest, *newest;
};

/* File b in its bin of s, first. */
static inline void bins_push(struct bins *s, struct cache_block *b)
{
    b->prev = NULL;
    b->next = s->head[b->bin];
    if (b->next != NULL)
        b->next->prev = b;
    s->head[b->bin] = b;
    s->nonempty[b->bin / 64] |= UINT64_C(1) << (b->bin % 64);
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
static inline struct cache_block *bins_fit(const struct bins *s, int bin, size_t min,
                                    size_t max)
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

/* ---- size classes ------------------------------------------------------- */

/* The smallest class of at least bytes, and its size in *class_bytes; the
 * overflow bin (bytes rounded to 512) above 2^40. */
static inline int block_class_of(size_t bytes, size_t *class_bytes)
{
    if (bytes <= MIN_BLOCK) {
        *class_bytes = MIN_BLOCK;
        return 0;
    }
    if (bytes > ((size_t)1 << MAX_SHIFT)) {
        *class_bytes = (bytes + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
        return OVERFLOW_BIN;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes */
    size_t base = (size_t)1 << k, step_bytes = base / STEPS;
    size_t step = (bytes - base + step_bytes - 1) / step_bytes; /* 1..STEPS */
    *class_bytes = base + step * step_bytes;
    return (k - MIN_SHIFT) * STEPS + (int)step;
}

/* The bin a block of size bytes (>= 512) is filed in: the largest class not
 * above its size, so every block in a bin above a request's is big enough. */
static inline int block_bin_of(size_t bytes)
{
    size_t class_bytes;
    int c = block_class_of(bytes, &class_bytes);
    return class_bytes > bytes && c != OVERFLOW_BIN ? c - 1 : c;
}

/* bytes rounded up to one of 2^shift sizes per power of two (shift 0..8),
 * 512 at least, to 512 bytes above 2^40.  The bins keep STEPS classes
 * whatever the rounding (their bitmap one cache line): a block of any size
 * is filed in the largest class not above it, and a search checks each
 * candidate's size.  Rounding finer than STEPS stops at steps of 512 bytes
 * (or STEPS' step, where that is less): below 512 x 2^shift bytes it would
 * make more blocks whose size is no multiple of 512 (never cut:
 * block_segments.c), as PyTorch's roundup_power2_divisions leaves small
 * sizes to 512. */
static inline size_t block_round_up(size_t bytes, int shift)
{
    if (bytes <= MIN_BLOCK)
        return MIN_BLOCK;
    if (bytes > ((size_t)1 << MAX_SHIFT))
        return (bytes + MIN_BLOCK - 1) & ~(MIN_BLOCK - 1);
    int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes */
    int fine = k - shift; /* k >= 9, shift <= 8 */
    int least = k - STEPS_SHIFT < MIN_SHIFT ? k - STEPS_SHIFT : MIN_SHIFT;
    size_t step = (size_t)1 << (fine > least ? fine : least);
    return (bytes + step - 1) & ~(step - 1);
}

/* ---- per-device state ---------------------------------------------------- */

/* Zeroed memory for n bytes (a multiple of 64: the size of a struct with
 * a 64-aligned member) on a cache line boundary, or NULL; free() it. */
static inline void *block_zalloc(size_t n)
{
    void *p = aligned_alloc(64, n);
    if (p != NULL)
        memset(p, 0, n);
    return p;
}

/* The blocks PENDING on one stream of a device, by size and, through their
 * lru links, in the order they were freed. */
struct stream_bins {
    unsigned long long stream_id;
    struct stream_bins *next;
    struct order_list order;
    _Alignas(64) struct bins bins; /* its bitmap on a line of its own */
};

#define STREAM_BUCKETS 64
#define MAX_SPARE 4

/* The address range of one segment (an allocation of cudefer's). */
struct segment_range {
    uintptr_t start, end; /* [start, end) */
};

/* A device's segments by address (block_segments.h): sorted, disjoint;
 * changed only when a segment is made or handed back. */
struct segment_index {
    struct segment_range *ranges;
    size_t count, room;
};

/* One device's cache; its mutex guards everything in it but the waiting
 * count and the surplus records' list (atomics, read as hints outside the
 * lock).  Laid out by cache line (the struct is allocated aligned): the
 * lock with the hand-out counter, which every hit writes in the same hold;
 * the rarely written rest; the two atomics; the stream buckets; the FREE
 * bins, bitmap first.  Each
 * line a call touches is a miss when PyTorch's own work ran between two
 * calls (bench/cold-calls, 2026-11-26). */
struct device_cache {
    _Alignas(64) pthread_mutex_t lock;
    uint64_t next_handout; /* unique per hand-out on this device, from 1 */
    struct stream_bins *recent; /* the bins looked up last (PyTorch works on
                                   one stream: no bucket to read) */
    struct cache_block *spare_records; /* kept for reuse (block_records.h) */
    _Alignas(64) struct stream_bins *spare; /* emptied, for reuse */
    int nspare;
    struct order_list lru; /* FREE, oldest first */
    struct segment_index segments;
    /* Written outside the lock (so on a line of their own): the threads in
     * cache_lock that found it held; the records retired beyond
     * BLOCK_RECORDS_KEPT, linked by lru_next, which the reclaimer frees
     * outside the lock (block_records_collect). */
    _Alignas(64) _Atomic unsigned waiting;
    _Atomic(struct cache_block *) surplus_records;
    _Alignas(64) struct stream_bins *streams[STREAM_BUCKETS]; /* with PENDING */
    _Alignas(64) struct bins free;                            /* FREE blocks */
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
 * counts itself in c->waiting until it has it, so that the reclaimer,
 * between two holds of a long run of work, lets it in first
 * (block_done_claims): asleep on the lock, a launching thread was
 * otherwise woken only after the reclaimer had taken it again, and waited
 * for the rest of its batch (t/cache_lock_waiters).  In the PyTorch LM on
 * an H100 such waits of 4 us or more are rare (0.5 a step; the slow frees
 * are the seals' event records, bench/results/2026-11-26-h100-slow-frees-
 * traced.txt), and spinning up to 20 us before sleeping gained nothing
 * there.  An uncontended call costs what pthread_mutex_lock does. */
static inline void cache_lock(struct device_cache *c)
{
    if (pthread_mutex_trylock(&c->lock) == 0)
        return;
    atomic_fetch_add_explicit(&c->waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->lock);
    atomic_fetch_sub_explicit(&c->waiting, 1, memory_order_relaxed);
}

/* Whether b is a whole segment (one allocation of cudefer's, uncut): the
 * only kind that goes back to the pool or to CUDA. */
static inline bool is_whole(const struct cache_block *b)
{
    return b->seg_prev == NULL && b->seg_next == NULL;
}

/* FREE b leaves c's free bins, and the age list if on it. */
static inline void free_unlink(struct device_cache *c, struct cache_block *b)
{
    bins_unlink(&c->free, b);
    if (b->in_lru) {
        order_unlink(&c->lru, b);
        b->in_lru = false;
    }
}

/* FREE b joins c's free bins, and when it is a whole segment the age list
 * (only whole segments expire: pieces cannot be released). */
static inline void free_link(struct device_cache *c, struct cache_block *b)
{
    bins_push(&c->free, b);
    if (is_whole(b)) {
        order_append(&c->lru, b);
        b->in_lru = true;
    }
}

/* The first bin in [lo, hi] non-empty in own (NULL: none) or in c's free
 * bins, or -1. */
static inline int bins_next_either(const struct device_cache *c,
                                   const struct stream_bins *own, int lo,
                                   int hi)
{
    int next_own = own != NULL ? bins_next(&own->bins, lo, hi) : -1;
    int next_free = bins_next(&c->free, lo, hi);
    return next_own < 0 ? next_free
           : next_free < 0 || next_own < next_free ? next_own : next_free;
}

/* For the files of the block cache (block_cache.c defines them).  Device
 * device's state (NULL: no such device); with its mutex held, the bins of
 * stream id's PENDING blocks (NULL: none), and PENDING b out of them (an
 * emptied stream leaves the table). */
struct device_cache *block_cache_device(int device);

/* Any thread holding no device's lock; may block on the locks.  ptr's
 * record in the block map, with its device's lock taken (*cache: the
 * caller lets it go), or NULL (nothing taken) when the map has none.  A
 * record found in the map before the lock is taken may be retired, and
 * reused for another block, or freed meanwhile (a double free racing a
 * merge): the map is asked again under the lock. */
struct cache_block *block_cache_find_locked(const void *ptr,
                                            struct device_cache **cache);
struct stream_bins *block_cache_stream_bins(struct device_cache *c,
                                            unsigned long long id);
void block_cache_stream_unlink(struct device_cache *c, struct cache_block *b);

/* Lock held.  b's work is done: FREE, filed for any stream, merged with
 * its free neighbours (b's record may be retired).  block_cache.c. */
void block_cache_make_free(struct device_cache *c, struct cache_block *b,
                           uint64_t now);

/* Lock held.  Whether b's record is to be forgotten: dropped (block_stale.h:
 * hand-out 0) and named by no entry or claim, itself or through a part. */
static inline bool block_dropped_unnamed(const struct cache_block *b)
{
    return b->handout == 0 && b->events == 0 && b->outstanding == 0;
}

/* Lock held, a claim on b let go: whether to forget b
 * (block_dropped_unnamed). */
static inline bool block_claim_let_go(struct cache_block *b)
{
    b->events--;
    return block_dropped_unnamed(b);
}

#endif
