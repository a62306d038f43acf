/* SPDX-License-Identifier: MIT */
/* The library's process hooks: the drain at process exit (atexit, registered
 * by the start) and the fork child's handler (pthread_atfork, registered at
 * load); the gate, the request and the stop they use are shutdown's too
 * (lifecycle.c, lent through lifecycle_hooks.h).  The start names
 * lifecycle_hooks_exit, so a static link that takes lifecycle.c takes this
 * file, and the fork hook's constructor, with it. */
#define _GNU_SOURCE
#include "lifecycle.h"
#include "lifecycle_hooks.h"
#include "reclaimer_state.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "cache.h"
#include "config.h"
#include "configure.h"
#include "cuda.h"
#include "event_pool.h"
#include "free_batch.h"
#include "oom_handler.h"
#include "report.h"
#include "stats.h"

/* At process exit, how long to wait for pending work before giving up on it
 * (the process must never hang in exit). */
#define EXIT_DRAIN_NS (UINT64_C(2) * 1000000000)

static void fork_child(void);

/* Note [Running entries]
 * What a thread abandons (exit's give-up; a fork child, whose one thread
 * is the forking one) is what is pending but for the entries that thread
 * runs itself at that moment: exit() or fork() called from a callback
 * (nothing else of cudefer's runs user code) leaves that callback running,
 * neither leaked nor failed.  On the synchronous route (CUDEFER_DISABLE,
 * or no event) they are the entries its defer call releases
 * (thread_here.releasing); on the reclaimer thread, the one entry whose
 * callback it runs.  At exit they never end; in a fork child the callback
 * returns and its entry is counted then, released: by its defer call on
 * the synchronous route, by reclaimer_release_now on the reclaimer thread
 * (the child counting nothing else). */

/* Any thread: how many entries are pending that the calling thread is not
 * itself running (Note [Running entries]).  Never blocks. */
static uint64_t pending_not_running(void)
{
    struct defer_stats s;
    defer_stats_get(&s);
    uint64_t running = thread_here.releasing + (thread_here.reclaimer ? 1 : 0);
    return s.pending > running ? s.pending - running : 0;
}

/* Exit's end: from here nothing counts (a call still admitted, the
 * reclaimer left running, a graph destroyed later), and what is left
 * pending counts in leaked_at_exit and failed: every entry still pending
 * (those a graph still alive holds among them: the drain does not wait
 * for a graph, and capture_stop leaves them to its destructor), but for
 * those the exiting thread runs itself (Note [Running entries]).  Read
 * once nothing counts any more (rs.abandoned set, rs.counting 0), so that
 * none is counted both ways, and once: what counts after this would count
 * it a second time.  Returns how many. */
static uint64_t abandon_pending(void)
{
    atomic_store(&rs.abandoned, true);
    while (atomic_load(&rs.counting) != 0)
        sched_yield();
    uint64_t left = pending_not_running();
    stats_add(&stats.leaked_at_exit, left);
    stats_add(&stats.failed, left);
    return left;
}

/* Note [Fork]
 * A fork child has no reclaimer thread and cannot use CUDA, so every defer
 * call in it is refused and what was pending is abandoned (fork_child).
 * The handler must run in every child: glibc runs in a child only the
 * handlers registered when fork() began, and drops its atfork lock around
 * each prepare handler, so a handler registered by a first defer call
 * could miss a fork() that races that call, and the child would believe
 * the reclaimer runs (a flush or trim there would wait for ever).  So it
 * is registered when the library is loaded, before main.  A child forked
 * while a start is under way is refused too (rs.start_tried): the start's
 * thread and half-made state are not in the child; and so is one forked
 * after a start failed, which may have initialized CUDA in the parent. */
__attribute__((constructor)) static void register_fork_hook(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

/* Exit gives up: the reclaimer, left running, and a call still admitted
 * count nothing from here on (one may be inside a count: never blocks), so
 * that what is counted failed here is never counted released too; the
 * reclaimer makes no CUDA call either, its pass under way left unfinished
 * (reclaimer_abandoned), and a shutdown waiting for it returns
 * (lifecycle_shutdown).  Said: what is left pending, else why nothing
 * was: "exit: <why> <the drain's ms> ms: <fate>". */
static void give_up(const char *why, const char *fate)
{
    /* Abandoned, as in a fork child (cudefer.h: failed counts them).
     * The unsealed batches' frees are among them (never counted
     * finished), and so are the entries the policy held: none reads held
     * from now on. */
    uint64_t left = abandon_pending();
    stats_abandon_held();
    unsigned long long ms = EXIT_DRAIN_NS / 1000000;
    if (left > 0)
        report("exit: %llu entries still pending after %llu ms: left "
               "unreleased", (unsigned long long)left, ms);
    else
        report("exit: %s %llu ms: %s", why, ms, fate);
}

/* exit() from a callback on the reclaimer thread: no drain can run, the
 * thread that would run it being this one, which never goes back to its
 * pass.  Exit gives up at once: the gate closes (waiting, as the drain
 * does, for the calls under way), and what is left pending but the
 * callback's own entry counts in leaked_at_exit and failed; from here
 * nothing counts, and a graph destroyed later counts nothing more.  With
 * or without life_lock (a shutdown on another thread holding it waits for
 * this thread, and writes no state until the abandon ends its wait); a
 * shutdown that joined first cannot have (this thread has not ended), and
 * a fork child (no longer STATE_RUNNING) counted its pending already. */
static void exit_on_reclaimer(uint64_t deadline)
{
    int open = ENDING_OPEN;
    if (atomic_load(&rs.state) != STATE_RUNNING ||
        !atomic_compare_exchange_strong(&rs.ending, &open, ENDING_GIVE_UP))
        return;
    atomic_store(&rs.exiting, true); /* before the gate closes */
    lifecycle_close_gate(deadline);
    uint64_t left = abandon_pending();
    stats_abandon_held(); /* the held entries were among them */
    if (left > 0)
        report("exit: %llu entries still pending (exit() was called from a "
               "callback on the reclaimer thread, which releases nothing "
               "from then on): left unreleased", (unsigned long long)left);
}

/* Process exit: release what completes within EXIT_DRAIN_NS and stop; what
 * does not is counted as leaked, never waited for without end.  The thread is
 * joined only when it finished, so a hung device cannot hang exit. */
void lifecycle_hooks_exit(void)
{
    if (thread_here.reclaimer) {
        bool locked = pthread_mutex_trylock(&rs.life_lock) == 0;
        exit_on_reclaimer(now_ns() + EXIT_DRAIN_NS);
        if (rs.cfg.print_stats)
            stats_print(stderr);
        if (locked)
            pthread_mutex_unlock(&rs.life_lock);
        return;
    }
    /* Another thread may hold life_lock for a moment (a first call that
     * found the reclaimer started): wait for it, within the drain's time.
     * Inside a callback, the holder may be a shutdown waiting for this very
     * thread: do not wait then. */
    uint64_t deadline = now_ns() + EXIT_DRAIN_NS;
    struct timespec until = realtime_at(deadline);
    bool inside = lifecycle_in_callback();
    if ((inside ? pthread_mutex_trylock(&rs.life_lock)
                : pthread_mutex_timedlock(&rs.life_lock, &until)) != 0) {
        /* exit() from inside start or shutdown: leave it be.  Else a
         * defer_shutdown on another thread held the lock for the whole
         * drain (it waits for work that outlasts it): exit gives up as
         * its own drain would, so that the reclaimer releases nothing and
         * makes no CUDA call once the process and the CUDA runtime end.
         * Without the lock: the shutdown closed the gate and writes no
         * state while it waits for the reclaimer's answer (a wait the
         * abandon ends).  A shutdown that joined the reclaimer took the
         * library's end first (rs.ending): it is left to finish. */
        int open = ENDING_OPEN;
        if (!inside && atomic_load(&rs.state) == STATE_RUNNING &&
            atomic_load(&rs.gate_closed) &&
            atomic_compare_exchange_strong(&rs.ending, &open,
                                           ENDING_GIVE_UP)) {
            give_up("defer_shutdown on another thread still under way "
                    "after", "not waited for");
            if (rs.cfg.print_stats)
                stats_print(stderr);
        }
        return;
    }
    if (atomic_load(&rs.state) == STATE_RUNNING && !thread_here.reclaimer) {
        static struct request q; /* outlives this call if the wait gives up */
        q = (struct request){.err = cudaSuccess};
        atomic_store(&rs.exiting, true); /* before the gate closes */
        bool closed = lifecycle_close_gate(deadline);
        /* No wait for the legacy stream here: a batch that cannot get
         * its event is left unreleased, as what the drain gives up on. */
        size_t unsealed = closed ? free_batch_seal_at_exit() : 0;
        if (closed && lifecycle_requests_wait(&q, deadline, false) &&
            lifecycle_stop_and_join(deadline)) {
            /* The unsealed batches' frees are among what is left. */
            uint64_t left = abandon_pending();
            if (unsealed > 0)
                report("exit: %zu entries still pending (blocks freed on the "
                       "legacy stream, whose batch could get no event): left "
                       "unreleased", unsealed);
            if (left > unsealed)
                report("exit: %llu entries still pending (captured into a "
                       "graph not destroyed): left unreleased",
                       (unsigned long long)(left - unsealed));
        } else {
            if (!closed) /* a call not yet counted: nothing pending */
                give_up("a defer call on another thread still under way "
                        "after", "not waited for");
            else
                give_up("the reclaimer did not stop within", "left running");
        }
        atomic_store(&rs.state, STATE_STOPPED);
    } else if (atomic_load(&rs.state) == STATE_STOPPED &&
               !atomic_load(&rs.abandoned)) {
        /* Shut down before: what is pending still is held by graphs alive
         * (capture_stop left them to their destructor), left as the drain
         * leaves them; their destructor counts nothing from here. */
        uint64_t left = abandon_pending();
        if (left > 0)
            report("exit: %llu entries still pending (captured into a graph "
                   "not destroyed): left unreleased", (unsigned long long)left);
    }
    if (rs.cfg.print_stats)
        stats_print(stderr);
    pthread_mutex_unlock(&rs.life_lock);
}

/* Process exit before cudefer started: a first call's start may hold
 * life_lock in a CUDA call that hangs (cudaGetDeviceCount), before the
 * drain's handler is registered.  Exit began: from here every call is
 * refused ("called after exit began"), and a start under way starts no
 * thread and, once its cudaGetDeviceCount returned, makes no CUDA call
 * more (start_locked reads rs.exiting, under life_lock, after that call
 * and before the thread).  So exit waits for it only as long as its
 * drain would, then says it gave up.
 * Registered by the first start before its first CUDA call, so run after
 * the drain's handler, which a start that succeeded registers; nothing to
 * do then (the state is no longer STATE_NEW).  exiting and gate_closed
 * are written without life_lock, which the start may hold for good: with
 * the state STATE_NEW no call is admitted and no reclaimer runs, so they
 * only refuse.  A start that read exiting unset before the thread, just
 * before it was set, is past its last CUDA call and ends at once: this
 * wait then takes life_lock and leaves the library to the drain's
 * handler, which that start registered (run next). */
void lifecycle_hooks_exit_starting(void)
{
    if (atomic_load(&rs.state) != STATE_NEW)
        return;
    atomic_store(&rs.exiting, true); /* before the gate closes */
    atomic_store(&rs.gate_closed, true);
    struct timespec until = realtime_at(now_ns() + EXIT_DRAIN_NS);
    if (pthread_mutex_timedlock(&rs.life_lock, &until) == 0) {
        pthread_mutex_unlock(&rs.life_lock);
        return;
    }
    give_up("a defer call on another thread still starting cudefer after",
            "not waited for (it starts nothing)");
}

/* In a fork child (Note [Fork]): no reclaimer thread exists and CUDA cannot
 * be used.  Every entry still pending is abandoned (counted failed, never
 * freed here), but for the callback the forking thread runs itself (Note
 * [Running entries]), and every later call is refused. */
static void fork_child(void)
{
    /* Whatever the state, the locks may have been held by threads that do
     * not exist here (a start in progress, say): usable again. */
    configure_fork_child();
    oom_handler_fork_child();
    pthread_mutex_init(&rs.wake_lock, NULL);
    pthread_cond_init(&rs.wake_cond, NULL);
    pthread_mutex_init(&rs.life_lock, NULL);
    int state = atomic_load(&rs.state);
    if (state != STATE_RUNNING &&
        !(state == STATE_NEW && atomic_load(&rs.start_tried))) {
        /* Admissions of threads that are gone never end. */
        lifecycle_gate_forget_admissions();
        /* Shut down before: what is pending still is held by graphs
         * alive at the shutdown, whose destructor (CUDA's thread) never
         * runs here.  Abandoned as a child forked while running abandons
         * its entries: counted failed now, and, rs.abandoned set, never
         * again (exit's handler, a count under way).  Not after exit's
         * drain, which abandoned them already. */
        if (atomic_load(&rs.state) == STATE_STOPPED &&
            !atomic_load(&rs.abandoned)) {
            atomic_store(&rs.abandoned, true);
            stats_add(&stats.failed, pending_not_running());
        }
        return;
    }
    atomic_store(&rs.state, STATE_FORKED);
    atomic_store(&rs.gate_closed, true);
    lifecycle_gate_forget_admissions();
    /* Forked by a callback on the reclaimer thread: the child's one thread
     * is the reclaimer's, which goes on once the callback returns.  It
     * must make no CUDA call, release nothing and count nothing but the
     * end of that callback (what else was pending is counted failed
     * below): abandoned, as after exit's give-up, it leaves its pass and
     * returns, and the child ends with its last thread (exit status 0). */
    if (thread_here.reclaimer)
        atomic_store(&rs.abandoned, true);
    /* First: the snapshot below reads the event pool, whose registry lock
     * another thread (reading the statistics, say) may have held. */
    event_pool_after_fork();
    /* What is pending counts failed, but for what the forking thread runs
     * itself: it goes on with it in the child, which counts its end (Note
     * [Running entries]). */
    stats_add(&stats.failed, pending_not_running());
    stats_abandon_held(); /* the held entries were among them */
    cuda_forget_entry_points();
    cache_fork_child();
    free_batch_fork_child();
    cache_upstream_fork_child();
}
