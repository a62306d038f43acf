/* SPDX-License-Identifier: MIT */
/*
 * Held lists: completed device and pinned memory that the release policy
 * keeps for a better moment (memory the application allocated itself and
 * deferred: blocks of defer_alloc go back to the block cache instead), per
 * device, oldest first.
 *
 * Reclaimer only: it pushes, releases and reads the lists, under the
 * lock per device; other threads read no list, only the device's held
 * bytes as published to the statistics under that lock (stats_device_held,
 * stats.h).  No CUDA call is made under it.
 */
#ifndef CUDEFER_HELD_H
#define CUDEFER_HELD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "entry.h"

struct held_list {
    pthread_mutex_t lock;
    struct entry *head, *tail; /* oldest first */
    uint64_t bytes;
    /* Of bytes, those of this device's own memory (entry.held_here): not
     * the pinned host memory of defer_free_host, nor another device's
     * memory freed on this device's streams, which count in bytes (the
     * device's held bytes, and against its cap) but are no part of the
     * device's used memory, so the auto cap takes only these out of it
     * (Note [The cap]).  Invariant:
     * device_bytes <= bytes; both change together, under the lock. */
    uint64_t device_bytes;
    uint64_t count;
    uint64_t cap; /* bytes above which a batch is released while busy;
                     0 until the reclaimer learns it (reclaimer only) */
    uint64_t cap_at_ns; /* when cap was learned (reclaimer only) */
    int device;         /* whose list: its bytes are that device's
                           held_bytes (stats.h, Note [Device counters]) */
};

/* Start-up only: an empty list of device's. */
void held_init(struct held_list *h, int device);

void held_lock(struct held_list *h);
void held_unlock(struct held_list *h);

/* Lock held.  Append a completed entry. */
void held_push_locked(struct held_list *h, struct entry *e);

/* Lock held.  Remove and return the oldest entry (NULL when empty). */
struct entry *held_pop_locked(struct held_list *h);

#endif
