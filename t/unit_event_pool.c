/* SPDX-License-Identifier: MIT */
/* The event pool (src/event_pool.c), called directly, without the rest of
 * the library: a thread's cache keeps up to min(EVENT_POOL_CACHE_MAX, N)
 * idle events of a device (N: the pool's bound, CUDEFER_EVENT_POOL) out of
 * other threads' reach, and beyond that empties into the pool, which keeps
 * N and destroys the rest; a sharing lane's take leaves the pool's reserve
 * (a quarter of N, half of the first stock at most) to lanes that hold
 * none, and its miss asks the reclaimer's refill for more, which makes
 * none on a failed device; the first stock makes no event the pool has no
 * room for; a slab holds min(N + 1, ENTRY_SLAB_ENTRIES) entries; devices
 * beyond a thread cache's 16 use the pool alone; a fork child keeps count
 * of the idle events that were in the threads' caches.  Each scenario is a
 * fresh process. */
#include <pthread.h>
#include <sys/wait.h>

#include "entry_slab.h"
#include "event_pool.h"
#include "helpers.h"

static bool failing; /* every device's sticky error, as the pool asks */

static bool device_failed(int device)
{
    (void)device;
    return failing;
}

/* n events of device 0, taken as a lane that holds none takes them (the
 * reserve too), or made when the pool has none (the first making stocks
 * the pool); false if one could not be had. */
static bool hold_events(struct shared_event **ev, int n)
{
    for (int i = 0; i < n; i++) {
        cudaError_t err;
        const char *call;
        ev[i] = event_pool_take_pooled_event(0);
        if (ev[i] == NULL)
            ev[i] = event_pool_make_event(0, &err, &call);
        if (ev[i] == NULL)
            return false;
    }
    return true;
}

/* Another thread's take of an idle event of device 0, into *found (the
 * event given back to its cache, which its exit empties into the pool). */
static void *take_one(void *found)
{
    struct shared_event *ev = event_pool_take_pooled_event(0);
    *(bool *)found = ev != NULL;
    if (ev != NULL)
        event_pool_give_event(ev);
    return NULL;
}

/* Whether another thread finds an idle event of device 0. */
static bool other_thread_takes(void)
{
    pthread_t th;
    bool found = false;
    if (pthread_create(&th, NULL, take_one, &found) != 0)
        bail("pthread_create");
    pthread_join(th, NULL);
    return found;
}

/* With a bound of n: the cache keeps min(EVENT_POOL_CACHE_MAX, n) given
 * back, which no other thread can take; one more empties the cache into
 * the pool (n kept, the rest destroyed), and its count goes to 0. */
static void cache_keeps(size_t n)
{
    enum { MOST = EVENT_POOL_CACHE_MAX + 1 };
    size_t keep = n < EVENT_POOL_CACHE_MAX ? n : EVENT_POOL_CACHE_MAX;
    struct shared_event *ev[MOST];
    CHECK(event_pool_init(1, n, device_failed) == cudaSuccess, "init");
    CHECK(hold_events(ev, (int)keep + 1), "%zu events held", keep + 1);
    CHECK(event_pool_idle_count() == 0, "none idle: %zu",
          event_pool_idle_count());
    for (size_t i = 0; i < keep; i++)
        event_pool_give_event(ev[i]);
    CHECK(event_pool_idle_count() == keep, "%zu given back, %zu idle", keep,
          event_pool_idle_count());
    CHECK(!other_thread_takes(), "another thread finds none: the %zu stay in "
          "this thread's cache", keep);
    event_pool_give_event(ev[keep]);
    size_t pooled = keep + 1 < n ? keep + 1 : n;
    CHECK(event_pool_idle_count() == pooled && fake_live_events() == pooled,
          "one more: the cache's %zu went to the pool, which keeps %zu "
          "(%zu idle, %zu live)", keep + 1, pooled, event_pool_idle_count(),
          fake_live_events());
    CHECK(other_thread_takes(), "another thread takes one of them");
    CHECK(event_pool_idle_count() == pooled, "given back by its exit: %zu "
          "idle", event_pool_idle_count());
    event_pool_destroy_all();
    CHECK(fake_live_events() == 0, "all destroyed: %zu live",
          fake_live_events());
}

static void s_cache_keeps_the_pools_bound(void)
{
    cache_keeps(4);
}

static void s_cache_keeps_its_most(void)
{
    cache_keeps(100);
}

/* N = 16: the first stock makes 16 (fewer where its 5 ms ran out) and
 * keeps a quarter of N (half of what it made at most) in reserve. */
static void s_reserve(void)
{
    enum { N = 16 };
    struct shared_event *ev[N + 1];
    CHECK(event_pool_init(1, N, device_failed) == cudaSuccess, "init");
    CHECK(hold_events(ev, 1), "an event made, the pool stocked");
    size_t stocked = event_pool_idle_count();
    size_t reserve = N / 4 < stocked / 2 ? N / 4 : stocked / 2;
    size_t spare = 0, needed = 0;
    while (spare < N &&
           (ev[1 + spare] = event_pool_take_idle_event(0)) != NULL)
        spare++;
    CHECK(spare == stocked - reserve, "a sharing lane took %zu of the %zu "
          "stocked: all but the reserve (%zu)", spare, stocked, reserve);
    while (spare + needed < N &&
           (ev[1 + spare + needed] = event_pool_take_pooled_event(0)) != NULL)
        needed++;
    CHECK(needed == reserve, "a lane that holds none took the %zu kept "
          "(%zu)", reserve, needed);
    unsigned long created = fake_calls(FAKE_EVENT_CREATE);
    size_t made = event_pool_refill();
    CHECK(made > 0 && event_pool_idle_count() == made &&
              fake_calls(FAKE_EVENT_CREATE) - created == made,
          "the sharing lane's miss asked for more: the refill made %zu", made);
    CHECK(event_pool_refill() == 0, "made once: no more asked for");
    for (size_t i = 0; i < 1 + spare + needed; i++)
        event_pool_give_event(ev[i]);
    event_pool_destroy_all();
    CHECK(fake_live_events() == 0, "all destroyed: %zu live",
          fake_live_events());
}

/* A failed device's want of idle events makes none (its events could not
 * be created, and would be only forgotten). */
static void s_no_refill_on_a_failed_device(void)
{
    CHECK(event_pool_init(1, 16, device_failed) == cudaSuccess, "init");
    failing = true;
    CHECK(event_pool_take_idle_event(0) == NULL, "none idle: the reclaimer is "
          "asked for more");
    unsigned long created = fake_calls(FAKE_EVENT_CREATE);
    CHECK(event_pool_refill() == 0 && fake_calls(FAKE_EVENT_CREATE) == created,
          "on the failed device the refill made none (%lu creations)",
          fake_calls(FAKE_EVENT_CREATE) - created);
    failing = false;
    event_pool_destroy_all();
}

/* N = 8: the first stock asks for a batch (32), but makes only the 8 the
 * pool has room for, not events it would destroy at once. */
static void s_stock_within_room(void)
{
    enum { N = 8 };
    struct shared_event *ev;
    CHECK(event_pool_init(1, N, device_failed) == cudaSuccess, "init");
    CHECK(hold_events(&ev, 1), "an event made, the pool stocked");
    size_t idle = event_pool_idle_count();
    unsigned long created = fake_calls(FAKE_EVENT_CREATE);
    CHECK(idle >= 1 && idle <= N && created == 1 + idle &&
              fake_live_events() == created,
          "%lu created: the one taken and %zu idle, none destroyed", created,
          idle);
    event_pool_give_event(ev);
    event_pool_destroy_all();
}

/* N = 100: a slab holds the entry taken and the 100 the pool keeps; the
 * 102nd entry taken maps a second slab. */
static void s_slab_of_entries(void)
{
    enum { N = 100, TAKEN = N + 2 };
    struct entry *e[TAKEN];
    size_t slabs = entry_slab_count();
    bool all = true;
    CHECK(event_pool_init(1, N, device_failed) == cudaSuccess, "init");
    for (int i = 0; i < TAKEN; i++) {
        cudaError_t err;
        const char *call;
        all &= (e[i] = event_pool_take_entry(0, &err, &call)) != NULL;
        if (i == N)
            CHECK(entry_slab_count() == slabs + 1, "%d entries of one slab",
                  N + 1);
    }
    CHECK(all && entry_slab_count() == slabs + 2, "the next maps another: "
          "%zu slabs", entry_slab_count() - slabs);
    for (int i = 0; i < TAKEN; i++)
        event_pool_give_unused(e[i]);
    event_pool_destroy_all();
    CHECK(entry_slab_count() == slabs, "all unmapped");
}

/* 17 devices: device 16, past the 16 a thread's cache serves, takes its
 * entries from its pool one at a time and keeps none in a cache (they
 * would land in another device's): of two the reclaimer gives back as one
 * batch (the pool has room for both while a third is taken), a take
 * leaves the other in the pool. */
static void s_device_past_the_caches(void)
{
    enum { DEVICES = 17, LAST = DEVICES - 1, N = 64, TAKEN = 3 };
    struct entry *e[TAKEN];
    cudaError_t err;
    const char *call;
    CHECK(event_pool_init(DEVICES, N, device_failed) == cudaSuccess, "init");
    for (int i = 0; i < TAKEN; i++)
        CHECK((e[i] = event_pool_take_entry(LAST, &err, &call)) != NULL,
              "an entry of device %d", LAST);
    e[0]->link.next = &e[1]->link;
    e[1]->link.next = NULL;
    event_pool_give_chain(LAST, &e[0]->link, NULL);
    e[0] = event_pool_take_entry(LAST, &err, &call);
    CHECK(e[0] != NULL && e[0]->device == LAST, "one of them taken");
    CHECK(event_pool_take_pooled_event(0) == NULL &&
              event_pool_idle_count() == 0,
          "device 0 has no idle event (%zu counted)",
          event_pool_idle_count());
    e[1] = event_pool_take_entry(LAST, &err, &call);
    CHECK(e[1] != NULL && e[1]->device == LAST, "then the other");
    for (int i = 0; i < TAKEN; i++)
        event_pool_give_unused(e[i]);
    event_pool_destroy_all();
}

/* A fork child: the threads' caches (this thread's here) go to the
 * pools, and their events are still counted idle. */
static void s_fork_child_counts_the_caches(void)
{
    enum { HELD = 4 };
    struct shared_event *ev[HELD];
    CHECK(event_pool_init(1, 64, device_failed) == cudaSuccess, "init");
    CHECK(hold_events(ev, HELD), "%d events held", HELD);
    for (int i = 0; i < HELD; i++)
        event_pool_give_event(ev[i]); /* into this thread's cache */
    size_t idle = event_pool_idle_count();
    pid_t pid = fork_flushed();
    if (pid == 0) {
        event_pool_after_fork();
        child_end(event_pool_idle_count() != idle);
    }
    int status = 0;
    CHECK(wait_child(pid, 10000, &status) && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "the fork child counts the %zu idle events, the %d of this thread's "
          "cache among them", idle, HELD);
    event_pool_destroy_all();
}

int main(void)
{
    plan_lazy();
    fork_scenario("a thread's cache keeps N (4) idle events, then empties "
                  "into the pool", "", 1, 30000,
                  s_cache_keeps_the_pools_bound);
    fork_scenario("a thread's cache keeps its most (64) idle events, then "
                  "empties into the pool", "", 1, 30000,
                  s_cache_keeps_its_most);
    fork_scenario("a sharing lane leaves the reserve; its miss is refilled",
                  "", 1, 30000, s_reserve);
    fork_scenario("no refill on a failed device", "", 1, 30000,
                  s_no_refill_on_a_failed_device);
    fork_scenario("the first stock makes only what the pool has room for",
                  "", 1, 30000, s_stock_within_room);
    fork_scenario("a slab holds the entry taken and what the pool keeps", "",
                  1, 30000, s_slab_of_entries);
    fork_scenario("a device past the caches' 16 uses its pool alone", "", 1,
                  30000, s_device_past_the_caches);
    fork_scenario("a fork child counts the caches' idle events", "", 1,
                  30000, s_fork_child_counts_the_caches);
    return 0;
}
