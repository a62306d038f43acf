/* SPDX-License-Identifier: MIT */
/*
 * The reclaimer's state, shared by the reclaimer thread (reclaimer.c) and
 * the library's lifecycle (lifecycle.c: start, admission, flush and trim
 * requests, shutdown; lifecycle_hooks.c: exit, fork).  Internal: nothing
 * else includes it.
 */
#ifndef CUDEFER_RECLAIMER_STATE_H
#define CUDEFER_RECLAIMER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <cuda_runtime_api.h>

#include "clock.h"
#include "cudefer.h"
#include "entry.h"
#include "held.h"
#include "pointer_set.h"
#include "release_policy.h"
#include "queue.h"
#include "stream_table.h"
#include "thread_shard.h"

enum state {
    STATE_NEW,     /* no defer call yet: nothing started */
    STATE_RUNNING, /* the reclaimer thread runs */
    STATE_STOPPED, /* after defer_shutdown or exit: every call is refused */
    STATE_FORKED,  /* in a fork child: every call is refused */
};

enum reaper { REAPER_NONE, REAPER_JOIN, REAPER_DETACHED };

/* Who ends the library (reclaimer_state.ending). */
enum ending { ENDING_OPEN, ENDING_STOP, ENDING_GIVE_UP };

/* A defer_flush or defer_trim caller waits on one of these, on its stack;
 * shutdown and exit on one of their own, static (it outlives their wait
 * when exit gives up: the reclaimer may still answer it). */
struct request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    bool trim;
    cudaError_t err;
    uint64_t barrier;   /* flush: entries with seq < barrier must finish */
    uint64_t remaining; /* flush: of those, how many have not */
    uint64_t bytes;     /* trim: bytes released */
    bool abandonable;   /* static or never freed (shutdown's, a flush's,
                           a trim's, a synced entry's): the wait also ends
                           (unanswered) once exit gave up (rs.abandoned) */
    struct request *next;
    struct entry marker; /* what travels through the queue */
};

/* What a pass gives back to a device's pools: entries at its end, events
 * at its end or as soon as RECYCLE_EVENTS are chained (reclaimer.c). */
struct recycle_chains {
    struct pool_link *entries, *events;
    size_t nevents; /* chained on events */
};

/* Where the reclaimer gives device memory back on one device: its own
 * stream, on which nothing else runs.  Reclaimer thread only. */
struct free_stream {
    cudaStream_t stream; /* made on first use; NULL until then */
    uint32_t unsynced;   /* cudaMalloc pointers freed on stream since its
                            last cudaStreamSynchronize */
    int8_t async;        /* cudaMalloc memory freed with cudaFreeAsync: 1 yes,
                            -1 no (no memory pools), 0 not asked yet */
    bool sync_failure_said; /* a failed synchronize was reported; cleared
                               when one succeeds */
};

/* The one reclaimer's state: rs. */
struct reclaimer_state {
    /* Shared with launching threads: what every call reads (state,
     * gate_closed, disabled, any_device_failed, device_errors: one cache
     * line; cfg) apart from
     * what they write (the gate's counts, in their thread shards:
     * thread_shard.h; the queue) and from what the reclaimer writes
     * (sleeping), each on cache lines of its own. */
    /* Who writes them, under which lock.  The lifecycle (lifecycle.c,
     * lifecycle_hooks.c) under life_lock, in the start, shutdown or exit:
     * state, gate_closed, starting, thread, stop, abandoned (also without
     * it, by an exit that a shutdown's hold of it kept out:
     * lifecycle_hooks_exit; and, with exiting, by an exit before any start
     * succeeded, which a start's hold of it may keep out:
     * lifecycle_hooks_exit_starting), and, at the
     * start and the stop only, disabled, cfg, ndevices, the device_errors
     * array and any_device_failed's reset.  The fork child
     * (lifecycle_hooks.c), alone in its process and holding no lock: state,
     * gate_closed, and the three locks, made anew.  Any thread, lock-free:
     * a device's error and any_device_failed's set
     * (reclaimer_fail_device_in), sleeping, the queue, counting.  From
     * counting on, the reclaimer thread's alone. */
    _Alignas(64) _Atomic int state;
    _Atomic bool gate_closed;
    bool disabled; /* cfg.disable, set at start */
    /* Whether any device has a sticky error: until one has, a call reads
     * this line only, not device_errors (a line of its own, in the heap:
     * one cache miss a call less, bench/cold-calls). */
    _Atomic bool any_device_failed;
    _Atomic cudaError_t *device_errors; /* per device; set once, sticky */
    int ndevices;
    _Alignas(64) struct queue queue;
    _Alignas(64) _Atomic bool sleeping;
    _Atomic bool stop;
    /* Set once by exit when it gives up on the drain and counts every entry
     * still pending as failed: from then on the reclaimer counts nothing,
     * releases nothing and makes no CUDA call; it ends where it finds it
     * set (reclaimer_abandoned), in the middle of a pass too.  Also set
     * by the fork child's handler where the reclaimer thread forked (a
     * callback): the child's one thread must not go on reclaiming. */
    _Atomic bool abandoned;
    /* Who ends the reclaimer thread: REAPER_NONE until the stop takes it
     * to join the thread (REAPER_JOIN), or the thread, abandoned, takes it
     * to detach itself (REAPER_DETACHED), each with a compare-and-swap:
     * so a shutdown's join never meets a thread that detached itself,
     * which it would join after its end (exit may give up while a
     * shutdown on another thread stops the reclaimer).  A timed join that
     * gives up (exit's) puts REAPER_NONE back before the abandon. */
    _Atomic int reaper;
    /* Set by exit under life_lock before it closes the gate, or, before
     * any start succeeded, without it (lifecycle_hooks_exit_starting): a
     * refusal from then on says that exit stopped cudefer, not
     * defer_shutdown, and a start under way refuses (start_locked). */
    _Atomic bool exiting;
    /* Who ends the library: ENDING_OPEN from the start until the stop
     * that joined the reclaimer takes it (ENDING_STOP: it frees the state
     * then), or exit, kept out of life_lock by a shutdown, gives up
     * (ENDING_GIVE_UP), each with a compare-and-swap: so exit never gives
     * up on a shutdown that went on to end the library itself. */
    _Atomic int ending;
    _Alignas(64) struct defer_config cfg;
    pthread_mutex_t wake_lock; /* with wake_cond: only for sleeping */
    pthread_cond_t wake_cond;
    pthread_mutex_t life_lock; /* serializes start, shutdown and exit */
    /* Set under life_lock when a first start begins, never cleared: a
     * fork child of a start under way, or of one that failed, is refused
     * like one of a running library (Note [Fork], lifecycle_hooks.c). */
    _Atomic bool start_tried;
    pthread_t thread;

    /* The threads counting entries released or failed now
     * (lifecycle_count_finished): the reclaimer for every entry, a
     * launching thread that released or gave up what it deferred itself.
     * Exit waits for it to be 0 before it counts what is left as failed
     * (lifecycle_hooks_exit).  On a line of its own, with the reclaimer's
     * state below, not on one every call reads. */
    _Alignas(64) _Atomic unsigned counting;

    /* The reclaimer thread's alone. */
    struct queue_batch batch;    /* entries being taken in */
    struct pointer_set deferred; /* CUDEFER_CHECK: pointers not yet released */
    struct stream_table streams; /* entries whose work is incomplete */
    uint64_t incomplete;         /* entries in streams */
    struct held_list *held;      /* per device: completed, held by policy */
    /* Per device: the reclaimer's stream for cudaFreeAsync (Note
     * [Releasing without a drain], reclaimer_frees.c). */
    struct free_stream *free_streams;
    struct recycle_chains *recycle; /* per device: done entries and events
                                       to give back (event_pool.h) */
    uint64_t next_seq;
    uint64_t tracked; /* entries taken in and not yet finished */
    struct request *flushes, *trims, *done_requests;
    uint64_t pass_released, pass_released_bytes;
    bool pass_sync_failed; /* a sync of freed memory met a sticky error in
                              this pass (reclaimer_frees.c) */
    int current_device; /* -1: unknown */
    uint64_t last_activity_ns;
    uint32_t nap_us;
};

extern struct reclaimer_state rs;

/* Reclaimer only: take in a pushed entry (reclaimer_take.c; capture.c
 * takes in a graph entry this way once it is complete). */
void reclaimer_take_in(struct entry *e);

/* Reclaimer thread only (reclaimer.c): make device current (false, the
 * device marked failed, if that failed); mark device failed by call's err
 * (the first error wins, said once); what the policy sees now. */
bool reclaimer_use_device(int device);
void reclaimer_fail_device(int device, const char *call, cudaError_t err);
/* Any thread: the same, said as who's (a synchronous release's). */
void reclaimer_fail_device_in(const char *who, int device, const char *call,
                              cudaError_t err);
struct policy_view reclaimer_view_now(uint64_t now);

/* Reclaimer thread only (reclaimer_frees.c: Note [Releasing without a
 * drain]).  The reclaimer's own stream on device, where device memory is
 * freed with cudaFreeAsync, made on first use (NULL if none could be made:
 * reported once); the stream e's memory goes back on, or NULL for cudaFree
 * (asks CUDA once a device whether it has memory pools); n more cudaMalloc
 * pointers freed on device's stream, synchronized once a slice is full;
 * device's stream synchronized now, whatever was freed on it (a trim of
 * the block cache's pool); every device's stream synchronized where frees
 * wait (end of a pass); the streams destroyed (shutdown).  Only a
 * synchronize blocks, and only until the frees on that stream ran; a
 * failed one is handled as sync_frees says. */
cudaStream_t reclaimer_frees_stream(int device);
cudaStream_t reclaimer_frees_stream_of(const struct entry *e);
void reclaimer_frees_queued(int device, unsigned n);
void reclaimer_frees_wait(int device);
void reclaimer_frees_sync(void);
void reclaimer_frees_destroy(void);

/* Reclaimer thread only (reclaimer.c): release one completed entry now
 * (making its device current) and finish it; returns the release's error
 * (reported and counted as failed).  Once exit gave up (rs.abandoned), it
 * releases nothing and leaves e as it is: cudaErrorCudartUnloading. */
cudaError_t reclaimer_release_now(struct entry *e, uint64_t now);

/* Reclaimer thread only (reclaimer.c): entry e is done with (its release
 * made, or failed with err: counted, its request told, recycled); e's event
 * completed (err cudaSuccess: e completes, released or held as the policy
 * says) or never will (err); whether someone waits for the reclaimer (a
 * flush, a trim, the stop). */
void reclaimer_finish_entry(struct entry *e, cudaError_t err);
void reclaimer_event_done(struct entry *e, cudaError_t err, uint64_t now);
bool reclaimer_demand_now(void);

/* Reclaimer thread only (reclaimer_poll.c): query the heads of the streams
 * that are due (in a trim's pass, every memory entry behind an incomplete
 * head too) and complete what finished; drop the entries of devices that
 * failed.  Returns how many completed. */
size_t reclaimer_poll_streams(uint64_t now);

/* Reclaimer thread only (reclaimer_held.c): release what the policy says
 * of each device's held entries, a batch per device and reason; a failed
 * device's are abandoned instead, every pass: finished as failed with the
 * device's error (counted in failed, their held bytes gone from the
 * counts), never released, as memory on a failed device cannot be given
 * back.  Never blocks but in a release. */
void reclaimer_held_release(uint64_t now);

/* Reclaimer only, on device (reclaimer_use_device): learn device's cap
 * from its memory now (Note [The cap], release_policy.h); a set cap
 * (max_pending_bytes) asks nothing.  A failed query keeps the cap learned
 * before (the first is reported, and assumes a device of 80 GiB).  Does
 * not block beyond the query. */
void reclaimer_held_learn_cap(int device, uint64_t now);

/* Reclaimer thread, after a pass (progress: it completed or took in
 * something): naps while entries are pending, waits for the release
 * policy's next deadline while only held memory waits, and sleeps until a
 * push (or a cached block's expiry) once nothing is left.  Blocks. */
void reclaimer_wait_for_work(bool progress, uint64_t now);

/* The reclaimer thread's body (pthread_create). */
void *reclaimer_main(void *unused);

/* Any thread: the sticky error of device (cudaSuccess if none). */
static inline cudaError_t device_error(int device)
{
    /* Acquire: pairs with reclaimer_fail_device_in's release, made after
     * the error was stored. */
    if (!atomic_load_explicit(&rs.any_device_failed, memory_order_acquire))
        return cudaSuccess;
    return atomic_load_explicit(&rs.device_errors[device], memory_order_relaxed);
}

/* Reclaimer thread only: whether exit gave up its drain (rs.abandoned).
 * Read at the top of each pass, between its stages and between the entries
 * of a stage, since what outlasted the drain (a callback, a blocking CUDA
 * call) may end in the middle of one: once it is set the thread makes no
 * CUDA call, frees nothing (the process and the CUDA runtime are ending,
 * and exit said what was pending is left unreleased), and returns from
 * reclaimer_main without ending its pass.  Never blocks. */
static inline bool reclaimer_abandoned(void)
{
    return atomic_load(&rs.abandoned);
}

#endif
