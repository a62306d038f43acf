/*
 * Block cache: the device memory defer_alloc hands out, and what comes back.
 *
 * Memory comes in segments, each one allocation of cudefer's own (from its
 * pool, or cudaMalloc); a block is a segment or a piece of one, known by
 * its start address (block_map.h), its device and its size.  A request of
 * at least split_min_bytes (CUDEFER_SPLIT_MIN; 1 MiB by default, 0: none) that
 * no cached block fits is cut from the end of the
 * smallest larger one, FREE or PENDING on its own stream (the rest stays
 * cached in its state); a block that goes FREE merges with its FREE
 * neighbours, and one PENDING on stream S with its neighbours PENDING on S
 * and its FREE ones at once (the merged block is PENDING on S and goes
 * FREE once every part's work is done), so
 * that memory freed in pieces serves a large request again: the cache
 * holds about the live peak where unsplit blocks held the sum of each
 * size's most-live count (1.44x the live peak of a ResNet-50 step).  Only
 * whole segments go back to the pool or to CUDA.  A block is
 *   LIVE     the application's (handed out, not yet freed);
 *   FREEING  a free accepted it (any defer_free* path, on the launching
 *            thread, before its event is recorded): no other free and no
 *            defer_record_stream takes it; it goes to PENDING (a
 *            stream-ordered free), to FREE (its entry adopts it once the
 *            work is done), or back to LIVE (the free was refused after
 *            all, e.g. its event could not be recorded);
 *   PENDING  freed with defer_free on stream S, its event not yet seen
 *            complete: reusable at once, but only by a request on S — work
 *            enqueued later on S runs after the work that used it (the rule
 *            cudaMallocAsync pools and PyTorch's caching allocator follow);
 *   FREE     its work is done: reusable by any stream of its device;
 *   GONE     handed back to the pool while PENDING (see below): no longer
 *            cudefer's memory; its record lives until its entry is done;
 *   MERGED   absorbed while PENDING by its left neighbour PENDING on the
 *            same stream: its record lives, filed under its address (a
 *            second free of it is refused), until its entry is done.
 * A FREE whole segment that nobody took for cache_keep_ms is released on the
 * reclaimer thread (back to the pool of block_pool.h, or cudaFree), as is
 * every FREE block on defer_trim and shutdown.  A request that misses, when
 * the pool lacks the memory for it, hands pool blocks back to the pool, the
 * largest first, FREE ones or ones PENDING on its own stream (a free
 * ordered on that stream is as safe as reusing them there), until it lacks
 * nothing: the pool does not grow while the cache holds memory nobody
 * uses.
 *
 * Sizes: a new block for a request of n bytes gets n rounded up to one of 16
 * classes per power of two (at most 6.25 % more), from 512 bytes; a request
 * takes the smallest cached block of at least n bytes and at most 1/8
 * above that rounded size, preferring, size for size, one pending on its
 * own stream.
 *
 * Who calls what: the launching threads take, add, claim and park blocks and
 * record streams; the reclaimer completes and adopts them (adopt also on
 * a thread that releases synchronously) and collects those that leave the
 * cache (block_leave.h).  One mutex per device
 * guards its lists; no CUDA call is ever made under it.
 */
#ifndef CUDEFER_BLOCK_CACHE_H
#define CUDEFER_BLOCK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

/* A block may be recorded on this many streams besides the one it is freed
 * on (defer_free_streams takes at most 64). */
#define BLOCK_MAX_RECORDED 63

/* A stream recorded as a user of a block (defer_record_stream): its
 * handle, its id, and the device the handle named when it was recorded (a
 * special handle, 0 or cudaStreamLegacy, means the current device's
 * legacy stream: the free records its event there, on that device). */
struct block_user {
    cudaStream_t handle;
    unsigned long long id;
    int device;
};

enum block_state {
    BLOCK_LIVE,
    BLOCK_FREEING,
    BLOCK_PENDING,
    BLOCK_FREE,
    BLOCK_GONE, /* handed back to the pool while PENDING: its record waits
                   for the entries that name it, nothing else */
    BLOCK_MERGED, /* PENDING, absorbed by its left neighbour PENDING on
                     the same stream: its record waits for the entries
                     that name it and then tells the neighbour
                     (merged_into) */
    BLOCK_RETIRED /* no block: a record kept for reuse (block_records.h),
                     in no list and not in the block map */
};

struct stream_bins;

struct cache_block {
    /* Hot first: the 64 bytes a hit, a free's look-up and the bins touch
     * (at most two cache lines however malloc places the record; aligned
     * records cost more in aligned_alloc than they saved, bench/cold-calls
     * 2026-11-26); then the age list, the segment and the rest.  A call
     * touches each line it reads, a miss after PyTorch's own work between
     * two calls. */
    void *ptr;
    size_t size;
    struct cache_block *map_next;    /* block_map.c */
    struct cache_block *prev, *next; /* its bin */
    struct stream_bins *stream;      /* PENDING: the stream it may go to now */
    uint64_t handout;                /* unique per hand-out: names the owner */
    int bin;
    enum block_state state;
    struct cache_block *lru_prev; /* FREE: oldest first */
    struct cache_block *lru_next;
    /* Its neighbours in address order within its segment (the one
     * allocation it was carved from; NULL at the segment's ends): a block
     * that has none is a whole segment, the only kind that goes back to
     * the pool or to CUDA. */
    struct cache_block *seg_prev, *seg_next;
    uint64_t freed_ns; /* FREE: when its work was seen done */
    /* Merged PENDING neighbours: a block that absorbed others counts those
     * whose entries are not done (outstanding) and goes FREE only when
     * they and its own event (ready) are; MERGED records name it. */
    struct cache_block *merged_into;
    uint32_t outstanding;
    uint32_t events; /* claims and entries naming this block */
    int device;
    uint8_t nrecorded; /* defer_record_stream: at most BLOCK_MAX_RECORDED */
    bool pool; /* from cudefer's memory pool (block_pool.h): handed back
                  with cudaFreeAsync, never cudaFree */
    bool in_lru; /* on the device's FREE list by age: FREE and whole */
    bool ready;
    struct block_user *recorded; /* read only when nrecorded > 0 */
};

/* How defer_free must treat a pointer (block_cache_plan_free,
 * block_cache_claim).  Every path but the first three claimed the block
 * (FREEING). */
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
    BLOCK_AFTER_STREAMS,  /* recorded streams: a group over them */
};

struct block_free_plan {
    enum block_free_path path;
    struct cache_block *block;
    uint64_t handout;
    /* The streams the free waits for: its own, then the recorded ones
     * (AFTER_STREAMS when more than 1; the group path takes them from
     * block_users_of, so the plan only counts them). */
    size_t nstreams;
    size_t size;     /* the block's, when claimed (before any merge) */
    bool parked;     /* block_cache_plan_free_parked parked the block */
};

/* Lifecycle, under the library's start/shutdown lock: make the per-device
 * state (false when out of memory), requests of split_min_bytes or more
 * (0: none) to be cut from larger blocks, new blocks rounded up to one of
 * round_divisions sizes per power of two (a power of two, 1..256: config.c
 * checks it); forget every record after the reclaimer
 * released what it could (LIVE blocks stay the application's memory); in a
 * fork child, forget everything without touching the locks' owners. */
bool block_cache_init(int ndevices, size_t split_min_bytes,
                      unsigned round_divisions);
void block_cache_destroy(void);
void block_cache_fork_child(void);

/* The reclaimer, once a pass: frees the block records retired beyond what
 * each device keeps (block_records.h), outside the devices' locks. */
void block_cache_collect_records(void);

/* Tests: hook (NULL: none) runs in every look-up of a freed or recorded
 * pointer between the block map's answer and the device's lock, so that
 * a test can retire and reuse the record found there. */
void block_cache_set_find_hook(void (*hook)(void));

/* Any thread: true once a block was ever made (defer_free skips the lookup
 * until then). */
bool block_cache_active(void);

/* The largest request the cache takes (2^62 bytes on 64-bit): its
 * rounding, the 1/8 a request may take beyond it and a split's rest all
 * stay far from wrapping.  defer_alloc refuses larger ones. */
#define BLOCK_MAX_REQUEST (SIZE_MAX / 4 + 1)

/* Any thread, once block_cache_init ran: the size a new block for a
 * request of bytes (at most BLOCK_MAX_REQUEST) gets: bytes rounded up to
 * one of round_divisions sizes per power of two from 512 (waste under
 * 1/round_divisions), to 512 bytes above 2^40. */
size_t block_cache_round(size_t bytes);

/* Any thread.  Takes a reusable block of at least bytes for a request on
 * stream stream_id of device; LIVE now.  Its pointer (and *size its size),
 * or NULL when none fits.  Never blocks but on the device's mutex. */
void *block_cache_take(int device, unsigned long long stream_id, size_t bytes,
                       size_t *size);

/* Any thread.  Files a block fresh from cudaMalloc as LIVE, a segment of
 * its own (in the device's segment index); false when no record could be
 * allocated (the caller keeps plain cudaMalloc memory). */
bool block_cache_add(int device, void *ptr, size_t size, bool pool);

/* Any thread, the block's owner.  Decides how defer_free(ptr) on stream
 * stream_id of stream_device goes (see enum block_free_path: a pointer
 * that starts no block is BLOCK_INSIDE when it lies in a segment of the
 * cache's, which only such a miss looks up, else BLOCK_NOT_OURS); streams
 * recorded that are stream_id itself do not count.  A LIVE block is claimed
 * (FREEING) in the same step, so that of two frees only one is accepted:
 * the caller then parks it, hands the claim (plan->block, plan->handout)
 * to an entry, or gives it back with block_cache_unclaim.  Never blocks but on the device's mutex. */
void block_cache_plan_free(void *ptr, int stream_device,
                           unsigned long long stream_id,
                           struct block_free_plan *plan);

/* The same, and a BLOCK_STREAM_ORDERED block is parked (block_cache_park)
 * in the same lock hold (plan->parked): for a free that is sure to be
 * accepted if its path is that one (it then joins a free batch,
 * free_batch.h, which records nothing that could fail). */
void block_cache_plan_free_parked(void *ptr, int stream_device,
                                  unsigned long long stream_id,
                                  struct block_free_plan *plan);

/* A free's claim on a block, carried by its entry to the release: the
 * record it made FREEING and that hand-out (block NULL: the pointer was no
 * block when the free was accepted).  A claim holds one of the record's
 * events (an entry names it), so the record outlives it; the release (or
 * unclaim) acts on that record, never on whatever block starts at the
 * pointer by then (an interior pointer's address may be cut as another
 * owner's block meanwhile). */
struct block_claim {
    struct cache_block *block;
    uint64_t handout;
};

/* Any thread, the block's owner, for the frees that wait for more than one
 * stream-ordered event (several pointers, several streams, a graph capture,
 * a synchronous release).  Claims the LIVE block at ptr (FREEING; its entry
 * adopts it once the work is done) into *claim: BLOCK_AFTER_EVENT.
 * BLOCK_NOT_OURS when ptr is no block nor in the cache's memory;
 * BLOCK_NOT_LIVE (nothing changed) when it is a block already being freed
 * or free, BLOCK_INSIDE when it starts no block but lies in the cache's
 * memory: the free must be refused; then claim->block is NULL.  Never
 * blocks but on the devices' mutexes. */
enum block_free_path block_cache_claim(void *ptr, struct block_claim *claim);

/* Any thread, for the report of a free refused as BLOCK_INSIDE: true when
 * ptr lies in a block the application holds (LIVE: an interior pointer),
 * false when in one free or being freed (freed twice?) or in none. */
bool block_cache_inside_live(const void *ptr);

/* Any thread, the free that made claim (block_cache_claim, or a plan's
 * block and hand-out), refused after all: the block is LIVE again (the
 * application's).  Nothing when claim->block is NULL. */
void block_cache_unclaim(const struct block_claim *claim);

/* Any thread, once the free of a BLOCK_STREAM_ORDERED plan is sure to be
 * accepted (its event recorded): the claimed block becomes PENDING on
 * stream_id, named by the entry that carries the plan's claim.  False
 * (nothing changed) when it is not the plan's claimed block any more (no
 * caller should see that).  A batched free parks in its plan instead
 * (block_cache_plan_free_parked). */
bool block_cache_park(const struct block_free_plan *plan,
                      unsigned long long stream_id);


/* Any thread: a record that left the cache (block_leave.h) or that no
 * entry names any more is freed. */
void block_cache_forget(struct cache_block *block);

#endif
