/* SPDX-License-Identifier: MIT */
/* The reclaimer's side of the held lists (held.h): which completed
 * entries the release policy (release_policy.h) lets go now, and why, in
 * one batch per device.  Reclaimer thread only. */
#include "reclaimer_state.h"

#include <stdatomic.h>

#include "cuda.h"
#include "held.h"
#include "queue.h"
#include "release_policy.h"
#include "stats.h"
#include "trace.h"

/* The counter of batches released for reason. */
static _Atomic uint64_t *reason_counter(enum release_reason reason)
{
    switch (reason) {
    case RELEASE_IDLE:
        return &stats.idle_releases;
    case RELEASE_CAP:
        return &stats.cap_releases;
    case RELEASE_AGE:
        return &stats.age_releases;
    default:
        return &stats.demand_releases;
    }
}

/* The trace range of a batch released for reason. */
static const char *reason_name(enum release_reason reason)
{
    switch (reason) {
    case RELEASE_IDLE:
        return "cudefer: idle-time batch";
    case RELEASE_CAP:
        return "cudefer: over-cap batch";
    case RELEASE_AGE:
        return "cudefer: max-delay batch";
    default:
        return "cudefer: flush/trim batch";
    }
}

/* Device failed (device_error): every entry it holds finished as failed
 * with the device's error.  No CUDA call. */
static void abandon(int device)
{
    struct held_list *h = &rs.held[device];
    cudaError_t err = device_error(device);
    for (;;) {
        held_lock(h);
        struct entry *e = held_pop_locked(h);
        held_unlock(h);
        if (e == NULL)
            break;
        reclaimer_finish_entry(e, err);
    }
}

void reclaimer_held_release(uint64_t now)
{
    struct policy_view view = reclaimer_view_now(now);
    /* A release may block (cudaFree): once exit gave up meanwhile, no
     * device is asked for its memory, and what is held stays held. */
    for (int d = 0; d < rs.ndevices && !reclaimer_abandoned(); d++) {
        struct held_list *h = &rs.held[d];
        /* A failed device releases nothing: what it holds is abandoned in
         * the first pass that sees it failed, however it failed (a
         * launching thread's call, or this loop's own release). */
        if (device_error(d) != cudaSuccess) {
            abandon(d);
            continue;
        }
        if (h->head != NULL && release_policy_cap_follows_use(&rs.cfg) &&
            now - h->cap_at_ns >= RELEASE_POLICY_CAP_REFRESH_NS &&
            reclaimer_use_device(d))
            reclaimer_held_learn_cap(d, now);
        held_lock(h);
        enum release_reason reason = release_policy_decide(&rs.cfg, h, &view);
        held_unlock(h);
        if (reason == RELEASE_NONE)
            continue;
        uint64_t n = 0;
        trace_push(reason_name(reason));
        for (;;) {
            /* An idle-time batch yields as soon as the application is back. */
            if ((reason == RELEASE_IDLE && !queue_is_empty(&rs.queue)) ||
                reclaimer_abandoned())
                break;
            held_lock(h);
            struct entry *e = release_policy_continue(&rs.cfg, h, reason, now)
                                  ? held_pop_locked(h)
                                  : NULL;
            held_unlock(h);
            if (e == NULL)
                break;
            if (reclaimer_release_now(e, now) != cudaSuccess)
                continue; /* reported and counted as failed */
            n++;
        }
        trace_pop();
        stats_add(reason_counter(reason), n);
    }
}

void reclaimer_held_learn_cap(int device, uint64_t now)
{
    struct held_list *h = &rs.held[device];
    h->cap_at_ns = now;
    /* A set cap (max_pending_bytes) owes nothing to the device's memory:
     * no query, so none to fail and be said. */
    if (!release_policy_cap_follows_use(&rs.cfg)) {
        h->cap = release_policy_cap(&rs.cfg, 0, 0, 0);
        return;
    }
    size_t free_bytes = 0, total = 0;
    cudaError_t err = cuda_memory_info(&free_bytes, &total);
    if (err != cudaSuccess) {
        if (h->cap != 0)
            return; /* the cap learned before stays */
        total = (size_t)80 << 30; /* what today's large GPUs have */
        free_bytes = total;
        cuda_report_failure("reclaimer", "cudaMemGetInfo", err,
                    "; the cap assumes 80 GiB of device memory");
    }
    /* Device memory only: what cudefer holds of the device's used memory
     * (held pinned host memory is none of it), and the block cache's free
     * blocks there, which are cudefer's too (a device past the slots of
     * its own shares the overflow slot's count: none taken then). */
    held_lock(h);
    uint64_t held_bytes = h->device_bytes;
    held_unlock(h);
    if (stats_device_own(device))
        held_bytes += atomic_load_explicit(&stats_devices[device].free_bytes,
                                           memory_order_relaxed);
    h->cap = release_policy_cap(&rs.cfg, total, free_bytes, held_bytes);
}
