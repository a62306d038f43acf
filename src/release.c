/* SPDX-License-Identifier: MIT */
/* Release of one completed entry. */
#include "release.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"
#include "cache.h"
#include "report.h"

/* A release of ptr by e refused as an invalid value: said in the words of
 * the call that deferred it (entry_caller_name: "defer_free_streams(PTR)";
 * "defer_free_n: PTR", whose argument is an array) when CUDA can tell what
 * ptr is (not memory of its own, memory of the other kind, a pointer
 * inside an allocation); false when it cannot (the caller says what the
 * call returned). */
static bool report_not_releasable(const struct entry *e, const void *ptr,
                                  const char *call)
{
    bool host = e->kind == ENTRY_FREE_HOST;
    char api[64];
    snprintf(api, sizeof api,
             e->caller == ENTRY_BY_N ? "%s: %p" : "%s(%p)",
             entry_caller_name(e), ptr);
    const void *start;
    enum cuda_memory_kind kind = cuda_memory_kind_of(ptr, &start);
    if (kind == CUDA_MEMORY_UNKNOWN) {
        report("%s: not memory CUDA allocated (a host pointer, a freed or "
               "made-up address): %s refused it, so it is not released "
               "(counted in failed)", api, call);
    } else if (kind == CUDA_MEMORY_HOST && !host) {
        report("%s: pinned host memory, which defer_free_host releases: "
               "%s refused it, so it is not released (counted in failed)",
               api, call);
    } else if (kind == CUDA_MEMORY_DEVICE && host) {
        report("%s: device memory, which defer_free releases: %s "
               "refused it, so it is not released (counted in failed)",
               api, call);
    } else if (kind != CUDA_MEMORY_UNSURE && start != ptr) {
        report("%s: points %zu bytes inside the allocation at %p, not at "
               "its start: %s refused it, so it is not released (counted "
               "in failed)", api,
               (size_t)((const char *)ptr - (const char *)start), start, call);
    } else {
        return false;
    }
    return true;
}

/* The release of ptr of e failed with err: out->failed_bytes gets ptr's
 * share of e->held_bytes, so that the bytes of e's other pointers still
 * count as given back.  A pointer refused as an invalid value (the
 * pointer's own mistake: CUDA frees nothing of it, the rest goes on) has
 * the bytes size_up (reclaimer_take.c) counted for it, asked again the
 * same way, quietly (its refusal is said).  CUDA knowing no allocation
 * there now, in an entry with no pointer inside an allocation
 * (e->interior), means none there when size_up asked either (it counted
 * none: a plain host pointer, say): e owns its pointers, and an
 * allocation's start is freed by its own release only, which just failed.
 * In an entry with one, no allocation there now may be one that size_up
 * counted and that the release of its start, another pointer of e, freed
 * since.  That case, any other error (the runtime unloading, say), and
 * the query failing leave unknown what was given back: all of e's bytes
 * count as failed, so a trim never says more than it gave back, and no
 * CUDA call is added to a failing runtime.  An entry never sized (a
 * synchronous release: held_bytes 0) asks nothing: cuda_allocation_known
 * is the reclaimer's. */
static void note_failed_bytes(const struct entry *e, const void *ptr,
                              cudaError_t err, struct release_report *out)
{
    struct cuda_allocation info;
    if (e->held_bytes == 0)
        return;
    if (err != cudaErrorInvalidValue ||
        !cuda_allocation_known(ptr, e->kind == ENTRY_FREE_DEVICE, &info) ||
        (info.bytes == 0 && e->interior))
        out->failed_bytes = UINT64_MAX;
    else if (out->failed_bytes < UINT64_MAX - info.bytes)
        out->failed_bytes += info.bytes;
}

/* The release of ptr of e failed with err in call: out names the call of
 * the error release_entry returns (the first, or a later sticky one: the
 * device's) and counts ptr's bytes as not given back. */
static void note_failure(const struct entry *e, const void *ptr,
                         const char *call, cudaError_t err,
                         struct release_report *out)
{
    bool sticky = cuda_error_is_sticky(err);
    if (out->failed_call == NULL || (sticky && !out->failed_sticky)) {
        out->failed_call = call;
        out->failed_sticky = sticky;
    }
    note_failed_bytes(e, ptr, err, out);
}

/* Free pointer i of e; report a failure with the pointer named. */
static cudaError_t release_pointer(const struct entry *e, size_t i,
                                   cudaStream_t async_stream,
                                   struct release_report *out)
{
    void *ptr = e->ptrs[i];
    cudaError_t err;
    const char *call;
    /* The block its free claimed goes back to the cache: reusable by any
     * stream now.  A pointer that was no block then is never taken for
     * the block that may start there now (another owner's). */
    if (e->kind != ENTRY_FREE_HOST && e->claims != NULL &&
        e->claims[i].block != NULL) {
        cache_reclaim_adopt(&e->claims[i], entry_caller_name(e));
        return cudaSuccess;
    }
    if (e->kind != ENTRY_FREE_HOST && cache_reclaim_unclaimed_is_block(ptr))
        return cudaSuccess;
    if (e->kind == ENTRY_FREE_HOST) {
        err = cuda_free_host(ptr);
        call = "cudaFreeHost";
    } else if (async_stream == NULL) {
        err = cuda_free(ptr);
        call = "cudaFree";
    } else {
        err = cuda_free_async(ptr, async_stream);
        call = "cudaFreeAsync";
        if (err == cudaSuccess && !e->pool)
            out->queued++;
        /* What cudaFreeAsync refused goes to cudaFree, unless cudaFree
         * would refuse it too: a sticky error is the device's, and a
         * pointer refused as an invalid value is no allocation's start
         * (said below) or pool memory's (an interior pointer, say).  The
         * fallback is said for pool memory only: a cudaMalloc pointer is
         * cudaFree's anyway (Note [Releasing without a drain]). */
        bool refused = err == cudaErrorInvalidValue &&
                       (e->pool || report_not_releasable(e, ptr, call));
        if (refused && !e->pool) {
            note_failure(e, ptr, call, err, out);
            return err;
        }
        if (err != cudaSuccess && !refused && !cuda_error_is_sticky(err)) {
            if (e->pool) {
                char detail[96];
                snprintf(detail, sizeof detail,
                         "; freeing %p with cudaFree instead", ptr);
                cuda_report_failure("release", call, err, detail);
            }
            err = cuda_free(ptr);
            call = "cudaFree";
        }
    }
    /* A sticky error is the device's, not the pointer's: the caller marks
     * the device failed and says so once.  A pointer refused as an invalid
     * value is the caller's mistake, said in its words where CUDA can tell
     * what the pointer is. */
    if (err != cudaSuccess)
        note_failure(e, ptr, call, err, out);
    if (err == cudaErrorInvalidValue && report_not_releasable(e, ptr, call))
        return err;
    if (err != cudaSuccess && !cuda_error_is_sticky(err)) {
        char detail[96];
        snprintf(detail, sizeof detail, "; %p (device %d) is not released",
                 ptr, e->device);
        cuda_report_failure("release", call, err, detail);
    }
    return err;
}

cudaError_t release_entry(const struct entry *e, cudaStream_t async_stream,
                          bool (*stop)(void), struct release_report *out)
{
    struct release_report ignored = {0};
    if (out == NULL)
        out = &ignored;
    if (e->kind == ENTRY_CALL) {
        e->fn(e->arg);
        return cudaSuccess;
    }
    /* The entry's error: its first pointer's, but for a sticky one met
     * later, which is the device's and must reach the caller, that fails
     * the device (out->failed_call names its call). */
    cudaError_t first = cudaSuccess;
    for (size_t i = 0; i < e->nptrs && (i == 0 || stop == NULL || !stop());
         i++) {
        cudaError_t err = release_pointer(e, i, async_stream, out);
        if (first == cudaSuccess ||
            (cuda_error_is_sticky(err) && !cuda_error_is_sticky(first)))
            first = err;
    }
    return first;
}

void release_forget_pointers(struct entry *e)
{
    if (e->ptrs != &e->one_ptr)
        free(e->ptrs);
    e->ptrs = &e->one_ptr;
    e->nptrs = 0;
    if (e->claims != &e->one_claim)
        free(e->claims);
    e->claims = NULL;
}

void release_move_pointer(struct entry *e, size_t from, size_t to)
{
    e->ptrs[to] = e->ptrs[from];
    if (e->claims != NULL)
        e->claims[to] = e->claims[from];
}
