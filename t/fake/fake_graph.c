/* SPDX-License-Identifier: MIT */
/*
 * fake_graph.c — stream capture and graphs: what a capturing stream
 * refuses (and which captures that invalidates), graphs made by a capture,
 * executable graphs and their launches, and user objects whose destructors
 * run on the fake's own thread once no graph holds them.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#define GRAPH_BASE    ((uintptr_t)0x6a0000000000u)  /* graph handles */
#define EXEC_BASE     ((uintptr_t)0x6c0000000000u)  /* executable graphs */
#define UOBJ_BASE     ((uintptr_t)0x6e0000000000u)  /* user objects */

/* A graph or executable graph, not destroyed, that uses bytes of r (it
 * can still be launched), or NULL. */
struct fgraph *fake_graph_using(struct frange r)
{
    struct fgraph **lists[2] = { fake.graphs, fake.execs };
    size_t counts[2] = { fake.ngraphs, fake.nexecs };

    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++) {
            struct fgraph *x = lists[l][i];

            if (x->destroyed)
                continue;
            for (size_t k = 0; k < x->nuses; k++)
                if (x->uses[k].lo < r.hi && r.lo < x->uses[k].hi)
                    return x;
        }
    return NULL;
}

/* A call that may not be made on a capturing stream was: the capture is
 * invalidated (as CUDA does).  Lock held. */
cudaError_t fake_capture_invalidate(struct fstream *s)
{
    s->capture->invalidated = 1;
    return cudaErrorStreamCaptureUnsupported;
}

/* A "potentially unsafe" call (see THE MODEL) by the calling thread:
 * cudaSuccess if allowed; else the captures it conflicts with are
 * invalidated and it is refused.  Lock held. */
cudaError_t fake_capture_unsafe_call(void)
{
    int refused = 0;
    size_t i;

    if (fake_thread.mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    for (i = 0; i < fake.ngraphs; i++) {
        struct fgraph *x = fake.graphs[i];
        int own;

        if (!x->capturing || x->invalidated)
            continue;
        own = pthread_equal(x->thread, pthread_self());
        if ((own && x->mode != cudaStreamCaptureModeRelaxed) ||
            (!own && x->mode == cudaStreamCaptureModeGlobal &&
             fake_thread.mode == cudaStreamCaptureModeGlobal)) {
            x->invalidated = 1;
            refused = 1;
        }
    }
    return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

int fake_capture_implicit(const struct fstream *s)
{
    size_t i;

    if (s->kind != S_LEGACY)
        return 0;
    for (i = 0; i < fake.nstreams; i++) {
        const struct fstream *o = fake.streams[i];

        if (o->dev == s->dev && o->kind != S_LEGACY && !o->nonblocking &&
            !o->destroyed && o->capture != NULL)
            return 1;
    }
    return 0;
}

/* The capture status of s.  Lock held. */
enum cudaStreamCaptureStatus fake_capture_status(const struct fstream *s)
{
    if (s->capture == NULL)
        return cudaStreamCaptureStatusNone;
    return s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
}

/* ---- cudart: graphs and user objects -----------------------------------
 * A capture builds a graph (struct fgraph); instantiating copies it into an
 * executable graph, user object references included.  Destructors run on
 * the fake's own thread (uobj_main), outside the lock. */


static struct fgraph *new_graph(int exec)
{
    struct fgraph *x = calloc(1, sizeof *x);

    if (x == NULL)
        fake_die("out of memory");
    x->exec = exec;
    if (exec) {
        x->id = fake.next_exec_id++;
        fake.execs = fake_grow(fake.execs, fake.nexecs, &fake.capexecs,
                                     sizeof *fake.execs);
        fake.execs[fake.nexecs++] = x;
    } else {
        x->id = fake.next_graph_id++;
        fake.graphs = fake_grow(fake.graphs, fake.ngraphs, &fake.capgraphs,
                                      sizeof *fake.graphs);
        fake.graphs[fake.ngraphs++] = x;
    }
    return x;
}

/* The handle of graph or executable graph x.  Lock held. */
static void *graph_handle(const struct fgraph *x)
{
    return (void *)((x->exec ? EXEC_BASE : GRAPH_BASE) +
                    (uintptr_t)x->id * HANDLE_STRIDE);
}

/* The index into a registry (of n, the first with id first) that handle h
 * of base names; -1 if none.  Unknown handles are never dereferenced. */
static long handle_index(const void *h, uintptr_t base,
                         unsigned long long first, size_t n)
{
    uintptr_t v = (uintptr_t)h;
    unsigned long long id;

    if (v < base || (v - base) % HANDLE_STRIDE != 0)
        return -1;
    id = (v - base) / HANDLE_STRIDE;
    if (id < first || id - first >= n)
        return -1;
    return (long)(id - first);
}

/* The live graph (exec = 0) or executable graph h names, or NULL. */
static struct fgraph *find_graph(const void *h, int exec)
{
    long i = exec ? handle_index(h, EXEC_BASE, fake.exec_base, fake.nexecs)
                  : handle_index(h, GRAPH_BASE, fake.graph_base, fake.ngraphs);
    struct fgraph *x;

    if (i < 0)
        return NULL;
    x = exec ? fake.execs[i] : fake.graphs[i];
    return x->destroyed ? NULL : x;
}

/* The user object h names, if its destructor has not run, or NULL. */
static struct fuobj *find_uobj(cudaUserObject_t h)
{
    long i = handle_index(h, UOBJ_BASE, fake.uobj_base, fake.nuobjs);

    return i < 0 || fake.uobjs[i]->state != U_LIVE ? NULL : fake.uobjs[i];
}

/* Work launched on capturing stream s: added to its graph, never run.
 * Lock held. */
struct fake_work *fake_capture_work(struct fstream *s, enum work_kind kind,
                                      unsigned us, void *const *uses,
                                      size_t nuses)
{
    struct fgraph *x = s->capture;
    struct fake_work *w = calloc(1, sizeof *w);
    size_t i, k;

    if (w == NULL)
        fake_die("out of memory");
    fake.works = fake_grow(fake.works, fake.nworks, &fake.capworks,
                                 sizeof *fake.works);
    fake.works[fake.nworks++] = w;
    w->id = fake.nworks;
    w->stream = s;
    w->kind = W_CAPTURED;
    w->launch_ns = fake_now_ns();
    if (kind == W_TIMED)
        x->duration_ns += (int64_t)us * 1000;
    for (i = 0; uses != NULL && i < nuses; i++) {
        struct falloc *a = fake_alloc_find(uses[i], 0);
        struct frange r;

        if (a == NULL)
            continue;
        if (a->released) {
            fake_violation("work #%llu captured on stream id %llu uses %p, "
                           "which was already released", w->id, s->id,
                           uses[i]);
            continue;
        }
        /* The graph's kernels keep using these bytes, whatever is handed
         * out of the allocation later. */
        r = fake_alloc_block_of(a, (uintptr_t)uses[i]);
        for (k = 0; k < x->nuses &&
                    (x->uses[k].lo != r.lo || x->uses[k].hi != r.hi); k++)
            ;
        if (k < x->nuses)
            continue;
        x->uses = fake_grow(x->uses, x->nuses, &x->capuses, sizeof *x->uses);
        x->uses[x->nuses++] = r;
    }
    return w;
}

/* Give x count references to o (taken from nobody: the caller moves its
 * own first if it moves them).  Lock held. */
static void add_ref(struct fgraph *x, struct fuobj *o, unsigned long count)
{
    size_t i;

    o->refs += count;
    for (i = 0; i < x->nrefs; i++)
        if (x->refs[i].o == o) {
            x->refs[i].count += count;
            return;
        }
    x->refs = fake_grow(x->refs, x->nrefs, &x->caprefs, sizeof *x->refs);
    x->refs[x->nrefs].o = o;
    x->refs[x->nrefs].count = count;
    x->nrefs++;
}

/* Drop every user object reference x owns.  Lock held. */
static void drop_refs(struct fgraph *x)
{
    size_t i;

    for (i = 0; i < x->nrefs; i++)
        x->refs[i].o->refs -= x->refs[i].count;
    x->nrefs = 0;
    fake_uobj_kick();
}

/* 1 if every launch of executable graph x has completed (those that have
 * are forgotten).  Lock held. */
static int launches_done(struct fgraph *x, int64_t now, int64_t *hint)
{
    size_t i, n = 0;

    for (i = 0; i < x->nlaunches; i++)
        if (!fake_work_completed(x->launches[i], now, hint))
            x->launches[n++] = x->launches[i];
    x->nlaunches = n;
    return n == 0;
}

/* After dropping the references of destroyed executable graphs whose
 * launches have all completed: a user object with no reference left whose
 * destructor has not run, or NULL.  *holding: an executable graph still
 * waits for its launches.  Lock held. */
static struct fuobj *due_uobj(int *holding)
{
    int64_t now = fake_now_ns(), hint = INF_NS;
    size_t i;

    *holding = 0;
    for (i = 0; i < fake.nexecs; i++) {
        struct fgraph *x = fake.execs[i];

        if (!x->holding)
            continue;
        if (launches_done(x, now, &hint)) {
            x->holding = 0;
            drop_refs(x);
        } else {
            *holding = 1;
        }
    }
    for (i = 0; i < fake.nuobjs; i++)
        if (fake.uobjs[i]->state == U_LIVE && fake.uobjs[i]->refs == 0)
            return fake.uobjs[i];
    return NULL;
}

/* The destructor thread: runs each due destructor outside the lock, and
 * polls (every millisecond) while an executable graph waits for its
 * launches. */
static void *uobj_main(void *unused)
{
    (void)unused;
    pthread_setname_np(pthread_self(), "fake-cuda-uobj");
    fake_lock();
    for (;;) {
        int holding;
        struct fuobj *o = due_uobj(&holding);

        if (o != NULL) {
            cudaHostFn_t fn = o->fn;
            void *ptr = o->ptr;
            unsigned gen = fake.gen;

            o->state = U_RUNNING;
            fake_unlock();
            fake_thread.in_destructor = 1;
            fn(ptr);
            fake_thread.in_destructor = 0;
            fake_lock();
            if (fake.gen == gen) {  /* o is gone after a fake_reset */
                o->state = U_DONE;
                fake.live_uobjs--;
            }
            pthread_cond_broadcast(&fake.cond);
            continue;
        }
        {
            int64_t until = fake_now_ns() + (holding ? 1000000 : MAX_WAIT_NS);
            struct timespec ts;

            ts.tv_sec = (time_t)(until / 1000000000);
            ts.tv_nsec = (long)(until % 1000000000);
            pthread_cond_timedwait(&fake.cond, &fake.lock, &ts);
        }
    }
    return NULL;
}

/* References may have dropped: make sure the destructor thread runs, and
 * wake it.  Lock held. */
void fake_uobj_kick(void)
{
    if (!fake.uobj_thread) {
        pthread_t t;
        pthread_attr_t attr;
        sigset_t all, old;

        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&t, &attr, uobj_main, NULL) != 0)
            fake_die("cannot start the destructor thread");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        fake.uobj_thread = 1;
    }
    pthread_cond_broadcast(&fake.cond);
}

/* Start capturing stream into a new graph (mode: any valid one). */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                   enum cudaStreamCaptureMode mode)
{
    struct fstream *s;
    struct fgraph *x;

    ENTER(GCALL(FAKE_STREAM_BEGIN_CAPTURE));
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (s->kind == S_LEGACY)
        return fake_leave(cudaErrorStreamCaptureUnsupported);
    if (s->capture != NULL)
        return fake_leave(cudaErrorIllegalState);
    x = new_graph(0);
    x->capturing = 1;
    x->mode = mode;
    x->thread = pthread_self();
    x->capture_id = fake.next_capture_id++;
    x->origin = s;
    s->capture = x;
    return fake_leave(cudaSuccess);
}

/* End the capture begun on stream (and on the streams that joined it):
 * the graph, or NULL and cudaErrorStreamCaptureInvalidated (the graph is
 * destroyed) if the capture was invalidated. */
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    struct fstream *s;
    struct fgraph *x;
    size_t i;

    ENTER(GCALL(FAKE_STREAM_END_CAPTURE));
    if (pGraph == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if ((x = s->capture) == NULL)
        return fake_leave(cudaErrorIllegalState);
    if (x->origin != s)
        return fake_leave(cudaErrorStreamCaptureUnmatched);
    for (i = 0; i < fake.nstreams; i++)
        if (fake.streams[i]->capture == x)
            fake.streams[i]->capture = NULL;
    x->capturing = 0;
    if (x->invalidated) {
        x->destroyed = 1;
        drop_refs(x);
        *pGraph = NULL;
        return fake_leave(cudaErrorStreamCaptureInvalidated);
    }
    *pGraph = (cudaGraph_t)graph_handle(x);
    return fake_leave(cudaSuccess);
}

/* The capture status of stream and, while it is active, the capture's id
 * and graph (no dependency nodes: the fake's graphs have none). */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
    enum cudaStreamCaptureStatus *captureStatus_out,
    unsigned long long *id_out, cudaGraph_t *graph_out,
    const cudaGraphNode_t **dependencies_out,
    const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    struct fstream *s;

    ENTER(GCALL(FAKE_STREAM_GET_CAPTURE_INFO));
    if (captureStatus_out == NULL ||
        (edgeData_out != NULL && dependencies_out == NULL))
        return fake_leave(cudaErrorInvalidValue);
    if ((s = fake_stream_resolve(stream)) == NULL)
        return fake_leave(cudaErrorInvalidResourceHandle);
    if (fake_capture_implicit(s))
        return fake_leave(cudaErrorStreamCaptureImplicit);
    *captureStatus_out = fake_capture_status(s);
    if (*captureStatus_out != cudaStreamCaptureStatusActive)
        return fake_leave(cudaSuccess);
    if (id_out != NULL)
        *id_out = s->capture->capture_id;
    if (graph_out != NULL)
        *graph_out = (cudaGraph_t)graph_handle(s->capture);
    if (dependencies_out != NULL)
        *dependencies_out = NULL;
    if (edgeData_out != NULL)
        *edgeData_out = NULL;
    if (numDependencies_out != NULL)
        *numDependencies_out = 0;
    return fake_leave(cudaSuccess);
}

/* An executable graph of graph (flags ignored): its work, its allocations
 * and a reference to each of its user objects. */
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec,
                                          cudaGraph_t graph,
                                          unsigned long long flags)
{
    struct fgraph *x, *e;
    size_t i;

    (void)flags;
    ENTER(GCALL(FAKE_GRAPH_INSTANTIATE));
    if (pGraphExec == NULL || (x = find_graph(graph, 0)) == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if (x->capturing)
        return fake_leave(cudaErrorStreamCaptureUnsupported);
    e = new_graph(1);
    e->duration_ns = x->duration_ns;
    for (i = 0; i < x->nuses; i++) {
        e->uses = fake_grow(e->uses, e->nuses, &e->capuses, sizeof *e->uses);
        e->uses[e->nuses++] = x->uses[i];
    }
    for (i = 0; i < x->nrefs; i++)
        add_ref(e, x->refs[i].o, x->refs[i].count);
    *pGraphExec = (cudaGraphExec_t)graph_handle(e);
    return fake_leave(cudaSuccess);
}

/* Same as cudaGraphInstantiateWithFlags. */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec,
                                 cudaGraph_t graph, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

/* Enqueue executable graph h on stream as one work item of kind; NULL with
 * *err if not.  Lock held. */
static struct fake_work *launch_graph(cudaGraphExec_t h, cudaStream_t stream,
                                      enum work_kind kind, cudaError_t *err)
{
    struct fgraph *x;
    struct fstream *s;
    struct fake_work *w;
    size_t i;

    if ((x = find_graph(h, 1)) == NULL) {
        *err = cudaErrorInvalidValue;
        return NULL;
    }
    if ((s = fake_stream_resolve(stream)) == NULL) {
        *err = cudaErrorInvalidResourceHandle;
        return NULL;
    }
    if (s->capture != NULL) {   /* child graph nodes are not modeled */
        *err = cudaErrorNotSupported;
        return NULL;
    }
    w = fake_work_new(s, kind);
    if (kind == W_TIMED)
        w->duration_ns = x->duration_ns;
    for (i = 0; i < x->nuses; i++)
        fake_alloc_add_use_range(w, x->uses[i]);
    if (x->nlaunches == x->caplaunches) {
        int64_t hint = INF_NS;

        launches_done(x, fake_now_ns(), &hint);     /* prune */
    }
    x->launches = fake_grow(x->launches, x->nlaunches, &x->caplaunches,
                       sizeof *x->launches);
    x->launches[x->nlaunches++] = w;
    *err = cudaSuccess;
    return w;
}

/* Enqueue the graph's work on stream, as one timed item. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    cudaError_t err;

    ENTER(GCALL(FAKE_GRAPH_LAUNCH));
    launch_graph(graphExec, stream, W_TIMED, &err);
    return fake_leave(err);
}

/* Launch exec on s as one held item (fake_cuda.h); NULL if not. */
fake_work *fake_graph_launch_held(cudaGraphExec_t exec, cudaStream_t s)
{
    cudaError_t err;
    struct fake_work *w;

    if (fake_enter(GCALL(FAKE_GRAPH_LAUNCH)) != cudaSuccess)
        return NULL;
    w = launch_graph(exec, s, W_HELD, &err);
    fake_unlock();
    return w;
}

/* Destroy a graph: its references to user objects go. */
cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    struct fgraph *x;

    ENTER(GCALL(FAKE_GRAPH_DESTROY));
    if ((x = find_graph(graph, 0)) == NULL)
        return fake_leave(cudaErrorInvalidValue);
    if (x->capturing)
        return fake_leave(cudaErrorIllegalState);
    x->destroyed = 1;
    drop_refs(x);
    return fake_leave(cudaSuccess);
}

/* Destroy an executable graph: its references to user objects go once
 * every launch of it has completed. */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    struct fgraph *x;
    int64_t hint = INF_NS;

    ENTER(GCALL(FAKE_GRAPH_EXEC_DESTROY));
    if ((x = find_graph(graphExec, 1)) == NULL)
        return fake_leave(cudaErrorInvalidValue);
    x->destroyed = 1;
    if (launches_done(x, fake_now_ns(), &hint)) {
        drop_refs(x);
    } else {
        x->holding = 1;
        fake_uobj_kick();
    }
    return fake_leave(cudaSuccess);
}

/* A user object with initialRefcount references owned by the caller;
 * flags must be cudaUserObjectNoDestructorSync. */
cudaError_t cudaUserObjectCreate(cudaUserObject_t *object_out, void *ptr,
                                 cudaHostFn_t destroy,
                                 unsigned int initialRefcount,
                                 unsigned int flags)
{
    struct fuobj *o;

    ENTER(GCALL(FAKE_USER_OBJECT_CREATE));
    if (object_out == NULL || destroy == NULL || initialRefcount == 0 ||
        initialRefcount > INT32_MAX || flags != cudaUserObjectNoDestructorSync)
        return fake_leave(cudaErrorInvalidValue);
    if ((o = calloc(1, sizeof *o)) == NULL)
        fake_die("out of memory");
    o->id = fake.next_uobj_id++;
    o->ptr = ptr;
    o->fn = destroy;
    o->own = o->refs = initialRefcount;
    o->state = U_LIVE;
    fake.uobjs = fake_grow(fake.uobjs, fake.nuobjs, &fake.capuobjs,
                                 sizeof *fake.uobjs);
    fake.uobjs[fake.nuobjs++] = o;
    fake.live_uobjs++;
    fake_uobj_kick();
    *object_out = (cudaUserObject_t)(UOBJ_BASE +
                                     (uintptr_t)o->id * HANDLE_STRIDE);
    return fake_leave(cudaSuccess);
}

/* Release count of the caller's references. */
cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count)
{
    struct fuobj *o;

    ENTER(GCALL(FAKE_USER_OBJECT_RELEASE));
    if ((o = find_uobj(object)) == NULL || count == 0 || count > INT32_MAX)
        return fake_leave(cudaErrorInvalidValue);
    if (count > o->own) {
        fake_violation("cudaUserObjectRelease of %u references to user object "
                       "#%llu: the application owns %lu", count, o->id, o->own);
        return fake_leave(cudaErrorInvalidValue);
    }
    o->own -= count;
    o->refs -= count;
    fake_uobj_kick();
    return fake_leave(cudaSuccess);
}

/* Give graph count references to object: new ones, or (with
 * cudaGraphUserObjectMove) count of the caller's. */
cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph,
                                      cudaUserObject_t object,
                                      unsigned int count, unsigned int flags)
{
    struct fgraph *x;
    struct fuobj *o;

    ENTER(GCALL(FAKE_GRAPH_RETAIN_USER_OBJECT));
    if ((x = find_graph(graph, 0)) == NULL || (o = find_uobj(object)) == NULL ||
        count == 0 || count > INT32_MAX ||
        (flags & ~(unsigned)cudaGraphUserObjectMove) != 0)
        return fake_leave(cudaErrorInvalidValue);
    if (flags & cudaGraphUserObjectMove) {
        if (count > o->own)
            return fake_leave(cudaErrorInvalidValue);
        o->own -= count;
        o->refs -= count;
    }
    add_ref(x, o, count);
    return fake_leave(cudaSuccess);
}

/* Swap the calling thread's capture mode with *mode. */
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    enum cudaStreamCaptureMode old;

    ENTER(GCALL(FAKE_THREAD_EXCHANGE_CAPTURE_MODE));
    if (mode == NULL || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        return fake_leave(cudaErrorInvalidValue);
    old = fake_thread.mode;
    fake_thread.mode = *mode;
    *mode = old;
    return fake_leave(cudaSuccess);
}

/* Make stream h join the capture of stream capturing (fake_cuda.h). */
cudaError_t fake_capture_join(cudaStream_t h, cudaStream_t capturing)
{
    struct fstream *s, *c;
    cudaError_t err = cudaSuccess;

    fake_lock();
    if ((s = fake_stream_resolve(h)) == NULL ||
        (c = fake_stream_resolve(capturing)) == NULL)
        err = cudaErrorInvalidResourceHandle;
    else if (c->capture == NULL || s->capture != NULL)
        err = cudaErrorIllegalState;
    else
        s->capture = c->capture;
    fake_unlock();
    return err;
}

/* User objects whose destructor has not returned yet. */
size_t fake_live_user_objects(void)
{
    size_t n;

    fake_lock();
    n = fake.live_uobjs;
    fake_unlock();
    return n;
}

/* Graphs and executable graphs not yet destroyed. */
size_t fake_live_graphs(void)
{
    size_t i, n = 0;

    fake_lock();
    for (i = 0; i < fake.ngraphs; i++)
        n += !fake.graphs[i]->destroyed;
    for (i = 0; i < fake.nexecs; i++)
        n += !fake.execs[i]->destroyed;
    fake_unlock();
    return n;
}
