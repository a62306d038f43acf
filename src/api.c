/* The public API: each defer call records an event on the caller's stream and
 * hands an entry to the reclaimer. */
#include <stdlib.h>

#include "cudefer.h"
#include "entry.h"
#include "event_pool.h"
#include "reclaimer.h"
#include "release.h"
#include "report.h"
#include "stats.h"

/* The caller was refused: say why (call failed with err), count it. */
static cudaError_t reject(const char *what, const char *call, cudaError_t err)
{
    stats_add(&stats.rejected, 1);
    report_cuda(what, call, err, "; nothing was deferred (the caller keeps "
                                 "ownership)");
    return err;
}

/* No event could be had: wait for the stream here and release at once. */
static cudaError_t release_synchronously(struct entry *e, cudaStream_t stream)
{
    cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess)
        return err;
    stats_add(&stats.deferred, 1);
    stats_add(&stats.sync_releases, 1);
    err = release_entry(e);
    stats_add(err == cudaSuccess ? &stats.released : &stats.failed, 1);
    return cudaSuccess; /* the entry was accepted; a release error is counted */
}

/* Record an event for e on stream (launching thread) and push e.  Takes e's
 * ownership in every case. */
static cudaError_t record_and_push(const char *what, struct entry *e,
                                   cudaStream_t stream)
{
    cudaError_t err;
    if ((err = cudaStreamGetDevice(stream, &e->device)) != cudaSuccess) {
        free(e);
        return reject(what, "cudaStreamGetDevice", err);
    }
    if ((err = reclaimer_device_error(e->device)) != cudaSuccess) {
        free(e);
        return reject(what, "an earlier CUDA call on this device", err);
    }
    if ((err = cudaStreamGetId(stream, &e->stream_id)) != cudaSuccess) {
        free(e);
        return reject(what, "cudaStreamGetId", err);
    }
    if ((err = event_pool_take(e->device, &e->event)) != cudaSuccess) {
        report_cuda(what, "cudaEventCreateWithFlags", err,
                    "; waiting for the stream and releasing synchronously");
        err = release_synchronously(e, stream);
        free(e);
        return err == cudaSuccess ? err
                                  : reject(what, "cudaStreamSynchronize", err);
    }
    if ((err = cudaEventRecord(e->event, stream)) != cudaSuccess) {
        event_pool_give(e->device, &e->event, 1);
        free(e);
        return reject(what, "cudaEventRecord", err);
    }
    stats_add(&stats.deferred, 1);
    reclaimer_push(e);
    return cudaSuccess;
}

/* Admit, build and submit one entry. */
static cudaError_t submit(const char *what, struct entry proto,
                          cudaStream_t stream)
{
    cudaError_t err = reclaimer_enter(what);
    if (err != cudaSuccess)
        return err;
    struct entry *e = malloc(sizeof *e);
    if (e == NULL) {
        err = reject(what, "malloc", cudaErrorMemoryAllocation);
    } else {
        *e = proto;
        err = record_and_push(what, e, stream);
    }
    reclaimer_leave();
    return err;
}

cudaError_t defer_free(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    return submit("defer_free",
                  (struct entry){.kind = ENTRY_FREE_DEVICE, .u.ptr = ptr},
                  stream);
}

cudaError_t defer_free_host(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    return submit("defer_free_host",
                  (struct entry){.kind = ENTRY_FREE_HOST, .u.ptr = ptr},
                  stream);
}

cudaError_t defer_call(void (*fn)(void *arg), void *arg, cudaStream_t stream)
{
    if (fn == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_call: fn is NULL: refused");
        return cudaErrorInvalidValue;
    }
    return submit("defer_call",
                  (struct entry){.kind = ENTRY_CALL,
                                 .u.call = {.fn = fn, .arg = arg}},
                  stream);
}

cudaError_t defer_flush(void)
{
    return reclaimer_flush();
}

cudaError_t defer_shutdown(void)
{
    return reclaimer_shutdown();
}

const char *defer_version(void)
{
    return PACKAGE_VERSION;
}
