/* SPDX-License-Identifier: MIT */
/* Free batches: blocks freed on the legacy stream share one event (see the
 * header). */
#include "free_batch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "capture.h"
#include "clock.h"
#include "cuda.h"
#include "entry.h"
#include "event_pool.h"
#include "lifecycle.h"
#include "report.h"
#include "stats.h"
#include "stream_identity.h"
#include "stream_lane.h"

/* One device's batch: the claims of blocks parked PENDING on its legacy
 * stream that no event covers yet, oldest first.  Aligned, its first line
 * holds what every free reads and writes (the lock, the array, the counts
 * and the age): under PyTorch each line a free touches is a miss
 * (cache_block.h, Note [Cache lines]).  32-bit counts keep them on it: a
 * batch that would pass 2^31 claims is out of memory (append). */
struct batch {
    _Alignas(64) pthread_mutex_t lock;
    struct block_claim *claims;
    uint32_t count, room;
    uint64_t oldest_ns; /* when claims[0] was added */
    /* The legacy stream's id, written by the free that adds a batch's first
     * claim (every free of the batch names the same stream: its device's
     * legacy one), read by a seal of the whole batch (seal_batches). */
    unsigned long long stream_id;
};

/* Where pthread_mutex_t is larger than glibc's 40 bytes on x86-64 (48 on
 * aarch64), the age spills onto the next line. */
_Static_assert(sizeof(pthread_mutex_t) > 40 ||
                   offsetof(struct batch, oldest_ns) + sizeof(uint64_t) <= 64,
               "a batch's lock, claims, counts and age share one cache line");

static struct batch *batches;
static int nbatches;
static uint32_t max_claims;
static _Atomic uint64_t age_ns = FREE_BATCH_AGE_NS;
/* Claims taken by a seal and not yet pushed (nor given back), counted in
 * the generation current when the seal took them.  A flush, once its own
 * scan took what waited, starts a new generation and waits until none of
 * the old one is in flight, so that its barrier covers every free that
 * returned before it, also one whose claim another thread's seal took.
 * Seals begun after the turn count in the new generation: with one count
 * a flush waited for those too, until the other threads stopped freeing
 * (7-2079 ms with two threads freeing nonstop, 2 ms a record;
 * t/free_batch_flush scenario_flush_not_starved).  turn: one flush turns
 * the generation at a time (the next waits for the one before). */
static _Atomic size_t in_flight[2];
static _Atomic unsigned generation;
static pthread_mutex_t turn = PTHREAD_MUTEX_INITIALIZER;
/* Claims given back by a seal that could not be pushed, ever: a flush
 * that saw some come back while it waited seals once more. */
static _Atomic unsigned long given_back;
/* The calling thread's own give-backs among them: a seal_all's own failed
 * seal is no reason for a second round, which would fail and say so
 * again. */
static _Thread_local unsigned long given_back_mine;

/* Set by shutdown's seal (free_batch_seal_all with last), false from
 * free_batch_init until then: no free or flush comes after it, so what it
 * leaves in a batch is dropped at the stop (free_batch_destroy, said),
 * never sealed later; its lines say so.  Written only by the shutting-down
 * thread, once the gate is closed and every admitted call ended; read by
 * any thread's seal (atomic: a seal of another thread may read it while a
 * flush runs; relaxed, as nothing else is published through it). */
static _Atomic bool sealing_last;

/* What becomes of the claims a seal leaves in their batch, for its line. */
static const char *left_in_batch(const char *later)
{
    if (atomic_load_explicit(&sealing_last, memory_order_relaxed))
        return "; blocks freed on the legacy stream are dropped at the stop, "
               "never released";
    return later;
}

/* Tests: called between reading the generation and counting. */
static void (*_Atomic take_hook)(void);

void free_batch_set_take_hook(void (*hook)(void))
{
    atomic_store(&take_hook, hook);
}

/* Counts n claims in flight (with a batch's lock held, when taken from
 * it); returns the generation to land them in.  A flush that turns the
 * generation between the read and the count would not see the count, and
 * a later flush would wait for the other generation: the claims of frees
 * that returned before it would be missed.  So
 * the generation is read again after counting (sequentially consistent
 * with the flush's turn and its wait), and the count moved where it
 * changed.  Only a flush whose scan came before this take can turn it
 * meanwhile (the take holds the batch's lock), so this ends. */
static unsigned take_off(size_t n)
{
    unsigned gen = atomic_load(&generation);
    void (*hook)(void) = atomic_load(&take_hook);
    if (hook != NULL)
        hook();
    for (;;) {
        atomic_fetch_add(&in_flight[gen & 1u], n);
        unsigned now = atomic_load(&generation);
        if (now == gen)
            return gen & 1u;
        atomic_fetch_sub(&in_flight[gen & 1u], n);
        gen = now;
    }
}

/* n claims of generation g pushed or given back. */
static void land(unsigned g, size_t n)
{
    atomic_fetch_sub_explicit(&in_flight[g], n, memory_order_release);
}

static void reset_flights(void)
{
    atomic_store(&in_flight[0], 0);
    atomic_store(&in_flight[1], 0);
}

bool free_batch_init(int ndevices, uint32_t max)
{
    size_t bytes = (size_t)(ndevices > 0 ? ndevices : 1) * sizeof *batches;
    batches = aligned_alloc(64, bytes); /* a multiple of 64: _Alignas */
    if (batches == NULL)
        return false;
    memset(batches, 0, bytes);
    for (int d = 0; d < ndevices; d++)
        pthread_mutex_init(&batches[d].lock, NULL);
    nbatches = ndevices;
    max_claims = max;
    atomic_store_explicit(&sealing_last, false, memory_order_relaxed);
    reset_flights();
    return true;
}

void free_batch_destroy(void)
{
    for (int d = 0; d < nbatches; d++) {
        /* Each was counted deferred (submit_join_batch): abandoned, as at
         * exit or in a fork child, so that none stays pending for good.
         * Only defer_shutdown leaves any (exit's seal drops and counts its
         * own; a failed start had no free yet). */
        if (batches[d].count > 0) {
            stats_add(&stats.failed, batches[d].count);
            report("defer_shutdown: %u blocks freed on device %d's legacy "
                   "stream were never sealed: their records are dropped "
                   "(counted as failed)", batches[d].count, d);
        }
        free(batches[d].claims);
        pthread_mutex_destroy(&batches[d].lock);
    }
    free(batches);
    batches = NULL;
    nbatches = 0;
    reset_flights();
}

void free_batch_fork_child(void)
{
    /* The child has no CUDA and no use for the parent's records; another
     * thread may have held a lock at the fork. */
    batches = NULL;
    nbatches = 0;
    reset_flights();
    pthread_mutex_init(&turn, NULL);
}

bool free_batch_takes(cudaStream_t stream)
{
    /* Not on the reclaimer thread: a callback's free during the shutdown
     * drain must be pushed before the drain ends, and nobody would seal
     * it after the drain's own seal. */
    return max_claims > 1 && stream_is_legacy(stream) &&
           !lifecycle_on_reclaimer_thread();
}

size_t free_batch_waiting(void)
{
    size_t n = 0;
    for (int d = 0; d < nbatches; d++) {
        pthread_mutex_lock(&batches[d].lock);
        n += batches[d].count;
        pthread_mutex_unlock(&batches[d].lock);
    }
    return n;
}

static bool append(struct batch *b, const struct block_claim *claim,
                   uint64_t now);

/* Claims taken by a seal that could not be pushed go back to device's
 * batch, to be sealed later (their work is not known to be done, so their
 * blocks stay PENDING: reusable on the legacy stream only).  One that
 * finds no room (out of memory) stays so for good, its free never
 * released: reported and counted as failed (each was counted deferred). */
static void give_back_claims(const char *what, int device,
                             const struct block_claim *claims, size_t n)
{
    struct batch *b = &batches[device];
    size_t lost = 0;
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < n; i++)
        lost += !append(b, &claims[i], coarse_now_ns());
    pthread_mutex_unlock(&b->lock);
    atomic_fetch_add(&given_back, 1);
    given_back_mine++;
    if (lost > 0) {
        lifecycle_count_finished(false, lost);
        report("%s: out of memory for %zu claims of blocks freed on the "
               "legacy stream: they stay reusable on it only, never released "
               "(counted as failed)", what, lost);
    }
}

/* Claims of a device that failed, abandoned as the reclaimer abandons a
 * failed device's entries (the device's work on their blocks is not known
 * to be over): their blocks never handed out again nor released, counted
 * as failed. */
static void abandon_claims(const struct block_claim *claims, size_t n)
{
    if (n == 0)
        return;
    cache_reclaim_claims_done(claims, n, false, now_ns());
    lifecycle_count_finished(false, n);
}

/* The claims of the block frees an event could not cover: the caller
 * waits for stream here, after which their work is done (counted as
 * released).  A sticky error of the wait is the device's: the device
 * fails (said once), and the claims are abandoned as the reclaimer
 * abandons a failed device's entries (counted as failed; the device's
 * blocks are never handed out again).  Any other failed wait gives them
 * back to the batch.  The wait is relaxed (cuda.h): stream, the legacy
 * stream, passed the seal's capture check (legacy_check), and a capture
 * this thread runs elsewhere, or another thread's global one, is left
 * intact. */
static cudaError_t complete_synchronously(const char *what, int device,
                                          cudaStream_t stream,
                                          const struct block_claim *claims,
                                          size_t n, const char *call,
                                          cudaError_t err)
{
    cuda_report_failure(what, call, err,
                        "; waiting for the legacy stream to give back the "
                        "blocks freed on it");
    /* The seal goes on another way: the failed creation or record (a
     * runtime call's, where the driver's was not made) is no error of the
     * application's next cudaGetLastError to find. */
    cuda_forget_failure_left(err);
    cudaError_t sync = cuda_stream_synchronize_relaxed(stream);
    if (cuda_error_is_sticky(sync)) {
        lifecycle_fail_device(what, device, "cudaStreamSynchronize", sync);
        abandon_claims(claims, n);
        return sync;
    }
    if (sync != cudaSuccess) {
        cuda_report_failure(what, "cudaStreamSynchronize", sync,
                            left_in_batch("; the blocks freed on the legacy "
                                          "stream stay reusable on it only "
                                          "until a later seal"));
        give_back_claims(what, device, claims, n);
        return sync;
    }
    cache_reclaim_claims_done(claims, n, true, now_ns());
    lifecycle_count_finished(true, n);
    stats_add(&stats.sync_releases, n);
    return cudaSuccess;
}

/* Seal claims[0..n) of device (an array the entry then owns, or one
 * claim in *one when n is 1 and array is NULL), in flight in generation
 * g: one event recorded on stream after them, one entry pushed.  The
 * claims were taken from the batch before this call, so their work was
 * enqueued before the record.  Returns cudaSuccess, or the error of the
 * wait that could not replace the event: the claims are back in the
 * batch then, or abandoned with the device when the error is sticky
 * (said).  With left (exit): no event means no wait, which could last for
 * ever; the claims are dropped, their blocks left PENDING, and counted in
 * *left (not in the statistics, not said: exit does both). */
static cudaError_t seal(const char *what, int device, cudaStream_t stream,
                        unsigned long long id, struct block_claim *array,
                        const struct block_claim *one, size_t n, unsigned g,
                        size_t *left)
{
    const struct block_claim *claims = array != NULL ? array : one;
    struct lane_pick pick;
    const char *call = NULL;
    cudaError_t err = stream_lane_pick(device, id, LANE_SOLO, &pick, &call);
    struct entry *e = NULL;
    if (err == cudaSuccess &&
        (e = event_pool_take_entry(device, &err, &call)) == NULL)
        stream_lane_cancel(&pick);
    if (e != NULL &&
        (err = cuda_event_record(pick.ev->event, stream)) != cudaSuccess) {
        call = "cudaEventRecord";
        stream_lane_cancel(&pick);
        event_pool_give_unused(e);
        e = NULL;
    }
    if (e == NULL && left != NULL) {
        *left += n;
        free(array);
        land(g, n);
        return err;
    }
    if (e == NULL) {
        err = complete_synchronously(what, device, stream, claims, n, call,
                                     err);
        free(array);
        land(g, n);
        return err;
    }
    stream_lane_commit(&pick, e);
    entry_begin(e, ENTRY_BLOCK, id);
    e->nptrs = n;
    if (array == NULL || n == 1) {
        e->one_claim = claims[0];
        e->claims = &e->one_claim;
        free(array);
    } else {
        e->claims = array; /* the entry's now */
    }
    lifecycle_push(e);
    land(g, n);
    return cudaSuccess;
}

/* Lock held.  Takes b's claims: *array (the batch's array, which the
 * caller now owns; the batch starts a new one), in flight in generation
 * *g; returns their count. */
static size_t take_claims(struct batch *b, struct block_claim **array,
                          unsigned *g)
{
    size_t n = b->count;
    *array = b->claims;
    b->claims = NULL;
    b->count = b->room = 0;
    *g = take_off(n);
    return n;
}

/* Lock held.  Appends claim to b; false when out of memory. */
static bool append(struct batch *b, const struct block_claim *claim,
                   uint64_t now)
{
    if (b->count == b->room) {
        if (b->room > UINT32_MAX / 2) /* 32-bit counts (struct batch) */
            return false;
        uint32_t room = b->room > 0 ? b->room * 2 : max_claims;
        struct block_claim *grown = realloc(b->claims, room * sizeof *grown);
        if (grown == NULL)
            return false;
        b->claims = grown;
        b->room = room;
    }
    if (b->count == 0)
        b->oldest_ns = now;
    b->claims[b->count++] = *claim;
    return true;
}

/* Whether an event may be recorded on the legacy stream (the current
 * device's) now: cudaSuccess; not while another thread captures a blocking
 * stream in the global mode (cudaErrorStreamCaptureImplicit: the record
 * would fail and invalidate that capture; the check does not); or the
 * check's own error, which, sticky, is the device's. */
static cudaError_t legacy_check(cudaStream_t stream)
{
    bool capturing = false;
    const char *call;
    return capture_status(&stream, 1, &capturing, &call);
}

/* Any thread, admitted; b is the batch of a device that failed: its
 * claims are abandoned (abandon_claims).  No CUDA call. */
static void abandon_batch(struct batch *b)
{
    struct block_claim *array = NULL;
    unsigned g = 0;
    pthread_mutex_lock(&b->lock);
    size_t n = take_claims(b, &array, &g);
    pthread_mutex_unlock(&b->lock);
    abandon_claims(array, n);
    free(array);
    land(g, n);
}

/* Lock held.  Whether b is to be sealed now: full, or its oldest claim
 * old.  now was read before the lock: another thread may have started the
 * batch since, at a later reading (its claim is then not old). */
static bool due(const struct batch *b, uint64_t now)
{
    return b->count >= max_claims ||
           (now >= b->oldest_ns &&
            now - b->oldest_ns >=
                atomic_load_explicit(&age_ns, memory_order_relaxed));
}

void free_batch_set_age_ns(uint64_t ns)
{
    atomic_store(&age_ns, ns);
}

bool free_batch_add(int device, unsigned long long stream_id,
                    const struct block_claim *claim, bool *due_now)
{
    struct batch *b = &batches[device];
    uint64_t now = coarse_now_ns(); /* now_ns: ~10 % of the call, perf */
    pthread_mutex_lock(&b->lock);
    if (b->count == 0) /* only then: it is on the batch's second line */
        b->stream_id = stream_id;
    bool added = append(b, claim, now);
    *due_now = due(b, now);
    pthread_mutex_unlock(&b->lock);
    return added;
}

void free_batch_seal(const char *what, int device, cudaStream_t stream,
                     unsigned long long stream_id,
                     const struct block_claim *claim, bool added,
                     bool due_now, bool current)
{
    struct batch *b = &batches[device];
    /* Checked before the claims are taken: a batch that cannot be sealed
     * now stays, for the next free (or a flush) to seal. */
    cudaError_t barred = current ? legacy_check(stream) : cudaSuccess;
    /* The free is accepted, its batch left waiting: a check refused (a
     * runtime call's, where the driver's was not made) leaves no error
     * for the application's next cudaGetLastError to find. */
    cuda_forget_failure_left(barred);
    if (!current || barred != cudaSuccess) {
        if (!added) { /* out of memory, and no event can be recorded */
            lifecycle_count_finished(false, 1); /* counted deferred */
            report("%s: out of memory for the claim of %p, freed "
                   "on the legacy stream while no event can be recorded "
                   "there (another thread's capture bars it, or its device "
                   "could not be made current): the block stays reusable "
                   "on it only, never released (counted as failed)", what,
                   cache_claim_ptr(claim));
        }
        return;
    }
    struct block_claim *array = NULL;
    unsigned g = 0;
    pthread_mutex_lock(&b->lock);
    size_t n = due_now ? take_claims(b, &array, &g) : 0;
    pthread_mutex_unlock(&b->lock);
    /* The free is accepted whatever its seal met (said): a wait that
     * failed is no error of the application's to find either. */
    if (n > 0)
        cuda_forget_failure_left(
            seal(what, device, stream, stream_id, array, NULL, n, g, NULL));
    else
        free(array);
    if (!added) /* no room for it: alone (in flight until pushed) */
        cuda_forget_failure_left(seal(what, device, stream, stream_id, NULL,
                                      claim, 1, take_off(1), NULL));
}

/* free_batch_seal_all's scan, and free_batch_seal_at_exit's with left:
 * seals what waits in each batch now.  Returns cudaSuccess, or the first
 * error that left a batch's claims waiting (said); with left, nothing
 * waits and nothing is said: what could not be sealed is dropped and
 * counted in *left. */
static cudaError_t seal_batches(const char *what, size_t *left)
{
    cudaError_t first = cudaSuccess;
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    for (int d = 0; d < nbatches; d++) {
        struct batch *b = &batches[d];
        pthread_mutex_lock(&b->lock);
        bool any = b->count > 0;
        pthread_mutex_unlock(&b->lock);
        if (!any)
            continue;
        /* A device that failed seals nothing: its batch is abandoned with
         * its other entries, and no CUDA call is made on it.  Else the
         * legacy stream (NULL) is the current device's: switched only
         * when another is current (a switch back to the caller's device
         * then creates no context that was not). */
        const char *call = "cudaStreamIsCapturing";
        cudaError_t err =
            left != NULL ? cudaSuccess : lifecycle_device_error(d);
        bool failed = err != cudaSuccess;
        if (!failed) {
            err = cuda_switch_device(&sw, d, &call);
            if (err == cudaSuccess)
                err = legacy_check(NULL); /* call: cudaStreamIsCapturing */
            if (err != cudaSuccess && left != NULL) {
                /* Exit: dropped, never released (blocks stay PENDING). */
                pthread_mutex_lock(&b->lock);
                *left += b->count;
                b->count = 0;
                pthread_mutex_unlock(&b->lock);
                continue;
            }
            /* A sticky error is the device's, not a capture's: the
             * device fails (said once) and its batch goes with it.  Taken
             * for a capture, the batch would wait for a seal that can
             * never be made, the device taking calls on. */
            failed = cuda_error_is_sticky(err);
            if (failed)
                lifecycle_fail_device(what, d, call, err);
        }
        if (failed) {
            abandon_batch(b);
        } else if (err != cudaSuccess) {
            /* Left in the batch, reusable on the stream; said. */
            cuda_report_failure(
                what, call, err,
                left_in_batch("; blocks freed on the legacy stream wait "
                              "there until a later free or flush can seal "
                              "their batch"));
        } else {
            struct block_claim *array = NULL;
            unsigned g = 0;
            pthread_mutex_lock(&b->lock);
            size_t n = take_claims(b, &array, &g);
            unsigned long long id = b->stream_id;
            pthread_mutex_unlock(&b->lock);
            if (n > 0)
                err = seal(what, d, NULL, id, array, NULL, n, g, left);
            else
                free(array);
        }
        if (err != cudaSuccess && first == cudaSuccess)
            first = err;
    }
    cuda_switch_back(&sw, what);
    return first;
}

/* free_batch_seal_all's wait: other threads' seals that took their claims
 * before now are pushed soon (none waits for anything but the CUDA calls
 * of its seal); later ones count in the next generation. */
static void wait_for_earlier_seals(void)
{
    pthread_mutex_lock(&turn);
    unsigned old = atomic_fetch_add(&generation, 1) & 1u;
    while (atomic_load(&in_flight[old]) > 0) {
        struct timespec nap = {.tv_nsec = 20000}; /* 20 us */
        nanosleep(&nap, NULL);
    }
    pthread_mutex_unlock(&turn);
}

cudaError_t free_batch_seal_all(const char *what, bool last)
{
    /* A seal that could neither record nor wait gives its claims back to
     * the batch (reported): where another thread's did while this call
     * waited (its claims may be of frees that returned before this call),
     * seal once more.  This call's own gave back what it just failed to
     * seal: a second try would fail and say so again.  (The last seal is
     * then sealed once: no other thread seals during shutdown.) */
    if (last)
        atomic_store_explicit(&sealing_last, true, memory_order_relaxed);
    cudaError_t err = cudaSuccess;
    for (int round = 0; round < 2; round++) {
        unsigned long back = atomic_load(&given_back);
        unsigned long mine = given_back_mine;
        err = seal_batches(what, NULL);
        wait_for_earlier_seals();
        if (atomic_load(&given_back) - back == given_back_mine - mine)
            break;
    }
    return err;
}

size_t free_batch_seal_at_exit(void)
{
    /* The gate is closed and every admitted call ended: no other seal is
     * under way, nor will one give claims back. */
    size_t left = 0;
    seal_batches("exit", &left);
    return left;
}
