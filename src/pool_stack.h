/* SPDX-License-Identifier: MIT */
/*
 * Pool stack: the idle items of one pool (event_pool.h: entries or shared
 * events of a device), kept as a stack of batches, so that a thread
 * cache's refill takes a whole batch in O(1) under the lock.
 *
 * Why: the pool was one chain, and a refill walked BATCH items under the
 * lock, each a cache line last written by another thread (the reclaimer
 * gives them back): on an H100, in W5 runs that made no event, one
 * defer_free in 32 was slow, 2-4 us, the p99.  Now whoever gives items
 * back cuts its chain into batches before it takes the lock (the
 * reclaimer, whose items those are), and a taker pops one.
 *
 * A batch is a chain of items by their next link; its first item also
 * holds the next batch and the batch's count (pool_link).  Any thread;
 * the lock guards only the stack and its count: no CUDA call, no
 * allocation under it.
 */
#ifndef CUDEFER_POOL_STACK_H
#define CUDEFER_POOL_STACK_H

#include <pthread.h>
#include <stddef.h>

#include "entry.h"

struct pool_stack {
    pthread_mutex_t lock;
    struct pool_link *top; /* the first item of the top batch */
    size_t count;          /* items in all batches */
};

/* Start-up, or a fork child (the lock is made anew; the items stay). */
void pool_stack_init(struct pool_stack *s);

/* Any thread.  Pushes the chain at first (linked by next), cut into
 * batches of at most batch items, while the stack holds at most max
 * items; returns what did not fit, as a stack of batches (see
 * pool_stack_next_batch), and *kept how many were pushed.  The cut is
 * made before the lock is taken. */
struct pool_link *pool_stack_push(struct pool_stack *s,
                                  struct pool_link *first, size_t batch,
                                  size_t max, size_t *kept);

/* Any thread.  Pops the top batch when it has at most n items and the
 * stack keeps at least keep; else one item while it keeps keep; else
 * none.  Returns the items chained by next (NULL-terminated), *got how
 * many.  O(1) under the lock. */
struct pool_link *pool_stack_pop(struct pool_stack *s, size_t n, size_t keep,
                                 size_t *got);

/* Any thread: items in the stack now (under the lock). */
size_t pool_stack_count(struct pool_stack *s);

/* Shutdown (nobody else uses s): empties it; returns its batches. */
struct pool_link *pool_stack_take_all(struct pool_stack *s);

/* Any thread: the batch after b in a stack of batches (as push returns and
 * take_all), NULL at the end.  Each batch's items are chained by next. */
struct pool_link *pool_stack_next_batch(struct pool_link *b);

#endif
