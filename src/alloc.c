/* SPDX-License-Identifier: MIT */
/* The allocation calls: defer_alloc, defer_record_stream and PyTorch's
 * pluggable-allocator entry points, over the block cache (cache.h):
 * a block freed on a stream goes back to a request on that stream at once,
 * to any stream once its work is done, and a miss is a new block from the
 * device's upstream pool (cache_upstream.c; cudaMalloc where none can be
 * made), once the cached segments the pool lacks for it went back to the
 * pool (cache_hand_back.c). */
#include <stdio.h>

#include "cache.h"
#include "capture.h"
#include "clock.h"
#include "cuda.h"
#include "cudefer.h"
#include "free_batch.h"
#include "lifecycle.h"
#include "oom_handler.h"
#include "report.h"
#include "stats.h"
#include "stream_identity.h"
#include "submit.h"

/* A request's words for the lines it says: what names the call the user
 * made; end ends each of its failure lines (report.h; NULL where the error
 * goes back to the caller; defer_pluggable_alloc, whose caller does not
 * check its NULL, says there that it returns NULL), made into text only
 * when a line is said; said: a failure line was written (every error but
 * out of memory is said where it arises). */
struct words {
    const char *what;
    const struct line_end *end;
    bool said;
};

/* w's line end as text, in buf. */
#define W_TAIL(w, buf) report_line_end((w)->end, buf, sizeof buf)

static cudaError_t refuse(struct words *w, const char *call, cudaError_t err,
                          const char *detail);

/* A new block of size bytes on stream, filed in the cache, all while
 * admitted: a shutdown (which destroys the pools and the cache) waits for
 * it.  A block that cannot be filed is plain memory: defer_free releases
 * it like any other.  Returns the allocation's error: out of memory
 * unreported (the caller hears it), any other reported and counted (a
 * refused admission by lifecycle_enter, the allocation here). */
static cudaError_t malloc_filed(struct words *w, int device, size_t size,
                                cudaStream_t stream, void **ptr)
{
    cudaError_t err = lifecycle_enter_ending(w->what, w->end);
    if (err != cudaSuccess) {
        w->said = true;
        return err;
    }
    bool upstream;
    err = cache_upstream_malloc(w->what, device, size, stream, ptr, &upstream);
    if (err != cudaSuccess && err != cudaErrorMemoryAllocation)
        refuse(w, "allocating a new block", err, "");
    if (err == cudaSuccess) {
        /* Counted as a new block once filed: one that is not is plain
         * memory, never a block of the cache (in neither cache_bytes nor
         * allocs, and its release in no cache_releases). */
        if (cache_add(w->what, device, *ptr, size, upstream)) {
            stats_device_count_mallocs(device, 1);
        } else {
            report("%s: out of memory for the record of %p: it is "
                   "released when freed, never reused", w->what, *ptr);
            if (upstream)
                cache_upstream_forget(device, size);
        }
    }
    lifecycle_leave();
    return err;
}

/* bytes rounded up to 512 only: a block's smallest unit. */
static size_t exact_size(size_t bytes)
{
    return (bytes + 511) & ~(size_t)511;
}

/* The size of a fresh block for bytes on device: rounded
 * (cache_round), or exact when the rounded size is more than the
 * device holds (a coarse CUDEFER_ROUND_DIVISIONS near the device's size:
 * 1 takes 65 GiB to 128 GiB), which no trim could make fit. */
static size_t fresh_size(int device, size_t bytes)
{
    size_t rounded = cache_round(bytes);
    return cache_upstream_beyond_device(device, rounded) ? exact_size(bytes)
                                                     : rounded;
}

/* A fresh block for a request of bytes on stream, of rounded bytes (its
 * fresh_size, found while the request was admitted: it reads the device's
 * pool, which a shutdown destroys once no call is admitted); out of
 * memory, everything cudefer holds is trimmed (not admitted: the trim
 * waits for the reclaimer) and that size tried again, then bytes rounded
 * up to 512 only where that is less (it may fit where the rounded size
 * does not).  A callback cannot wait for the reclaimer: there the trim
 * and its retry are left out (a refused trim would be said, and the
 * caller of defer_alloc never called it).  The trim speaks in the
 * request's words; refused (a shutdown closed the gate meanwhile), it is
 * the request's one refusal, said and counted once: no retry. */
static cudaError_t malloc_block(struct words *w, int device, size_t bytes,
                                size_t rounded, cudaStream_t stream,
                                void **ptr)
{
    size_t exact = exact_size(bytes);
    cudaError_t err = malloc_filed(w, device, rounded, stream, ptr);
    if (err != cudaErrorMemoryAllocation)
        return err;
    if (!lifecycle_in_callback()) {
        size_t trimmed = 0;
        bool refused = false;
        cudaError_t trim_err =
            lifecycle_requests_trim_for(w->what, w->end, &trimmed,
                                        &refused);
        if (refused) {
            w->said = true;
            return trim_err;
        }
        err = malloc_filed(w, device, rounded, stream, ptr);
    }
    if (err != cudaErrorMemoryAllocation || exact >= rounded)
        return err;
    return malloc_filed(w, device, exact, stream, ptr);
}

/* A refusal of an allocation call: counted, said in w's words (detail,
 * then w's tail). */
static cudaError_t refuse(struct words *w, const char *call, cudaError_t err,
                          const char *detail)
{
    stats_add(&stats.rejected, 1);
    char line[384], tail[128];
    snprintf(line, sizeof line, "%s%s", detail, W_TAIL(w, tail));
    cuda_report_failure(w->what, call, err, line);
    w->said = true;
    return err;
}

/* Refuses a request on stream while it is captured (or barred by
 * another thread's capture): cudaStreamGetDevice would invalidate a
 * capture, and the new block's cudaMallocFromPoolAsync, or a hand-back's
 * cudaFreeAsync, on that stream would be captured into its graph. */
static cudaError_t refuse_if_capturing(struct words *w, cudaStream_t stream)
{
    bool capturing = false;
    const char *call = NULL;
    cudaError_t err = capture_status(&stream, 1, &capturing, &call);
    if (err != cudaSuccess)
        return refuse(w, call, err, "");
    if (capturing)
        return refuse(w, "the stream", cudaErrorStreamCaptureUnsupported,
                      ": it is being captured into a graph; allocate before "
                      "the capture begins (the capture is left intact)");
    return cudaSuccess;
}

/* A refusal because device could not be made current (call failed with
 * err): the device said, unless w's line end says it. */
static cudaError_t refuse_switch(struct words *w, const char *call,
                                 cudaError_t err, int device)
{
    char detail[48];
    snprintf(detail, sizeof detail, " (device %d)", device);
    return refuse(w, call, err, w->end != NULL ? "" : detail);
}

/* The refusals of a request that no device could serve, said in w's
 * words: more bytes than any device holds (no device holds it, and
 * rounding it up would wrap, to a block of 0 bytes, which would "succeed"
 * with NULL); a stream of another device than the one asked for (a block
 * of that device would fault, or cross the link, where the caller uses
 * it); no device at all (alloc_on would take a negative one for "any",
 * and a created stream would get a block of its own device).  Counted and
 * said; the error. */
static cudaError_t refuse_beyond_devices(struct words *w, size_t bytes)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_beyond_devices(struct words *w, size_t bytes)
{
    stats_add(&stats.rejected, 1);
    char tail[128];
    report("%s: %zu bytes asked for, more than any device holds (a "
           "negative size converted?): out of memory%s", w->what, bytes,
           W_TAIL(w, tail));
    w->said = true;
    return cudaErrorMemoryAllocation;
}

static cudaError_t refuse_other_device(struct words *w, int expect,
                                       cudaStream_t stream, int device)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_other_device(struct words *w, int expect,
                                       cudaStream_t stream, int device)
{
    stats_add(&stats.rejected, 1);
    char tail[128];
    report("%s: device %d asked for, but stream %p is on device %d: "
           "refused%s", w->what, expect, (void *)stream, device,
           W_TAIL(w, tail));
    w->said = true;
    return cudaErrorInvalidDevice;
}

static cudaError_t refuse_no_device(struct words *w, int device)
    FRAME_OF_ITS_OWN;
static cudaError_t refuse_no_device(struct words *w, int device)
{
    stats_add(&stats.rejected, 1);
    char tail[128];
    report("%s: device %d: no such device: refused%s", w->what, device,
           W_TAIL(w, tail));
    w->said = true;
    return cudaErrorInvalidDevice;
}

/* A request's current device made current where the caller left that to
 * the request (lazy: the pluggable allocation's switch, on the legacy
 * stream of device current; NULL: current already), before a CUDA call on
 * the stream: a hit makes none, so it never asks for the current device.
 * cudaSuccess, or the refusal (said and counted). */
static cudaError_t make_current(struct words *w, struct cuda_switch *lazy,
                                int current)
{
    const char *call = NULL;
    cudaError_t err = cuda_switch_lazy(lazy, current, &call);
    return err == cudaSuccess ? err : refuse_switch(w, call, err, current);
}

/* defer_alloc, admitted: the cache, else a new block (current: the current
 * device when the caller knows it, else -1; lazy: make_current's), of
 * *fresh bytes (fresh_size: sized here, admitted, since it reads the
 * device's pool, which defer_shutdown frees once no call is admitted). */
static cudaError_t alloc_admitted(struct words *w, void **ptr, size_t bytes,
                                  cudaStream_t stream, int current,
                                  int expect, struct cuda_switch *lazy,
                                  int *device, size_t *fresh)
{
    /* The legacy stream cannot capture, only be barred by another thread's
     * capture, which matters only once a CUDA call uses the stream: a hit
     * makes none, so it is checked on a miss only. */
    bool legacy = stream_is_legacy(stream);
    cudaError_t err;
    if (legacy && current < 0 &&
        (err = cuda_get_device(&current)) != cudaSuccess)
        return refuse(w, "cudaGetDevice", err, "");
    unsigned long long id;
    bool cached =
        legacy && stream_identity_cached_special(stream, current, device, &id);
    /* A first look-up asks the stream itself (cudaStreamGetId): checked
     * first, as any stream is. */
    if (!cached && ((err = make_current(w, lazy, current)) != cudaSuccess ||
                    (err = refuse_if_capturing(w, stream)) != cudaSuccess))
        return err;
    const char *call = NULL;
    if (!cached &&
        (err = stream_identity_lookup_on(stream, true, current, device, &id,
                                         &cached, &call)) != cudaSuccess)
        return refuse(w, call, err, "");
    if (expect >= 0 && *device != expect)
        return refuse_other_device(w, expect, stream, *device);
    if ((err = lifecycle_device_error(*device)) != cudaSuccess)
        return refuse(w, "an earlier CUDA call on this device", err, "");
    size_t size;
    *ptr = cache_take(*device, id, bytes, &size);
    if (*ptr != NULL)
        return cudaSuccess;
    /* A miss asks the stream and allocates on the device: current now. */
    if ((err = make_current(w, lazy, current)) != cudaSuccess)
        return err;
    /* Read on a miss only (a hit's clock read was a tenth of the call):
     * blocks that went FREE after the search and before this read may go
     * back to the pool too, which a later miss would have done anyway. */
    uint64_t before = now_ns();
    if (legacy && (err = refuse_if_capturing(w, stream)) != cudaSuccess)
        return err;
    /* More than the whole device can never succeed: it must not empty the
     * cache on its way to failing (the hand-back below, the trim of
     * malloc_block), nor reach the pool with a size beyond what the device
     * maps (such a request, a 1 PiB torch.empty, can kill the process
     * there). */
    if (cache_upstream_beyond_device(*device, bytes))
        return cudaErrorMemoryAllocation;
    *fresh = fresh_size(*device, bytes);
    cache_hand_back(w->what, *device, *fresh, stream, id, before);
    return cudaSuccess;
}

/* Any thread, holding no lock or admission of cudefer's.  One try of a
 * request (alloc_on's arguments): admitted, the cache; then, not admitted,
 * a new block, out of memory after a trim.  cudaSuccess with *ptr, or the
 * error (said and counted where it arose, out of memory neither);
 * *device: the request's device.  *full: whether the device itself was out
 * of memory for the new block (not a request above its memory, which no
 * freeing makes fit, nor host memory). */
static cudaError_t alloc_try(struct words *w, void **ptr, size_t bytes,
                             cudaStream_t stream, int current, int expect,
                             struct cuda_switch *lazy,
                             int *device, bool *full)
{
    *device = -1;
    *full = false;
    cudaError_t err = lifecycle_enter_ending(w->what, w->end);
    if (err != cudaSuccess) {
        w->said = true;
        return err;
    }
    size_t fresh = 0;
    err = alloc_admitted(w, ptr, bytes, stream, current, expect, lazy, device,
                         &fresh);
    /* A trim below must not wait behind our admission; from here on
     * nothing of the cache or its pools is read but by malloc_filed, which
     * is admitted again (a shutdown may have freed them meanwhile). */
    lifecycle_leave();
    if (err == cudaSuccess && *ptr == NULL) { /* said and counted there */
        err = malloc_block(w, *device, bytes, fresh, stream, ptr);
        *full = err == cudaErrorMemoryAllocation;
    }
    return err;
}

/* Any thread, holding no lock or admission of cudefer's; blocks while the
 * application's out-of-memory handler runs (oom_handler.h): whether to
 * try the request of bytes on device again.  The device current before
 * the handler is current after it, whatever the handler left: the retry's
 * CUDA calls, and the caller's switch back, count on it.  A failure to
 * make it current again is said and ends the retries. */
static bool handler_retry(struct words *w, size_t bytes, int device,
                          unsigned *calls) FRAME_OF_ITS_OWN;
static bool handler_retry(struct words *w, size_t bytes, int device,
                          unsigned *calls)
{
    int before = -1;
    if (cuda_get_device(&before) != cudaSuccess)
        before = -1;
    bool again = oom_handler_retry(bytes, device, calls, w->what, w->end,
                                   &w->said);
    /* A switch of its own, never switched back: to before, where the
     * handler left another device current. */
    struct cuda_switch back = CUDA_SWITCH_NONE;
    const char *call = NULL;
    cudaError_t err;
    if (*calls > 0 && before >= 0 &&
        (err = cuda_switch_device(&back, before, &call)) != cudaSuccess) {
        char tail[192], end[128];
        snprintf(tail, sizeof tail,
                 "; device %d, current before the out-of-memory handler, "
                 "could not be made current again: out of memory%s",
                 before, report_line_end(w->end, end, sizeof end));
        cuda_report_failure(w->what, call, err, tail);
        w->said = true;
        return false;
    }
    return again;
}

/* defer_alloc, said in w's words, with the current device when the
 * caller knows it (current >= 0: the pluggable entry point made it
 * current, or, lazy not NULL, leaves that to make_current) and the device
 * the block must be on (expect >= 0: the one PyTorch named; a stream of
 * another device is refused). */
static cudaError_t alloc_on(struct words *w, void **ptr, size_t bytes,
                            cudaStream_t stream, int current, int expect,
                            struct cuda_switch *lazy)
{
    if (ptr == NULL) {
        stats_add(&stats.rejected, 1);
        report("%s: ptr is NULL: refused", w->what);
        return cudaErrorInvalidValue;
    }
    *ptr = NULL;
    if (bytes == 0)
        return cudaSuccess; /* like cudaMalloc: nothing to allocate */
    cudaError_t err;
    if (bytes > BLOCK_MAX_REQUEST) {
        err = refuse_beyond_devices(w, bytes);
    } else {
        /* Out of memory, the application's handler may free memory of its
         * own and ask for the whole request again (its calls are bounded
         * there). */
        unsigned handler_calls = 0;
        int device;
        bool full;
        do
            err = alloc_try(w, ptr, bytes, stream, current, expect, lazy,
                            &device, &full);
        while (full && handler_retry(w, bytes, device, &handler_calls));
        if (err == cudaErrorMemoryAllocation)
            stats_add(&stats.rejected, 1); /* the caller sees it: no report */
    }
    /* Out of memory is the return value's alone (cudefer.h): the thread's
     * last error is left clear however it was found, by a failed
     * allocation (whose error cache_upstream_malloc cleared) or by a size
     * no allocation was tried for (an error pending before goes too, as a
     * failed cudaMalloc replaces it). */
    if (err == cudaErrorMemoryAllocation)
        cuda_clear_last_error();
    if (err != cudaSuccess)
        *ptr = NULL; /* whatever a failed allocation call left there */
    return err;
}

cudaError_t defer_alloc(void **ptr, size_t bytes, cudaStream_t stream)
{
    struct words w = {.what = "defer_alloc", .end = NULL};
    return alloc_on(&w, ptr, bytes, stream, -1, -1, NULL);
}

cudaError_t defer_record_stream(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_record_stream: ptr is NULL: refused");
        return cudaErrorInvalidValue;
    }
    if (stream == cudaStreamPerThread) {
        /* Not cudaErrorInvalidValue, which says ptr is no block of
         * cudefer's: a caller may take that for memory it need not
         * protect, and this block is cudefer's. */
        stats_add(&stats.rejected, 1);
        report("defer_record_stream: cudaStreamPerThread names a different "
               "stream on each thread, so the thread that frees %p could not "
               "wait for it: refused (record a created stream)", ptr);
        return cudaErrorNotSupported;
    }
    cudaError_t err = lifecycle_enter("defer_record_stream");
    if (err != cudaSuccess)
        return err;
    struct words w = {.what = "defer_record_stream", .end = NULL};
    int device;
    unsigned long long id;
    bool cached, capturing = false;
    const char *call = NULL;
    if ((err = capture_status(&stream, 1, &capturing, &call)) == cudaSuccess &&
        !capturing)
        err = stream_identity_lookup(stream, true, &device, &id, &cached, &call);
    if (err != cudaSuccess)
        refuse(&w, call, err, "; nothing recorded");
    else if (capturing)
        err = refuse(&w, "the stream",
                     cudaErrorStreamCaptureUnsupported,
                     ": it is being captured into a graph; nothing recorded");
    else if ((err = lifecycle_device_error(device)) != cudaSuccess)
        /* A failed device's error, as every later call on it returns. */
        refuse(&w, "an earlier CUDA call on this device",
               err, "; nothing recorded");
    else if ((err = cache_users_add(
                  ptr, &(struct block_user){stream, id, device})) !=
             cudaSuccess)
        stats_add(&stats.rejected, 1);
    lifecycle_leave();
    return err;
}

/* Make device current for a call on a special stream handle (which means
 * the current device's stream; a created stream carries its device:
 * nothing to do).  cudaSuccess or cuda_switch_device's error, *call naming
 * the call that failed. */
static cudaError_t enter_device(struct cuda_switch *sw, int device,
                                cudaStream_t stream, const char **call)
{
    return stream_is_special(stream) ? cuda_switch_device(sw, device, call)
                                     : cudaSuccess;
}

/* The two pluggable allocations, said in w's words: a block of size bytes
 * on device for stream in *ptr, or NULL and the error (a failed switch to
 * device said and counted as rejected). */
static cudaError_t pluggable_alloc(struct words *w, void **ptr, size_t size,
                                   int device, cudaStream_t stream)
{
    *ptr = NULL;
    if (device < 0)
        return refuse_no_device(w, device);
    /* Refused before the switch: a forked child cannot use CUDA (a
     * 0-byte request, which has nothing to do, is never refused). */
    cudaError_t err;
    if (size > 0 &&
        (err = lifecycle_refused_ending(w->what, w->end)) != cudaSuccess) {
        w->said = true;
        return err;
    }
    /* On the legacy stream the request makes device current only before a
     * CUDA call (make_current), which a hit of the cache does not make:
     * PyTorch's requests on it mostly never ask for the current device. */
    bool lazy = stream_is_legacy(stream);
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *call = NULL;
    err = lazy ? cudaSuccess : enter_device(&sw, device, stream, &call);
    if (err != cudaSuccess)
        return refuse_switch(w, call, err, device);
    /* A special handle's device is now the current one (lazy: will be). */
    err = alloc_on(w, ptr, size, stream,
                   stream_is_special(stream) ? device : -1, device,
                   lazy ? &sw : NULL);
    cuda_switch_back(&sw, w->what);
    return err;
}

cudaError_t defer_pluggable_alloc_status(void **ptr, size_t size, int device,
                                         cudaStream_t stream)
{
    if (ptr == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_pluggable_alloc_status: ptr is NULL: refused");
        return cudaErrorInvalidValue;
    }
    struct words w = {.what = "defer_pluggable_alloc_status", .end = NULL};
    return pluggable_alloc(&w, ptr, size, device, stream);
}

void *defer_pluggable_alloc(size_t size, int device, cudaStream_t stream)
{
    /* Said: PyTorch does not check the pointer (cudefer.h), so this line
     * may be all the application hears before the tensor faults.  One
     * error, one line: the line that says what failed also says that NULL
     * is returned (two lines read as two errors). */
    const struct line_end end = {.kind = LINE_END_NULL_RETURNED,
                                 .bytes = size, .device = device};
    struct words w = {.what = "defer_pluggable_alloc", .end = &end};
    void *ptr;
    cudaError_t err = pluggable_alloc(&w, &ptr, size, device, stream);
    /* Out of memory is said nowhere else (defer_alloc's caller hears it),
     * but where the handler gave up or no device holds the size. */
    if (err == cudaErrorMemoryAllocation && !w.said)
        report("defer_pluggable_alloc: out of memory for %zu bytes on "
               "device %d: returning NULL", size, device);
    return ptr;
}

/* Any thread; never blocks on the GPU.  Admitted: a shutdown, which
 * destroys the pools, waits for it.  A refusal is said and counted. */
cudaError_t defer_peer_access(int device, int peer)
{
    cudaError_t err = lifecycle_enter("defer_peer_access");
    if (err != cudaSuccess)
        return err;
    const char *call;
    err = cache_upstream_grant(device, peer, &call);
    lifecycle_leave();
    if (err == cudaSuccess)
        return err;
    stats_add(&stats.rejected, 1);
    if (call == NULL)
        report("defer_peer_access: device %d, peer %d: no such device: "
               "refused", device, peer);
    else if (err == cudaErrorPeerAccessUnsupported)
        report("defer_peer_access: device %d cannot be reached from "
               "device %d (cudaDeviceCanAccessPeer): refused", device, peer);
    else
        cuda_report_failure("defer_peer_access", call, err, "");
    return err;
}

/* defer_pluggable_free refused because call failed with err (a switch to
 * the block's device): said in one line ending with kept's text,
 * counted. */
static void reject_free(const struct line_end *kept, const char *call,
                        cudaError_t err) FRAME_OF_ITS_OWN;
static void reject_free(const struct line_end *kept, const char *call,
                        cudaError_t err)
{
    submit_reject(&(struct request_args){.what = "defer_pluggable_free",
                                         .end = kept},
                  call, err);
}

void defer_pluggable_free(void *ptr, size_t size, int device,
                          cudaStream_t stream)
{
    if (ptr == NULL)
        return;
    /* A refusal (after defer_shutdown, in a forked child) is said in one
     * line with what becomes of ptr (PyTorch cannot hear an error). */
    const struct line_end kept = {.kind = LINE_END_STAYS_ALLOCATED,
                                  .ptr = ptr};
    /* On a special handle the device names the stream: the block's own
     * device decides, never the caller's word, which would have the free
     * wait for another device's legacy stream.  The free says a mismatch. */
    int on = device, block_device = -1;
    bool block_known = false;
    if (stream_is_special(stream)) {
        /* With one device, a block of the cache is on device 0: where
         * PyTorch says 0, no look-up can change the device to switch to,
         * and the plan's look-up under device 0's lock decides whether
         * ptr is a block. */
        if (device == 0 && cache_one_device())
            block_device = 0, block_known = true;
        else
            block_known = cache_device_of(ptr, &block_device);
        if (block_known)
            on = block_device;
    }
    /* A block freed on the legacy stream, which may join its device's
     * free batch: the request makes the device current only if it makes a
     * CUDA call (request_args.h, lazy_switch), which a batched free does
     * not (one in free_batch claims seals): most such frees never ask
     * for the current device. */
    bool lazy = block_known && free_batch_takes(stream);
    /* Refused before the switch: a forked child cannot use CUDA.  A lazy
     * free makes no switch before its admission (submit_pluggable_free),
     * which refuses it in the same line and count: so the gate is read
     * once.  The look-up above makes no CUDA call: it reads the address
     * map, which a fork child and a shutdown empty. */
    if (!lazy && lifecycle_refused_ending("defer_pluggable_free", &kept) !=
                     cudaSuccess)
        return;
    struct cuda_switch sw = CUDA_SWITCH_NONE;
    const char *call = NULL;
    cudaError_t err =
        lazy ? cudaSuccess : enter_device(&sw, on, stream, &call);
    /* A special handle's device is now the current one (or will be,
     * lazy).  The size and device PyTorch says are checked against the
     * block's (submit.c).  A refusal, a failed switch's too, is said in one
     * line and counted. */
    if (err == cudaSuccess)
        (void)submit_pluggable_free(&(struct pluggable_free){
            .ptr = ptr, .stream = stream,
            .current = stream_is_special(stream) ? on : -1,
            .said_bytes = size, .said_device = device,
            .block_known = block_known, .block_device = block_device,
            .end = &kept, .lazy = lazy ? &sw : NULL});
    else
        reject_free(&kept, call, err);
    cuda_switch_back(&sw, "defer_pluggable_free");
}
