/* SPDX-License-Identifier: MIT */
/*
 * naive_reclaimer — the literal deferred-free design, kept in bench/ as the
 * baseline cudefer is measured against:
 *   - naive_free() creates a CUDA event, records it on the stream, and
 *     appends (ptr, event) to a mutex-protected list;
 *   - one thread wakes every poll_us microseconds, queries the event of every
 *     entry in the list (under the mutex), and calls cudaFree (and
 *     cudaEventDestroy) for each completed one (outside the mutex).
 * No batching, no event pool, no per-stream ordering tricks.
 */
#ifndef CUDEFER_BENCH_NAIVE_RECLAIMER_H
#define CUDEFER_BENCH_NAIVE_RECLAIMER_H

#include <stdint.h>
#include <sys/types.h>
#include <cuda_runtime_api.h>

struct naive_reclaimer;

struct naive_stats {
    uint64_t deferred;      /* entries accepted by naive_free */
    uint64_t released;      /* entries whose cudaFree has returned */
    uint64_t failed;        /* entries whose event query or cudaFree failed */
    uint64_t event_queries; /* cudaEventQuery calls made by the thread */
    uint64_t polls;         /* times the thread woke up */
};

/* Start the reclaimer thread (named "naive-reclaim") for the current device.
 * Returns 0, or -1 with a message on stderr. */
int naive_start(struct naive_reclaimer **out, unsigned poll_us);

/* Queue ptr for cudaFree once the work enqueued on stream so far is done.
 * On error nothing is queued and ptr still belongs to the caller. */
cudaError_t naive_free(struct naive_reclaimer *nr, void *ptr,
                       cudaStream_t stream);

/* Block until every entry queued before the call has been freed. */
void naive_drain(struct naive_reclaimer *nr);

/* Counters (a snapshot). */
void naive_stats_get(struct naive_reclaimer *nr, struct naive_stats *out);

/* Kernel thread id of the reclaimer thread (for /proc/self/task/TID). */
pid_t naive_tid(struct naive_reclaimer *nr);

/* Drain, stop and join the thread, free the reclaimer. */
void naive_stop(struct naive_reclaimer *nr);

#endif
