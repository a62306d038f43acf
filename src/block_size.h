/* SPDX-License-Identifier: MIT */
/*
 * The block cache's size classes, pure (no state, no lock): the classes a
 * block's size is filed in (16 per power of two, from 512 bytes to 2^40,
 * then one overflow bin), the rounding of a new block's size
 * (CUDEFER_ROUND_DIVISIONS), and the fit rule a request's search follows.
 * cache_block.h's bins are indexed by these classes.
 */
#ifndef CUDEFER_BLOCK_SIZE_H
#define CUDEFER_BLOCK_SIZE_H

#include <stddef.h>

#define MIN_SHIFT 9  /* 512 bytes: the smallest block */
#define MAX_SHIFT 40 /* classes up to 2^40 bytes */
#define STEPS_SHIFT 4 /* 16 classes per power of two */
#define STEPS (1 << STEPS_SHIFT)
#define OVERFLOW_BIN ((MAX_SHIFT - MIN_SHIFT) * STEPS + 1)
#define NBINS (OVERFLOW_BIN + 1)
#define NWORDS ((NBINS + 63) / 64)
#define MIN_BLOCK ((size_t)1 << MIN_SHIFT)

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
 * cache_segments.c), as PyTorch's roundup_power2_divisions leaves small
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

/* The fit rule: the blocks a request of bytes may take, when new blocks are
 * rounded with shift (block_round_up).  A block of at least *min bytes
 * (bytes, 512 at least) and at most *max (1/8 above what a new block for
 * the request would get), searched in the bins [*lo, *hi]. */
struct block_fit {
    size_t min, max;
    int lo, hi;
};

static inline struct block_fit block_fit_of(size_t bytes, int shift)
{
    struct block_fit f;
    f.min = bytes < MIN_BLOCK ? MIN_BLOCK : bytes;
    size_t fresh = block_round_up(f.min, shift), max_class;
    f.max = fresh + fresh / 8;
    f.lo = block_bin_of(f.min);
    f.hi = block_class_of(f.max, &max_class);
    return f;
}

#endif
