/* SPDX-License-Identifier: MIT */
/* Entry slabs (src/entry_slab.h): a slab's entries, its unmapping when the
 * last is freed, and the library's use of them: a burst's slabs go back
 * once it drains (but for what the pools keep, the limit in entry_slab.h),
 * CUDEFER_EVENT_POOL=0 keeps none, shutdown unmaps every one.  Each
 * scenario is a fresh process. */
#include <stdint.h>

#include "entry.h"
#include "entry_slab.h"
#include "helpers.h"

static void test_slab(void)
{
    size_t before = entry_slab_count(), n = 0;
    struct entry *e = entry_slab_make(20, &n);
    ok(e != NULL && n == 20, "a slab of 20 asked for holds 20 (%zu)", n);
    int zeroed = 1, same_slab = 1, aligned = 1;
    for (size_t i = 0; i < n; i++) {
        zeroed &= e[i].kind == 0 && e[i].ev == NULL && e[i].ptrs == NULL &&
                  e[i].fn == NULL && !e[i].pooled;
        same_slab &= e[i].slab != NULL && e[i].slab == e[0].slab;
        aligned &= (uintptr_t)&e[i] % _Alignof(struct entry) == 0;
    }
    ok(zeroed && same_slab && aligned, "zeroed, aligned, all of one slab");
    is_int(entry_slab_count(), before + 1, "one more slab mapped");
    for (size_t i = 1; i < n; i++)
        entry_slab_free(&e[i]);
    is_int(entry_slab_count(), before + 1, "mapped while one entry is not "
           "freed");
    entry_slab_free(&e[0]);
    is_int(entry_slab_count(), before, "unmapped with its last entry");
    e = entry_slab_make(0, &n);
    ok(e != NULL && n == 1 && e->slab == NULL &&
           entry_slab_count() == before,
       "below %d, one entry, calloc'ed (%zu, no slab)", ENTRY_SLAB_MIN, n);
    entry_slab_free(e);
    e = entry_slab_make(ENTRY_SLAB_MIN, &n);
    ok(e != NULL && n == ENTRY_SLAB_MIN && e->slab != NULL,
       "%d: a slab (%zu)", ENTRY_SLAB_MIN, n);
    for (size_t i = 0; i < n; i++)
        entry_slab_free(&e[i]);
    e = entry_slab_make(SIZE_MAX, &n);
    ok(e != NULL && n == ENTRY_SLAB_ENTRIES, "at most %d (%zu)",
       ENTRY_SLAB_ENTRIES, n);
    for (size_t i = n; i-- > 0;) /* any order */
        entry_slab_free(&e[i]);
    is_int(entry_slab_count(), before, "all unmapped");
}

static void count(void *arg)
{
    (void)arg;
}

enum { BURST = 20000 };

/* CUDEFER_EVENT_POOL=64: slabs of 65 (no more than a pool keeps, and the
 * one taken).  20,000 callbacks behind held work map about 300; once they
 * ran, no more stay mapped than idle entries are kept (64 in the pool, 64
 * in this thread's cache), and shutdown unmaps every one. */
static void s_burst_drains(void)
{
    cudaStream_t s = stream_new();
    fake_work *gate = work_held(s, NULL);
    for (int i = 0; i < BURST; i++)
        CHECK(defer_call(count, NULL, s) == cudaSuccess, "defer_call %d", i);
    size_t burst = entry_slab_count();
    CHECK(burst >= BURST / 65, "%zu slabs for %d pending callbacks", burst,
          BURST);
    fake_complete(gate);
    CHECK(defer_flush() == cudaSuccess, "flush");
    size_t drained = entry_slab_count();
    CHECK(drained <= 128, "%zu slabs mapped once they ran (128 at most)",
          drained);
    cudaStreamDestroy(s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(entry_slab_count() == 0, "%zu slabs mapped after shutdown",
          entry_slab_count());
    CHECK(fake_violations() == 0, "oracle");
}

/* CUDEFER_EVENT_POOL=0: nothing idle is kept, so entries are calloc'ed
 * one at a time (a slab a free would be mapped and unmapped each time),
 * none mapped, all freed. */
static void s_no_pool_keeps_none(void)
{
    cudaStream_t s = stream_new();
    fake_work *w = work_held(s, NULL);
    for (int i = 0; i < 100; i++) {
        void *p = device_alloc(64);
        CHECK(defer_free(p, s) == cudaSuccess, "defer_free %d", i);
    }
    CHECK(entry_slab_count() == 0, "%zu slabs mapped for 100 pending frees",
          entry_slab_count());
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().released == 100, "all released");
    cudaStreamDestroy(s);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_violations() == 0, "oracle");
}

int main(void)
{
    plan_lazy();
    test_slab();
    fork_scenario("a burst's slabs are unmapped once it drains, all at "
                  "shutdown", "CUDEFER_EVENT_POOL=64", 1, 60000,
                  s_burst_drains);
    fork_scenario("CUDEFER_EVENT_POOL=0 maps no slab", "CUDEFER_EVENT_POOL=0",
                  1, 30000, s_no_pool_keeps_none);
    return 0;
}
