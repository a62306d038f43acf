/* SPDX-License-Identifier: MIT */
/*
 * The lifecycle's one private header (the interface is lifecycle.h): what
 * lifecycle.c and the process hooks (lifecycle_hooks.c) share.  lifecycle.c
 * holds the lazy start, the gate, the hand-over, flush and trim requests and
 * shutdown, and lends the hooks the gate's close and forget, the request's
 * wait and the stop; lifecycle_hooks.c holds the drain at process exit,
 * which the start registers, and the fork child's handler with Note [Fork].
 * Only these two include it.
 *
 * State: both work on rs alone (reclaimer_state.h says who writes each of
 * its fields and under which lock); neither file keeps state of its own
 * that the other reads.
 */
#ifndef CUDEFER_LIFECYCLE_HOOKS_H
#define CUDEFER_LIFECYCLE_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include "reclaimer_state.h"

/* Under life_lock (shutdown, exit): close the gate and wait for the
 * submissions already admitted, but for the caller's own, until deadline_ns
 * if not 0.  Blocks (yields, then naps).  False if the deadline passed. */
bool lifecycle_close_gate(uint64_t deadline_ns);

/* Fork child only (lifecycle_hooks.c), alone in its process: forget every
 * admission of the threads that are gone, keeping the forking thread's own.
 * Never blocks. */
void lifecycle_gate_forget_admissions(void);

/* Any thread but the reclaimer (flush, trim; shutdown and exit under
 * life_lock): push the request q and block until the reclaimer answers it,
 * at most until deadline_ns if not 0.  False if the deadline passed first,
 * or, q abandonable (shutdown's, a flush's or trim's), once exit gave up:
 * q, left to the reclaimer, must outlive it.  With leave_gate, the caller's admission
 * ends once q is pushed. */
bool lifecycle_requests_wait(struct request *q, uint64_t deadline_ns,
                             bool leave_gate);

/* Under life_lock, not on the reclaimer thread (shutdown, exit): ask the
 * reclaimer to stop once everything is released, join it and free its
 * state, until deadline_ns if not 0.  Blocks.  False if the deadline passed
 * first (the thread is left running, its state kept), or if exit gave up
 * (rs.abandoned: the thread detached itself, or was joined; its state is
 * kept, as it may be mid-pass and no CUDA call is to follow). */
bool lifecycle_stop_and_join(uint64_t deadline_ns);

/* Process exit only: the atexit handler, registered once by the first
 * start (lifecycle.c).  Drains what completes within its limit and stops
 * the reclaimer; what does not is counted as leaked.  Blocks at most the
 * drain's limit; never hangs exit.  A shutdown on another thread that
 * holds life_lock for the whole limit is given up on the same way
 * (rs.abandoned, without the lock): it returns.  Run on the reclaimer
 * thread (exit() from a callback), which no drain can wait for, it gives
 * up at once.  After defer_shutdown, what graphs alive hold counts as
 * leaked. */
void lifecycle_hooks_exit(void);

/* Process exit only: the atexit handler that the first start registers
 * before its first CUDA call (lifecycle.c), for an exit before cudefer
 * started: sets rs.exiting and closes the gate without life_lock, so that
 * a start under way refuses once its CUDA call returns; waits for that
 * start at most the drain's limit, then says it gave up.  Does nothing
 * once a start succeeded (lifecycle_hooks_exit's, run first). */
void lifecycle_hooks_exit_starting(void);

#endif
