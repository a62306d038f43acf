/* SPDX-License-Identifier: MIT */
/* The pointer set alone (CUDEFER_CHECK's record of the pointers deferred
 * and not yet released): after a removal, every other member is still
 * found, so a pointer deferred twice is still seen as a second free.
 * The backward shift of a removal must move a member whose home is the
 * very slot emptied (a mutant that moved only members homed strictly
 * before it left a hole there: the member behind it was lost, and its
 * second defer_free was taken for a first one). */
#include <stdint.h>

#include "pointer_set.h"
#include "tap.h"

/* The slot a key goes to first in a set of capacity slots (as
 * src/pointer_set.c hashes it). */
static size_t home_of(uintptr_t key, size_t capacity)
{
    return (size_t)((key >> 4) * UINT64_C(0x9e3779b97f4a7c15) >> 20) &
           (capacity - 1);
}

/* n distinct pointer-like keys (multiples of 256) that share one home in
 * a set of 1024 slots (the first table). */
static void colliding_keys(uintptr_t *keys, int n)
{
    uintptr_t first = 0x7f0000000000u;
    size_t home = home_of(first, 1024);
    keys[0] = first;
    int found = 1;
    for (uintptr_t k = first + 256; found < n; k += 256)
        if (home_of(k, 1024) == home)
            keys[found++] = k;
}

static void test_remove_keeps_same_home_members(void)
{
    uintptr_t k[3];
    colliding_keys(k, 3);
    struct pointer_set s = {0};
    ok(pointer_set_add(&s, (void *)k[0]) && pointer_set_add(&s, (void *)k[1]) &&
           pointer_set_add(&s, (void *)k[2]),
       "three pointers of one home added");
    ok(!pointer_set_add(&s, (void *)k[1]), "a second add is refused");
    pointer_set_remove(&s, (void *)k[0]); /* the first of the run */
    ok(!pointer_set_add(&s, (void *)k[1]) && !pointer_set_add(&s, (void *)k[2]),
       "after removing the run's first, the others are still members");
    is_int(s.count, 2, "two members");
    pointer_set_remove(&s, (void *)k[1]);
    ok(!pointer_set_add(&s, (void *)k[2]), "the last one still found");
    pointer_set_remove(&s, (void *)k[2]);
    is_int(s.count, 0, "empty");
    ok(pointer_set_add(&s, (void *)k[1]), "a removed pointer may come again");
    pointer_set_destroy(&s);
}

/* Many members, removed in an order unlike their insertion, through
 * growth: each is found until removed, never after. */
static void test_many(void)
{
    enum { N = 5000 };
    struct pointer_set s = {0};
    long lost = 0, ghosts = 0;
    for (uintptr_t i = 1; i <= N; i++)
        pointer_set_add(&s, (void *)(i * 256));
    for (uintptr_t i = 1; i <= N; i += 2)
        pointer_set_remove(&s, (void *)(i * 256));
    for (uintptr_t i = 1; i <= N; i++) {
        bool added = pointer_set_add(&s, (void *)(i * 256));
        if (i % 2 == 0)
            lost += added; /* a member not found */
        else {
            ghosts += !added; /* a removed one still there */
            pointer_set_remove(&s, (void *)(i * 256));
        }
    }
    is_int(lost, 0, "no member lost by the removals");
    is_int(ghosts, 0, "no removed pointer left behind");
    is_int(s.count, N / 2, "count");
    pointer_set_destroy(&s);
}

int main(void)
{
    plan_lazy();
    test_remove_keeps_same_home_members();
    test_many();
    return 0;
}
