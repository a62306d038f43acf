/* SPDX-License-Identifier: MIT */
/* Open-addressing set of pointers with linear probing and backward-shift
 * deletion (no tombstones). */
#include "pointer_set.h"

#include <stdlib.h>

static size_t home(const struct pointer_set *s, uintptr_t key)
{
    return (size_t)((key >> 4) * UINT64_C(0x9e3779b97f4a7c15) >> 20) &
           (s->capacity - 1);
}

/* Double the table (or make the first one); false when out of memory. */
static bool grow(struct pointer_set *s)
{
    size_t capacity = s->capacity ? s->capacity * 2 : 1024;
    uintptr_t *slots = calloc(capacity, sizeof *slots);
    if (slots == NULL)
        return false;
    struct pointer_set bigger = {slots, capacity, 0};
    for (size_t i = 0; i < s->capacity; i++)
        if (s->slots[i] != 0)
            pointer_set_add(&bigger, (const void *)s->slots[i]);
    free(s->slots);
    *s = bigger;
    return true;
}

bool pointer_set_add(struct pointer_set *s, const void *p)
{
    uintptr_t key = (uintptr_t)p;
    if (2 * (s->count + 1) > s->capacity && !grow(s))
        return true;
    size_t i = home(s, key);
    while (s->slots[i] != 0) {
        if (s->slots[i] == key)
            return false;
        i = (i + 1) & (s->capacity - 1);
    }
    s->slots[i] = key;
    s->count++;
    return true;
}

void pointer_set_remove(struct pointer_set *s, const void *p)
{
    uintptr_t key = (uintptr_t)p;
    if (s->capacity == 0)
        return;
    size_t mask = s->capacity - 1, i = home(s, key);
    while (s->slots[i] != key) {
        if (s->slots[i] == 0)
            return;
        i = (i + 1) & mask;
    }
    /* Shift later members of the run back so lookups still find them. */
    for (size_t j = (i + 1) & mask; s->slots[j] != 0; j = (j + 1) & mask) {
        size_t h = home(s, s->slots[j]);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            s->slots[i] = s->slots[j];
            i = j;
        }
    }
    s->slots[i] = 0;
    s->count--;
}

void pointer_set_destroy(struct pointer_set *s)
{
    free(s->slots);
    *s = (struct pointer_set){0};
}
