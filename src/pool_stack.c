/* SPDX-License-Identifier: MIT */
/* A pool's idle items as a stack of batches: see pool_stack.h. */
#include "pool_stack.h"

void pool_stack_init(struct pool_stack *s)
{
    pthread_mutex_init(&s->lock, NULL);
}

/* Cut the chain at first into batches of at most batch items (no lock:
 * the caller's chain); returns the first batch. */
static struct pool_link *cut(struct pool_link *first, size_t batch)
{
    struct pool_link *head = NULL, *prev_head = NULL;
    while (first != NULL) {
        struct pool_link *b = first, *tail = first;
        size_t k = 1;
        while (k < batch && tail->next != NULL) {
            tail = tail->next;
            k++;
        }
        first = tail->next;
        tail->next = NULL;
        b->batch_count = k;
        b->next_batch = NULL;
        if (prev_head != NULL)
            prev_head->next_batch = b;
        else
            head = b;
        prev_head = b;
    }
    return head;
}

/* Split batch b after its first k items (0 < k < its count); returns the
 * second part as a batch of its own, b's next batch after it. */
static struct pool_link *split(struct pool_link *b, size_t k)
{
    struct pool_link *tail = b;
    for (size_t i = 1; i < k; i++)
        tail = tail->next;
    struct pool_link *rest = tail->next;
    tail->next = NULL;
    rest->batch_count = b->batch_count - k;
    rest->next_batch = b->next_batch;
    b->batch_count = k;
    b->next_batch = rest;
    return rest;
}

struct pool_link *pool_stack_push(struct pool_stack *s,
                                  struct pool_link *first, size_t batch,
                                  size_t max, size_t *kept)
{
    size_t got = 0;
    struct pool_link *b = cut(first, batch), *head = b, *keep_last = NULL;
    pthread_mutex_lock(&s->lock);
    size_t room = max > s->count ? max - s->count : 0;
    while (b != NULL && got < room) {
        if (b->batch_count > room - got) /* at the bound: part of it */
            split(b, room - got);
        got += b->batch_count;
        keep_last = b;
        b = b->next_batch;
    }
    if (keep_last != NULL) {
        keep_last->next_batch = s->top;
        s->top = head;
        s->count += got;
    }
    pthread_mutex_unlock(&s->lock);
    *kept = got;
    return b;
}

struct pool_link *pool_stack_pop(struct pool_stack *s, size_t n, size_t keep,
                                 size_t *got)
{
    struct pool_link *l = NULL;
    size_t taken = 0;
    pthread_mutex_lock(&s->lock);
    struct pool_link *top = s->top;
    size_t avail = s->count > keep ? s->count - keep : 0;
    if (top != NULL && avail > 0) {
        l = top;
        if (top->batch_count <= n && top->batch_count <= avail) {
            taken = top->batch_count;
            s->top = top->next_batch;
        } else { /* one item; the rest of its batch stays on top */
            taken = 1;
            struct pool_link *second = top->next;
            if (second != NULL) {
                second->batch_count = top->batch_count - 1;
                second->next_batch = top->next_batch;
                s->top = second;
            } else {
                s->top = top->next_batch;
            }
            l->next = NULL;
        }
        s->count -= taken;
    }
    pthread_mutex_unlock(&s->lock);
    *got = taken;
    return l;
}

size_t pool_stack_count(struct pool_stack *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->count;
    pthread_mutex_unlock(&s->lock);
    return n;
}

struct pool_link *pool_stack_take_all(struct pool_stack *s)
{
    struct pool_link *top = s->top;
    s->top = NULL;
    s->count = 0;
    return top;
}

struct pool_link *pool_stack_next_batch(struct pool_link *b)
{
    return b->next_batch;
}
