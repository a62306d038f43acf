/* SPDX-License-Identifier: MIT */
/*
 * Release policy: WHEN completed memory is released.
 *
 * cudaFree and cudaFreeHost wait for all work on the device and hold a driver
 * lock that the application's launches need, so releasing each entry as soon
 * as it completes stalls the application at every call.  Instead, completed
 * device and pinned memory is HELD, per device, oldest first, and released
 * as a batch when
 *   - the application is quiet: no stream cudefer tracks has work pending and
 *     no defer call arrived for idle_us (such a batch stops at the next
 *     defer call, so it never stands long in the application's way);
 *   - a device holds more than its cap (max_pending_bytes, or a share of
 *     the memory the application uses there: Note [The cap]): released
 *     down to half the cap, in one batch;
 *   - the oldest held entry is older than max_delay_ms;
 *   - a flush, trim or shutdown asks for everything.
 * Pool memory (cudaMallocAsync) is not held: cudaFreeAsync on the
 * reclaimer's own stream costs the application nothing.  Callbacks are not
 * held either.  With policy "eager" nothing is held.
 *
 * Everything here belongs to the reclaimer thread.
 */
#ifndef CUDEFER_RELEASE_POLICY_H
#define CUDEFER_RELEASE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "cudefer.h"
#include "entry.h"
#include "held.h"

enum release_reason {
    RELEASE_NONE,
    RELEASE_DEMAND, /* flush, trim or shutdown: everything now */
    RELEASE_IDLE,   /* the application is quiet: everything, until it is not */
    RELEASE_CAP,    /* over the cap: the oldest, down to half the cap */
    RELEASE_AGE,    /* the oldest are older than max_delay_ms */
};

/* What the reclaimer knows when it decides. */
struct policy_view {
    uint64_t now_ns;
    uint64_t last_activity_ns; /* last time new entries arrived */
    bool work_pending;         /* some tracked stream has incomplete entries */
    bool demand;               /* a flush, trim or shutdown is waiting */
};

/* True when an entry that just completed should be released at once rather
 * than held (a callback, pool memory, blocks of the cache, a synced entry,
 * whose caller waits for it, or the eager policy). */
bool release_policy_release_at_once(const struct defer_config *cfg,
                                    const struct entry *e);

/* Whether the application is quiet: no stream cudefer tracks has work
 * pending and nothing arrived for idle_us. */
bool release_policy_quiet(const struct defer_config *cfg,
                          const struct policy_view *view);

/* From when the application is quiet if nothing else arrives: idle_us
 * after the last arrival; UINT64_MAX while work is pending. */
uint64_t release_policy_quiet_at(const struct defer_config *cfg,
                                 const struct policy_view *view);

/* The policy reads a held list: call these with its lock held. */

/* Why the held entries of h should be released now, or RELEASE_NONE. */
enum release_reason release_policy_decide(const struct defer_config *cfg,
                                          const struct held_list *h,
                                          const struct policy_view *view);

/* Given reason, whether the oldest entry of h is still to be released in
 * this batch (false when h is empty). */
bool release_policy_continue(const struct defer_config *cfg,
                             const struct held_list *h,
                             enum release_reason reason, uint64_t now_ns);

/* Nanoseconds from view->now_ns until release_policy_decide could change
 * its answer for h without anything new happening (UINT64_MAX: never). */
uint64_t release_policy_wait_ns(const struct defer_config *cfg,
                                const struct held_list *h,
                                const struct policy_view *view);

/* Note [The cap]
 * In training the GPU is never idle and a step frees more than the age
 * limit lets pile up, so the cap is what bounds held memory.  A fixed
 * share of the device would let a program that keeps cudaMalloc and defers
 * its frees hold many times its working set: cudaMalloc cannot reuse held
 * memory, so every held byte adds to the program's peak.  So by default
 * the cap follows the application: a sixth (1 / RELEASE_POLICY_CAP_SHARE)
 * of the memory it uses on the device (the device's used memory less the
 * device's own memory cudefer holds there, and the free blocks of its
 * cache, whose memory is cudefer's: held pinned host memory, and
 * another device's memory freed on its streams, are not in it, though they
 * count against the cap), at least RELEASE_POLICY_CAP_FLOOR and at most a
 * quarter of the device.  The floor is for a program whose working set is
 * small but whose frees are many: each batch over the cap is a release.
 * Where a release drains the device (cudaFree, on a device without memory
 * pools) a floor of a quarter GiB cost a loop of 1 MiB frees 40 % of its run
 * time.  Released on the reclaimer's stream (Note [Releasing without a
 * drain], reclaimer_frees.c), such loops (one stream, bursts, eight threads)
 * run as fast under caps of a quarter, a half and one GiB, while a CNN whose
 * working set is 4 GiB holds 1.32 times the peak of cudaMalloc and cudaFree
 * under a floor of one GiB and 1.20 times under half a GiB.  So the floor is
 * half a GiB, and a working set of more than 3 GiB sets the cap.  A batch
 * over the cap releases down to half of it: a twelfth of the working set at
 * a time.  The reclaimer asks the device's use again every
 * RELEASE_POLICY_CAP_REFRESH_NS while it holds memory there;
 * max_pending_bytes, when set, is the cap instead. */
#define RELEASE_POLICY_CAP_SHARE 6
#define RELEASE_POLICY_CAP_FLOOR (UINT64_C(1) << 29)
#define RELEASE_POLICY_CAP_REFRESH_NS (UINT64_C(10) * 1000000)

/* The cap of a device under cfg (Note [The cap]): of total_bytes memory,
 * free_bytes of them free, held_bytes of them cudefer's own (device memory
 * it holds to release, and its cache's free blocks). */
uint64_t release_policy_cap(const struct defer_config *cfg,
                            uint64_t total_bytes, uint64_t free_bytes,
                            uint64_t held_bytes);

/* Whether the cap follows the device's use, so that the reclaimer asks for
 * it again while it holds memory (Note [The cap]). */
bool release_policy_cap_follows_use(const struct defer_config *cfg);

#endif
