/*
 * Release: what it means to finish one entry's work — cudaFree, cudaFreeHost
 * or the callback — and how a failure is reported.  When to release is the
 * reclaimer's decision.
 */
#ifndef CUDEFER_RELEASE_H
#define CUDEFER_RELEASE_H

#include "entry.h"

/* The reclaimer (or a launching thread, in the synchronous fallback), once
 * the entry's work is complete.  Blocks as long as the release does.  Returns
 * the CUDA error of the release, already reported; cudaSuccess for calls. */
cudaError_t release_entry(const struct entry *e);

#endif
