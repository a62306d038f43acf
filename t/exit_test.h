/* SPDX-License-Identifier: MIT */
/* What the tests of exit's give-up share (t/exit_abandon.c,
 * t/exit_shutdown.c): a callback stuck past exit's 2 s drain, the wait for
 * it in a later exit handler, the CUDA calls the reclaimer makes after the
 * abandon, and a return hook that holds the reclaimer's first call. */
#ifndef CUDEFER_T_EXIT_TEST_H
#define CUDEFER_T_EXIT_TEST_H

#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "lifecycle.h"

static const size_t KiB = 1024;

/* Whether the stuck or blocked call has returned. */
static atomic_int call_returned;

/* In an exit handler that runs after cudefer's: wait up to 5 s for the
 * stuck callback to return (CHECKed), then settle_ms for the reclaimer's
 * pass that ran it to end. */
static inline void wait_stuck_callback(unsigned settle_ms)
{
    for (int i = 0; i < 5000 && !atomic_load(&call_returned); i++)
        sleep_ms(1);
    CHECK(atomic_load(&call_returned), "the stuck callback returned");
    sleep_ms(settle_ms);
}

static inline void stuck_callback(void *arg)
{
    (void)arg;
    sleep_ms(2500); /* the drain gives up after 2 s */
    atomic_store(&call_returned, 1);
}

/* The CUDA calls made so far by threads other than the calling one (the
 * runtime's and the graph calls): the reclaimer's, in check_no_cuda_after,
 * whose own calls (none) would not count. */
static inline unsigned long others_calls(unsigned long per_call[FAKE_NCALLS])
{
    unsigned long n = 0;
    for (int c = 0; c < FAKE_NCALLS; c++) {
        per_call[c] = fake_calls(c) - fake_thread_calls(c);
        n += per_call[c];
    }
    for (int c = 0; c < FAKE_GRAPH_NCALLS; c++)
        n += fake_graph_calls(c);
    return n;
}

/* The CUDA calls other threads (the reclaimer) made while the stuck call
 * returned and settle_ms passed (wait_stuck_callback), each kind said. */
static inline unsigned long calls_after_abandon(unsigned settle_ms)
{
    unsigned long before[FAKE_NCALLS], after[FAKE_NCALLS];
    unsigned long calls = others_calls(before);
    wait_stuck_callback(settle_ms);
    unsigned long calls_after = others_calls(after);
    for (int c = 0; c < FAKE_NCALLS; c++)
        if (after[c] != before[c])
            diag("  %s: %lu calls after the abandon",
                 fake_call_name(c), after[c] - before[c]);
    return calls_after - calls;
}

/* A return hook: the reclaimer's first call of those hooked (counted in
 * *arg, an atomic_int) returns only after 2.5 s, past exit's drain. */
static inline void hold_first_on_reclaimer(enum fake_call c, cudaError_t r,
                                    void *arg)
{
    (void)c, (void)r;
    if (!lifecycle_on_reclaimer_thread() ||
        atomic_fetch_add((atomic_int *)arg, 1) != 0)
        return;
    sleep_ms(2500);
    atomic_store(&call_returned, 1);
}

#endif
