/* SPDX-License-Identifier: MIT */
/*
 * Time: the monotonic clock in nanoseconds, which every interval and
 * deadline of cudefer is measured on, and its conversion to the realtime
 * clock that pthread's timed waits (condition variables made without a
 * clock attribute, pthread_timedjoin_np, pthread_mutex_timedlock) take.
 */
#ifndef CUDEFER_CLOCK_H
#define CUDEFER_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Any thread: now, on the monotonic clock. */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Any thread: now, on the monotonic clock read at its last tick (1 to 10
 * ms ago): a few nanoseconds where now_ns costs tens, for bounds that a
 * tick more does not matter to (a free batch's age). */
static inline uint64_t coarse_now_ns(void)
{
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Any thread: the realtime instant at the monotonic deadline_ns (now if it
 * has passed). */
static inline struct timespec realtime_at(uint64_t deadline_ns)
{
    uint64_t now = now_ns(), wait = deadline_ns > now ? deadline_ns - now : 0;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + wait % 1000000000u;
    until.tv_sec += (time_t)(wait / 1000000000u + ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    return until;
}

#endif
