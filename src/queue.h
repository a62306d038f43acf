/* SPDX-License-Identifier: MIT */
/*
 * Intrusive multi-producer, single-consumer queue.
 *
 * Producers (any thread, the launching threads) push one node with one atomic
 * exchange and one store: wait-free, no lock, no allocation.  The consumer (the
 * reclaimer thread alone) takes the whole queue at once and walks it as a
 * batch, in push order per producer.
 */
#ifndef CUDEFER_QUEUE_H
#define CUDEFER_QUEUE_H

#include <stdatomic.h>
#include <stdbool.h>

struct queue_node {
    _Atomic(struct queue_node *) next;
};

struct queue {
    struct queue_node stub; /* stub.next is the first node */
    /* &stub when empty.  Every producer exchanges it: on a cache line of its
     * own, apart from stub.next, which the consumer clears. */
    _Alignas(64) _Atomic(struct queue_node *) tail;
};

/* A batch taken from the queue: first..last, linked by next. */
struct queue_batch {
    struct queue_node *first;
    struct queue_node *last;
};

/* Any thread, once, before use. */
void queue_init(struct queue *q);

/* Any thread.  Never blocks.  Sequentially consistent, so a producer that
 * pushes and then reads a "consumer sleeps" flag cannot miss a consumer that
 * sets the flag and then checks queue_is_empty. */
void queue_push_mpsc(struct queue *q, struct queue_node *node);

/* Any thread.  True when nothing has been pushed since the last take. */
bool queue_is_empty(struct queue *q);

/* Consumer only.  Moves every node pushed so far into *batch; returns false
 * (and leaves *batch empty) when the queue was empty.  May spin briefly on a
 * producer that is between its two steps. */
bool queue_take_all_sc(struct queue *q, struct queue_batch *batch);

/* Consumer only.  The node after node in a taken batch, or NULL after the
 * last; waits (briefly) for a producer still linking it. */
struct queue_node *queue_batch_next(const struct queue_batch *batch,
                                    struct queue_node *node);

#endif
