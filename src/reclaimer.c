/* The reclaimer thread and the library's lifecycle: see reclaimer.h. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "reclaimer.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "event_pool.h"
#include "queue.h"
#include "release.h"
#include "report.h"
#include "stats.h"
#include "stream_table.h"

/* Idle events kept per device before extras are destroyed. */
#define EVENT_POOL_MAX_IDLE 4096

enum state {
    STATE_NEW,     /* no defer call yet: nothing started */
    STATE_RUNNING, /* the reclaimer thread runs */
    STATE_STOPPED, /* after defer_shutdown: every call is refused */
};

/* A defer_flush caller waits on one of these, on its own stack. */
struct flush_request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    cudaError_t err;
    uint64_t barrier;   /* entries with seq < barrier must finish */
    uint64_t remaining; /* of those, how many have not */
    struct flush_request *next;
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
    struct config cfg;
    pthread_mutex_t wake_lock; /* with wake_cond: only for sleeping */
    pthread_cond_t wake_cond;
    pthread_mutex_t life_lock; /* serializes start and shutdown */
    pthread_t thread;

    /* The reclaimer thread's alone. */
    struct stream_table streams;
    uint64_t next_seq;
    uint64_t tracked; /* entries taken in and not yet finished */
    struct flush_request *flushes;
    int current_device; /* -1: unknown */
} r = {
    .wake_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake_cond = PTHREAD_COND_INITIALIZER,
    .life_lock = PTHREAD_MUTEX_INITIALIZER,
};

static _Thread_local bool on_reclaimer_thread;

/* ---- the reclaimer thread ------------------------------------------------ */

static void complete_flush(struct flush_request *f)
{
    pthread_mutex_lock(&f->lock);
    f->done = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock); /* f may be gone from here on */
}

/* An entry's work is over (released, run, or failed): count it, free it and
 * tell the flushes that wait for it. */
static void finish_entry(struct entry *e, cudaError_t err)
{
    stats_add(err == cudaSuccess ? &stats.released : &stats.failed, 1);
    r.tracked--;
    for (struct flush_request **link = &r.flushes; *link != NULL;) {
        struct flush_request *f = *link;
        if (e->seq < f->barrier) {
            if (err != cudaSuccess && f->err == cudaSuccess)
                f->err = err;
            if (--f->remaining == 0) {
                *link = f->next;
                complete_flush(f);
                continue;
            }
        }
        link = &f->next;
    }
    free(e);
}

/* Mark device failed with err (first error wins) and say so once. */
static void fail_device(int device, const char *call, cudaError_t err)
{
    cudaError_t none = cudaSuccess;
    if (atomic_compare_exchange_strong(&r.device_errors[device], &none, err))
        report("reclaimer: device %d: %s failed: %s (%s); its pending entries "
               "will not be released, and later defer calls on it return "
               "this error", device, call, cudaGetErrorString(err),
               cudaGetErrorName(err));
}

static cudaError_t device_error(int device)
{
    return atomic_load_explicit(&r.device_errors[device], memory_order_relaxed);
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

/* Take in a flush request: it waits for every entry taken in before it. */
static void take_flush(struct flush_request *f)
{
    /* A failed device is reported to every flush, even one that arrives
     * after its entries were abandoned. */
    for (int d = 0; d < r.ndevices && f->err == cudaSuccess; d++)
        f->err = device_error(d);
    f->barrier = r.next_seq;
    f->remaining = r.tracked;
    if (f->remaining == 0) {
        complete_flush(f);
        return;
    }
    f->next = r.flushes;
    r.flushes = f;
}

/* Move every pushed entry into its stream's FIFO. */
static void take_pushed(void)
{
    struct queue_batch batch;
    if (!queue_take_all_sc(&r.queue, &batch))
        return;
    struct queue_node *node = batch.first;
    while (node != NULL) {
        /* Read the link first: a completed flush request is gone. */
        struct queue_node *next = queue_batch_next(&batch, node);
        struct entry *e = entry_of_node(node);
        if (e->kind == ENTRY_FLUSH) {
            take_flush(e->u.flush);
        } else {
            e->seq = r.next_seq++;
            r.tracked++;
            cudaError_t err = device_error(e->device);
            if (err != cudaSuccess) {
                finish_entry(e, err);
            } else if (!stream_table_append(&r.streams, e)) {
                /* Out of memory: completing this one entry synchronously
                 * keeps its promise without a FIFO. */
                report("reclaimer: out of memory; waiting for one entry's "
                       "event synchronously");
                err = device_error(e->device);
                if (use_device(e->device) &&
                    (err = cudaEventSynchronize(e->event)) == cudaSuccess) {
                    err = release_entry(e);
                    event_pool_give(e->device, &e->event, 1);
                }
                finish_entry(e, err);
            }
        }
        node = next;
    }
}

/* Drop every pending entry of failed devices, as failed. */
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
        while (r.streams.count > i && r.streams.fifos[i] == f)
            finish_entry(stream_table_pop(&r.streams, f), err);
    }
}

/* Release a batch of completed entries, oldest stream first.  The batch is
 * counted before its entries finish, so a flush that returns sees it. */
static void release_batch(struct entry *ready)
{
    uint64_t n = 0;
    for (struct entry *e = ready; e != NULL; e = e->fifo_next)
        n++;
    if (n > 0)
        stats_record_batch(n);
    while (ready != NULL) {
        struct entry *e = ready;
        ready = e->fifo_next;
        cudaError_t err;
        if (use_device(e->device)) {
            err = release_entry(e);
            if (e->kind == ENTRY_CALL)
                r.current_device = -1; /* the callback may have switched */
            event_pool_give(e->device, &e->event, 1);
        } else {
            err = device_error(e->device);
        }
        finish_entry(e, err);
    }
}

/* Poll the oldest entries of every stream; release what completed. */
static void poll_streams(void)
{
    struct entry *ready = NULL, **ready_tail = &ready;
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
            *ready_tail = stream_table_pop(&r.streams, f);
            ready_tail = &(*ready_tail)->fifo_next;
        }
        any_failed |= device_error(f->device) != cudaSuccess;
        if (!emptied)
            i++;
    }
    if (any_failed)
        abandon_failed_devices();
    release_batch(ready);
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

static void nap_us(uint32_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *reclaimer_main(void *unused)
{
    (void)unused;
    on_reclaimer_thread = true;
    pthread_setname_np(pthread_self(), "cudefer-reclaim");
    for (;;) {
        take_pushed();
        if (r.tracked > 0)
            poll_streams();
        if (r.tracked == 0) {
            if (atomic_load(&r.stop) && queue_is_empty(&r.queue))
                break;
            sleep_until_pushed();
        } else {
            nap_us(r.cfg.poll_us);
        }
        stats_add(&stats.wakeups, 1);
    }
    event_pool_destroy_all();
    return NULL;
}

/* ---- lifecycle (any thread) ---------------------------------------------- */

/* Start the reclaimer; life_lock held.  On failure nothing stays allocated
 * and the next defer call tries again. */
static cudaError_t start_locked(void)
{
    config_defaults(&r.cfg);
    config_load_env(&r.cfg);
    int n;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess)
        return err;
    r.device_errors = calloc((size_t)n, sizeof *r.device_errors);
    if (r.device_errors == NULL)
        return cudaErrorMemoryAllocation;
    if ((err = event_pool_init(n, EVENT_POOL_MAX_IDLE)) != cudaSuccess) {
        free(r.device_errors);
        return err;
    }
    if (!stream_table_init(&r.streams)) {
        event_pool_abandon();
        free(r.device_errors);
        return cudaErrorMemoryAllocation;
    }
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
        free(r.device_errors);
        return cudaErrorOperatingSystem;
    }
    atomic_store(&r.state, STATE_RUNNING);
    return cudaSuccess;
}

static cudaError_t refuse(const char *what)
{
    stats_add(&stats.rejected, 1);
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
    if (state == STATE_NEW)
        err = start_locked();
    else if (state == STATE_STOPPED) /* shut down while we waited */
        err = refuse(what);
    pthread_mutex_unlock(&r.life_lock);
    if (err != cudaSuccess)
        atomic_fetch_sub(&r.gate, 1);
    return err;
}

void reclaimer_leave(void)
{
    atomic_fetch_sub_explicit(&r.gate, 1, memory_order_release);
}

void reclaimer_push(struct entry *e)
{
    queue_push_mpsc(&r.queue, &e->node);
    if (atomic_load(&r.sleeping)) {
        pthread_mutex_lock(&r.wake_lock);
        pthread_cond_signal(&r.wake_cond);
        pthread_mutex_unlock(&r.wake_lock);
    }
}

const struct config *reclaimer_config(void)
{
    return &r.cfg;
}

cudaError_t reclaimer_device_error(int device)
{
    if (device < 0 || device >= r.ndevices)
        return cudaErrorInvalidDevice;
    return device_error(device);
}

/* Push a flush request and wait for it; the gate is held by the caller. */
static cudaError_t flush_and_wait(void)
{
    struct flush_request f = {.err = cudaSuccess};
    struct entry marker = {.kind = ENTRY_FLUSH, .u.flush = &f};
    pthread_mutex_init(&f.lock, NULL);
    pthread_cond_init(&f.cond, NULL);
    reclaimer_push(&marker);
    pthread_mutex_lock(&f.lock);
    while (!f.done)
        pthread_cond_wait(&f.cond, &f.lock);
    pthread_mutex_unlock(&f.lock);
    pthread_cond_destroy(&f.cond);
    pthread_mutex_destroy(&f.lock);
    return f.err;
}

cudaError_t reclaimer_flush(void)
{
    if (on_reclaimer_thread) {
        report("defer_flush called from a defer_call callback: refused "
               "(it would wait for itself)");
        return cudaErrorNotPermitted;
    }
    if (atomic_load(&r.gate) & GATE_CLOSED)
        return refuse("defer_flush");
    if (atomic_load_explicit(&r.state, memory_order_acquire) == STATE_NEW)
        return cudaSuccess; /* nothing was ever deferred */
    cudaError_t err = reclaimer_enter("defer_flush");
    if (err != cudaSuccess)
        return err;
    err = flush_and_wait();
    reclaimer_leave();
    return err;
}

cudaError_t reclaimer_shutdown(void)
{
    if (on_reclaimer_thread) {
        report("defer_shutdown called from a defer_call callback: refused "
               "(it would wait for itself)");
        return cudaErrorNotPermitted;
    }
    pthread_mutex_lock(&r.life_lock);
    if (atomic_fetch_or(&r.gate, GATE_CLOSED) & GATE_CLOSED) {
        pthread_mutex_unlock(&r.life_lock);
        return cudaSuccess; /* already shut down */
    }
    cudaError_t err = cudaSuccess;
    if (atomic_load(&r.state) == STATE_RUNNING) {
        /* Submissions already admitted finish pushing first. */
        while ((atomic_load(&r.gate) & ~GATE_CLOSED) != 0)
            sched_yield();
        err = flush_and_wait();
        atomic_store(&r.stop, true);
        pthread_mutex_lock(&r.wake_lock);
        pthread_cond_signal(&r.wake_cond);
        pthread_mutex_unlock(&r.wake_lock);
        pthread_join(r.thread, NULL);
        stream_table_destroy(&r.streams);
    }
    atomic_store(&r.state, STATE_STOPPED);
    pthread_mutex_unlock(&r.life_lock);
    return err;
}
