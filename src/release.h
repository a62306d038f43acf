/* SPDX-License-Identifier: MIT */
/*
 * Release: what it means to finish one entry's work — cudaFree, cudaFreeAsync
 * (pool memory), cudaFreeHost or the callback — and how a failure is
 * reported.  When to release is the release policy's decision.
 */
#ifndef CUDEFER_RELEASE_H
#define CUDEFER_RELEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "entry.h"

/* What release_entry did besides its return value. */
struct release_report {
    unsigned queued;         /* cudaMalloc pointers freed on async_stream:
                                back once the caller synchronizes it */
    const char *failed_call; /* the call that returned the error
                                release_entry returns (the first, or a
                                later sticky one); set whenever it fails */
    bool failed_sticky;      /* failed_call's error was sticky */
    uint64_t failed_bytes;   /* of the entry's held_bytes, those of the
                                pointers whose release failed (all of
                                them when that is not known): the rest
                                was given back */
};

/* The reclaimer (or a launching thread, in the synchronous fallback), once
 * the entry's work is complete.  async_stream is where device memory is
 * freed with cudaFreeAsync (Note [Releasing without a drain], reclaimer_frees.c);
 * NULL frees it with cudaFree.  out, when not NULL, says what was queued on
 * async_stream, which call failed and the bytes of what failed.  stop,
 * when not NULL, is asked before each pointer after the first: once it
 * says true (exit gave up its drain while a free blocked), the rest are
 * left unfreed and no CUDA call is made.  Blocks as long as the release
 * does.  Returns the first CUDA error, or a later sticky one (the
 * device's; each one already reported); cudaSuccess for calls and for
 * pointers left by stop. */
cudaError_t release_entry(const struct entry *e, cudaStream_t async_stream,
                          bool (*stop)(void), struct release_report *out);

/* Any thread: free the pointer array of a multi-pointer entry, and its
 * claims (none from now). */
void release_forget_pointers(struct entry *e);

/* The owner of e: pointer from (and its claim) moves to index to, when
 * the pointers of e are compacted (to <= from). */
void release_move_pointer(struct entry *e, size_t from, size_t to);

#endif
