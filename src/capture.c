/* SPDX-License-Identifier: MIT */
/* Graph capture: entries tied to a graph's life (see capture.h). */
#include "capture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda.h"
#include "lifecycle.h"
#include "reclaimer_state.h"
#include "release.h"
#include "report.h"
#include "stats.h"

/* A stream the capture ran on, whose work from before the capture the
 * entry waits for too: an event is recorded on it once its capture has
 * ended (the reclaimer's). */
enum origin_state {
    ORIGIN_CAPTURING, /* no event yet: the stream still (or again) captures */
    ORIGIN_RECORDED,  /* event recorded after the capture ended */
    ORIGIN_DONE,      /* that event completed */
    ORIGIN_LOST,      /* the stream is gone (or failed) before it could be */
};

struct origin {
    cudaStream_t stream;
    cudaEvent_t event;
    int device; /* the stream's, once its event is recorded */
    enum origin_state state;
};

/* Who owns a graph entry once it is pushed (capture.h). */
enum graph_owner {
    GRAPH_LIVE,      /* the reclaimer; the graph lives */
    GRAPH_DEAD,      /* the reclaimer; the graph died (the destructor ran) */
    GRAPH_ABANDONED, /* the destructor: the reclaimer stopped before it */
};

/* What a graph's user object points to. */
struct graph_entry {
    struct entry e;     /* first: the reclaimer frees the entry with free(&e) */
    const char *what;   /* the defer call, for messages */
    _Atomic bool armed; /* false: the set-up failed; the destructor only frees */
    _Atomic int owner;  /* enum graph_owner */
    struct origin *origins; /* the capturing streams (NULL once all done) */
    size_t norigins;
    struct graph_entry *next; /* the reclaimer's list */
};

/* Graphs that died so far (the destructor counts): the reclaimer looks for
 * dead ones only when this moved. */
static _Atomic uint64_t deaths;

/* Set once exit() has begun (our handler runs before the reclaimer's: it is
 * registered later).  A graph that dies from then on, e.g. as CUDA tears
 * down its contexts, is not worth a message. */
static _Atomic bool exiting;
static pthread_once_t exit_hook_once = PTHREAD_ONCE_INIT;

static void at_exit(void)
{
    atomic_store(&exiting, true);
}

static void register_exit_hook(void)
{
    atexit(at_exit);
}

cudaError_t capture_status(const cudaStream_t *streams, size_t n,
                           bool *capturing, const char **call)
{
    size_t active = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaStreamCaptureStatus status;
        cudaError_t err = cuda_stream_is_capturing(streams[i], &status);
        if (err != cudaSuccess) {
            *call = "cudaStreamIsCapturing";
            return err;
        }
        if (status == cudaStreamCaptureStatusInvalidated) {
            *call = "the stream's capture";
            return cudaErrorStreamCaptureInvalidated;
        }
        active += status == cudaStreamCaptureStatusActive;
    }
    if (active != 0 && active != n) {
        *call = "stream capture (some of the streams capture, some do not)";
        return cudaErrorStreamCaptureUnsupported;
    }
    *capturing = active != 0;
    return cudaSuccess;
}

struct entry *capture_entry_new(void)
{
    struct graph_entry *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->e.ev = NULL; /* complete when it reaches the reclaimer */
    g->e.ptrs = &g->e.one_ptr;
    g->e.group_remaining = 1;
    g->e.group_err = cudaSuccess;
    atomic_init(&g->armed, true);
    return &g->e;
}

void capture_entry_discard(struct entry *e)
{
    release_forget_pointers(e);
    free(((struct graph_entry *)e)->origins);
    free(e); /* the graph_entry: e is its first member */
}

/* The user object's destructor, on a CUDA thread, once no graph can use the
 * entry's memory any more.  No CUDA call here. */
static void CUDART_CB graph_released(void *ptr)
{
    struct graph_entry *g = ptr;
    if (!atomic_load_explicit(&g->armed, memory_order_acquire)) {
        capture_entry_discard(&g->e); /* never pushed */
        return;
    }
    int live = GRAPH_LIVE;
    if (atomic_compare_exchange_strong(&g->owner, &live, GRAPH_DEAD)) {
        /* The reclaimer's: it releases the entry once the streams' work
         * from before the capture is done too.  g is not touched again. */
        atomic_fetch_add(&deaths, 1);
        lifecycle_wake();
        return;
    }
    /* Abandoned: the reclaimer stopped first, nobody may release it now. */
    lifecycle_count_finished(false, 1);
    if (atomic_load(&exiting)) { /* the process ends: not worth a word */
        capture_entry_discard(&g->e);
        return;
    }
    if (g->e.kind == ENTRY_CALL)
        report("graph capture: the graph that held %s's callback was "
               "destroyed after defer_shutdown: the callback is not run "
               "(counted as failed)", g->what);
    else
        report("graph capture: the graph that held %s's entry was destroyed "
               "after defer_shutdown: its %zu pointer(s) are not released "
               "(a graph's destructor may not call CUDA; counted as failed)",
               g->what, g->e.nptrs);
    capture_entry_discard(&g->e);
}

/* The device of the entry e made on a capturing stream.  The stream cannot
 * be asked: cudaStreamGetDevice and cudaStreamGetId on a capturing stream
 * are refused, and the refusal invalidates the capture, whatever the
 * thread's capture mode (as CUDA 13.0 does).  So: the device of its first
 * pointer that CUDA knows (where cudaFree wants to run anyway), else (a
 * callback, unknown memory) the calling thread's current device.  Both
 * calls are allowed during a capture. */
static cudaError_t entry_device(struct entry *e, const char **call)
{
    if ((e->device = cuda_device_of_pointers(e->ptrs, e->nptrs)) >= 0)
        return cudaSuccess;
    cudaError_t err = cuda_get_device_runtime(&e->device);
    if (err != cudaSuccess)
        *call = "cudaGetDevice";
    return err;
}

/* The graph the n streams capture into; an error with *call if there is
 * none or several. */
static cudaError_t capture_graph(const cudaStream_t *streams, size_t n,
                                 cudaGraph_t *graph, const char **call)
{
    unsigned long long first_id = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaStreamCaptureStatus status;
        unsigned long long id;
        cudaError_t err = cuda_stream_capture_info(streams[i], &status, &id,
                                                   graph);
        if (err != cudaSuccess) {
            *call = "cudaStreamGetCaptureInfo";
            return err;
        }
        if (status != cudaStreamCaptureStatusActive) { /* ended meanwhile */
            *call = "the stream's capture";
            return status == cudaStreamCaptureStatusInvalidated
                       ? cudaErrorStreamCaptureInvalidated
                       : cudaErrorIllegalState;
        }
        if (i == 0) {
            first_id = id;
        } else if (id != first_id) {
            *call = "stream capture (the streams capture into different "
                    "graphs)";
            return cudaErrorStreamCaptureUnsupported;
        }
    }
    return cudaSuccess;
}

cudaError_t capture_defer(const char *what, struct entry *e,
                          const cudaStream_t *streams, size_t n,
                          const char **call)
{
    struct graph_entry *g = (struct graph_entry *)e;
    cudaGraph_t graph = NULL;
    cudaUserObject_t object;
    g->what = what;
    cudaError_t err = capture_graph(streams, n, &graph, call);
    if (err == cudaSuccess)
        err = entry_device(e, call);
    if (err == cudaSuccess &&
        (err = lifecycle_device_error(e->device)) != cudaSuccess)
        *call = "an earlier CUDA call on this device";
    if (err == cudaSuccess &&
        (g->origins = calloc(n, sizeof *g->origins)) == NULL) {
        err = cudaErrorMemoryAllocation;
        *call = "calloc";
    }
    if (err == cudaSuccess) {
        g->norigins = n;
        for (size_t i = 0; i < n; i++)
            g->origins[i] = (struct origin){.stream = streams[i],
                                            .state = ORIGIN_CAPTURING};
        atomic_init(&g->owner, GRAPH_LIVE);
        e->captured = true;
    }
    if (err == cudaSuccess &&
        (err = cuda_user_object_create(&object, g, graph_released)) !=
            cudaSuccess)
        *call = "cudaUserObjectCreate";
    if (err != cudaSuccess) {
        capture_entry_discard(e);
        return err;
    }
    pthread_once(&exit_hook_once, register_exit_hook);
    err = cuda_graph_take_user_object(graph, object);
    if (err != cudaSuccess) {
        /* The object is still ours: its destructor only frees the entry. */
        *call = "cudaGraphRetainUserObject";
        atomic_store_explicit(&g->armed, false, memory_order_release);
        cudaError_t release_err = cuda_user_object_release(object);
        if (release_err != cudaSuccess)
            cuda_report_failure(what, "cudaUserObjectRelease", release_err,
                                "; a user object and its entry are leaked");
        return err;
    }
    /* From here on the entry is the reclaimer's (the destructor may even
     * have marked it dead already, if another thread ended the capture and
     * destroyed the graph); we are admitted, so the reclaimer runs. */
    lifecycle_count_admitted();
    lifecycle_push(e);
    return cudaSuccess;
}

/* ---- the reclaimer's side ------------------------------------------------- */

/* Reclaimer only: graph entries waiting for their graph or their streams. */
static struct graph_entry *waiting;
static size_t origins_open; /* origins not DONE or LOST, over the list */
static uint64_t deaths_seen;
static bool taken_since_poll; /* its graph may have died before it came */

void capture_take(struct entry *e)
{
    struct graph_entry *g = (struct graph_entry *)e;
    g->next = waiting;
    waiting = g;
    origins_open += g->norigins;
    taken_since_poll = true;
}

static bool capture_error(cudaError_t err)
{
    return err == cudaErrorStreamCaptureUnsupported ||
           err == cudaErrorStreamCaptureInvalidated ||
           err == cudaErrorStreamCaptureImplicit ||
           err == cudaErrorStreamCaptureIsolation ||
           err == cudaErrorStreamCaptureWrongThread ||
           err == cudaErrorCapturedEvent;
}

/* Whether stream is not capturing now (false for a stream gone: *gone). */
static bool not_capturing(cudaStream_t stream, bool *gone)
{
    enum cudaStreamCaptureStatus status;
    cudaError_t err = cuda_stream_is_capturing_runtime(stream, &status);
    *gone = err != cudaSuccess;
    return err == cudaSuccess && status == cudaStreamCaptureStatusNone;
}

/* Record o's event once its stream's capture has ended.  The stream may
 * begin another capture at any time: the check is made again right before
 * the record, and a record that a new capture took is made again later. */
static void record_origin(struct origin *o)
{
    bool gone;
    int device;
    if (!not_capturing(o->stream, &gone)) {
        if (gone)
            o->state = ORIGIN_LOST;
        return;
    }
    /* A capture begun since the check refuses the look-up (and CUDA
     * invalidates it): the stream lives, so it is looked at again later,
     * as one seen capturing is; any other failure means it is gone. */
    cudaError_t err = cuda_stream_get_device(o->stream, &device);
    if (capture_error(err))
        return;
    if (err != cudaSuccess || device < 0 || device >= rs.ndevices ||
        device_error(device) != cudaSuccess) {
        o->state = ORIGIN_LOST;
        return;
    }
    if (!reclaimer_use_device(device)) { /* the device failed, said */
        o->state = ORIGIN_LOST;
        return;
    }
    bool had_event = o->event != NULL;
    if (!had_event &&
        (err = cuda_event_create_runtime(&o->event)) != cudaSuccess) {
        /* Tried again on the next pass, the entry waiting meanwhile: said
         * once, since every pass may meet it again. */
        static bool said;
        if (!said)
            cuda_report_failure("graph capture", "cudaEventCreateWithFlags",
                                err, "; a captured entry waits for its "
                                "streams' work from before the capture "
                                "until an event can be made (said once)");
        said = true;
        o->event = NULL;
        return;
    }
    if (!had_event) /* counted as every event of cudefer's is */
        stats_add(&stats.events_created, 1);
    if (!not_capturing(o->stream, &gone)) {
        if (gone)
            o->state = ORIGIN_LOST;
        return;
    }
    err = cuda_event_record_runtime(o->event, o->stream);
    o->device = device;
    if (err == cudaSuccess)
        o->state = ORIGIN_RECORDED;
    else if (!capture_error(err))
        o->state = ORIGIN_LOST;
}

static void query_origin(struct origin *o)
{
    cudaError_t err = cuda_event_query(o->event);
    stats_add(&stats.event_queries, 1);
    if (err == cudaErrorNotReady)
        return;
    if (err == cudaSuccess) {
        o->state = ORIGIN_DONE;
    } else if (capture_error(err)) { /* a capture took the record: again */
        o->state = ORIGIN_CAPTURING;
    } else {
        /* Never complete: as with any failed query (reclaimer_poll.c),
         * the device fails, said once. */
        reclaimer_fail_device(o->device, "cudaEventQuery", err);
        o->state = ORIGIN_LOST;
    }
}

/* Destroy the events of the n origins o; how many origins were lost. */
static size_t drop_origin_events(struct origin *o, size_t n)
{
    size_t lost = 0;
    for (size_t i = 0; i < n; i++) {
        if (o[i].event != NULL)
            cuda_event_destroy(o[i].event);
        o[i].event = NULL;
        lost += o[i].state == ORIGIN_LOST;
    }
    return lost;
}

/* Destroy g's origins' events; how many origins were lost. */
static size_t drop_origins(struct graph_entry *g)
{
    return drop_origin_events(g->origins, g->norigins);
}

/* A dead graph's entry that cannot be released (why): counted, said, freed. */
static void fail_entry(struct graph_entry *g, const char *why)
{
    lifecycle_count_finished(false, 1);
    if (g->e.kind == ENTRY_CALL)
        report("graph capture: %s's callback is not run: %s (counted as "
               "failed)", g->what, why);
    else
        report("graph capture: %s's %zu pointer(s) are not released: %s "
               "(counted as failed)", g->what, g->e.nptrs, why);
    capture_entry_discard(&g->e);
}

/* How many of g's origins are still open (capturing or recorded), after
 * progressing them if progress. */
static size_t origins_open_in(struct graph_entry *g, bool progress)
{
    size_t open = 0;
    for (size_t i = 0; i < g->norigins; i++) {
        struct origin *o = &g->origins[i];
        if (progress && o->state == ORIGIN_CAPTURING)
            record_origin(o);
        if (progress && o->state == ORIGIN_RECORDED)
            query_origin(o);
        open += o->state == ORIGIN_CAPTURING || o->state == ORIGIN_RECORDED;
    }
    return open;
}

/* A dead graph whose origins are all settled leaves the list: pushed
 * again as complete (the reclaimer releases it as its policy says; true),
 * or failed if an origin was lost (false). */
static bool settle(struct graph_entry *g)
{
    if (drop_origins(g) > 0) {
        fail_entry(g, "a stream it was captured on was destroyed (or its "
                      "device failed) before cudefer saw the capture end, "
                      "so its work from before the capture could not be "
                      "waited for");
        return false;
    }
    free(g->origins);
    g->origins = NULL;
    g->norigins = 0;
    g->e.captured = false;
    reclaimer_take_in(&g->e); /* complete: released as the policy says */
    return true;
}

/* Whether an origin of g is in state s. */
static bool origin_in(const struct graph_entry *g, enum origin_state s)
{
    for (size_t i = 0; i < g->norigins; i++)
        if (g->origins[i].state == s)
            return true;
    return false;
}

/* Whether dead graph g's entry is worth waiting for at the stop: some
 * origin still has its event to complete, and none captures again (its
 * capture may never end) nor was lost (the entry fails whatever the
 * others do).  Note [A graph dead at the stop]. */
static bool worth_waiting(const struct graph_entry *g)
{
    return origin_in(g, ORIGIN_RECORDED) && !origin_in(g, ORIGIN_CAPTURING) &&
           !origin_in(g, ORIGIN_LOST);
}

bool capture_news(void)
{
    return atomic_load(&deaths) != deaths_seen || taken_since_poll ||
           origins_open > 0;
}

bool capture_poll(void)
{
    uint64_t died = atomic_load(&deaths);
    if (waiting == NULL) {
        /* Deaths counted meanwhile are news no more: a graph that died
         * during the pass that settles it leaves deaths_seen behind, and
         * capture_news would keep the idle reclaimer awake (900
         * wake-ups a second). */
        deaths_seen = died;
        taken_since_poll = false;
        origins_open = 0;
        return false;
    }
    if (origins_open == 0 && died == deaths_seen && !taken_since_poll)
        return false; /* nothing moved: no CUDA call */
    deaths_seen = died;
    taken_since_poll = false;
    size_t open = 0;
    /* A graph settled is taken in, and may run a callback that outlasts
     * exit's drain: no stream is asked about from then on. */
    for (struct graph_entry **link = &waiting;
         *link != NULL && !reclaimer_abandoned();) {
        struct graph_entry *g = *link;
        size_t left = origins_open_in(g, true);
        if (left == 0 && atomic_load(&g->owner) == GRAPH_DEAD) {
            *link = g->next;
            settle(g);
            continue;
        }
        open += left;
        link = &g->next;
    }
    origins_open = open;
    return open > 0;
}

/* Note [A graph dead at the stop]
 * The reclaimer stops once nothing is tracked and no dead graph's entry
 * waits for an event recorded on its streams (capture_dead_pending); then
 * capture_stop hands the entries of graphs still alive to their
 * destructor.  A graph may die after the pass's last look at its streams:
 * a look made while a stream still captured (the capture ended since), or
 * the graph still lived.  capture_stop looks again, and where each stream
 * now has its event (the work from before the capture merely running)
 * the entry stays in the list: the reclaimer makes more passes until
 * those events complete, as the drain waits for any entry's event
 * (without end under defer_shutdown; exit's drain gives up after its time
 * and counts it leaked).  A stream capturing again at the stop (or with
 * no event to be had) is not waited for: its capture may never end (its
 * thread may be the one in defer_shutdown), so the entry fails, said,
 * never released under that work; nor is a graph with a stream lost,
 * whose entry fails whatever the other streams do.  A failed query fails the entry and
 * the device (query_origin), as anywhere else. */
bool capture_dead_pending(void)
{
    for (struct graph_entry *g = waiting; g != NULL; g = g->next) {
        if (atomic_load(&g->owner) == GRAPH_DEAD && worth_waiting(g))
            return true;
    }
    return false;
}

size_t capture_stop(void)
{
    size_t more = 0, open = 0;
    /* A callback run by settle may outlast exit's drain: then no stream is
     * asked about, as in capture_poll. */
    for (struct graph_entry **link = &waiting;
         *link != NULL && !reclaimer_abandoned();) {
        struct graph_entry *g = *link;
        /* Read before the hand-off: once abandoned, g is the destructor's,
         * which may free it at any time (its origins array NULL then, the
         * events ours to destroy); back in g if the graph died first. */
        struct graph_entry *next = g->next;
        struct origin *origins = g->origins;
        size_t norigins = g->norigins;
        g->origins = NULL;
        int live = GRAPH_LIVE;
        if (atomic_compare_exchange_strong(&g->owner, &live,
                                           GRAPH_ABANDONED)) {
            *link = next;
            drop_origin_events(origins, norigins);
            free(origins);
            continue; /* the destructor reports and frees it */
        }
        /* Dead: the reclaimer's for good. */
        g->origins = origins;
        size_t left = origins_open_in(g, true);
        if (left > 0 && worth_waiting(g)) {
            /* Waited for (Note [A graph dead at the stop]). */
            open += left;
            more++;
            link = &g->next;
            continue;
        }
        *link = next;
        if (left == 0 || origin_in(g, ORIGIN_LOST)) {
            more += settle(g); /* fails it if an origin was lost */
            continue;
        }
        drop_origins(g);
        fail_entry(g, "a stream it was captured on was capturing again at "
                      "shutdown (or no event could be made for it), so its "
                      "work from before the capture could not be waited "
                      "for");
    }
    origins_open = open;
    return more;
}
