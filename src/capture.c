/* Graph capture: entries tied to a graph's life (see capture.h). */
#include "capture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "reclaimer.h"
#include "release.h"
#include "report.h"
#include "stats.h"

/* What a graph's user object points to. */
struct graph_entry {
    struct entry e;     /* first: the reclaimer frees the entry with free(&e) */
    const char *what;   /* the defer call, for messages */
    _Atomic bool armed; /* false: the set-up failed; the destructor only frees */
};

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
        cudaError_t err = cudaStreamIsCapturing(streams[i], &status);
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
    g->e.event = NULL; /* complete when it reaches the reclaimer */
    g->e.ptrs = &g->e.one_ptr;
    g->e.group_remaining = 1;
    g->e.group_err = cudaSuccess;
    atomic_init(&g->armed, true);
    return &g->e;
}

void capture_entry_discard(struct entry *e)
{
    release_forget_pointers(e);
    free(e); /* the graph_entry: e is its first member */
}

/* The user object's destructor, on a CUDA thread, once no graph can use the
 * entry's memory any more.  No CUDA call here. */
static void CUDART_CB graph_released(void *ptr)
{
    struct graph_entry *g = ptr;
    if (!atomic_load_explicit(&g->armed, memory_order_acquire) ||
        atomic_load(&exiting)) {
        capture_entry_discard(&g->e);
        return;
    }
    if (reclaimer_enter("graph capture: a graph's destructor") == cudaSuccess) {
        reclaimer_push(&g->e);
        reclaimer_leave();
        return;
    }
    /* Shut down: nobody may release it now. */
    stats_add(&stats.failed, 1);
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
 * thread's capture mode (seen on an H200, CUDA 13.0).  So: the device of
 * its first pointer that CUDA knows (where cudaFree wants to run anyway),
 * else (a callback, unknown memory) the calling thread's current device.
 * Both calls are allowed during a capture. */
static cudaError_t entry_device(struct entry *e, const char **call)
{
    /* A failed query is no error of the application's: leave its last
     * error as it was (where it had none). */
    bool had_error = e->nptrs > 0 && cudaPeekAtLastError() != cudaSuccess;
    for (size_t i = 0; i < e->nptrs; i++) {
        struct cudaPointerAttributes at;
        cudaError_t err = cudaPointerGetAttributes(&at, e->ptrs[i]);
        if (err != cudaSuccess && !had_error)
            cudaGetLastError();
        if (err == cudaSuccess && at.type != cudaMemoryTypeUnregistered &&
            at.device >= 0) {
            e->device = at.device;
            return cudaSuccess;
        }
    }
    cudaError_t err = cudaGetDevice(&e->device);
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
        cudaError_t err = cudaStreamGetCaptureInfo(streams[i], &status, &id,
                                                   graph, NULL, NULL, NULL);
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
        (err = reclaimer_device_error(e->device)) != cudaSuccess)
        *call = "an earlier CUDA call on this device";
    if (err == cudaSuccess &&
        (err = cudaUserObjectCreate(&object, g, graph_released, 1,
                                    cudaUserObjectNoDestructorSync)) !=
            cudaSuccess)
        *call = "cudaUserObjectCreate";
    if (err != cudaSuccess) {
        capture_entry_discard(e);
        return err;
    }
    pthread_once(&exit_hook_once, register_exit_hook);
    err = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
    if (err != cudaSuccess) {
        /* The object is still ours: its destructor only frees the entry. */
        *call = "cudaGraphRetainUserObject";
        atomic_store_explicit(&g->armed, false, memory_order_release);
        cudaError_t release_err = cudaUserObjectRelease(object, 1);
        if (release_err != cudaSuccess)
            report_cuda(what, "cudaUserObjectRelease", release_err,
                        "; a user object and its entry are leaked");
        return err;
    }
    /* From here on the entry is the graph's (it may even be released by
     * now, if another thread ended the capture and destroyed the graph). */
    stats_add(&stats.deferred, 1);
    return cudaSuccess;
}
