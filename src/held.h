/*
 * Held lists: completed device and pinned memory that the release policy
 * keeps for a better moment, per device, oldest first — and, for entries of
 * one whole size class, also on a shelf from which defer_alloc can take them
 * back instead of calling cudaMalloc.
 *
 * The reclaimer pushes and releases; defer_alloc (any thread) takes from a
 * shelf.  A lock per device guards the list; no CUDA call is made under it.
 */
#ifndef CUDEFER_HELD_H
#define CUDEFER_HELD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "entry.h"

/* Size classes: four per power of two (2^k, 1.25, 1.5 and 1.75 x 2^k) from
 * 512 bytes to 2^40: a request rounded up to its class wastes under 25 %. */
#define SIZE_CLASSES 128

struct held_list {
    pthread_mutex_t lock;
    struct entry *head, *tail;          /* oldest first */
    struct entry *shelf[SIZE_CLASSES];  /* reusable, newest first */
    uint64_t bytes;
    uint64_t count;
    uint64_t cap; /* bytes above which a batch is released while busy;
                     0 until the reclaimer learns it (reclaimer only) */
};

/* Any thread.  The class of a request of bytes (and the class's size), or
 * -1 when it is larger than every class. */
int size_class_of(size_t bytes, size_t *class_bytes);

/* Start-up only. */
void held_init(struct held_list *h);

void held_lock(struct held_list *h);
void held_unlock(struct held_list *h);

/* Lock held.  Append a completed entry; shelve it when it is one whole
 * class of device memory (one pointer, not pool memory). */
void held_push_locked(struct held_list *h, struct entry *e);

/* Lock held.  Remove and return the oldest entry (NULL when empty). */
struct entry *held_pop_locked(struct held_list *h);

/* Any thread (takes the lock).  Remove and return the newest shelved entry
 * of class cls, or NULL. */
struct entry *held_take_shelved(struct held_list *h, int cls);

#endif
