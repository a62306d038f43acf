/* SPDX-License-Identifier: MIT */
/* The out-of-memory handler (oom_handler.h): the pair, its setter and its
 * calls.  The pair is read and written under one mutex, held only to copy
 * two pointers (never while the handler runs), so a request never calls
 * one handler with another's arg, and the handler may set the pair itself
 * or allocate. */
#include <pthread.h>

#include "cudefer.h"
#include "oom_handler.h"
#include "report.h"

static struct {
    pthread_mutex_t lock; /* guards fn and arg together */
    defer_oom_handler fn; /* NULL: no handler */
    void *arg;
} pair = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Whether the thread runs the handler now: its own allocations out of
 * memory do not call it again (no recursion into a handler that
 * allocates). */
static _Thread_local bool in_handler;

/* Fork child only (lifecycle_hooks.c's fork handler); never blocks: the
 * lock re-made, the pair kept (the child's own calls are refused anyway). */
void oom_handler_fork_child(void)
{
    pthread_mutex_init(&pair.lock, NULL);
}

/* Public, any thread, the handler included; blocks only on the pair's
 * lock (held for two pointers), never on the GPU.  Stores (fn, arg), NULL
 * fn removing the handler, and gives the pair replaced in *prev_fn and
 * *prev_arg (each if not NULL).  Always cudaSuccess. */
cudaError_t defer_set_oom_handler(defer_oom_handler fn, void *arg,
                                  defer_oom_handler *prev_fn,
                                  void **prev_arg)
{
    if (fn == NULL)
        arg = NULL; /* no handler has no arg: a later read gives NULL, NULL */
    pthread_mutex_lock(&pair.lock);
    defer_oom_handler old_fn = pair.fn;
    void *old_arg = pair.arg;
    pair.fn = fn;
    pair.arg = arg;
    pthread_mutex_unlock(&pair.lock);
    if (prev_fn != NULL)
        *prev_fn = old_fn;
    if (prev_arg != NULL)
        *prev_arg = old_arg;
    return cudaSuccess;
}

/* Any thread, holding no lock or admission of cudefer's; blocks while
 * the handler runs.  Whether to try the request again (oom_handler.h). */
bool oom_handler_retry(size_t bytes, int device, unsigned *calls,
                       const char *what, const struct line_end *end,
                       bool *said)
{
    if (in_handler)
        return false;
    pthread_mutex_lock(&pair.lock);
    defer_oom_handler fn = pair.fn;
    void *arg = pair.arg;
    pthread_mutex_unlock(&pair.lock);
    if (fn == NULL)
        return false;
    if (*calls >= DEFER_OOM_MAX_CALLS) {
        char tail[128];
        report_line_end(end, tail, sizeof tail);
        report("%s: out of memory for %zu bytes on device %d after the "
               "out-of-memory handler asked for %u retries: giving up%s",
               what, bytes, device, *calls, tail);
        *said = true;
        return false;
    }
    ++*calls;
    in_handler = true;
    int again = fn(bytes, device, arg);
    in_handler = false;
    return again != 0;
}
