/*
 * The reclaimer: one thread that takes every pushed entry at once, keeps it
 * in its stream's FIFO, polls the oldest event of each stream and releases
 * what has completed, as a batch.  With nothing pending it sleeps on a
 * condition variable until the next push.  Also the library's lifecycle:
 * lazy start, flush, shutdown.
 *
 * Launching threads bracket a submission with reclaimer_enter and
 * reclaimer_leave, so shutdown can wait for submissions already under way.
 */
#ifndef CUDEFER_RECLAIMER_H
#define CUDEFER_RECLAIMER_H

#include <stdbool.h>
#include <cuda_runtime_api.h>

#include "config.h"
#include "entry.h"

/* Any thread.  Starts the reclaimer on first use (reading the configuration)
 * and admits one submission.  Returns cudaSuccess (then call
 * reclaimer_leave), cudaErrorNotPermitted after defer_shutdown (reported with
 * the name of the caller, what), or the error that prevented start-up.  */
cudaError_t reclaimer_enter(const char *what);

/* Any thread, between enter and leave.  Hands e to the reclaimer (which now
 * owns it) and wakes it if it sleeps.  Never blocks. */
void reclaimer_push(struct entry *e);

/* Any thread, after a successful reclaimer_enter. */
void reclaimer_leave(void);

/* Any thread, between enter and leave.  The configuration in force, the
 * number of devices, and the sticky error of a device (cudaSuccess if none;
 * cudaErrorInvalidDevice for a device the reclaimer does not know). */
const struct config *reclaimer_config(void);
cudaError_t reclaimer_device_error(int device);

/* Any thread but the reclaimer.  Blocks until everything pushed before the
 * call has been released or has failed.  Returns cudaSuccess, the error of a
 * failed device, or cudaErrorNotPermitted (on the reclaimer thread, after
 * shutdown). */
cudaError_t reclaimer_flush(void);

/* Any thread but the reclaimer.  Refuses new submissions, drains, stops and
 * joins the thread.  Blocks.  A second call returns cudaSuccess. */
cudaError_t reclaimer_shutdown(void);

#endif
