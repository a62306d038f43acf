/* SPDX-License-Identifier: MIT */
/* Held lists: see held.h. */
#include "held.h"

#include "lifecycle.h"
#include "stats.h"

/* Lock held: device's held bytes are h's now, unless exit abandoned what
 * was held (then they read 0: lifecycle_hooks_exit). */
static void publish_bytes(struct held_list *h)
{
    if (lifecycle_counting_begin()) {
        stats_device_held(h->device, h->bytes);
        lifecycle_counting_end();
    }
}

void held_init(struct held_list *h, int device)
{
    *h = (struct held_list){.device = device};
    pthread_mutex_init(&h->lock, NULL);
}

void held_lock(struct held_list *h)
{
    pthread_mutex_lock(&h->lock);
}

void held_unlock(struct held_list *h)
{
    pthread_mutex_unlock(&h->lock);
}

void held_push_locked(struct held_list *h, struct entry *e)
{
    e->fifo_next = NULL;
    e->held_prev = h->tail;
    if (h->tail != NULL)
        h->tail->fifo_next = e;
    else
        h->head = e;
    h->tail = e;
    h->bytes += e->held_bytes;
    if (e->held_here)
        h->device_bytes += e->held_bytes;
    h->count++;
    publish_bytes(h);
}

struct entry *held_pop_locked(struct held_list *h)
{
    struct entry *e = h->head;
    if (e == NULL)
        return NULL;
    h->head = e->fifo_next;
    if (h->head != NULL)
        h->head->held_prev = NULL;
    else
        h->tail = NULL;
    h->bytes -= e->held_bytes;
    if (e->held_here)
        h->device_bytes -= e->held_bytes;
    h->count--;
    publish_bytes(h);
    e->fifo_next = e->held_prev = NULL;
    return e;
}
