/* SPDX-License-Identifier: MIT */
/* Intrusive MPSC queue: see queue.h.  Push is exchange-then-link, so the
 * consumer can briefly see a node whose successor is not linked yet; it then
 * yields until the producer finishes its link store. */
#include "queue.h"

#include <sched.h>
#include <stddef.h>

void queue_init(struct queue *q)
{
    atomic_init(&q->stub.next, NULL);
    atomic_init(&q->tail, &q->stub);
}

void queue_push_mpsc(struct queue *q, struct queue_node *node)
{
    atomic_store_explicit(&node->next, NULL, memory_order_relaxed);
    struct queue_node *prev = atomic_exchange(&q->tail, node);
    atomic_store_explicit(&prev->next, node, memory_order_release);
}

bool queue_is_empty(struct queue *q)
{
    return atomic_load(&q->tail) == &q->stub;
}

/* Wait for the producer that owns *link to publish its node. */
static struct queue_node *wait_linked(_Atomic(struct queue_node *) *link)
{
    struct queue_node *next;
    while ((next = atomic_load_explicit(link, memory_order_acquire)) == NULL)
        sched_yield();
    return next;
}

bool queue_take_all_sc(struct queue *q, struct queue_batch *batch)
{
    batch->first = batch->last = NULL;
    if (queue_is_empty(q))
        return false;
    batch->first = wait_linked(&q->stub.next);
    /* Only the producer that swapped tail away from &stub links stub.next,
     * and it has done so: clearing it before re-arming the tail is safe. */
    atomic_store_explicit(&q->stub.next, NULL, memory_order_relaxed);
    batch->last = atomic_exchange(&q->tail, &q->stub);
    return true;
}

struct queue_node *queue_batch_next(const struct queue_batch *batch,
                                    struct queue_node *node)
{
    if (node == batch->last)
        return NULL;
    return wait_linked(&node->next);
}
