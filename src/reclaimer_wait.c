/* SPDX-License-Identifier: MIT */
/* The reclaimer's wait between passes (see reclaimer_state.h): a nap while
 * work is pending, the policy's next deadline while only held memory waits,
 * and a sleep until a push once there is nothing at all. */
#include "reclaimer_state.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cache.h"
#include "capture.h"
#include "clock.h"
#include "held.h"
#include "queue.h"
#include "release_policy.h"

/* Sleep until something is pushed or stop is requested, or (deadline_ns on
 * the monotonic clock, if not UINT64_MAX) a cached block expires. */
static void sleep_until_pushed(uint64_t deadline_ns)
{
    /* wake_cond waits on the realtime clock. */
    struct timespec until = {0};
    if (deadline_ns != UINT64_MAX)
        until = realtime_at(deadline_ns);
    pthread_mutex_lock(&rs.wake_lock);
    atomic_store(&rs.sleeping, true);
    while (queue_is_empty(&rs.queue) && !atomic_load(&rs.stop) &&
           !capture_news()) {
        if (deadline_ns == UINT64_MAX)
            pthread_cond_wait(&rs.wake_cond, &rs.wake_lock);
        else if (pthread_cond_timedwait(&rs.wake_cond, &rs.wake_lock,
                                        &until) == ETIMEDOUT)
            break;
    }
    atomic_store(&rs.sleeping, false);
    pthread_mutex_unlock(&rs.wake_lock);
}

static void nap_us(uint64_t us)
{
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000),
                          .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t held_count(void)
{
    uint64_t n = 0;
    for (int d = 0; d < rs.ndevices; d++) {
        held_lock(&rs.held[d]);
        n += rs.held[d].count;
        held_unlock(&rs.held[d]);
    }
    return n;
}

#define NS_PER_MS UINT64_C(1000000)

/* When the next cached segment is released (UINT64_MAX: none, or never),
 * as the pass's cache release decides (reclaimer.c): cache_keep_ms after it
 * was freed if the application is quiet then, else once it is, at most 4 x
 * cache_keep_ms after; never for a failed device's blocks.  A deadline
 * that ignored the quiet rule would pass with the segment not released,
 * and end the timed sleep at once, pass after pass. */
static uint64_t cache_release_ns(void)
{
    if (rs.cfg.cache_keep_ms == 0)
        return UINT64_MAX;
    uint64_t keep = (uint64_t)rs.cfg.cache_keep_ms * NS_PER_MS;
    struct policy_view view = reclaimer_view_now(0);
    uint64_t quiet_at = release_policy_quiet_at(&rs.cfg, &view);
    uint64_t next = UINT64_MAX;
    for (int d = 0; d < rs.ndevices; d++) {
        uint64_t freed = cache_reclaim_oldest_free_ns(d);
        if (freed == UINT64_MAX || device_error(d) != cudaSuccess)
            continue;
        uint64_t at = freed + keep;
        if (at < quiet_at)
            at = quiet_at < freed + 4 * keep ? quiet_at : freed + 4 * keep;
        if (at < next)
            next = at;
    }
    return next;
}

/* Wait for the next pass.  Polling backs off from poll_us to poll_max_us
 * while nothing happens; with only held entries the wait ends at the
 * policy's next deadline; with nothing at all, after a short linger (so a
 * steady trickle of calls costs no wake-ups), the thread sleeps until a push
 * wakes it. */
void reclaimer_wait_for_work(bool progress, uint64_t now)
{
    const struct defer_config *cfg = &rs.cfg;
    rs.nap_us = progress ? cfg->poll_us
                        : (rs.nap_us * 2 < cfg->poll_max_us ? rs.nap_us * 2
                                                           : cfg->poll_max_us);
    if (rs.incomplete > 0 || capture_news()) {
        nap_us(rs.nap_us);
        return;
    }
    if (held_count() > 0) {
        struct policy_view view = reclaimer_view_now(now);
        uint64_t wait = UINT64_MAX;
        for (int d = 0; d < rs.ndevices; d++) {
            held_lock(&rs.held[d]);
            uint64_t w = release_policy_wait_ns(cfg, &rs.held[d], &view);
            held_unlock(&rs.held[d]);
            if (w < wait)
                wait = w;
        }
        uint64_t us = wait / 1000;
        nap_us(us < cfg->poll_us ? cfg->poll_us
                                 : us > cfg->poll_max_us ? cfg->poll_max_us : us);
        return;
    }
    if (now - rs.last_activity_ns < (uint64_t)cfg->poll_max_us * 1000) {
        nap_us(rs.nap_us);
        return;
    }
    sleep_until_pushed(cache_release_ns());
}
