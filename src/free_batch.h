/* SPDX-License-Identifier: MIT */
/*
 * Free batches: blocks of the cache freed on the legacy stream share one
 * event (without it, about 2.5 us per defer_free in PyTorch training on an
 * H100 went to the launching thread, most of it the cudaEventRecord on
 * stream 0 and the entry each free pushed).
 *
 * A block freed with defer_free on its device's stream is reusable there at
 * once (cache.h: PENDING); its event is needed only for another
 * stream, a release or a trim.  So a free on the legacy stream parks its
 * block and adds its claim to the device's batch without recording
 * anything; the defer call that finds the batch full (free_batch claims)
 * or its oldest claim older than FREE_BATCH_AGE_NS records one event on
 * the legacy stream and pushes one entry (ENTRY_BLOCK) carrying every
 * claim of the batch.  Stream order makes that sound: each claim was added
 * after its work was enqueued, and the event is recorded after the claims
 * are taken, so it completes after all their work.
 *
 * Only the legacy stream batches.  Any thread may record on it at any time
 * and it is never destroyed, so whoever must have a batch's blocks back (a
 * flush, a trim, shutdown, exit) seals the batch itself (free_batch_seal_all);
 * a created stream could be destroyed with claims in its batch, after which
 * nobody could record on it again, and the per-thread default stream is
 * another stream on every thread.  The reclaimer never seals: an event
 * recorded on the legacy stream at its own moments could meet another
 * thread's graph capture of a blocking stream and invalidate it.
 *
 * Limit: until its batch is sealed, a block is reusable on the legacy
 * stream only (not by another stream, not released, not expired): at most
 * free_batch - 1 blocks per device wait so, until the batch fills, the
 * first defer_free on that stream once the oldest waited FREE_BATCH_AGE_NS,
 * or a defer_flush, defer_trim, shutdown or exit, whichever comes first.
 *
 * Cost: the free that seals pays the record, which in PyTorch training on
 * an H100 takes 1-4 us on the legacy stream (0.2-0.35 us in a loop): the
 * LM's frees of 4 us or more, 25-47 a step, are those seals (batches of
 * 64 seal half as often but each record takes longer: the same time a
 * step).
 *
 * Launching threads add and seal; flush, trim, shutdown and exit seal
 * everything.  One mutex per device guards its batch; no CUDA call is made
 * under it.
 */
#ifndef CUDEFER_FREE_BATCH_H
#define CUDEFER_FREE_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "cache.h"

/* A batch is sealed once its oldest claim is this old, at the next free,
 * as the coarse clock tells (clock.h: so up to one tick, 1 to 10 ms,
 * later). */
#define FREE_BATCH_AGE_NS 1000000u

/* Tests: seal batches by age after age_ns instead (UINT64_MAX: only when
 * full or on demand), so that a tick of the coarse clock between two frees
 * cannot split a batch a test fills.  Before the frees it concerns. */
void free_batch_set_age_ns(uint64_t age_ns);

/* Tests: hook (NULL: none) runs in every seal's take of claims, after it
 * read the flushes' generation and before it counts its claims (the batch's
 * lock held), so that a test can turn the generation there. */
void free_batch_set_take_hook(void (*hook)(void));

/* Start-up, under the library's start lock: ndevices batches, each sealed
 * once it holds max_claims claims (1: every free records its own event,
 * nothing is batched).  False when out of memory. */
bool free_batch_init(int ndevices, uint32_t max_claims);

/* Shutdown, after everything was sealed and the reclaimer stopped: forgets
 * the batches (a claim still in one is reported and dropped, its free
 * counted as failed: it is never released). */
void free_batch_destroy(void);

/* Fork child: forgets the batches without touching the locks' owners. */
void free_batch_fork_child(void);

/* Any thread: whether a free of a cache block on stream (its device's) is
 * to be batched: stream is the legacy stream (NULL or cudaStreamLegacy) and
 * batches hold more than one claim. */
bool free_batch_takes(cudaStream_t stream);

/* The launching thread, inside its admitted defer_free, right after the
 * claimed block was parked PENDING on the legacy stream of device
 * (stream_id its id): adds claim to device's batch.  Makes no CUDA call:
 * the device need not be current.  Returns whether it was added (false:
 * out of memory); *due_now: whether the batch is now full or old.  Blocks
 * only on the batch's mutex and in malloc. */
bool free_batch_add(int device, unsigned long long stream_id,
                    const struct block_claim *claim, bool *due_now);
/* The same thread next, when free_batch_add said the batch was due or the
 * claim not added, what its call (for messages), stream that legacy stream's
 * handle, current: whether device is current on this thread (false: the
 * switch to it failed, said by the caller): seals the batch when due, and a
 * claim not added alone, both only where current and no other thread's
 * capture bars the stream (else the batch waits for a later free or flush).
 * Never fails.  Blocks only in the fallback of a seal whose event could not
 * be recorded (it synchronizes the stream). */
void free_batch_seal(const char *what, int device, cudaStream_t stream,
                     unsigned long long stream_id,
                     const struct block_claim *claim, bool added,
                     bool due_now, bool current);
/* Any application thread that must have every batch sealed before it goes on
 * (defer_flush, defer_trim, shutdown with last, each its what for messages;
 * exit has its own, free_batch_seal_at_exit): records an event on the legacy
 * stream of each device with claims (switching the current device and back)
 * and pushes its entry; then waits until other threads' seals that took
 * claims before it looked have pushed theirs (not for seals begun later),
 * and seals once more where one of those gave its claims back (it could
 * neither record nor synchronize: said).  Blocks as free_batch_seal does,
 * and for those seals' CUDA calls.  Returns cudaSuccess, or the error that
 * left a batch it found waiting (said): cudaErrorStreamCaptureImplicit while
 * a blocking stream of the batch's device captures (any thread, any mode:
 * the legacy stream is then unusable), or the error
 * of switching to the batch's device or of the wait that replaces a failed
 * record (a sticky error of that wait fails the device: the frees it could
 * not wait for are then abandoned, counted as failed, as the reclaimer
 * abandons the device's entries).  A device that failed, or whose capture
 * check meets a sticky error (which fails it, said), has its batch
 * abandoned the same way, with no CUDA call, and its error returned.  With
 * last (shutdown: the gate closed,
 * every admitted call ended, and no free or flush to come) its lines say
 * that what it leaves waiting is dropped at the stop. */
cudaError_t free_batch_seal_all(const char *what, bool last);

/* Exit only, once the gate is closed and every admitted call ended: seals
 * every batch as free_batch_seal_all does, but never waits (the process
 * must not hang in exit): the claims of a batch that cannot get its event
 * (or whose device cannot be made current, or whose legacy stream another
 * thread's capture bars) are dropped, their blocks left PENDING, their
 * frees never released.  Returns their count: neither counted in the
 * statistics nor said (exit counts and says them with what its drain
 * gives up on). */
size_t free_batch_seal_at_exit(void);

/* Any thread: claims waiting in batches now (takes each device's batch
 * lock; for tests). */
size_t free_batch_waiting(void);

#endif
