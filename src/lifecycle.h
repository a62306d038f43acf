/* SPDX-License-Identifier: MIT */
/*
 * The library's lifecycle (lifecycle.c): lazy start of the reclaimer thread
 * (reclaimer.c), admission of every defer call (the gate), hand-over of
 * entries to the reclaimer, shutdown; flush and trim requests and the
 * waits for the reclaimer (lifecycle_requests.c); process exit and fork
 * (lifecycle_hooks.c, whose private header lifecycle_hooks.h is what it
 * shares with lifecycle.c).
 *
 * Launching threads bracket a submission with lifecycle_enter and
 * lifecycle_leave, so shutdown can wait for submissions already under way.
 */
#ifndef CUDEFER_LIFECYCLE_H
#define CUDEFER_LIFECYCLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "entry.h"
#include "report.h"

/* Any thread.  Starts the reclaimer on first use (settling the
 * configuration) and admits one submission.  Returns cudaSuccess (then call
 * lifecycle_leave), cudaErrorNotPermitted after defer_shutdown or in a forked
 * child (reported naming the caller, what), or the start-up error. */
cudaError_t lifecycle_enter(const char *what);

/* lifecycle_enter, each line it says ending with end's text (report.h; a
 * caller that cannot hand the error back says what it does instead, in the
 * same line: defer_pluggable_alloc's "; returning NULL ..."; NULL: none). */
cudaError_t lifecycle_enter_ending(const char *what,
                                   const struct line_end *end);

/* Any thread: cudaErrorNotPermitted (said naming what, counted) where
 * lifecycle_enter would refuse for the closed gate (after defer_shutdown,
 * in a forked child), else cudaSuccess; admits nothing, starts nothing,
 * makes no CUDA call.  For a call that must make CUDA calls before it is
 * admitted (a device switch): a forked child cannot use CUDA. */
cudaError_t lifecycle_refused(const char *what);

/* lifecycle_refused, its line ending with end's text
 * (lifecycle_enter_ending). */
cudaError_t lifecycle_refused_ending(const char *what,
                                     const struct line_end *end);

/* Any thread, between enter and leave.  Hands e to the reclaimer (which now
 * owns it) and wakes it if it sleeps.  Never blocks. */
void lifecycle_push(struct entry *e);

/* Any thread, after a successful lifecycle_enter. */
void lifecycle_leave(void);

/* Any thread, even a graph's destructor (no CUDA call): wake the reclaimer
 * if it sleeps.  Never blocks for long. */
void lifecycle_wake(void);

/* Any thread: signal the reclaimer's wake condition whether or not it
 * sleeps (a request just pushed).  Never blocks for long. */
void lifecycle_wake_now(void);

/* Any thread: refuse the call what (after shutdown or exit, or in a
 * forked child), counted and said in one line ending with end's text
 * (NULL: nothing); cudaErrorNotPermitted. */
cudaError_t lifecycle_refuse(const char *what, const struct line_end *end);

/* Any thread, between enter and leave.  Hands the synced entry e (see
 * entry.h: no event, its stream already synchronized) to the reclaimer and
 * blocks until the reclaimer has finished it, behind the earlier entries of
 * its stream; on the reclaimer thread (a callback) it only pushes e, which
 * then runs after the callback.  cudaSuccess; cudaErrorCudartUnloading
 * once another thread's exit gave up its drain while this waited: e is
 * then left to the reclaimer, never released. */
cudaError_t lifecycle_requests_push_and_wait(struct entry *e);

/* Any thread, between enter and leave: the configuration in force (its
 * disable field also alone, from the line every call reads), and the
 * sticky error of a device (cudaSuccess if none; cudaErrorInvalidDevice for
 * a device the reclaimer does not know). */
const struct defer_config *lifecycle_config(void);
bool lifecycle_disabled(void);
cudaError_t lifecycle_device_error(int device);

/* Any thread, between enter and leave: mark device failed by the sticky
 * error err that call met in what (a synchronous release's cudaFree); the
 * first error wins and is said once.  A device the reclaimer does not know
 * is ignored. */
void lifecycle_fail_device(const char *what, int device, const char *call,
                           cudaError_t err);

/* Any thread; never blocks.  n entries counted deferred are over: counted
 * released (released) or failed, unless exit gave up on them (then it
 * counted them failed itself: lifecycle_hooks_exit, lifecycle_hooks.c).
 * Every count of an entry's end goes through here, so that none is counted
 * twice. */
void lifecycle_count_finished(bool released, uint64_t n);

/* Any thread; never blocks.  One entry counted deferred, unless exit gave
 * up (lifecycle_hooks_exit): then neither it nor its end is counted.  For
 * the synchronous routes, whose wait for the stream comes before the count
 * and may outlast exit's drain.  The other routes count with
 * lifecycle_count_admitted. */
void lifecycle_count_deferred(void);

/* Any thread, admitted; never blocks.  One entry counted deferred, by the
 * routes that wait for nothing but a CUDA call's own return (an event's
 * creation or record) between their admission and the count: while the
 * gate is open, with stats_count_deferred (no shared line); once it is
 * closed, as lifecycle_count_deferred, since exit may give up meanwhile
 * (a callback of its drain, admitted past the closed gate, is waited for
 * by nobody; so is a call whose CUDA call outlasted the gate's wait). */
void lifecycle_count_admitted(void);

/* Any thread; never blocks.  Begin a write of counters that exit resets
 * when it gives up (lifecycle_hooks_exit: the held counts): true, and then
 * lifecycle_counting_end once written; false once exit gave up, and then
 * nothing is written (what was held is abandoned, counted failed). */
bool lifecycle_counting_begin(void);
void lifecycle_counting_end(void);

/* Any thread: whether it is the reclaimer thread (running a callback). */
bool lifecycle_on_reclaimer_thread(void);

/* Any thread: whether it runs a callback now (the reclaimer thread, or a
 * thread inside a defer call that runs one itself): it must not wait for
 * the reclaimer (a flush or trim would wait for itself). */
bool lifecycle_in_callback(void);

/* Any thread but the reclaimer.  Blocks until everything pushed before the
 * call has been released or has failed.  Returns cudaSuccess, the error of a
 * failed device, or cudaErrorNotPermitted (on the reclaimer thread, after
 * shutdown, in a forked child). */
cudaError_t lifecycle_requests_flush(void);

/* Any thread but the reclaimer.  Blocks while the reclaimer polls every
 * stream once and releases every completed entry, whatever the policy;
 * *bytes (if not NULL) gets the bytes released.  Errors as for flush. */
cudaError_t lifecycle_requests_trim(size_t *bytes);

/* Any thread but the reclaimer: lifecycle_requests_trim for a call of
 * what's that trims on its own (defer_alloc out of memory, before its
 * retry), each line said in its words and ending with end's text
 * (report.h; NULL: nothing), so that none names a defer_trim the caller
 * never made.  *refused: whether it was refused (a shutdown closed the gate
 * since the call was admitted; said and counted in rejected once, here),
 * when its caller must give up rather than try again.  Errors as for
 * trim. */
cudaError_t lifecycle_requests_trim_for(const char *what,
                                        const struct line_end *end,
                                        size_t *bytes, bool *refused);

/* Any thread: flush and trim requests pushed to the reclaimer so far (a
 * waiting flush's marker is in the queue once this grew; for tests). */
unsigned long lifecycle_requests_pushed(void);

/* Any thread but the reclaimer.  Refuses new submissions, drains, stops and
 * joins the thread.  Blocks.  Where exit on another thread gives up its
 * drain while this waits for the reclaimer's answer, returns then
 * (cudaErrorCudartUnloading); its wait for admitted calls and its join are
 * not cut short.  A second call returns cudaSuccess. */
cudaError_t lifecycle_shutdown(void);

/* Tests: hook (NULL: none) runs in the stop, once it joined the reclaimer
 * and took the library's end from exit (rs.ending), before it frees the
 * state; so that a test can have exit run meanwhile. */
void lifecycle_test_set_stop_hook(void (*hook)(void));

#endif
