/* The reclaimer thread and the library's lifecycle: see reclaimer.h. */
#define _GNU_SOURCE /* pthread_setname_np, pthread_timedjoin_np */
#include "reclaimer.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc_info.h"
#include "config.h"
#include "event_pool.h"
#include "held.h"
#include "pointer_set.h"
#include "queue.h"
#include "release.h"
#include "release_policy.h"
#include "report.h"
#include "stats.h"
#include "stream_table.h"
#include "trace.h"

/* At process exit, how long to wait for pending work before giving up on it
 * (the process must never hang in exit). */
#define EXIT_DRAIN_NS (UINT64_C(2) * 1000000000)

enum state {
    STATE_NEW,     /* no defer call yet: nothing started */
    STATE_RUNNING, /* the reclaimer thread runs */
    STATE_STOPPED, /* after defer_shutdown or exit: every call is refused */
    STATE_FORKED,  /* in a fork child: every call is refused */
};

/* A defer_flush or defer_trim caller waits on one of these, on its stack. */
struct request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    bool trim;
    cudaError_t err;
    uint64_t barrier;   /* flush: entries with seq < barrier must finish */
    uint64_t remaining; /* flush: of those, how many have not */
    uint64_t bytes;     /* trim: bytes released */
    struct request *next;
    struct entry marker; /* what travels through the queue */
};

/* The gate admits submissions: the count of those under way, plus the CLOSED
 * bit once shutdown has begun. */
#define GATE_CLOSED (UINT64_C(1) << 63)

static struct {
    /* Shared with launching threads. */
    _Atomic int state;
    _Atomic uint64_t gate;
    struct queue queue;
    _Atomic bool sleeping;
    _Atomic bool stop;
    _Atomic cudaError_t *device_errors; /* per device; set once, sticky */
    int ndevices;
    struct defer_config cfg;
    pthread_mutex_t wake_lock; /* with wake_cond: only for sleeping */
    pthread_cond_t wake_cond;
    pthread_mutex_t life_lock; /* serializes start, shutdown and exit */
    pthread_t thread;

    /* The reclaimer thread's alone. */
    struct queue_batch batch;    /* entries being taken in */
    struct pointer_set deferred; /* CUDEFER_CHECK: pointers not yet released */
    struct stream_table streams; /* entries whose work is incomplete */
    uint64_t incomplete;         /* entries in streams */
    struct held_list *held;      /* per device: completed, held by policy */
    cudaStream_t *free_streams;  /* per device: for cudaFreeAsync; lazy */
    struct entry **recycle;      /* per device: done entries to give back */
    uint64_t next_seq;
    uint64_t tracked; /* entries taken in and not yet finished */
    struct request *flushes, *trims, *done_requests;
    uint64_t pass_released, pass_demand_bytes;
    int current_device; /* -1: unknown */
    uint64_t last_activity_ns;
    uint32_t nap_us;
} r = {
    .wake_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_cond = PTHREAD_COND_INITIALIZER,
    .life_lock = PTHREAD_MUTEX_INITIALIZER,
};

static _Thread_local bool on_reclaimer_thread;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the reclaimer thread: requests -------------------------------------- */

static void complete_request(struct request *q)
{
    pthread_mutex_lock(&q->lock);
    q->done = true;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock); /* q may be gone from here on */
}

/* Move a request to the list completed at the end of the pass (so the pass's
 * statistics are in place when its waiter wakes). */
static void request_done(struct request *q)
{
    q->next = r.done_requests;
    r.done_requests = q;
}

static cudaError_t device_error(int device)
{
    return atomic_load_explicit(&r.device_errors[device], memory_order_relaxed);
}

/* Take in a flush (waits for every entry taken in before it) or a trim
 * (served at the end of this pass). */
static void take_request(struct request *q)
{
    /* A failed device is reported to every request, even one that arrives
     * after its entries were abandoned. */
    for (int d = 0; d < r.ndevices && q->err == cudaSuccess; d++)
        q->err = device_error(d);
    if (q->trim) {
        q->next = r.trims;
        r.trims = q;
        return;
    }
    q->barrier = r.next_seq;
    q->remaining = r.tracked;
    if (q->remaining == 0) {
        request_done(q);
        return;
    }
    q->next = r.flushes;
    r.flushes = q;
}

/* ---- the reclaimer thread: entries ---------------------------------------- */

/* An entry's work is over (released, run, or failed): count it, recycle it
 * and tell the flushes that wait for it. */
static void finish_entry(struct entry *e, cudaError_t err)
{
    if (r.cfg.check)
        for (size_t i = 0; i < e->nptrs; i++)
            pointer_set_remove(&r.deferred, e->ptrs[i]);
    if (e->kind != ENTRY_MEMBER) /* members are not the caller's entries */
        stats_add(err == cudaSuccess ? &stats.released : &stats.failed, 1);
    r.tracked--;
    for (struct request **link = &r.flushes; *link != NULL;) {
        struct request *q = *link;
        if (e->seq < q->barrier) {
            if (err != cudaSuccess && q->err == cudaSuccess)
                q->err = err;
            if (--q->remaining == 0) {
                *link = q->next;
                request_done(q);
                continue;
            }
        }
        link = &q->next;
    }
    release_forget_pointers(e);
    if (e->event == NULL || device_error(e->device) != cudaSuccess) {
        free(e); /* no event, or it died with the device's context */
        return;
    }
    e->fifo_next = r.recycle[e->device];
    r.recycle[e->device] = e;
}

/* Mark device failed with err (first error wins) and say so once; a runtime
 * that is unloading (process exit) is not worth a message. */
static void fail_device(int device, const char *call, cudaError_t err)
{
    cudaError_t none = cudaSuccess;
    if (atomic_compare_exchange_strong(&r.device_errors[device], &none, err) &&
        err != cudaErrorCudartUnloading)
        report("reclaimer: device %d: %s failed: %s (%s); its pending entries "
               "will not be released, and later defer calls on it return "
               "this error", device, call, cudaGetErrorString(err),
               cudaGetErrorName(err));
}

/* Make device current on the reclaimer thread; false if that failed. */
static bool use_device(int device)
{
    if (r.current_device == device)
        return true;
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        fail_device(device, "cudaSetDevice", err);
        return false;
    }
    r.current_device = device;
    return true;
}

/* The reclaimer's own stream on device, for cudaFreeAsync; NULL if none
 * could be made (pool memory is then freed with cudaFree). */
static cudaStream_t free_stream(int device)
{
    if (r.free_streams[device] != NULL)
        return r.free_streams[device];
    cudaError_t err = cudaStreamCreateWithFlags(&r.free_streams[device],
                                                cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        static bool reported; /* once: it is tried again for each entry */
        r.free_streams[device] = NULL;
        if (!reported)
            report_cuda("reclaimer", "cudaStreamCreateWithFlags", err,
                        "; pool memory is freed with cudaFree until a "
                        "stream can be made (reported once)");
        reported = true;
    }
    return r.free_streams[device];
}

/* Release one completed entry now (device current) and finish it. */
static cudaError_t release_now(struct entry *e, uint64_t now)
{
    cudaError_t err = device_error(e->device);
    if (err == cudaSuccess && use_device(e->device)) {
        trace_push(e->kind == ENTRY_CALL ? "cudefer: callback"
                                         : "cudefer: release");
        err = release_entry(e, e->pool ? free_stream(e->device) : NULL);
        trace_pop();
        if (e->kind == ENTRY_CALL)
            r.current_device = -1; /* the callback may have switched */
        if (cuda_error_is_sticky(err))
            fail_device(e->device, e->kind == ENTRY_FREE_HOST ? "cudaFreeHost"
                                                              : "cudaFree",
                        err);
        stats_record_latency(now - e->completed_ns);
    } else {
        err = device_error(e->device);
    }
    r.pass_released++;
    finish_entry(e, err);
    return err;
}

/* A completed entry: released at once or held, as the policy says. */
static void completed(struct entry *e, uint64_t now)
{
    e->completed_ns = now;
    if (policy_release_at_once(&r.cfg, e)) {
        release_now(e, now);
        return;
    }
    struct held_list *h = &r.held[e->device];
    held_lock(h);
    held_push_locked(h, e);
    held_unlock(h);
}

/* One part of payload p's group is done (err: it failed, never completed).
 * When the last part is done, p completes, or fails if any part failed. */
static void part_done(struct entry *p, cudaError_t err, uint64_t now)
{
    if (err != cudaSuccess && p->group_err == cudaSuccess)
        p->group_err = err;
    if (--p->group_remaining > 0)
        return;
    if (p->group_err != cudaSuccess)
        finish_entry(p, p->group_err);
    else
        completed(p, now);
}

/* Entry e's event completed (err == cudaSuccess) or never will (err). */
static void event_done(struct entry *e, cudaError_t err, uint64_t now)
{
    if (e->kind == ENTRY_MEMBER) {
        struct entry *payload = e->group;
        finish_entry(e, err);
        part_done(payload, err, now);
    } else {
        part_done(e, err, now);
    }
}

/* Learn what a free entry holds: its bytes and whether it is pool memory. */
static void size_up(struct entry *e)
{
    e->held_bytes = 0;
    e->pool = e->kind == ENTRY_FREE_DEVICE;
    if (e->kind == ENTRY_CALL)
        return;
    for (size_t i = 0; i < e->nptrs; i++) {
        struct alloc_info info;
        alloc_info_query(e->ptrs[i], &info);
        e->pool &= info.pool;
        e->held_bytes += info.bytes;
    }
    if (e->pool)
        e->held_bytes = 0; /* cudaFreeAsync costs nothing: never held */
}

/* A device's cap, once it is in use (asking earlier would create a
 * context): from its memory when the configuration says "auto". */
static void learn_cap(int device)
{
    size_t free_bytes = 0, total = 0;
    cudaError_t err = cudaMemGetInfo(&free_bytes, &total);
    if (err != cudaSuccess) {
        total = (size_t)80 << 30; /* what today's large GPUs have */
        report_cuda("reclaimer", "cudaMemGetInfo", err,
                    "; the cap assumes 80 GiB of device memory");
    }
    r.held[device].cap = policy_cap(&r.cfg, total);
}

/* CUDEFER_CHECK: drop (and report) the pointers of e that are already
 * pending; false when none is left. */
static bool check_pointers(struct entry *e)
{
    size_t kept = 0;
    for (size_t i = 0; i < e->nptrs; i++) {
        if (pointer_set_add(&r.deferred, e->ptrs[i])) {
            e->ptrs[kept++] = e->ptrs[i];
            continue;
        }
        report("CUDEFER_CHECK: %p (device %d) was deferred again while its "
               "first release is still pending: the second request is "
               "dropped", e->ptrs[i], e->device);
    }
    e->nptrs = kept;
    return kept > 0 || e->kind == ENTRY_CALL;
}

/* Move every pushed entry into its stream's FIFO; returns how many came. */
static size_t take_pushed(void)
{
    /* The batch lives in r, not on this stack: a fork child (which has no
     * reclaimer thread) can still see the entries it holds. */
    struct queue_batch *batch = &r.batch;
    size_t arrived = 0;
    if (!queue_take_all_sc(&r.queue, batch))
        return 0;
    struct queue_node *node = batch->first;
    while (node != NULL) {
        /* Read the link first: a completed request may be gone. */
        struct queue_node *next = queue_batch_next(batch, node);
        struct entry *e = entry_of_node(node);
        node = next;
        if (e->kind == ENTRY_REQUEST) {
            take_request(e->request);
            continue;
        }
        if (e->kind == ENTRY_REUSED) { /* taken and tracked before */
            finish_entry(e, cudaSuccess);
            continue;
        }
        arrived++;
        e->seq = r.next_seq++;
        r.tracked++;
        if (device_error(e->device) != cudaSuccess) {
            event_done(e, device_error(e->device), now_ns());
            continue;
        }
        if (r.cfg.check && e->nptrs > 0 && !check_pointers(e)) {
            event_done(e, cudaErrorInvalidValue, now_ns());
            continue;
        }
        if (r.cfg.policy != DEFER_POLICY_EAGER && use_device(e->device)) {
            if (r.held[e->device].cap == 0)
                learn_cap(e->device);
            size_up(e);
        }
        if (e->event == NULL) { /* complete on arrival (graph capture) */
            event_done(e, cudaSuccess, now_ns());
            continue;
        }
        if (stream_table_append(&r.streams, e)) {
            r.incomplete++;
            continue;
        }
        /* Out of memory for a FIFO: wait for this one entry here. */
        report("reclaimer: out of memory; waiting for one entry's event "
               "synchronously");
        cudaError_t err = use_device(e->device)
                              ? cudaEventSynchronize(e->event)
                              : device_error(e->device);
        event_done(e, err, now_ns());
    }
    return arrived;
}

/* Drop every pending and held entry of failed devices, as failed. */
static void abandon_failed_devices(void)
{
    for (size_t i = 0; i < r.streams.count;) {
        struct stream_fifo *f = r.streams.fifos[i];
        cudaError_t err = device_error(f->device);
        if (err == cudaSuccess) {
            i++;
            continue;
        }
        /* Popping the last entry removes f and moves another FIFO to i. */
        while (r.streams.count > i && r.streams.fifos[i] == f) {
            r.incomplete--;
            event_done(stream_table_pop(&r.streams, f), err, now_ns());
        }
    }
    for (int d = 0; d < r.ndevices; d++) {
        while (device_error(d) != cudaSuccess) {
            held_lock(&r.held[d]);
            struct entry *e = held_pop_locked(&r.held[d]);
            held_unlock(&r.held[d]);
            if (e == NULL)
                break;
            finish_entry(e, device_error(d));
        }
    }
}

/* Poll the oldest entries of every stream; returns how many completed. */
static size_t poll_streams(uint64_t now)
{
    size_t done = 0;
    bool any_failed = false;
    for (size_t i = 0; i < r.streams.count;) {
        struct stream_fifo *f = r.streams.fifos[i];
        bool emptied = false;
        while (!emptied && device_error(f->device) == cudaSuccess &&
               use_device(f->device)) {
            cudaError_t err = cudaEventQuery(f->head->event);
            stats_add(&stats.event_queries, 1);
            if (err == cudaErrorNotReady)
                break;
            if (err != cudaSuccess) {
                /* Never completion: a sticky error poisons the device. */
                fail_device(f->device, "cudaEventQuery", err);
                break;
            }
            emptied = f->head == f->tail;
            r.incomplete--;
            done++;
            event_done(stream_table_pop(&r.streams, f), cudaSuccess, now);
        }
        any_failed |= device_error(f->device) != cudaSuccess;
        if (!emptied)
            i++;
    }
    if (any_failed)
        abandon_failed_devices();
    return done;
}

static _Atomic uint64_t *reason_counter(enum release_reason reason)
{
    switch (reason) {
    case RELEASE_IDLE:
        return &stats.idle_releases;
    case RELEASE_CAP:
        return &stats.cap_releases;
    case RELEASE_AGE:
        return &stats.age_releases;
    default:
        return &stats.demand_releases;
    }
}

/* The trace range of a batch released for reason. */
static const char *reason_name(enum release_reason reason)
{
    switch (reason) {
    case RELEASE_IDLE:
        return "cudefer: idle-time batch";
    case RELEASE_CAP:
        return "cudefer: over-cap batch";
    case RELEASE_AGE:
        return "cudefer: max-delay batch";
    default:
        return "cudefer: flush/trim batch";
    }
}

static struct policy_view view_now(uint64_t now)
{
    return (struct policy_view){
        .now_ns = now,
        .last_activity_ns = r.last_activity_ns,
        .work_pending = r.incomplete > 0,
        .demand = r.flushes != NULL || r.trims != NULL || atomic_load(&r.stop),
    };
}

/* Release what the policy says of each device's held entries. */
static void release_held(uint64_t now)
{
    struct policy_view view = view_now(now);
    for (int d = 0; d < r.ndevices; d++) {
        struct held_list *h = &r.held[d];
        held_lock(h);
        enum release_reason reason = policy_decide(&r.cfg, h, &view);
        held_unlock(h);
        if (reason == RELEASE_NONE)
            continue;
        uint64_t n = 0;
        trace_push(reason_name(reason));
        for (;;) {
            /* An idle-time batch yields as soon as the application is back. */
            if (reason == RELEASE_IDLE && !queue_is_empty(&r.queue))
                break;
            held_lock(h);
            struct entry *e = policy_continue(&r.cfg, h, reason, now)
                                  ? held_pop_locked(h)
                                  : NULL;
            held_unlock(h);
            if (e == NULL)
                break;
            uint64_t bytes = e->held_bytes;
            if (release_now(e, now) != cudaSuccess)
                continue; /* reported and counted as failed */
            if (reason == RELEASE_DEMAND)
                r.pass_demand_bytes += bytes;
            n++;
        }
        trace_pop();
        stats_add(reason_counter(reason), n);
    }
}

/* End of a pass: recycle entries, publish counts, wake finished waiters. */
static void end_pass(void)
{
    uint64_t held = 0, held_bytes = 0;
    for (int d = 0; d < r.ndevices; d++) {
        if (r.recycle[d] != NULL)
            event_pool_give_chain(d, r.recycle[d]);
        r.recycle[d] = NULL;
        held_lock(&r.held[d]);
        held += r.held[d].count;
        held_bytes += r.held[d].bytes;
        held_unlock(&r.held[d]);
    }
    stats_set(&stats.held, held);
    stats_set(&stats.held_bytes, held_bytes);
    if (r.pass_released > 0)
        stats_record_batch(r.pass_released);
    while (r.trims != NULL) {
        struct request *q = r.trims;
        r.trims = q->next;
        q->bytes = r.pass_demand_bytes;
        request_done(q);
    }
    while (r.done_requests != NULL) {
        struct request *q = r.done_requests;
        r.done_requests = q->next;
        complete_request(q);
    }
    r.pass_released = 0;
    r.pass_demand_bytes = 0;
}

/* Sleep until something is pushed or stop is requested. */
static void sleep_until_pushed(void)
{
    pthread_mutex_lock(&r.wake_lock);
    atomic_store(&r.sleeping, true);
    while (queue_is_empty(&r.queue) && !atomic_load(&r.stop))
        pthread_cond_wait(&r.wake_cond, &r.wake_lock);
    atomic_store(&r.sleeping, false);
    pthread_mutex_unlock(&r.wake_lock);
}

static void nap_us(uint64_t us)
{
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000),
                          .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t held_count(void)
{
    uint64_t n = 0;
    for (int d = 0; d < r.ndevices; d++) {
        held_lock(&r.held[d]);
        n += r.held[d].count;
        held_unlock(&r.held[d]);
    }
    return n;
}

/* Wait for the next pass.  Polling backs off from poll_us to poll_max_us
 * while nothing happens; with only held entries the wait ends at the
 * policy's next deadline; with nothing at all, after a short linger (so a
 * steady trickle of calls costs no wake-ups), the thread sleeps until a push
 * wakes it. */
static void wait_for_work(bool progress, uint64_t now)
{
    const struct defer_config *cfg = &r.cfg;
    r.nap_us = progress ? cfg->poll_us
                        : (r.nap_us * 2 < cfg->poll_max_us ? r.nap_us * 2
                                                           : cfg->poll_max_us);
    if (r.incomplete > 0) {
        nap_us(r.nap_us);
        return;
    }
    if (held_count() > 0) {
        struct policy_view view = view_now(now);
        uint64_t wait = UINT64_MAX;
        for (int d = 0; d < r.ndevices; d++) {
            held_lock(&r.held[d]);
            uint64_t w = policy_wait_ns(cfg, &r.held[d], &view);
            held_unlock(&r.held[d]);
            if (w < wait)
                wait = w;
        }
        uint64_t us = wait / 1000;
        nap_us(us < cfg->poll_us ? cfg->poll_us
                                 : us > cfg->poll_max_us ? cfg->poll_max_us : us);
        return;
    }
    if (now - r.last_activity_ns < (uint64_t)cfg->poll_max_us * 1000) {
        nap_us(r.nap_us);
        return;
    }
    sleep_until_pushed();
}

static void destroy_free_streams(void)
{
    for (int d = 0; d < r.ndevices; d++) {
        cudaError_t err;
        if (r.free_streams[d] != NULL && device_error(d) == cudaSuccess &&
            use_device(d) &&
            (err = cudaStreamDestroy(r.free_streams[d])) != cudaSuccess)
            report_cuda("shutdown", "cudaStreamDestroy", err, "");
    }
}

static void *reclaimer_main(void *unused)
{
    (void)unused;
    on_reclaimer_thread = true;
    pthread_setname_np(pthread_self(), "cudefer-reclaim");
    /* The reclaimer's queries and frees must never invalidate a capture
     * that another thread runs in the global mode (the default). */
    enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&relaxed);
    r.nap_us = r.cfg.poll_us;
    for (;;) {
        size_t arrived = take_pushed();
        uint64_t now = now_ns();
        if (arrived > 0)
            r.last_activity_ns = now;
        size_t done = r.incomplete > 0 ? poll_streams(now) : 0;
        release_held(now);
        end_pass();
        if (r.tracked == 0 && atomic_load(&r.stop) && queue_is_empty(&r.queue))
            break;
        wait_for_work(arrived + done > 0, now);
        stats_add(&stats.wakeups, 1);
    }
    destroy_free_streams();
    event_pool_destroy_all();
    return NULL;
}

/* ---- lifecycle (any thread) ---------------------------------------------- */

static void at_exit(void);
static void fork_child(void);

/* Allocate the reclaimer's per-device state; false when out of memory. */
static bool alloc_per_device(int n)
{
    r.device_errors = calloc((size_t)n, sizeof *r.device_errors);
    r.held = calloc((size_t)n, sizeof *r.held);
    r.free_streams = calloc((size_t)n, sizeof *r.free_streams);
    r.recycle = calloc((size_t)n, sizeof *r.recycle);
    return r.device_errors && r.held && r.free_streams && r.recycle;
}

static void free_per_device(void)
{
    free(r.device_errors);
    free(r.held);
    free(r.free_streams);
    free(r.recycle);
    r.device_errors = NULL;
    r.held = NULL;
    r.free_streams = NULL;
    r.recycle = NULL;
}

/* Start the reclaimer for the first call, what; life_lock held.  On
 * failure (reported) nothing stays allocated and the next call tries again. */
static cudaError_t start_locked(const char *what)
{
    static const char *const kept = "; nothing was deferred (the caller "
                                    "keeps ownership; the next call tries "
                                    "again)";
    config_at_start(&r.cfg);
    int n;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        report_cuda(what, "cudaGetDeviceCount", err, kept);
        return err;
    }
    if (!alloc_per_device(n)) {
        free_per_device();
        report_cuda(what, "calloc", cudaErrorMemoryAllocation, kept);
        return cudaErrorMemoryAllocation;
    }
    if ((err = event_pool_init(n, r.cfg.event_pool_max)) != cudaSuccess) {
        free_per_device();
        return err;
    }
    if (!stream_table_init(&r.streams)) {
        event_pool_abandon();
        free_per_device();
        return cudaErrorMemoryAllocation;
    }
    for (int d = 0; d < n; d++)
        held_init(&r.held[d]);
    r.ndevices = n;
    r.current_device = -1;
    queue_init(&r.queue);

    /* The thread inherits a full signal mask: signals go to the app. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&r.thread, NULL, reclaimer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        report("cannot start the reclaimer thread: %s", strerror(rc));
        stream_table_destroy(&r.streams);
        event_pool_abandon();
        free_per_device();
        return cudaErrorOperatingSystem;
    }
    static bool hooks_registered;
    if (!hooks_registered) {
        /* Registered after the CUDA runtime's own exit handler (the runtime
         * is initialized by now), so ours runs first, while it still works. */
        atexit(at_exit);
        pthread_atfork(NULL, NULL, fork_child);
        hooks_registered = true;
    }
    atomic_store(&r.state, STATE_RUNNING);
    return cudaSuccess;
}

static cudaError_t refuse(const char *what)
{
    stats_add(&stats.rejected, 1);
    if (atomic_load(&r.state) == STATE_FORKED)
        report("%s called in a forked child: refused (CUDA cannot be used "
               "after fork; the caller keeps ownership)", what);
    else
        report("%s called after defer_shutdown: refused (the caller keeps "
               "ownership)", what);
    return cudaErrorNotPermitted;
}

cudaError_t reclaimer_enter(const char *what)
{
    if (atomic_fetch_add(&r.gate, 1) & GATE_CLOSED) {
        atomic_fetch_sub(&r.gate, 1);
        return refuse(what);
    }
    if (atomic_load_explicit(&r.state, memory_order_acquire) == STATE_RUNNING)
        return cudaSuccess;
    pthread_mutex_lock(&r.life_lock);
    cudaError_t err = cudaSuccess;
    int state = atomic_load(&r.state);
    if (state == STATE_NEW) {
        if ((err = start_locked(what)) != cudaSuccess)
            stats_add(&stats.rejected, 1);
    } else if (state != STATE_RUNNING) { /* shut down while we waited */
        err = refuse(what);
    }
    pthread_mutex_unlock(&r.life_lock);
    if (err != cudaSuccess)
        atomic_fetch_sub(&r.gate, 1);
    return err;
}

void reclaimer_leave(void)
{
    atomic_fetch_sub_explicit(&r.gate, 1, memory_order_release);
}

static void wake(void)
{
    pthread_mutex_lock(&r.wake_lock);
    pthread_cond_signal(&r.wake_cond);
    pthread_mutex_unlock(&r.wake_lock);
}

void reclaimer_push(struct entry *e)
{
    queue_push_mpsc(&r.queue, &e->node);
    if (atomic_load(&r.sleeping))
        wake();
}

void *reclaimer_reuse(int device, int size_class)
{
    if (device < 0 || device >= r.ndevices ||
        r.cfg.policy == DEFER_POLICY_EAGER)
        return NULL;
    struct entry *e = held_take_shelved(&r.held[device], size_class);
    if (e == NULL)
        return NULL;
    void *ptr = e->ptrs[0];
    e->kind = ENTRY_REUSED; /* the reclaimer finishes it without freeing */
    reclaimer_push(e);
    stats_add(&stats.reused, 1);
    return ptr;
}

const struct defer_config *reclaimer_config(void)
{
    return &r.cfg;
}

cudaError_t reclaimer_device_error(int device)
{
    if (device < 0 || device >= r.ndevices)
        return cudaErrorInvalidDevice;
    return device_error(device);
}

/* Push a request and wait for it (at most until deadline_ns, if not 0);
 * false if the deadline passed first, and then the request (with its queue
 * marker) is left to the reclaimer: q must outlive it (the caller is
 * exiting).  With leave_gate, the
 * caller's admission ends once the request is pushed. */
static bool request_and_wait(struct request *q, uint64_t deadline_ns,
                             bool leave_gate)
{
    struct entry *marker = &q->marker;
    *marker = (struct entry){.kind = ENTRY_REQUEST, .request = q};
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, &attr);
    pthread_condattr_destroy(&attr);
    reclaimer_push(marker);
    if (leave_gate)
        reclaimer_leave();
    wake(); /* do not wait for a napping reclaimer's next pass */
    pthread_mutex_lock(&q->lock);
    while (!q->done) {
        if (deadline_ns == 0) {
            pthread_cond_wait(&q->cond, &q->lock);
            continue;
        }
        struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
                              .tv_nsec = (long)(deadline_ns % 1000000000u)};
        if (pthread_cond_timedwait(&q->cond, &q->lock, &ts) == ETIMEDOUT &&
            !q->done) {
            pthread_mutex_unlock(&q->lock);
            return false;
        }
    }
    pthread_mutex_unlock(&q->lock);
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    return true;
}

/* Checks shared by flush and trim; cudaSuccess when they may go on. */
static cudaError_t may_wait(const char *what)
{
    if (on_reclaimer_thread) {
        report("%s called from a defer_call callback: refused (it would wait "
               "for itself)", what);
        return cudaErrorNotPermitted;
    }
    int state = atomic_load(&r.state);
    if (state == STATE_FORKED || state == STATE_STOPPED ||
        (atomic_load(&r.gate) & GATE_CLOSED))
        return refuse(what);
    return cudaSuccess;
}

static cudaError_t request(const char *what, bool trim, size_t *bytes)
{
    if (bytes != NULL)
        *bytes = 0;
    cudaError_t err = may_wait(what);
    if (err != cudaSuccess)
        return err;
    if (atomic_load_explicit(&r.state, memory_order_acquire) == STATE_NEW)
        return cudaSuccess; /* nothing was ever deferred */
    if ((err = reclaimer_enter(what)) != cudaSuccess)
        return err;
    /* The gate is held only while pushing: a waiting flush must not keep
     * shutdown or exit from closing it.  The reclaimer answers every request
     * it took before it stops. */
    struct request q = {.trim = trim, .err = cudaSuccess};
    request_and_wait(&q, 0, true);
    if (bytes != NULL)
        *bytes = (size_t)q.bytes;
    return q.err;
}

cudaError_t reclaimer_flush(void)
{
    return request("defer_flush", false, NULL);
}

cudaError_t reclaimer_trim(size_t *bytes)
{
    return request("defer_trim", true, bytes);
}

/* Close the gate and wait for the submissions already admitted (until
 * deadline_ns, if not 0: one may be blocked for good, e.g. in
 * cudaStreamSynchronize under CUDEFER_DISABLE).  False if it passed. */
static bool close_gate(uint64_t deadline_ns)
{
    atomic_fetch_or(&r.gate, GATE_CLOSED);
    while ((atomic_load(&r.gate) & ~GATE_CLOSED) != 0) {
        if (deadline_ns != 0 && now_ns() > deadline_ns)
            return false;
        sched_yield();
    }
    return true;
}

/* Ask the thread to stop once everything is released, and join it. */
static void stop_and_join(void)
{
    atomic_store(&r.stop, true);
    wake();
    pthread_join(r.thread, NULL);
    stream_table_destroy(&r.streams);
    pointer_set_destroy(&r.deferred);
    free_per_device();
}

cudaError_t reclaimer_shutdown(void)
{
    if (on_reclaimer_thread) {
        report("defer_shutdown called from a defer_call callback: refused "
               "(it would wait for itself)");
        return cudaErrorNotPermitted;
    }
    if (atomic_load(&r.state) == STATE_FORKED)
        return refuse("defer_shutdown");
    pthread_mutex_lock(&r.life_lock);
    cudaError_t err = cudaSuccess;
    if (atomic_load(&r.state) == STATE_RUNNING) {
        close_gate(0);
        struct request q = {.err = cudaSuccess};
        request_and_wait(&q, 0, false);
        err = q.err;
        stop_and_join();
    } else {
        atomic_fetch_or(&r.gate, GATE_CLOSED);
    }
    atomic_store(&r.state, STATE_STOPPED);
    pthread_mutex_unlock(&r.life_lock);
    return err;
}

/* Process exit: release what completes within EXIT_DRAIN_NS and stop; what
 * does not is counted as leaked, never waited for without end.  The thread is
 * joined only when it finished, so a hung device cannot hang exit. */
static void at_exit(void)
{
    if (pthread_mutex_trylock(&r.life_lock) != 0)
        return; /* exit() from inside start or shutdown: leave it be */
    if (atomic_load(&r.state) == STATE_RUNNING && !on_reclaimer_thread) {
        uint64_t deadline = now_ns() + EXIT_DRAIN_NS;
        static struct request q; /* outlives this call if the wait gives up */
        q = (struct request){.err = cudaSuccess};
        if (close_gate(deadline) && request_and_wait(&q, deadline, false)) {
            stop_and_join();
        } else {
            struct defer_stats s;
            defer_stats_get(&s);
            stats_set(&stats.leaked_at_exit, s.pending);
            report("exit: %llu entries still pending after %llu ms: left "
                   "unreleased", (unsigned long long)s.pending,
                   (unsigned long long)(EXIT_DRAIN_NS / 1000000));
        }
        atomic_store(&r.state, STATE_STOPPED);
    }
    if (r.cfg.print_stats)
        stats_print(stderr);
    pthread_mutex_unlock(&r.life_lock);
}

/* In a fork child: no reclaimer thread exists and CUDA cannot be used.
 * Every entry still pending is abandoned (counted, never freed here), and
 * every later call is refused. */
static void fork_child(void)
{
    if (atomic_load(&r.state) != STATE_RUNNING)
        return;
    atomic_store(&r.state, STATE_FORKED);
    atomic_store(&r.gate, GATE_CLOSED);
    struct defer_stats s;
    defer_stats_get(&s);
    stats_add(&stats.failed, s.pending);
    pthread_mutex_init(&r.wake_lock, NULL);
    pthread_cond_init(&r.wake_cond, NULL);
    pthread_mutex_init(&r.life_lock, NULL);
    event_pool_after_fork();
    alloc_info_reset();
}
