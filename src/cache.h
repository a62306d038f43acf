/* SPDX-License-Identifier: MIT */
/*
 * The block cache: the device memory defer_alloc hands out, and what comes
 * back to it.  This header is the module's interface to the rest of src/.
 * Its one private header, cache_block.h, holds the block (struct
 * cache_block), its states and every transition, the per-device cache and
 * the lock rules, and includes the pure size classes (block_size.h); only
 * the module's own files include them.
 *
 * Memory comes in segments, each one allocation of cudefer's own from the
 * upstream pool (or cudaMalloc where there is none); a block is a segment
 * or a piece of one, known by its start address, its device and its size.
 * A block freed with defer_free on stream S is reusable at once by a
 * request on S (work enqueued later on S runs after the work that used it:
 * the rule cudaMallocAsync pools and PyTorch's caching allocator follow),
 * and by any stream of its device once its work is done.  A request that
 * no cached block fits is cut from a larger one; freed neighbours merge
 * again; only whole segments leave the cache.  A request that misses, when
 * the upstream pool lacks the memory for it, hands cached segments back to
 * the pool first, so the pool does not grow while the cache holds memory
 * nobody uses.
 *
 * Which file holds what:
 *   cache.c           the devices' caches and their streams' bins; start
 *                     and shutdown; take (a hit) and add (a new segment);
 *                     the look-ups under a device's lock and a free's
 *                     parking; the tests' view.
 *   cache_claim.c     a free's plan and claim (LIVE to FREEING, parked
 *                     PENDING), letting a claim go, a request's claims and
 *                     their refusals.
 *   cache_users.c     the streams recorded as a block's users
 *                     (defer_record_stream).
 *   cache_reclaim.c   the reclaimer side: a claim's work done (PENDING to
 *                     FREE, MERGED and GONE blocks settled), a release's
 *                     adoption, the blocks that leave the cache (expiry,
 *                     trim, a miss's hand-back) and their release; spare
 *                     block structs kept for reuse.
 *   cache_segments.c  split and merge; the segment index.
 *   cache_map.c       start address -> block.
 *   cache_stale.c     blocks freed with cudaFree behind cudefer's back,
 *                     dropped when CUDA gives their memory out again.
 *   cache_upstream.c  the stream-ordered upstream memory pool per device.
 *   cache_hand_back.c a miss's hand-back of cached segments to that pool.
 *
 * Threads: launching threads take, add, claim and park blocks and add
 * their users; the reclaimer completes claims and releases what leaves the
 * cache (a launching thread also completes claims in a free batch's
 * fallback and adopts blocks in a synchronous release).  One mutex per
 * device guards its blocks; no CUDA call is made under it (cache_block.h,
 * Note [Locks]).
 */
#ifndef CUDEFER_CACHE_H
#define CUDEFER_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

struct cache_block;     /* a block: private (cache_block.h) */
struct cuda_switch;   /* cuda.h */
struct request_args;    /* request_args.h */

/* The states of a block.  Who moves a block between them, when and under
 * which lock: cache_block.h, Note [Block states]. */
enum block_state {
    BLOCK_LIVE,    /* the application's: handed out, not yet freed */
    BLOCK_FREEING, /* a free accepted it; no other free or user takes it */
    BLOCK_PENDING, /* freed on stream S, its work not seen done: S's only */
    BLOCK_FREE,    /* its work done: any stream of its device may take it */
    BLOCK_GONE,    /* handed back upstream while PENDING: the struct waits
                      for the entries that name it, nothing else */
    BLOCK_MERGED,  /* PENDING, absorbed by its left neighbour PENDING on
                      the same stream: the struct waits for its entries,
                      then tells that neighbour (merged_into) */
    BLOCK_RETIRED  /* no block: a struct kept for reuse, in no list and
                      not in the address map */
};

/* ---- cache_users.c: a block's users (defer_record_stream) --------------- */

/* A block may have this many users besides the stream it is freed on
 * (defer_free_streams takes at most 64 streams). */
#define BLOCK_MAX_USERS 63

/* A stream recorded as a user of a block: its handle, its id, and the
 * device the handle named when it was recorded (a special handle, 0 or
 * cudaStreamLegacy, means that device's legacy stream: the free records
 * its event there, on that device). */
struct block_user {
    cudaStream_t handle;
    unsigned long long id;
    int device;
};

/* Any thread, the block's owner.  Records user as a user of the LIVE block
 * at ptr.  cudaSuccess (also when already recorded), cudaErrorInvalidValue
 * when ptr is no live block, cudaErrorNotSupported when it has
 * BLOCK_MAX_USERS already (both reported), cudaErrorMemoryAllocation.
 * Blocks on the device's mutex only. */
cudaError_t cache_users_add(void *ptr, const struct block_user *user);

/* Any thread, the block's owner.  The users of the LIVE (or claimed:
 * FREEING) block at ptr, copied to out (BLOCK_MAX_USERS of room) when not
 * NULL; how many (0 when ptr is no such block).  Blocks on the device's
 * mutex only. */
size_t cache_users_of_block(const void *ptr, struct block_user *out);

/* Launching thread.  How many streams the blocks of a's free have as
 * users (a stream that several of them have counted once when out is not
 * NULL); their frees must wait for those streams too.  Copied to out (64
 * of room) when not NULL; a count above 64 means too many.  Blocks on the
 * devices' mutexes only. */
size_t cache_users_of_free(const struct request_args *a,
                           struct block_user *out);

/* Any thread.  Makes the device u's handle means current, where it is a
 * special handle of another device than the current one (a created stream
 * carries its device: nothing to do).  cudaSuccess or cuda_switch_device's
 * error, *call naming the call that failed; cuda_switch_back makes the
 * caller's device current again. */
cudaError_t cache_users_enter(const struct block_user *u,
                              struct cuda_switch *sw, const char **call);

/* Any thread.  Whether u and v are the same stream: the same handle, and
 * for a special handle (0, the legacy or the per-thread stream) the same
 * device, where a device below 0 means the caller's (asked once, sw): the
 * legacy streams of two devices share a handle. */
bool cache_users_same(const struct block_user *u, const struct block_user *v,
                      struct cuda_switch *sw);

/* ---- a free's claim: the types ------------------------------------------ */

/* How defer_free must treat a pointer (cache_claim_plan, cache_claim).
 * Every path but the first three claimed the block (FREEING). */
enum block_free_path {
    BLOCK_NOT_OURS,       /* not a block: the ordinary release */
    BLOCK_NOT_LIVE,       /* a block already being freed or free: refuse */
    BLOCK_INSIDE,         /* no block starts there, but it lies in memory
                             of the cache's: an interior pointer, or a
                             block freed again after it merged: refuse */
    BLOCK_STREAM_ORDERED, /* record an event, park, push an ENTRY_BLOCK
                             (a batched free: parked by the plan, its
                             claim joins a free batch) */
    BLOCK_AFTER_EVENT,    /* another device's stream: the ordinary entry,
                             adopted back when its event completed */
    BLOCK_AFTER_STREAMS,  /* users recorded: a group over their streams */
};

struct block_free_plan {
    enum block_free_path path;
    struct cache_block *block;
    uint64_t handout;
    /* The streams the free waits for: its own, then its users' (AFTER_STREAMS
     * when more than 1; the group path takes them from cache_users_of_free,
     * so the plan only counts them). */
    size_t nstreams;
    size_t size;     /* the block's, when claimed (before any merge) */
    int device;      /* the block's (a block never changes device) */
    bool parked;     /* cache_claim_plan_parked parked the block */
};

/* A free's claim on a block, carried by its entry to the release: the
 * block it made FREEING and that hand-out (block NULL: the pointer was no
 * block when the free was accepted).  A claim counts among the block's
 * events, so the struct outlives it; the release (or unclaim) acts on that
 * struct, never on whatever block starts at the pointer by then (an
 * interior pointer's address may be cut as another owner's block
 * meanwhile). */
struct block_claim {
    struct cache_block *block;
    uint64_t handout;
};

/* Any thread holding claim (block not NULL): the block's start address,
 * fixed while a claim names it. */
void *cache_claim_ptr(const struct block_claim *claim);

/* ---- cache.c: the launching side ---------------------------------------- */

/* Lifecycle, under the library's start/shutdown lock: make the per-device
 * state (false when out of memory), requests of split_min_bytes or more
 * (0: none) to be cut from larger blocks, new blocks rounded up to one of
 * round_divisions sizes per power of two (a power of two, 1..256: config.c
 * checks it); forget every block after the reclaimer released what it
 * could (LIVE blocks stay the application's memory); in a fork child,
 * forget everything without touching the locks' owners. */
bool cache_init(int ndevices, size_t split_min_bytes,
                unsigned round_divisions);
void cache_destroy(void);
void cache_fork_child(void);

/* Any thread: true once a block was ever made (defer_free skips the look-up
 * until then). */
bool cache_active(void);

/* The largest request the cache takes (2^62 bytes on 64-bit): its
 * rounding, the 1/8 a request may take beyond it and a split's rest all
 * stay far from wrapping.  defer_alloc refuses larger ones. */
#define BLOCK_MAX_REQUEST (SIZE_MAX / 4 + 1)

/* Any thread, once cache_init ran: the size a new block for a request of
 * bytes (at most BLOCK_MAX_REQUEST) gets: bytes rounded up to one of
 * round_divisions sizes per power of two from 512 (waste under
 * 1/round_divisions), to 512 bytes above 2^40. */
size_t cache_round(size_t bytes);

/* Any thread.  Takes a reusable block of at least bytes for a request on
 * stream stream_id of device; LIVE now.  Its pointer (and *size its size),
 * or NULL when none fits.  Never blocks but on the device's mutex. */
void *cache_take(int device, unsigned long long stream_id, size_t bytes,
                 size_t *size);

/* Any thread.  Files new memory fresh from upstream (upstream: from the
 * upstream pool, else cudaMalloc) as a LIVE block, a segment of its own,
 * for what, the call the user made (which says any stale block the
 * memory replaces: Note [Stale blocks]); false when no block struct could
 * be allocated (the caller keeps plain memory).  Never blocks but on the
 * devices' mutexes. */
bool cache_add(const char *what, int device, void *ptr, size_t size,
               bool upstream);

/* Any thread.  Whether the cache is for one device (device 0: every block
 * is on it, so the device of a pointer that is a block needs no look-up).
 * Never blocks; a call not admitted may see it change at a start or a
 * shutdown, so it only spares a look-up that an admitted one repeats. */
bool cache_one_device(void);

/* Any thread, before its admission too (cache_map_clear waits for the
 * look-up): whether ptr starts a block, and then *device its device.
 * Never blocks but on the address map's mutex. */
bool cache_device_of(const void *ptr, int *device);

/* Any thread: a block struct that left the cache (cache_reclaim_expired)
 * or that nothing names any more is freed. */
void cache_forget(struct cache_block *block);

/* ---- cache_claim.c: a free's plan and claim ----------------------------- */

/* Any thread, the block's owner.  Decides how defer_free(ptr) on stream
 * stream_id of stream_device goes (see enum block_free_path: a pointer
 * that starts no block is BLOCK_INSIDE when it lies in a segment of the
 * cache's, which only such a miss looks up, else BLOCK_NOT_OURS); users
 * that are stream_id itself do not count.  A LIVE block is claimed
 * (FREEING) in the same step, so that of two frees only one is accepted:
 * the caller then parks it, hands the claim (plan->block, plan->handout)
 * to an entry, or gives it back with cache_claim_undo.  Never blocks but on
 * the device's mutex. */
void cache_claim_plan(void *ptr, int stream_device,
                      unsigned long long stream_id,
                      struct block_free_plan *plan);

/* The same, and a BLOCK_STREAM_ORDERED block is parked (cache_claim_park) in
 * the same lock hold (plan->parked): for a free that is sure to be accepted if
 * its path is that one (it then joins a free batch, free_batch.h, which
 * records nothing that could fail). */
void cache_claim_plan_parked(void *ptr, int stream_device,
                             unsigned long long stream_id,
                             struct block_free_plan *plan);

/* Either of the two (park: cache_claim_plan_parked), block_device the
 * device of ptr's block if ptr is one, when the caller knows it
 * (cache_device_of, cache_one_device; -1: not known), which spares the
 * look-up of ptr's device before its lock: the block is looked up under
 * that lock either way, and found on another device looked up afresh. */
void cache_claim_plan_on(void *ptr, int block_device, int stream_device,
                         unsigned long long stream_id, bool park,
                         struct block_free_plan *plan);

/* Any thread, once the free of a BLOCK_STREAM_ORDERED plan is sure to be
 * accepted (its event recorded): the claimed block becomes PENDING on
 * stream_id, named by the entry that carries the plan's claim.  False
 * (nothing changed) when it is not the plan's claimed block any more (no
 * caller should see that).  A batched free parks in its plan instead
 * (cache_claim_plan_parked).  Never blocks but on the device's mutex. */
bool cache_claim_park(const struct block_free_plan *plan,
                      unsigned long long stream_id);

/* Any thread, the block's owner, for the frees that wait for more than one
 * stream-ordered event (several pointers, several streams, a graph capture,
 * a synchronous release).  Claims the LIVE block at ptr (FREEING; its entry
 * adopts it once the work is done) into *claim: BLOCK_AFTER_EVENT.
 * BLOCK_NOT_OURS when ptr is no block nor in the cache's memory;
 * BLOCK_NOT_LIVE (nothing changed) when it is a block already being freed
 * or free, BLOCK_INSIDE when it starts no block but lies in the cache's
 * memory: the free must be refused; then claim->block is NULL.  Never
 * blocks but on the devices' mutexes. */
enum block_free_path cache_claim(void *ptr, struct block_claim *claim);

/* cache_claim_check_said's line, for a mismatch it found. */
void cache_claim_report_said(const void *ptr, size_t size, int device,
                             size_t said_bytes, int said_device);
/* Any thread: a block of size bytes on device at ptr, just claimed by
 * defer_pluggable_free, which said it has said_bytes on said_device: a
 * size above the block's or another device is reported (the block is
 * freed all the same).  Size 0 fits every block, but its device is checked
 * all the same: the device is said whatever the size.  Every route of that
 * free checks its claim here, so that none lets a mismatch go unsaid; no
 * other free calls it (they say neither).  Never blocks. */
static inline void cache_claim_check_said(const void *ptr, size_t size,
                                          int device, size_t said_bytes,
                                          int said_device)
{
    /* Inline: every pluggable free runs the test, one in many reports. */
    if (size < said_bytes || device != said_device)
        cache_claim_report_said(ptr, size, device, said_bytes, said_device);
}

/* Any thread, the free that made claim (cache_claim, or a plan's block and
 * hand-out), refused after all: the block is LIVE again (the
 * application's).  Nothing when claim->block is NULL. */
void cache_claim_undo(const struct block_claim *claim);

/* Any thread, for the report of a free refused as BLOCK_INSIDE: true when
 * ptr lies in a block the application holds (LIVE: an interior pointer),
 * false when in one free or being freed (freed twice?) or in none. */
bool cache_claim_inside_live(const void *ptr);

/* Launching thread, inside a defer call.  *a = *given with room for the
 * claims of its frees: one (*one) for a single pointer, an array for
 * several; none when a is no free of device memory or the cache is not in
 * use (no pointer can be a block).  False when out of memory.
 * cache_claim_room_free gives the room back once the call is over (an entry
 * copied the claims it carries). */
bool cache_claim_room(const struct request_args *given, struct request_args *a,
                      struct block_claim *one);
void cache_claim_room_free(struct request_args *a, struct block_claim *one);

/* Launching thread, the free paths but the single stream-ordered one
 * (whose plan claims its block, cache_claim_plan): claims every block among
 * a's pointers (FREEING) before anything is recorded, so that a block
 * freed twice, by any paths, is refused at the second free; a block that
 * defer_pluggable_free said otherwise is reported (cache_claim_check_said).
 * cudaSuccess (*claimed: whether any pointer was a block), or
 * cudaErrorInvalidValue (reported, counted; nothing claimed) when one is
 * already being freed or free, or starts no block inside the cache's
 * memory. */
cudaError_t cache_claim_all(const struct request_args *a, bool *claimed);

/* Launching thread, once a's free is refused after its blocks were
 * claimed: they are the caller's again. */
void cache_claim_undo_all(const struct request_args *a);

/* Launching thread.  The refusals (reported, counted in rejected;
 * cudaErrorInvalidValue): ptr is a block already free or being freed;
 * ptr lies inside the cache's memory but starts no block (an interior
 * pointer, or a block freed twice after it merged). */
cudaError_t cache_claim_refuse_freed(const struct request_args *a,
                                     const void *ptr);
cudaError_t cache_claim_refuse_inside(const struct request_args *a,
                                      const void *ptr);

/* ---- cache_reclaim.c: the reclaimer side -------------------------------- */

/* The reclaimer, or a thread that waited for the work itself (a free
 * batch's fallback).  The work of n claims (an entry's, a free batch's),
 * each naming a block (block not NULL), completed (ok) or never will: a
 * PENDING block of that hand-out is FREE from now, a MERGED part tells the
 * block it was merged into, a struct nothing names any more is retired.
 * Takes each device's mutex once for a run of its claims, 8 claims at
 * most a hold, after letting threads that already wait for it in (Note
 * [Letting waiters in]); makes no CUDA call. */
void cache_reclaim_claims_done(const struct block_claim *claims, size_t n,
                               bool ok, uint64_t now);
/* The same for one claim: block, hand-out handout. */
void cache_reclaim_event_done(struct cache_block *block, uint64_t handout,
                              bool ok, uint64_t now);

/* Any thread releasing a pointer whose work is done (the reclaimer, or a
 * synchronous release), of a free that claimed a block (claim->block not
 * NULL); blocks on the device's mutex: that block is FREE now, reusable by
 * any stream.  A block dropped meanwhile (its memory was cudaFree'd behind
 * cudefer's back and its address allocated again) is reported, naming
 * what, the free call the user made, and let go.  Either way the pointer
 * must not be cudaFree'd. */
void cache_reclaim_adopt(const struct block_claim *claim, const char *what);

/* Any thread releasing a pointer whose free claimed no block (it was none
 * when the free was accepted); blocks on the device's mutex.  True
 * (reported) when a whole segment starts at ptr now, which must not be
 * cudaFree'd under the cache (its address was cudaFree'd and allocated
 * again behind cudefer's back, or it is a block freed twice after cudefer
 * released it); false when ptr is no block, or a piece of a segment (the
 * pointer was interior when deferred: cudaFree refuses it as it would have
 * then).  Changes no block. */
bool cache_reclaim_unclaimed_is_block(void *ptr);

/* Reclaimer only.  Removes FREE whole segments of device that became free
 * at or before freed_before_ns (UINT64_MAX: all) and that nothing names,
 * oldest first, into out: at most max of them, and no more once their
 * sizes add up to max_bytes (SIZE_MAX: no such limit).  The caller
 * releases each (cache_upstream_free for an upstream one, else cudaFree)
 * and gives it to cache_forget.  Returns how many.  Holds the device's
 * mutex while it picks; no CUDA call. */
size_t cache_reclaim_expired(int device, uint64_t freed_before_ns,
                             struct cache_block **out, size_t max,
                             size_t max_bytes);

/* Reclaimer only, device current.  Releases what cache_reclaim_expired
 * takes (at most 64 at a time, until none is left): an upstream segment
 * back to the pool, ordered on stream (cache_upstream_free: with cudaFree
 * where that fails; NULL: with cudaFree), another with cudaFree (which
 * drains the device); each is then forgotten.  A sticky
 * error is handed to fail (device, the call by name, the error); another is
 * reported.  stop (NULL: none) is asked before each segment after the
 * first: once it says true (exit gave up its drain while a release
 * blocked), no further segment is released nor taken, and no CUDA call is
 * made (the ones taken stay out of the cache, unreleased: the process is
 * ending).  Counts the segments released (cache_releases) and those whose
 * release failed, out of the cache with their memory not given back
 * (cache_release_failures), and returns the bytes that left the device:
 * an upstream segment's leave it only when the pool's reserve shrinks
 * (cache_upstream_trim). */
size_t cache_reclaim_release(int device, uint64_t freed_before_ns,
                             cudaStream_t stream,
                             void (*fail)(int device, const char *call,
                                          cudaError_t err),
                             bool (*stop)(void));

/* The memory of a block that left the cache. */
struct block_memory {
    void *ptr;
    size_t size;
};

/* A request that missed, on stream stream_id of device.  Removes upstream
 * whole segments that are FREE (free at or before freed_before_ns, named
 * by no entry) or PENDING on that stream, the largest first (size for
 * size, FREE first), at most max of them and no more once their sizes add
 * up to max_bytes, and copies their memory to out: the caller hands it
 * back upstream, ordered on that very stream.  The structs are not the
 * caller's: a FREE one is retired here; a PENDING one is GONE and goes (on
 * the reclaimer) once the entry that names it is done, which may be before
 * the caller reads out.  Returns how many.  Never blocks but on the
 * device's mutex. */
size_t cache_reclaim_for_miss(int device, unsigned long long stream_id,
                              uint64_t freed_before_ns,
                              struct block_memory *out, size_t max,
                              size_t max_bytes);

/* Reclaimer only.  The time from which cache_reclaim_expired takes a FREE
 * segment of device: the first one nothing names, at the latest free time
 * of the segments before it on the age list (UINT64_MAX: none).  The
 * reclaimer sleeps until then plus cache_keep_ms; an earlier time would
 * end every such sleep at once.  Blocks on the device's mutex only. */
uint64_t cache_reclaim_oldest_free_ns(int device);

/* Reclaimer only, once a pass: frees the spare block structs retired beyond
 * what each device keeps (Note [Spare blocks]), outside the devices'
 * locks. */
void cache_reclaim_collect(void);

/* ---- cache_hand_back.c: a miss's hand-back ------------------------------ */

/* Any thread, admitted (the pools and the cache exist), holding no lock of
 * cudefer's.  A request on stream (id stream_id) of device missed; its new
 * block is of need bytes.  When the device's pool lacks that much memory,
 * cached segments go back to it, ordered on the request's stream, until it
 * has enough: FREE ones (free before before_ns, so none that turned free
 * during the request's search) or ones PENDING on this very stream (freed
 * on it, so a free ordered on it is safe), the largest first
 * (cache_reclaim_for_miss).  Their memory then serves this request
 * whatever its size, and the pool does not grow while the cache holds
 * memory nobody asks for.  Only what is lacking goes back: the rest stays
 * cached for the requests that follow (handing back every free block made
 * ~700 requests of a ResNet-50 step miss on the H100).  Why the largest: a
 * large block covers this request in one hand-back and leaves slack in the
 * pool for the misses after it, which then take nothing from the cache;
 * the oldest first handed back many blocks that later requests missed for
 * (t/alloc_steady: 55 misses a step, 27 with the largest first, both at
 * ~1.01x the live peak).  A block whose cudaFreeAsync fails goes with
 * cudaFree (said as what's); one neither releases is lost to the pool
 * (counted in cache_release_failures) and ends the hand-back.  Never waits
 * for the GPU; nothing without a pool (cudaMalloc segments). */
void cache_hand_back(const char *what, int device, size_t need,
                     cudaStream_t stream, unsigned long long stream_id,
                     uint64_t before_ns);

/* ---- cache_upstream.c: the upstream pool -------------------------------- */

/* One stream-ordered memory pool of cudefer's own per device
 * (cudaMemPoolCreate; its release threshold the maximum, so memory stays
 * with the pool), created on the first miss.  The pool makes memory
 * fungible: free segments of one size handed back to it (cudaFreeAsync, no
 * device drain) serve requests of any other size, which the cache's size
 * classes alone cannot do.  Where no pool can be made, segments come from
 * cudaMalloc (reported once). */

/* Start-up (the lifecycle lock held): room for ndevices; false when out of
 * memory.  Shutdown: destroy the pools (memory still allocated from one is
 * released by CUDA once freed).  Fork child: forget them. */
bool cache_upstream_init(int ndevices);
void cache_upstream_destroy(void);
void cache_upstream_fork_child(void);

/* Any thread.  bytes of new memory on device for use on stream (stream's
 * device is device): from the pool, ordered on stream (*upstream true), or
 * from cudaMalloc.  Returns the CUDA error; an error that is not sticky
 * (out of memory, a bad argument) leaves the runtime's last error clear.
 * The first call on a device creates its pool, under a lock that only
 * that creation takes; an allocation from a pool waits for a trim under
 * way (cache_upstream_trim).  what: the call the user made (defer_alloc,
 * defer_pluggable_alloc...), which says a failure here. */
cudaError_t cache_upstream_malloc(const char *what, int device, size_t bytes,
                                  cudaStream_t stream, void **ptr,
                                  bool *upstream);

/* Any thread, while the library is running.  Whether bytes exceed all of
 * device's memory, so that no allocation of them can succeed (the first
 * call asks cudaGetDeviceProperties, once per device); false when that is
 * not known.  Never blocks on the GPU. */
bool cache_upstream_beyond_device(int device, size_t bytes);

/* Any thread: whether device has a pool (it was used for segments). */
bool cache_upstream_exists(int device);

/* Any thread, while the library is running (the pools exist).  Lets peer's
 * kernels and copies use the memory of device's pool (cudaMemPoolSetAccess;
 * peer access, cudaDeviceEnablePeerAccess, does not reach a pool's
 * memory), creating the pool if it is not made yet (a failure said as
 * defer_peer_access's, the call that asks).  cudaSuccess where
 * device has no pool (its segments are cudaMalloc's, which peer access
 * covers) and for peer == device; cudaErrorInvalidDevice for a device or
 * peer the library does not know; cudaErrorPeerAccessUnsupported where
 * peer cannot access device (cudaDeviceCanAccessPeer); else
 * the error of the CUDA call *call names, the runtime's last error left
 * clear for one that is not sticky.  Never blocks on the GPU. */
cudaError_t cache_upstream_grant(int device, int peer, const char **call);

/* Any thread.  Hands bytes at ptr from device's pool back to it, ordered
 * on stream (cudaFreeAsync: the memory serves the next request on stream
 * at once, any stream once stream reached the free; NULL is the legacy
 * stream); where cudaFreeAsync fails with an error that is not sticky
 * (said as what's), with cudaFree, which drains the device and so is safe
 * for a block pending on any stream.  Returns the error of the last call
 * made, *call its name: on an error the memory is lost to the pool, still
 * lent in its books.  The runtime's last error is left clear for an error
 * that is not sticky. */
cudaError_t cache_upstream_free(const char *what, int device, void *ptr,
                                size_t bytes, cudaStream_t stream,
                                const char **call);
/* The same with cudaFree alone, for a caller that has no stream to order
 * the free on. */
cudaError_t cache_upstream_free_sync(int device, void *ptr, size_t bytes);

/* Any thread, while the library is running (the pools exist).  bytes taken
 * from device's pool are no block of the cache any more, though not handed
 * back through cache_upstream_free (memory that could not be filed, a
 * block dropped because its memory was freed behind cudefer's back): the
 * pool stops counting them as lent. */
void cache_upstream_forget(int device, size_t bytes);

/* Any thread.  The memory device's pool holds but no block uses: what it
 * has reserved from CUDA less what was taken from it and not handed back.
 * A request of at most this many bytes is likely served without the pool
 * growing (fragmentation aside).  0 without a pool or when the pool cannot
 * say; never blocks on the GPU. */
size_t cache_upstream_slack(int device);

/* Reclaimer only (device current): releases the pool's unused memory to
 * CUDA.  Segments handed back on a stream are the pool's unused memory
 * only once that stream reached their frees: the caller waits for it
 * first (and says a failed wait).  A sticky error of the trim is handed to
 * fail (device, the call by name, the error); another is reported.
 * Returns the bytes by which the pool's reserve shrank (0 without a
 * pool), exact: no allocation from the pool is made meanwhile. */
size_t cache_upstream_trim(int device,
                           void (*fail)(int device, const char *call,
                                        cudaError_t err));

/* ---- tests only --------------------------------------------------------- */

/* For the unit tests in t/ (the library never calls these): what a test
 * needs to see or stage of the cache's private state.  Each reads or
 * writes without taking the device's lock, but cache_test_lock: the test
 * makes sure no other thread changes the block or the cache meanwhile. */

/* A copy of a block's fields. */
struct block_view {
    void *ptr;
    size_t size;
    int device;
    enum block_state state;
    uint64_t handout;
    uint64_t freed_ns;                /* FREE: when its work was seen done */
    uint32_t events;                  /* claims and entries naming it */
    uint32_t outstanding;             /* MERGED parts not done */
    const struct cache_block *merged_into; /* MERGED: the block it is in */
    unsigned nusers;
    bool whole;                       /* a whole segment */
};

/* The block filed at ptr in the address map, or NULL. */
struct cache_block *cache_test_find(const void *ptr);
/* block's fields. */
struct block_view cache_test_view(const struct cache_block *block);
/* Adds delta to the claims and entries naming block (as if an older entry
 * still named it, and then no more). */
void cache_test_add_events(struct cache_block *block, int delta);
/* How many spare block structs device keeps. */
size_t cache_test_spares(int device);
/* Takes device's mutex as every caller does (a thread that finds it held
 * counts itself a waiter: cache_block.h, cache_lock), and lets it go. */
void cache_test_lock(int device);
void cache_test_unlock(int device);
/* The threads counted as waiting for device's mutex; set that count. */
unsigned cache_test_waiting(int device);
void cache_test_set_waiting(int device, unsigned n);
/* hook (NULL: none) runs in every look-up of a freed or recorded pointer
 * between the address map's answer and the device's lock (with one device,
 * before the lock and the one look-up under it), so that a test can
 * retire and reuse the block found there. */
void cache_test_set_find_hook(void (*hook)(void));
/* hook (NULL: none) runs in cache_device_of's look-up (defer_pluggable_free
 * before its admission) while it holds the address map's lock, so that a
 * test can shut down meanwhile. */
void cache_test_set_map_hook(void (*hook)(void));

#endif
