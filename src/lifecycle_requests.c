/* SPDX-License-Identifier: MIT */
/* Waiting for the reclaimer (lifecycle.h): a flush or trim request and
 * its wait, and a synced entry pushed and waited for.  The request's
 * marker goes through the same queue as every entry, so the reclaimer
 * answers it after everything pushed before it; the caller waits on the
 * request's own condition variable.  Any thread but the reclaimer (which
 * would wait for itself), but where a function says otherwise. */
#include "lifecycle.h"
#include "lifecycle_hooks.h"
#include "reclaimer_state.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "free_batch.h"
#include "report.h"
#include "stats.h"
#include "stream_lane.h"

/* How often an abandonable wait looks whether exit gave up. */
#define ABANDON_POLL_NS UINT64_C(10000000)

/* Flush and trim requests pushed so far (lifecycle_requests_pushed). */
static _Atomic unsigned long requests_pushed;

unsigned long lifecycle_requests_pushed(void)
{
    return atomic_load(&requests_pushed);
}

/* q's lock and condition, its timed waits on CLOCK_MONOTONIC (now_ns). */
static void request_init_sync(struct request *q)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, &attr);
    pthread_condattr_destroy(&attr);
}

/* Wait, holding no lock of cudefer's, until q is answered (true: its lock
 * and condition destroyed), or until deadline_ns if not 0, or, q
 * abandonable, once exit gave up (false: q is left to the reclaimer). */
static bool await_answer(struct request *q, uint64_t deadline_ns)
{
    pthread_mutex_lock(&q->lock);
    while (!q->done) {
        if (deadline_ns == 0 && !q->abandonable) {
            pthread_cond_wait(&q->cond, &q->lock);
            continue;
        }
        /* An abandonable wait looks at the abandon every
         * ABANDON_POLL_NS: exit, giving up, signals no request (it cannot
         * take life_lock while a shutdown holds it, and a reclaimer left
         * inside a callback answers nothing more). */
        uint64_t until = deadline_ns;
        if (q->abandonable) {
            if (atomic_load(&rs.abandoned))
                break;
            uint64_t slice = now_ns() + ABANDON_POLL_NS;
            if (until == 0 || slice < until)
                until = slice;
        }
        struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
                              .tv_nsec = (long)(until % 1000000000u)};
        if (pthread_cond_timedwait(&q->cond, &q->lock, &ts) == ETIMEDOUT &&
            !q->done && until == deadline_ns)
            break;
    }
    bool answered = q->done;
    pthread_mutex_unlock(&q->lock);
    if (answered) {
        pthread_cond_destroy(&q->cond);
        pthread_mutex_destroy(&q->lock);
    }
    return answered;
}

/* Push a request and wait for it (at most until deadline_ns, if not 0);
 * false if the deadline passed first, or, for an abandonable request,
 * once exit gave up: the request (with its queue marker) is then left to
 * the reclaimer, so q must outlive it.  With leave_gate, the caller's
 * admission ends once the request is pushed. */
bool lifecycle_requests_wait(struct request *q, uint64_t deadline_ns,
                             bool leave_gate)
{
    struct entry *marker = &q->marker;
    *marker = (struct entry){.kind = ENTRY_REQUEST, .request = q};
    request_init_sync(q);
    /* A flush waits for callbacks that share events: while it does, no
     * lane records a pending event again (stream_lane.h), so it waits for
     * no work deferred after it began (but a call's running beside its
     * start). */
    if (!q->trim)
        stream_lane_waiter(1);
    lifecycle_push(marker);
    atomic_fetch_add(&requests_pushed, 1);
    if (leave_gate)
        lifecycle_leave();
    lifecycle_wake_now(); /* do not wait for a napping reclaimer's next pass */
    bool answered = await_answer(q, deadline_ns);
    if (!q->trim)
        stream_lane_waiter(-1);
    return answered;
}

/* A request for the heap, abandonable: a waiter that exit leaves behind
 * returns, and the reclaimer may still answer it (the memory is then
 * never freed: the process is ending).  Where there is no host memory for
 * one, stack's (not abandonable): the wait ends only with its answer. */
static struct request *request_new(struct request *stack)
{
    struct request *q = calloc(1, sizeof *q);
    if (q == NULL) {
        *stack = (struct request){0};
        return stack;
    }
    q->abandonable = true;
    return q;
}

/* q's end, answered (a request_new's). */
static void request_free(struct request *q, const struct request *stack)
{
    if (q != stack)
        free(q);
}

cudaError_t lifecycle_requests_push_and_wait(struct entry *e)
{
    /* On the reclaimer thread e runs once this callback returns. */
    if (lifecycle_on_reclaimer_thread()) {
        e->request = NULL;
        lifecycle_push(e);
        return cudaSuccess;
    }
    struct request stack, *q = request_new(&stack);
    q->err = cudaSuccess;
    request_init_sync(q);
    e->request = q;
    stream_lane_waiter(1); /* it waits behind callbacks: as a flush does */
    lifecycle_push(e);
    bool answered = await_answer(q, 0);
    stream_lane_waiter(-1);
    if (!answered) /* exit gave up: q and e are left to the reclaimer */
        return cudaErrorCudartUnloading;
    request_free(q, &stack);
    return cudaSuccess;
}

/* Checks shared by flush and trim (what's lines ending with end's text);
 * cudaSuccess when they may go on. */
static cudaError_t may_wait(const char *what, const struct line_end *end)
{
    if (lifecycle_in_callback()) {
        stats_add(&stats.rejected, 1);
        report("%s called from a defer_call callback: refused (it would wait "
               "for itself)", what);
        return cudaErrorNotPermitted;
    }
    int state = atomic_load(&rs.state);
    if (state == STATE_FORKED || state == STATE_STOPPED ||
        atomic_load(&rs.gate_closed))
        return lifecycle_refuse(what, end);
    return cudaSuccess;
}

/* A flush or trim for a call of what's, each line it says ending with
 * end's text; *refused (if not NULL): whether the call was refused before
 * it asked anything of the reclaimer (said and counted). */
static cudaError_t request(const char *what, const struct line_end *end,
                           bool trim, size_t *bytes, bool *refused)
{
    if (bytes != NULL)
        *bytes = 0;
    if (refused != NULL)
        *refused = true;
    cudaError_t err = may_wait(what, end);
    if (err != cudaSuccess)
        return err;
    if (refused != NULL)
        *refused = false;
    if (atomic_load_explicit(&rs.state, memory_order_acquire) == STATE_NEW)
        return cudaSuccess; /* nothing was ever deferred */
    if ((err = lifecycle_enter_ending(what, end)) != cudaSuccess) {
        if (refused != NULL)
            *refused = true;
        return err;
    }
    /* Blocks freed on the legacy stream wait for no event yet: their
     * batches get one now, before the request (free_batch.h).  One that
     * cannot have it waits on: the request's error unless a device's is. */
    cudaError_t unsealed = free_batch_seal_all(what, false);
    /* The gate is held only while pushing: a waiting flush must not keep
     * shutdown or exit from closing it.  The reclaimer answers every request
     * it took before it stops. */
    struct request stack, *q = request_new(&stack);
    q->trim = trim;
    q->err = cudaSuccess;
    if (!lifecycle_requests_wait(q, 0, true))
        return cudaErrorCudartUnloading; /* exit gave up: q is left */
    if (bytes != NULL)
        *bytes = (size_t)q->bytes;
    err = q->err != cudaSuccess ? q->err : unsealed;
    request_free(q, &stack);
    return err;
}

cudaError_t lifecycle_requests_flush(void)
{
    return request("defer_flush", NULL, false, NULL, NULL);
}

cudaError_t lifecycle_requests_trim(size_t *bytes)
{
    return request("defer_trim", NULL, true, bytes, NULL);
}

cudaError_t lifecycle_requests_trim_for(const char *what,
                                        const struct line_end *end,
                                        size_t *bytes, bool *refused)
{
    return request(what, end, true, bytes, refused);
}
