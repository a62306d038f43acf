/* SPDX-License-Identifier: MIT */
/* Helpers shared by the free batch tests that run with batches of BATCH
 * blocks (t/free_batch_seals.c, t/free_batch_fallback.c): blocks on the
 * legacy stream used by held work, and the count of events recorded. */
#ifndef CUDEFER_T_FREE_BATCH_TEST_H
#define CUDEFER_T_FREE_BATCH_TEST_H

#include <stddef.h>

#include "helpers.h"

/* CUDEFER_FREE_BATCH, as each program's main sets it. */
#define BATCH 4
static const size_t KiB = 1024;

/* n blocks of bytes on the legacy stream, each used by held work (w[i]). */
static inline void alloc_used(void **p, fake_work **w, int n, size_t bytes)
{
    for (int i = 0; i < n; i++) {
        alloc_checked(&p[i], bytes, NULL);
        w[i] = work_held(NULL, p[i]);
    }
}

static inline unsigned long records(void)
{
    return fake_calls(FAKE_EVENT_RECORD);
}

#endif
