/*
 * Event pool: entries with a CUDA event each (cudaEventDisableTiming), kept
 * for reuse so a launching thread rarely creates an event or allocates.
 *
 * Each device has a pool (a stack under a lock that guards only the stack:
 * no CUDA call is made while it is held).  Each launching thread keeps a
 * small cache per device, filled from and drained to the pool in batches,
 * so the steady state takes no lock at all.  The reclaimer gives entries
 * back in batches.
 */
#ifndef CUDEFER_EVENT_POOL_H
#define CUDEFER_EVENT_POOL_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#include "entry.h"

/* Start-up only (one thread, before any other call).  ndevices pools, each
 * keeping at most max_idle idle entries (beyond that they are destroyed).
 * Returns cudaSuccess or cudaErrorMemoryAllocation. */
cudaError_t event_pool_init(int ndevices, size_t max_idle);

/* Any thread.  An entry whose event belongs to device (taken from the
 * thread's cache; the cache refills from the pool; an empty pool means a new
 * event, created with the thread's current device switched to device and
 * back).  NULL when no event could be had, with *err and *call (the CUDA
 * call that failed). */
struct entry *event_pool_take(int device, cudaError_t *err, const char **call);

/* Any thread.  Gives back an entry taken by this thread and not pushed. */
void event_pool_give_unused(struct entry *e);

/* The reclaimer.  Gives back entries of device, chained by fifo_next. */
void event_pool_give_chain(int device, struct entry *first);

/* The reclaimer, at shutdown, once no launching thread is inside cudefer:
 * destroys every idle event, the threads' caches included. */
void event_pool_destroy_all(void);

/* Start-up failure or shutdown: forgets the (empty) pools without any CUDA
 * call. */
void event_pool_abandon(void);

/* Fork child only: makes the pools' locks usable again; no CUDA call. */
void event_pool_after_fork(void);

/* Any thread; never blocks.  Idle entries in the pools and the threads'
 * caches now; only those in the pools while another thread holds the
 * registry of caches (a thread exiting destroys events under it). */
size_t event_pool_idle_count(void);

#endif
