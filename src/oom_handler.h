/* SPDX-License-Identifier: MIT */
/*
 * The out-of-memory handler (defer_set_oom_handler): one (fn, arg) pair
 * for the process, set by any thread, read as a pair by a request that ran
 * out of memory, and called on that request's thread with no lock of
 * cudefer's held.  Calls no CUDA function.
 */
#ifndef CUDEFER_OOM_HANDLER_H
#define CUDEFER_OOM_HANDLER_H

#include <stdbool.h>
#include <stddef.h>

#include "report.h"

/* Any thread, holding no lock of cudefer's and no admission (the handler
 * may trim, flush or shut down).  A request of bytes on device failed out
 * of memory after cudefer's own trim and retry; *calls is how often the
 * handler was called for it so far (0 at first) and grows by one when it
 * is called now.  Blocks as long as the handler runs.  True when the
 * request is to be tried again: a handler is set, the thread is not inside
 * a handler call already, fewer than DEFER_OOM_MAX_CALLS calls were made
 * (at the bound: said naming the request's call, what, the line ending
 * with end's text, report.h; *said set, false) and the handler returned
 * nonzero. */
bool oom_handler_retry(size_t bytes, int device, unsigned *calls,
                       const char *what, const struct line_end *end,
                       bool *said);

/* Fork child only, from the library's one fork handler
 * (lifecycle_hooks.c): the pair's lock made usable again (its holder may
 * not exist there). */
void oom_handler_fork_child(void);

#endif
