/*
 * Event pool: idle CUDA events (cudaEventDisableTiming), one pool per device,
 * reused so the launching thread rarely creates one.  A pool lock guards only
 * the list of idle events: no CUDA call is made while it is held.
 */
#ifndef CUDEFER_EVENT_POOL_H
#define CUDEFER_EVENT_POOL_H

#include <stddef.h>
#include <cuda_runtime_api.h>

/* Start-up only (one thread).  Room for ndevices pools of at most max_idle
 * idle events each.  Returns cudaErrorMemoryAllocation on failure. */
cudaError_t event_pool_init(int ndevices, size_t max_idle);

/* Any thread.  An event of device (created on it, with the calling thread's
 * current device switched for the call and switched back, when the pool is
 * empty).  Returns cudaSuccess or the error of creating one. */
cudaError_t event_pool_take(int device, cudaEvent_t *event);

/* Any thread.  Gives n idle events of device back; those beyond the bound are
 * destroyed (the calling thread's current device must be device). */
void event_pool_give(int device, cudaEvent_t *events, size_t n);

/* Reclaimer only, at shutdown: destroys every idle event (switching the
 * calling thread's device) and frees the pools. */
void event_pool_destroy_all(void);

/* Fork child only: forgets the pools without any CUDA call. */
void event_pool_abandon(void);

/* Any thread.  Idle events in all pools now. */
size_t event_pool_idle_count(void);

#endif
