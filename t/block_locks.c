/* SPDX-License-Identifier: MIT */
/* Every change of a block's state takes its device's lock (src/cache_block.h,
 * Note [Locks]), on the reclaimer's side too: while this thread holds device
 * 0's lock, a second thread that adopts a claimed block, completes a parked
 * block's entry, undoes a claim or parks a claimed block must wait for it
 * (seen in cache_test_waiting: a thread that finds the lock held counts
 * itself there), and changes nothing until it is let go.  No timing: the
 * test waits until the second thread either asks for the lock or is done.
 * Through src/cache.h and its tests-only lock calls. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "block_test.h"
#include "helpers.h"

static struct block_claim claim_of;
static struct block_free_plan plan_of;
static struct cache_block *block_of;
static uint64_t handout_of;
static atomic_bool done;

static void *do_adopt(void *arg)
{
    (void)arg;
    cache_reclaim_adopt(&claim_of, "defer_free");
    atomic_store(&done, true);
    return NULL;
}

static void *do_event_done(void *arg)
{
    (void)arg;
    cache_reclaim_event_done(block_of, handout_of, true, 1);
    atomic_store(&done, true);
    return NULL;
}

static void *do_undo(void *arg)
{
    (void)arg;
    cache_claim_undo(&claim_of);
    atomic_store(&done, true);
    return NULL;
}

static void *do_park(void *arg)
{
    (void)arg;
    cache_claim_park(&plan_of, 5);
    atomic_store(&done, true);
    return NULL;
}

/* Runs fn on a second thread while device 0's lock is held here: true when
 * it waited for the lock, leaving p's state as it was (before) until the
 * lock was let go. */
static bool waits_for_lock(void *(*fn)(void *), void *p, const char *what)
{
    pthread_t t;
    atomic_store(&done, false);
    enum block_state before = view(cache_test_find(p)).state;
    cache_test_lock(0);
    if (pthread_create(&t, NULL, fn, NULL) != 0)
        bail("pthread_create");
    while (cache_test_waiting(0) == 0 && !atomic_load(&done))
        sched_yield();
    bool waited = !atomic_load(&done) && cache_test_waiting(0) > 0;
    enum block_state during = view(cache_test_find(p)).state;
    cache_test_unlock(0);
    pthread_join(t, NULL);
    ok(waited && during == before,
       "%s waits for the device's lock (waited %d, state %d then %d)", what,
       (int)waited, (int)before, (int)during);
    return waited;
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    ok(cache_init(1, (size_t)1 << 20, 16), "init for one device");

    void *a = ADDR(1);
    ok(add_block(0, a, 4096, false) &&
           cache_claim(a, &claim_of) == BLOCK_AFTER_EVENT,
       "a block claimed by a free that waits for its event");
    waits_for_lock(do_adopt, a, "its adoption (cache_reclaim_adopt)");
    is_int(view(cache_test_find(a)).state, BLOCK_FREE, "then FREE");

    void *b = ADDR(2);
    ok(add_block(0, b, 4096, false), "a second block");
    block_of = cache_test_find(b);
    handout_of = free_on(b, 3);
    ok(handout_of != 0, "freed on stream 3: PENDING");
    waits_for_lock(do_event_done, b,
                   "its entry's completion (cache_reclaim_event_done)");
    is_int(view(cache_test_find(b)).state, BLOCK_FREE, "then FREE");

    void *c = ADDR(3);
    ok(add_block(0, c, 4096, false) &&
           cache_claim(c, &claim_of) == BLOCK_AFTER_EVENT,
       "a third block claimed");
    waits_for_lock(do_undo, c, "a claim's undoing (cache_claim_undo)");
    is_int(view(cache_test_find(c)).state, BLOCK_LIVE, "then LIVE");

    cache_claim_plan(c, 0, 5, &plan_of);
    is_int(plan_of.path, BLOCK_STREAM_ORDERED,
           "planned for a free on stream 5");
    waits_for_lock(do_park, c, "its parking (cache_claim_park)");
    is_int(view(cache_test_find(c)).state, BLOCK_PENDING, "then PENDING");

    cache_destroy();
    ok(!cache_active(), "destroyed");
    return 0;
}
