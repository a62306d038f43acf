/* SPDX-License-Identifier: MIT */
/* The MPSC queue alone: order per producer, nothing lost or duplicated when
 * many producers push while the consumer takes batches. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "queue.h"
#include "tap.h"

#define PRODUCERS 8
#define PER_PRODUCER 100000

struct item {
    struct queue_node node; /* first */
    int producer;
    int index;
};

static struct queue q;
static struct item items[PRODUCERS][PER_PRODUCER];

static void *produce(void *arg)
{
    int p = (int)(intptr_t)arg;
    for (int i = 0; i < PER_PRODUCER; i++) {
        items[p][i].producer = p;
        items[p][i].index = i;
        queue_push_mpsc(&q, &items[p][i].node);
    }
    return NULL;
}

static void test_single_thread(void)
{
    struct item a = {.index = 1}, b = {.index = 2};
    struct queue_batch batch;
    queue_init(&q);
    ok(queue_is_empty(&q), "new queue is empty");
    ok(!queue_take_all_sc(&q, &batch), "taking from an empty queue gets nothing");
    queue_push_mpsc(&q, &a.node);
    queue_push_mpsc(&q, &b.node);
    ok(!queue_is_empty(&q), "not empty after pushes");
    ok(queue_take_all_sc(&q, &batch), "take gets a batch");
    struct queue_node *n = batch.first;
    ok(n == &a.node, "first pushed comes first");
    n = queue_batch_next(&batch, n);
    ok(n == &b.node, "then the second");
    ok(queue_batch_next(&batch, n) == NULL, "and the batch ends");
    ok(queue_is_empty(&q), "empty after the take");
}

static void test_many_producers(void)
{
    int next[PRODUCERS] = {0};
    long taken = 0, out_of_order = 0, batches = 0;
    pthread_t t[PRODUCERS];
    queue_init(&q);
    for (int p = 0; p < PRODUCERS; p++)
        pthread_create(&t[p], NULL, produce, (void *)(intptr_t)p);
    while (taken < (long)PRODUCERS * PER_PRODUCER) {
        struct queue_batch batch;
        if (!queue_take_all_sc(&q, &batch))
            continue;
        batches++;
        for (struct queue_node *n = batch.first; n != NULL;
             n = queue_batch_next(&batch, n)) {
            struct item *it = (struct item *)n;
            out_of_order += it->index != next[it->producer];
            next[it->producer] = it->index + 1;
            taken++;
        }
    }
    for (int p = 0; p < PRODUCERS; p++)
        pthread_join(t[p], NULL);
    is_int(taken, (long)PRODUCERS * PER_PRODUCER, "every node taken once");
    is_int(out_of_order, 0, "each producer's nodes in push order");
    ok(queue_is_empty(&q), "empty at the end");
    diag("%ld nodes in %ld batches", taken, batches);
}

int main(void)
{
    plan(11);
    test_single_thread();
    test_many_producers();
    return 0;
}
