/* SPDX-License-Identifier: MIT */
/* The public defer_* calls that free or call back, and flush, trim,
 * shutdown and version: each checks its arguments (a bad one is refused
 * here, said in the caller's words and counted), builds its request and
 * submits it (submit.h).  The allocation calls are in alloc.c.  Any
 * thread; include/cudefer.h states each call's contract. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudefer.h"
#include "entry.h"
#include "lifecycle.h"
#include "report.h"
#include "request_args.h"
#include "stats.h"
#include "submit.h"

/* Any thread: whether streams[0..n) is a list a defer_*_streams call
 * (what) takes; else said and counted.  Never blocks. */
static bool streams_taken(const char *what, const cudaStream_t *streams,
                          size_t n)
{
    if (streams != NULL && n > 0 && n <= SUBMIT_MAX_STREAMS)
        return true;
    stats_add(&stats.rejected, 1);
    if (streams == NULL)
        report("%s: streams is NULL (with n = %zu): refused", what, n);
    else
        report("%s: %zu streams: refused (expected 1..%d streams)", what, n,
               SUBMIT_MAX_STREAMS);
    return false;
}

/* Any thread.  NULL: nothing to do; else submitted (blocks only where the
 * route does): cudaSuccess or the refusal. */
cudaError_t defer_free(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free", .kind = ENTRY_FREE_DEVICE,
                             .ptrs = &ptr, .nptrs = 1};
    return submit(&a, stream);
}

/* Any thread: as defer_free, for pinned host memory. */
cudaError_t defer_free_host(void *ptr, cudaStream_t stream)
{
    if (ptr == NULL)
        return cudaSuccess;
    struct request_args a = {.what = "defer_free_host", .kind = ENTRY_FREE_HOST,
                             .ptrs = &ptr, .nptrs = 1};
    return submit(&a, stream);
}

/* qsort's order of two pointers, by address. */
static int compare_pointers(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a,
              y = (uintptr_t) * (void *const *)b;
    return (x > y) - (x < y);
}

/* Any thread; blocks only in malloc.  A pointer that appears more than
 * once among the n in p, or NULL; *err gets cudaErrorMemoryAllocation
 * when a long list could not be copied to be sorted.  A short list is
 * compared pair by pair (no allocation on the common path). */
static void *repeated_pointer(void *const *p, size_t n, cudaError_t *err)
{
    *err = cudaSuccess;
    if (n <= 32) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (p[i] == p[j])
                    return p[i];
        return NULL;
    }
    void **sorted = malloc(n * sizeof *sorted);
    if (sorted == NULL) {
        *err = cudaErrorMemoryAllocation;
        return NULL;
    }
    memcpy(sorted, p, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_pointers);
    void *twice = NULL;
    for (size_t i = 1; i < n && twice == NULL; i++)
        if (sorted[i] == sorted[i - 1])
            twice = sorted[i];
    free(sorted);
    return twice;
}

/* Any thread: the n pointers in ptrs (NULL ones left out, none named
 * twice) as one request.  Blocks only in malloc and where the route does.
 * cudaSuccess or the refusal. */
cudaError_t defer_free_n(void *const *ptrs, size_t n, cudaStream_t stream)
{
    /* Its words, for a refusal before the request is made. */
    static const struct request_args free_n = {.what = "defer_free_n"};
    if (n == 0)
        return cudaSuccess;
    if (ptrs == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_free_n: ptrs is NULL with n = %zu: refused", n);
        return cudaErrorInvalidValue;
    }
    /* NULL pointers are no-ops, like cudaFree(NULL): leave them out. */
    size_t live = 0;
    for (size_t i = 0; i < n; i++)
        live += ptrs[i] != NULL;
    if (live == 0)
        return cudaSuccess;
    void **copy = NULL;
    if (live != n) {
        if ((copy = malloc(live * sizeof *copy)) == NULL)
            return submit_reject(&free_n, "malloc",
                                 cudaErrorMemoryAllocation);
        for (size_t i = 0, k = 0; i < n; i++)
            if (ptrs[i] != NULL)
                copy[k++] = ptrs[i];
    }
    /* A pointer named twice would be released twice: the second cudaFree
     * could free another thread's new allocation at that address (the
     * block cache refuses a block named twice by itself; plain memory
     * needs this check). */
    cudaError_t err;
    void *twice = repeated_pointer(copy != NULL ? copy : ptrs, live, &err);
    if (err != cudaSuccess || twice != NULL) {
        free(copy);
        if (err != cudaSuccess)
            return submit_reject(&free_n, "malloc", err);
        stats_add(&stats.rejected, 1);
        report("defer_free_n: %p is named more than once: refused; nothing "
               "was deferred", twice);
        return cudaErrorInvalidValue;
    }
    struct request_args a = {.what = "defer_free_n", .kind = ENTRY_FREE_DEVICE,
                             .caller = ENTRY_BY_N,
                             .ptrs = copy != NULL ? copy : ptrs, .nptrs = live};
    err = submit(&a, stream);
    free(copy);
    return err;
}

/* Any thread: fn(arg) once stream's work so far is done.  Blocks only
 * where the route does.  cudaSuccess or the refusal. */
cudaError_t defer_call(void (*fn)(void *arg), void *arg, cudaStream_t stream)
{
    if (fn == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_call: fn is NULL: refused");
        return cudaErrorInvalidValue;
    }
    struct request_args a = {.what = "defer_call", .kind = ENTRY_CALL,
                             .fn = fn, .arg = arg};
    return submit(&a, stream);
}

/* Any thread: as defer_free, once the work of all n streams is done. */
cudaError_t defer_free_streams(void *ptr, const cudaStream_t *streams,
                               size_t n)
{
    if (ptr == NULL)
        return cudaSuccess;
    if (!streams_taken("defer_free_streams", streams, n))
        return cudaErrorInvalidValue;
    struct request_args a = {.what = "defer_free_streams",
                             .kind = ENTRY_FREE_DEVICE,
                             .caller = ENTRY_BY_STREAMS, .ptrs = &ptr,
                             .nptrs = 1};
    return submit_streams(&a, streams, n);
}

/* Any thread: as defer_free_host, once the work of all n streams is
 * done. */
cudaError_t defer_free_host_streams(void *ptr, const cudaStream_t *streams,
                                    size_t n)
{
    if (ptr == NULL)
        return cudaSuccess;
    if (!streams_taken("defer_free_host_streams", streams, n))
        return cudaErrorInvalidValue;
    struct request_args a = {.what = "defer_free_host_streams",
                             .kind = ENTRY_FREE_HOST,
                             .caller = ENTRY_BY_STREAMS, .ptrs = &ptr,
                             .nptrs = 1};
    return submit_streams(&a, streams, n);
}

/* Any thread: as defer_call, once the work of all n streams is done. */
cudaError_t defer_call_streams(void (*fn)(void *arg), void *arg,
                               const cudaStream_t *streams, size_t n)
{
    if (fn == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_call_streams: fn is NULL: refused");
        return cudaErrorInvalidValue;
    }
    if (!streams_taken("defer_call_streams", streams, n))
        return cudaErrorInvalidValue;
    struct request_args a = {.what = "defer_call_streams", .kind = ENTRY_CALL,
                             .fn = fn, .arg = arg};
    return submit_streams(&a, streams, n);
}

/* Any thread but the reclaimer (lifecycle.h): blocks until everything
 * deferred before the call was released or failed. */
cudaError_t defer_flush(void)
{
    return lifecycle_requests_flush();
}

/* Any thread but the reclaimer (lifecycle.h): blocks while every
 * completed entry is released, whatever the policy. */
cudaError_t defer_trim(size_t *released_bytes)
{
    return lifecycle_requests_trim(released_bytes);
}

/* Any thread but the reclaimer (lifecycle.h): refuses new calls, drains,
 * stops the reclaimer; blocks. */
cudaError_t defer_shutdown(void)
{
    return lifecycle_shutdown();
}

/* Any thread; never blocks: the library's version string. */
const char *defer_version(void)
{
    return PACKAGE_VERSION;
}
