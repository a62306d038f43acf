/* SPDX-License-Identifier: MIT */
/*
 * fake_stream.c — streams, simulated work and events on the simulated
 * clock (real time, CLOCK_MONOTONIC).  Work on a stream completes strictly
 * in stream order; an event captures the work enqueued on a stream so far;
 * cudaStreamWaitEvent enqueues a barrier that completes with the event's
 * work.  Completion is computed lazily whenever someone looks.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM_BASE   ((uintptr_t)0x5a0000000000u)  /* stream handles */
#define EVENT_BASE    ((uintptr_t)0x5e0000000000u)  /* event handles */

/* Now on the monotonic clock, in nanoseconds.  Anyone. */
int64_t fake_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* A new stream of kind on dev, registered.  Lock held. */
struct fstream *fake_stream_new(int dev, enum stream_kind kind)
{
    struct fstream *s = calloc(1, sizeof *s);

    if (s == NULL)
        fake_die("out of memory");
    s->id = fake.next_stream_id++;
    s->reported_id = s->id;
    s->dev = dev;
    s->kind = kind;
    fake.streams = fake_grow(fake.streams, fake.nstreams, &fake.capstreams,
                                   sizeof *fake.streams);
    fake.streams[fake.nstreams++] = s;
    return s;
}

/* The handle of user stream s. */
static cudaStream_t stream_handle(const struct fstream *s)
{
    return (cudaStream_t)(STREAM_BASE + (uintptr_t)s->id * HANDLE_STRIDE);
}

/* The stream a handle names for the calling thread, or NULL if the handle
 * is not a live stream.  Unknown handles are never dereferenced. */
struct fstream *fake_stream_resolve(cudaStream_t h)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;
    struct fstream *s;

    if (h == 0 || h == cudaStreamLegacy) {
        fake_touch(fake_thread.dev);
        return fake.legacy[fake_thread.dev];
    }
    if (h == cudaStreamPerThread) {
        fake_touch(fake_thread.dev);
        if (fake_thread.pts[fake_thread.dev] == NULL)
            fake_thread.pts[fake_thread.dev] =
                fake_stream_new(fake_thread.dev, S_PER_THREAD);
        return fake_thread.pts[fake_thread.dev];
    }
    if (v < STREAM_BASE || (v - STREAM_BASE) % HANDLE_STRIDE != 0)
        return NULL;
    id = (v - STREAM_BASE) / HANDLE_STRIDE;
    if (id < fake.stream_base || id - fake.stream_base >= fake.nstreams)
        return NULL;
    s = fake.streams[id - fake.stream_base];
    while (s->destroyed && s->reused_by != NULL)
        s = s->reused_by;
    return (s->kind == S_USER && !s->destroyed) ? s : NULL;
}

cudaStream_t fake_stream_create_reusing(cudaStream_t destroyed)
{
    uintptr_t v = (uintptr_t)destroyed;
    struct fstream *old = NULL, *s;

    fake_lock();
    if (v >= STREAM_BASE && (v - STREAM_BASE) % HANDLE_STRIDE == 0) {
        unsigned long long id = (v - STREAM_BASE) / HANDLE_STRIDE;
        if (id >= fake.stream_base && id - fake.stream_base < fake.nstreams)
            old = fake.streams[id - fake.stream_base];
    }
    if (old == NULL || old->kind != S_USER || !old->destroyed ||
        old->reused_by != NULL)
        fake_die("fake_stream_create_reusing: not a destroyed user stream "
                 "whose handle is free");
    s = fake_stream_new(fake_thread.dev, S_USER);
    s->nonblocking = old->nonblocking;
    old->reused_by = s;
    fake_unlock();
    return destroyed;
}

/* Append a new work item to s. */
struct fake_work *fake_work_new(struct fstream *s, enum work_kind kind)
{
    struct fake_work *w = calloc(1, sizeof *w);

    if (w == NULL)
        fake_die("out of memory");
    fake.works = fake_grow(fake.works, fake.nworks, &fake.capworks,
                                 sizeof *fake.works);
    fake.works[fake.nworks++] = w;
    w->id = fake.nworks;
    w->stream = s;
    w->kind = kind;
    w->launch_ns = fake_now_ns();
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    if (s->first_pending == NULL)
        s->first_pending = w;
    return w;
}

/* Mark done, in order, the items of s that have completed by now.  *hint
 * is lowered to when the first pending item would complete, if known. */
static void eval_stream(struct fstream *s, int64_t now, int64_t *hint)
{
    struct fake_work *w;
    int64_t t;

    if (s->evaluating)
        return;
    s->evaluating = 1;
    for (w = s->first_pending; w != NULL; w = w->next) {
        int64_t prev = s->last_done_ns;

        if (w->kind == W_TIMED) {
            t = max64(prev, w->launch_ns) + w->duration_ns;
            if (t > now) {
                if (t < *hint)
                    *hint = t;
                break;
            }
        } else if (w->kind == W_HELD) {
            if (!w->released)
                break;
            t = max64(prev, w->release_ns);
        } else {
            struct fake_work *x = w->wait_for;

            if (!x->done)
                eval_stream(x->stream, now, hint);
            if (!x->done)
                break;
            t = max64(prev, x->done_ns);
        }
        w->done = 1;
        w->done_ns = t;
        s->last_done_ns = t;
        s->first_pending = w->next;
    }
    s->evaluating = 0;
}

/* 1 if w (NULL: nothing) has completed by now. */
int fake_work_completed(struct fake_work *w, int64_t now, int64_t *hint)
{
    if (w == NULL || w->done)
        return 1;
    eval_stream(w->stream, now, hint);
    return w->done;
}

/* Block (lock held) until the n items in ws have completed. */
void fake_work_wait(struct fake_work *const *ws, size_t n)
{
    for (;;) {
        int64_t now = fake_now_ns(), hint = INF_NS, until;
        struct timespec ts;
        size_t i, left = 0;

        for (i = 0; i < n; i++)
            left += !fake_work_completed(ws[i], now, &hint);
        if (left == 0)
            return;
        until = hint - now < MAX_WAIT_NS ? hint : now + MAX_WAIT_NS;
        ts.tv_sec = (time_t)(until / 1000000000);
        ts.tv_nsec = (long)(until % 1000000000);
        pthread_cond_timedwait(&fake.cond, &fake.lock, &ts);
    }
}

/* 1 if pending work u is ordered before item upto of stream x: on the
 * same stream, or (transitively) before a pending cudaStreamWaitEvent
 * barrier of x that precedes upto.
 *
 * A walk over (stream, item) pairs, each the question "is u before this
 * item of its stream": one for upto, then one for the item each pending
 * barrier met waits on.  Waits only name work enqueued earlier, so item
 * ids fall along every path and the walk ends.  It is linear: a stream
 * met again is scanned only past what this walk already scanned of it
 * (walk_next), since the barriers before that were followed already; a
 * later item of the stream asks everything an earlier one does and more.
 * Answered by scanning each stream's pending items afresh along every path,
 * a lattice of streams each waiting on the two before it took time
 * exponential in its size (t/fake_selftest_streams.c, test_wait_lattice).
 * The pairs wait in fake.walk, a scratch stack kept between calls. */
int fake_work_ordered_before(const struct fake_work *u, struct fstream *x,
                             const struct fake_work *upto)
{
    unsigned long long walk = ++fake.walk_id;
    size_t n = 0;

    if (upto == NULL)
        return 0;
    fake.walk = fake_grow(fake.walk, n, &fake.capwalk, sizeof *fake.walk);
    fake.walk[n++] = (struct fwalk){ x, upto };
    while (n > 0) {
        struct fwalk at = fake.walk[--n];
        const struct fake_work *w;

        if (at.s == u->stream) {
            if (u->id <= at.upto->id)
                return 1;
            continue;
        }
        if (at.s->walk_id != walk) {
            at.s->walk_id = walk;
            at.s->walk_next = at.s->first_pending;
        }
        for (w = at.s->walk_next; w != NULL && w->id <= at.upto->id;
             w = w->next)
            if (w->kind == W_BARRIER && !w->wait_for->done) {
                fake.walk = fake_grow(fake.walk, n, &fake.capwalk,
                                      sizeof *fake.walk);
                fake.walk[n++] = (struct fwalk){ w->wait_for->stream,
                                                 w->wait_for };
            }
        at.s->walk_next = w;
    }
    return 0;
}

/* Common part of fake_launch and fake_launch_held. */
static fake_work *launch(cudaStream_t h, enum work_kind kind, unsigned us,
                         void *const *uses, size_t nuses)
{
    struct fstream *s;
    struct fake_work *w = NULL;
    size_t i;

    fake_lock();
    s = fake_stream_resolve(h);
    if (s != NULL && s->capture != NULL) {
        w = fake_capture_work(s, kind, us, uses, nuses);
    } else if (s != NULL) {
        w = fake_work_new(s, kind);
        w->duration_ns = (int64_t)us * 1000;
        for (i = 0; uses != NULL && i < nuses; i++)
            fake_alloc_add_use(w, uses[i]);
    }
    fake_unlock();
    return w;
}

/* Simulated work of the control API (fake_cuda.h).  Any thread. */
fake_work *fake_launch(cudaStream_t s, unsigned duration_us,
                       void *const *uses, size_t nuses)
{
    return launch(s, W_TIMED, duration_us, uses, nuses);
}

fake_work *fake_launch_held(cudaStream_t s, void *const *uses, size_t nuses)
{
    return launch(s, W_HELD, 0, uses, nuses);
}

void fake_complete(fake_work *w)
{
    fake_lock();
    if (w != NULL && w->kind == W_HELD && !w->released) {
        w->released = 1;
        w->release_ns = fake_now_ns();
        pthread_cond_broadcast(&fake.cond);
    }
    fake_unlock();
}

int fake_work_done(const fake_work *w)
{
    int64_t hint = INF_NS;
    int r;

    if (w == NULL)
        return 0;
    fake_lock();
    r = fake_work_completed((struct fake_work *)w, fake_now_ns(), &hint);
    fake_unlock();
    return r;
}

unsigned long long fake_work_id(const fake_work *w)
{
    return w ? w->id : 0;
}

/* Events created and not yet destroyed. */
size_t fake_live_events(void)
{
    size_t n;

    fake_lock();
    n = fake.live_events;
    fake_unlock();
    return n;
}

/* ---- cudart: streams -------------------------------------------------- */

/* Create a stream on the current device (priority ignored; flags:
 * cudaStreamNonBlocking or not, for the legacy stream's capture status). */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream,
                                         unsigned int flags, int priority)
{
    struct fstream *s;

    (void)priority;
    ENTER(FAKE_STREAM_CREATE);
    if (pStream == NULL)
        return fake_leave(cudaErrorInvalidValue);
    fake_touch(fake_thread.dev);
    s = fake_stream_new(fake_thread.dev, S_USER);
    s->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    *pStream = stream_handle(s);
    return fake_leave(cudaSuccess);
}

/* Same as cudaStreamCreateWithPriority, priority 0. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream,
                                      unsigned int flags)
{
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithPriority(pStream, 0, 0);
}

/* Destroy a user stream; its pending work still completes. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_DESTROY);
    if (stream == 0 || stream == cudaStreamLegacy ||
        stream == cudaStreamPerThread ||
        (s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    s->destroyed = 1;
    fake_unmap_settle(s);
    return fake_leave(cudaSuccess);
}


/* Block until all work enqueued on stream so far has completed. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    struct fstream *s;
    struct fake_work *tail;

    ENTER(FAKE_STREAM_SYNCHRONIZE);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)
        return fake_leave(fake_capture_invalidate(s));
    UNSAFE_CALL();
    tail = s->tail;
    fake_work_wait(&tail, 1);
    fake_unmap_settle(s);
    return fake_leave(cudaSuccess);
}

/* cudaSuccess if all work on stream has completed, else NotReady. */
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    struct fstream *s;
    int64_t hint = INF_NS;

    ENTER(FAKE_STREAM_QUERY);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)
        return fake_leave(fake_capture_invalidate(s));
    UNSAFE_CALL();
    return fake_leave(fake_work_completed(s->tail, fake_now_ns(), &hint)
                          ? cudaSuccess : cudaErrorNotReady);
}

/* The stream's unique id (never reused, not even after fake_reset), unless
 * fake_set_stream_id gave it another. */
cudaError_t cudaStreamGetId(cudaStream_t hStream, unsigned long long *streamId)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_GET_ID);
    if (streamId == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* whatever the thread's mode */
        return fake_leave(fake_capture_invalidate(s));
    *streamId = s->reported_id;
    return fake_leave(cudaSuccess);
}

/* The device of the stream. */
cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_GET_DEVICE);
    if (device == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(hStream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* whatever the thread's mode */
        return fake_leave(fake_capture_invalidate(s));
    *device = s->dev;
    return fake_leave(cudaSuccess);
}


/* None, Active, or Invalidated (see cudaStreamBeginCapture). */
cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus)
{
    struct fstream *s;

    ENTER(FAKE_STREAM_IS_CAPTURING);
    if (pCaptureStatus == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (fake_capture_implicit(s))
        return fake_leave(cudaErrorStreamCaptureImplicit);
    *pCaptureStatus = fake_capture_status(s);
    return fake_leave(cudaSuccess);
}


/* ---- cudart: events --------------------------------------------------- */

/* The live event a handle names, or NULL. */
static struct fevent *find_event(cudaEvent_t h)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;

    if (v < EVENT_BASE || (v - EVENT_BASE) % HANDLE_STRIDE != 0)
        return NULL;
    id = (v - EVENT_BASE) / HANDLE_STRIDE;
    if (id < fake.event_base || id - fake.event_base >= fake.nevents)
        return NULL;
    return fake.events[id - fake.event_base].destroyed
               ? NULL : &fake.events[id - fake.event_base];
}

/* Make later work on stream wait for event's captured work (a no-op for
 * an event never recorded or already complete). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags)
{
    struct fstream *s;
    struct fevent *e;
    int64_t hint = INF_NS;

    (void)flags;
    ENTER(FAKE_STREAM_WAIT_EVENT);
    if ((e = find_event(event)) == NULL ||
        (s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL)     /* not modeled: see fake_capture_join */
        return fake_leave(cudaErrorNotSupported);
    if (!fake_work_completed(e->cap, fake_now_ns(), &hint))
        fake_work_new(s, W_BARRIER)->wait_for = e->cap;
    return fake_leave(cudaSuccess);
}

/* Create an event on the current device (flags ignored). */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    struct fevent *e;
    unsigned long long id;

    (void)flags;
    ENTER(FAKE_EVENT_CREATE);
    if (event == NULL)
        return fake_leave(cudaErrorInvalidValue);
    fake_touch(fake_thread.dev);
    fake.events = fake_grow(fake.events, fake.nevents, &fake.capevents,
                                  sizeof *fake.events);
    e = &fake.events[fake.nevents++];
    memset(e, 0, sizeof *e);
    e->dev = fake_thread.dev;
    id = fake.next_event_id++;
    fake.live_events++;
    *event = (cudaEvent_t)(EVENT_BASE + (uintptr_t)id * HANDLE_STRIDE);
    return fake_leave(cudaSuccess);
}

/* Same as cudaEventCreateWithFlags, no flags. */
cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

/* Destroy an event. */
cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    struct fevent *e;

    ENTER(FAKE_EVENT_DESTROY);
    if ((e = find_event(event)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    e->destroyed = 1;
    fake.live_events--;
    return fake_leave(cudaSuccess);
}

/* Capture the work enqueued on stream so far.  The event and the stream
 * must belong to the same device. */
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                     unsigned int flags)
{
    struct fevent *e;
    struct fstream *s;

    (void)flags;
    ENTER(FAKE_EVENT_RECORD);
    if ((e = find_event(event)) == NULL ||
        (s = fake_stream_resolve(stream)) == NULL ||
        e->dev != s->dev)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->capture != NULL) {
        fake_violation("event recorded into a capture: cudaEventRecord on "
                       "stream id %llu, which captures into graph #%llu",
                       s->id, s->capture->id);
        return fake_leave(cudaErrorStreamCaptureUnsupported);
    }
    e->cap = s->tail;
    fake_thread.last_recorded = event;
    return fake_leave(cudaSuccess);
}

cudaEvent_t fake_take_last_recorded(void)
{
    cudaEvent_t ev = fake_thread.last_recorded;
    fake_thread.last_recorded = NULL;
    return ev;
}

/* Same as cudaEventRecordWithFlags, no flags. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return cudaEventRecordWithFlags(event, stream, 0);
}

/* cudaSuccess if the captured work has completed (or the event was never
 * recorded), else cudaErrorNotReady. */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    struct fevent *e;
    int64_t hint = INF_NS;

    ENTER(FAKE_EVENT_QUERY);
    if ((e = find_event(event)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    UNSAFE_CALL();
    return fake_leave(fake_work_completed(e->cap, fake_now_ns(), &hint)
                          ? cudaSuccess : cudaErrorNotReady);
}

/* Block until the captured work has completed. */
cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    struct fevent *e;
    struct fake_work *cap;

    ENTER(FAKE_EVENT_SYNCHRONIZE);
    if ((e = find_event(event)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    UNSAFE_CALL();
    cap = e->cap;
    fake_work_wait(&cap, 1);
    return fake_leave(cudaSuccess);
}
