/* SPDX-License-Identifier: MIT */
/* The library's lifecycle: lazy start, admission of defer calls (the gate),
 * flush and trim requests, shutdown (see lifecycle.h); process exit and fork
 * are the process hooks' (lifecycle_hooks.c), which use the gate, the
 * request and the stop from here (lifecycle_hooks.h). */
#define _GNU_SOURCE
#include "lifecycle.h"
#include "lifecycle_hooks.h"
#include "reclaimer_state.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "config.h"
#include "configure.h"
#include "cuda.h"
#include "event_pool.h"
#include "free_batch.h"
#include "report.h"
#include "stats.h"
#include "stream_lane.h"

/* Allocate the reclaimer's per-device state; false when out of memory. */
static bool alloc_per_device(int n)
{
    rs.device_errors = calloc((size_t)n, sizeof *rs.device_errors);
    atomic_store(&rs.any_device_failed, false);
    rs.held = calloc((size_t)n, sizeof *rs.held);
    rs.free_streams = calloc((size_t)n, sizeof *rs.free_streams);
    rs.recycle = calloc((size_t)n, sizeof *rs.recycle);
    return rs.device_errors && rs.held && rs.free_streams && rs.recycle;
}

static void free_per_device(void)
{
    atomic_store(&rs.any_device_failed, false);
    free(rs.device_errors);
    free(rs.held);
    free(rs.free_streams);
    free(rs.recycle);
    rs.device_errors = NULL;
    rs.held = NULL;
    rs.free_streams = NULL;
    rs.recycle = NULL;
}

/* A start that failed part-way: what it made so far goes, so that the next
 * call starts from nothing (the block cache, its pool and the free batches
 * leaked when the event pool, the stream table or the thread failed). */
static void undo_start(void)
{
    cache_upstream_destroy();
    cache_destroy();
    free_batch_destroy();
    free_per_device();
}

/* The event pool's test (event_pool_init): whether device has a sticky
 * error, so its events are forgotten, not destroyed.  Any thread; false
 * once the per-device state is gone (after shutdown). */
static bool device_failed(int device)
{
    return rs.device_errors != NULL && device_error(device) != cudaSuccess;
}

/* Any thread: whether the call what hands something to cudefer: only the
 * frees and callbacks (defer_free*, defer_call*) do, so only their lines
 * say that the caller keeps it. */
static bool hands_over(const char *what)
{
    return strncmp(what, "defer_free", 10) == 0 ||
           strncmp(what, "defer_call", 10) == 0;
}

static cudaError_t say_refused(const char *what, const struct line_end *end);

/* Start the reclaimer for the first call, what; life_lock held.  On
 * failure (reported, the line ending with end's text) nothing stays allocated
 * and the next call tries again (the caller opens the configuration again:
 * configure_start_failed).  Once exit began (rs.exiting, which exit
 * may set without life_lock while this start holds it:
 * lifecycle_hooks_exit_starting) the start is refused, said as any call
 * after exit is: read before the first CUDA call, after
 * cudaGetDeviceCount (the runtime's initialization, which may hang for
 * good) and before the thread, so that neither the entry points' queries
 * nor the thread follow an exit that gave up waiting for that call. */
static cudaError_t start_locked(const char *what, const struct line_end *end)
{
    if (atomic_load(&rs.exiting))
        return say_refused(what, end);
    static bool exit_hook_registered;
    if (!exit_hook_registered) {
        /* Before the first CUDA call: an exit while it hangs finds this
         * start (lifecycle_hooks_exit_starting).  Run after the drain's
         * handler registered below. */
        atexit(lifecycle_hooks_exit_starting);
        exit_hook_registered = true;
    }
    char kept[256], tail[128];
    report_line_end(end, tail, sizeof tail);
    if (hands_over(what))
        snprintf(kept, sizeof kept, "; nothing was deferred (the caller "
                 "keeps ownership; the next call tries again)%s", tail);
    else
        snprintf(kept, sizeof kept, "; the next call tries again%s", tail);
    configure_at_start(&rs.cfg);
    rs.disabled = rs.cfg.disable != 0;
    int n;
    cudaError_t err = cuda_device_count(&n);
    if (err != cudaSuccess) {
        cuda_report_failure(what, "cudaGetDeviceCount", err, kept);
        return err;
    }
    if (atomic_load(&rs.exiting))
        return say_refused(what, end);
    /* The runtime is up: its entry points. */
    cuda_resolve_entry_points(what, rs.cfg.driver_calls != 0);
    if (!alloc_per_device(n) ||
        !cache_init(n, (size_t)rs.cfg.split_min_bytes,
                    rs.cfg.round_divisions) ||
        !cache_upstream_init(n) || !free_batch_init(n, rs.cfg.free_batch)) {
        undo_start();
        cuda_report_failure(what, "calloc", cudaErrorMemoryAllocation, kept);
        return cudaErrorMemoryAllocation;
    }
    if ((err = event_pool_init(n, rs.cfg.event_pool_max, device_failed)) !=
        cudaSuccess) {
        undo_start();
        cuda_report_failure(what, "calloc", err, kept);
        return err;
    }
    if (!stream_table_init(&rs.streams)) {
        event_pool_abandon();
        undo_start();
        cuda_report_failure(what, "calloc", cudaErrorMemoryAllocation, kept);
        return cudaErrorMemoryAllocation;
    }
    if (atomic_load(&rs.exiting)) {
        stream_table_destroy(&rs.streams);
        event_pool_abandon();
        undo_start();
        return say_refused(what, end);
    }
    for (int d = 0; d < n; d++)
        held_init(&rs.held[d], d);
    rs.ndevices = n;
    rs.current_device = -1;
    atomic_store(&rs.reaper, REAPER_NONE);
    atomic_store(&rs.ending, ENDING_OPEN);
    queue_init(&rs.queue);

    /* The thread inherits a full signal mask: signals go to the app. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&rs.thread, NULL, reclaimer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        report("%s: cannot start the reclaimer thread: %s%s", what,
               strerror(rc), kept);
        stream_table_destroy(&rs.streams);
        event_pool_abandon();
        undo_start();
        return cudaErrorOperatingSystem;
    }
    static bool hooks_registered;
    if (!hooks_registered) {
        /* Registered after the CUDA runtime's own exit handler (the runtime
         * is initialized by now), so ours runs first, while it still works. */
        atexit(lifecycle_hooks_exit);
        hooks_registered = true;
    }
    atomic_store(&rs.state, STATE_RUNNING);
    return cudaSuccess;
}

/* True when the caller is inside a callback (on the reclaimer thread, or
 * on its own thread inside a defer call): waiting for the reclaimer or for
 * the admissions would wait for itself. */
static bool inside_callback(void)
{
    return thread_here.reclaimer || thread_here.admissions > 0;
}

/* Any thread: refuse the call what (after shutdown or exit, or in a forked
 * child), counted and said in one line ending with end's text;
 * cudaErrorNotPermitted.
 * Only a call that hands something over (hands_over) says the caller
 * keeps it. */
static cudaError_t refuse_ending(const char *what, const struct line_end *end)
{
    stats_add(&stats.rejected, 1);
    return say_refused(what, end);
}

/* Any thread: refuse_ending's line, not counted (a refused start: its
 * caller counts it, as every failed start). */
static cudaError_t say_refused(const char *what, const struct line_end *end)
{
    char tail[128];
    report_line_end(end, tail, sizeof tail);
    bool handed = hands_over(what);
    const char *kept = handed ? "; the caller keeps ownership" : "";
    if (atomic_load(&rs.state) == STATE_FORKED)
        report("%s called in a forked child: refused (CUDA cannot be used "
               "after fork%s)%s", what, kept, tail);
    else if (atomic_load(&rs.exiting)) /* exit closed the gate */
        report("%s called after exit began: refused%s%s", what,
               handed ? " (the caller keeps ownership)" : "", tail);
    else if (handed)
        report("%s called after defer_shutdown: refused (the caller keeps "
               "ownership)%s", what, tail);
    else
        report("%s called after defer_shutdown: refused%s", what, tail);
    return cudaErrorNotPermitted;
}

cudaError_t lifecycle_refuse(const char *what, const struct line_end *end)
{
    return refuse_ending(what, end);
}

/* Any thread: refuse_ending with nothing after the refusal. */
static cudaError_t refuse(const char *what)
{
    return refuse_ending(what, NULL);
}

/* The gate: the closed flag (reclaimer_state.h) and the count of calls
 * under way, in the thread shards (thread_shard.h).  A submission counts
 * itself in its thread's shard and then reads the closed flag; shutdown
 * sets the flag and then sums the shards.  Both sequentially consistent,
 * so either the submission sees the gate closed or shutdown sees it
 * counted.  The admissions a thread holds now (thread_here.admissions):
 * more than 0 inside a defer call, e.g. in a callback run on the calling
 * thread (a synchronous release); such a thread must not wait for
 * admissions to end, its own never would. */
static _Atomic uint64_t *gate_shard_count(void)
{
    return &thread_shard_mine()->admitted;
}

/* Submissions under way now (a sum over the shards: one that stays under
 * way while it is read is counted). */
static uint64_t gate_admitted(void)
{
    uint64_t n = 0;
    for (int i = 0; i < THREAD_SHARDS; i++)
        n += atomic_load(&thread_shards[i].admitted);
    return n;
}

/* Count a submission in the gate; false (not counted) when it is closed. */
static bool gate_enter(void)
{
    _Atomic uint64_t *count = gate_shard_count();
    atomic_fetch_add(count, 1);
    if (!atomic_load(&rs.gate_closed))
        return true;
    atomic_fetch_sub(count, 1);
    return false;
}

/* Forget every admission (fork child: their threads are gone) but the
 * forking thread's own (a fork inside a callback run in a defer call:
 * that call still leaves, and its shard must not wrap). */
void lifecycle_gate_forget_admissions(void)
{
    for (int i = 0; i < THREAD_SHARDS; i++)
        atomic_store(&thread_shards[i].admitted, 0);
    if (thread_here.admissions > 0)
        atomic_store(&thread_shard_mine()->admitted, thread_here.admissions);
}

/* Admit a submission: count it in the gate unless the gate is closed.  Until
 * the reclaimer runs, the first callers start it under life_lock, holding no
 * admission while they wait for that lock: shutdown and exit take the lock
 * and then wait for every admission to end, so an admission held while
 * waiting for the lock would never end. */
cudaError_t lifecycle_enter(const char *what)
{
    return lifecycle_enter_ending(what, NULL);
}

cudaError_t lifecycle_enter_ending(const char *what,
                                   const struct line_end *end)
{
    for (;;) {
        if (!gate_enter()) {
            /* The drain of a shutdown or exit runs callbacks; they may
             * defer until the reclaimer stops (it finishes what they add
             * before it does), but not once exit gave up (rs.abandoned:
             * nothing is released, no CUDA call made from then on). */
            if (thread_here.reclaimer &&
                atomic_load(&rs.state) == STATE_RUNNING &&
                !atomic_load(&rs.abandoned)) {
                atomic_fetch_add(gate_shard_count(), 1);
                thread_here.admissions++;
                return cudaSuccess;
            }
            return refuse_ending(what, end);
        }
        if (atomic_load_explicit(&rs.state, memory_order_acquire) ==
            STATE_RUNNING) {
            thread_here.admissions++;
            return cudaSuccess;
        }
        atomic_fetch_sub(gate_shard_count(), 1);
        pthread_mutex_lock(&rs.life_lock);
        cudaError_t err = cudaSuccess;
        int state = atomic_load(&rs.state);
        if (state == STATE_NEW) {
            atomic_store(&rs.start_tried, true);
            if ((err = start_locked(what, end)) != cudaSuccess) {
                /* Nothing of it stays: the next start looks up the entry
                 * points again, as the configuration it settles says
                 * (CUDEFER_DRIVER_CALLS). */
                cuda_forget_entry_points();
                configure_start_failed();
                stats_add(&stats.rejected, 1);
            }
        } else if (state != STATE_RUNNING) { /* shut down while we waited */
            err = refuse_ending(what, end);
        }
        pthread_mutex_unlock(&rs.life_lock);
        if (err != cudaSuccess)
            return err;
        /* Running now: be admitted like any other call (or refused, if a
         * shutdown closed the gate meanwhile). */
    }
}

cudaError_t lifecycle_refused(const char *what)
{
    return lifecycle_refused_ending(what, NULL);
}

cudaError_t lifecycle_refused_ending(const char *what,
                                     const struct line_end *end)
{
    /* As lifecycle_enter: the reclaimer's callbacks may defer during the
     * drain of a shutdown or exit. */
    if (!atomic_load(&rs.gate_closed) ||
        (thread_here.reclaimer && atomic_load(&rs.state) == STATE_RUNNING &&
         !atomic_load(&rs.abandoned)))
        return cudaSuccess;
    return refuse_ending(what, end);
}

void lifecycle_leave(void)
{
    thread_here.admissions--;
    atomic_fetch_sub_explicit(gate_shard_count(), 1, memory_order_release);
}

static void wake(void)
{
    pthread_mutex_lock(&rs.wake_lock);
    pthread_cond_signal(&rs.wake_cond);
    pthread_mutex_unlock(&rs.wake_lock);
}

void lifecycle_wake_now(void)
{
    wake();
}

void lifecycle_wake(void)
{
    if (atomic_load(&rs.sleeping))
        wake();
}

void lifecycle_push(struct entry *e)
{
    queue_push_mpsc(&rs.queue, &e->node);
    /* Of the threads that find the reclaimer asleep, the one that clears
     * the flag wakes it; the others need not queue on wake_lock (it takes
     * everything pushed once it wakes). */
    if (atomic_load(&rs.sleeping) && atomic_exchange(&rs.sleeping, false))
        wake();
}

bool lifecycle_on_reclaimer_thread(void)
{
    return thread_here.reclaimer;
}

bool lifecycle_in_callback(void)
{
    return inside_callback();
}

const struct defer_config *lifecycle_config(void)
{
    return &rs.cfg;
}

bool lifecycle_disabled(void)
{
    return rs.disabled;
}

cudaError_t lifecycle_device_error(int device)
{
    if (device < 0 || device >= rs.ndevices)
        return cudaErrorInvalidDevice;
    return device_error(device);
}

bool lifecycle_counting_begin(void)
{
    /* Either exit sees this write under way and waits for it, or this
     * sees exit's abandon and writes nothing: sequentially consistent,
     * both sides.  A counter, not a flag: launching threads count too. */
    atomic_fetch_add(&rs.counting, 1);
    if (!atomic_load(&rs.abandoned))
        return true;
    atomic_fetch_sub(&rs.counting, 1);
    return false;
}

void lifecycle_counting_end(void)
{
    atomic_fetch_sub(&rs.counting, 1);
}

void lifecycle_count_finished(bool released, uint64_t n)
{
    /* Exit counted the entries as failed if it gave up first. */
    if (lifecycle_counting_begin()) {
        stats_add(released ? &stats.released : &stats.failed, n);
        lifecycle_counting_end();
    }
}

void lifecycle_count_deferred(void)
{
    /* Either exit waits for this count and its snapshot holds it (pending,
     * then counted failed by exit), or this counts nothing, and then
     * neither will the entry's end (abandoned stays set). */
    if (lifecycle_counting_begin()) {
        stats_count_deferred();
        lifecycle_counting_end();
    }
}

void lifecycle_fail_device(const char *what, int device, const char *call,
                           cudaError_t err)
{
    if (device >= 0 && device < rs.ndevices)
        reclaimer_fail_device_in(what, device, call, err);
}

void lifecycle_count_admitted(void)
{
    /* The gate closes before exit's drain begins, let alone gives up;
     * gate_closed is on the line every call reads. */
    if (!atomic_load(&rs.gate_closed))
        stats_count_deferred();
    else
        lifecycle_count_deferred();
}

/* Close the gate and wait for the submissions already admitted, but for
 * the caller's own (exit() from a callback run inside a defer call), until
 * deadline_ns if not 0: one may be blocked for good, e.g. in
 * cudaStreamSynchronize under CUDEFER_DISABLE.  False if it passed.  Yields
 * at first, then naps: a submission blocked in CUDA may take long. */
bool lifecycle_close_gate(uint64_t deadline_ns)
{
    atomic_store(&rs.gate_closed, true);
    for (unsigned spins = 0; gate_admitted() > thread_here.admissions; spins++) {
        if (deadline_ns != 0 && now_ns() > deadline_ns)
            return false;
        if (spins < 1000) {
            sched_yield();
        } else {
            struct timespec nap = {.tv_nsec = 100000}; /* 100 us */
            nanosleep(&nap, NULL);
        }
    }
    return true;
}

/* Tests: lifecycle_test_set_stop_hook's. */
static void (*_Atomic stop_hook)(void);

void lifecycle_test_set_stop_hook(void (*hook)(void))
{
    atomic_store(&stop_hook, hook);
}

/* Ask the thread to stop once everything is released (what callbacks
 * defer meanwhile included), and join it, until deadline_ns if not 0: false
 * if that passed first (the thread is left running, its state kept), or
 * where exit gave up (rs.reaper, rs.abandoned: its state kept). */
bool lifecycle_stop_and_join(uint64_t deadline_ns)
{
    atomic_store(&rs.stop, true);
    wake();
    /* The thread is joined only while it has not detached itself (exit
     * gave up: nobody joins it, its state is left as it is). */
    int none = REAPER_NONE;
    if (!atomic_compare_exchange_strong(&rs.reaper, &none, REAPER_JOIN))
        return false;
    if (deadline_ns == 0) {
        pthread_join(rs.thread, NULL);
    } else {
        struct timespec until = realtime_at(deadline_ns);
        if (pthread_timedjoin_np(rs.thread, NULL, &until) != 0) {
            atomic_store(&rs.reaper, REAPER_NONE); /* before any abandon */
            return false;
        }
    }
    /* The library's end, taken from exit (rs.ending).  Where exit gave
     * up first, while this shutdown joined (it could not take life_lock),
     * the thread ended its pass unfinished, and cudefer makes no CUDA call
     * and counts nothing from then on (the destruction below would
     * destroy memory pools and count the unsealed batches' frees failed a
     * second time): the state is left to the process's end.  Taken here,
     * exit leaves this shutdown to finish. */
    int open = ENDING_OPEN;
    if (!atomic_compare_exchange_strong(&rs.ending, &open, ENDING_STOP))
        return false;
    void (*hook)(void) = atomic_load(&stop_hook);
    if (hook != NULL)
        hook();
    stream_table_destroy(&rs.streams);
    pointer_set_destroy(&rs.deferred);
    free_batch_destroy();
    cache_destroy();
    cache_upstream_destroy();
    free_per_device();
    return true;
}

cudaError_t lifecycle_shutdown(void)
{
    if (inside_callback()) {
        stats_add(&stats.rejected, 1);
        report("defer_shutdown called from a defer_call callback: refused "
               "(it would wait for itself)");
        return cudaErrorNotPermitted;
    }
    if (atomic_load(&rs.state) == STATE_FORKED)
        return refuse("defer_shutdown");
    pthread_mutex_lock(&rs.life_lock);
    cudaError_t err = cudaSuccess;
    bool running = atomic_load(&rs.state) == STATE_RUNNING;
    if (running)
        lifecycle_close_gate(0);
    if (running && atomic_load(&rs.abandoned)) {
        /* Exit gave up while the gate waited for a call under way (it
         * could not take life_lock, held here): no seal, no CUDA call. */
        err = cudaErrorCudartUnloading;
    } else if (running) {
        /* No admitted call can add to them now; one that waits on is
         * dropped at the stop (said): the error unless a device's is. */
        cudaError_t unsealed = free_batch_seal_all("defer_shutdown", true);
        /* Static: exit on another thread may give up while this waits
         * (it cannot take life_lock, held here), and the reclaimer may
         * answer q after this call returned.  One shutdown ever pushes
         * it: after it the state is STOPPED. */
        static struct request q;
        q = (struct request){.err = cudaSuccess, .abandonable = true};
        if (lifecycle_requests_wait(&q, 0, false)) {
            err = q.err != cudaSuccess ? q.err : unsealed;
            if (!lifecycle_stop_and_join(0))
                err = cudaErrorCudartUnloading; /* exit gave up meanwhile */
        } else {
            err = cudaErrorCudartUnloading; /* exit gave up meanwhile */
        }
    } else {
        atomic_store(&rs.gate_closed, true);
        configure_refuse_from_now();
    }
    atomic_store(&rs.state, STATE_STOPPED);
    pthread_mutex_unlock(&rs.life_lock);
    return err;
}
