/*
 * Block bins: the block cache's lists (block_cache.c), header-only.  A set
 * of bins files blocks by size class (16 classes per power of two from 512
 * bytes: block_cache.c maps a size to its bin), each bin a list, newest
 * first, with a bitmap of the non-empty ones; an order list keeps blocks in
 * the order they joined it, through their lru links.  Callers hold the
 * device's mutex; nothing here allocates or blocks.
 */
#ifndef CUDEFER_BLOCK_BINS_H
#define CUDEFER_BLOCK_BINS_H

#include <stddef.h>
#include <stdint.h>

#include "block_cache.h"

#define MIN_SHIFT 9  /* 512 bytes: the smallest block */
#define MAX_SHIFT 40 /* classes up to 2^40 bytes */
#define STEPS 16     /* classes per power of two */
#define OVERFLOW_BIN ((MAX_SHIFT - MIN_SHIFT) * STEPS + 1)
#define NBINS (OVERFLOW_BIN + 1)
#define NWORDS ((NBINS + 63) / 64)
#define MIN_BLOCK ((size_t)1 << MIN_SHIFT)

struct bins {
    struct cache_block *head[NBINS]; /* newest first */
    uint64_t nonempty[NWORDS];
    uint64_t count;
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
    s->count++;
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
    s->count--;
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

#endif
