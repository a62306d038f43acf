/* SPDX-License-Identifier: MIT */
/*
 * Pointer set: the pointers deferred and not yet released, for
 * CUDEFER_CHECK=1 (a pointer deferred again while pending is reported, not
 * freed twice).  Open addressing; owned by the reclaimer thread alone.
 */
#ifndef CUDEFER_POINTER_SET_H
#define CUDEFER_POINTER_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pointer_set {
    uintptr_t *slots; /* 0: empty */
    size_t capacity;  /* a power of two, or 0 */
    size_t count;
};

/* Adds p; false if it was already there (or no memory: then nothing is
 * checked for p, and it is not reported). */
bool pointer_set_add(struct pointer_set *s, const void *p);

/* Removes p if present. */
void pointer_set_remove(struct pointer_set *s, const void *p);

void pointer_set_destroy(struct pointer_set *s);

#endif
