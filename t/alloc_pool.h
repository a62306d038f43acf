/* SPDX-License-Identifier: MIT */
/* What t/alloc_pool.c and t/alloc_pool_trim.c share: a Global capture
 * begun on another thread than the one whose calls it must survive (in
 * that mode CUDA's "potentially unsafe" calls of any thread refuse and
 * invalidate it), and its end whatever became of it. */
#ifndef CUDEFER_T_ALLOC_POOL_H
#define CUDEFER_T_ALLOC_POOL_H

#include <pthread.h>
#include <stdint.h>

#include "helpers.h"

static inline void *alloc_pool_begin_global(void *stream)
{
    return (void *)(intptr_t)cudaStreamBeginCapture(
        (cudaStream_t)stream, cudaStreamCaptureModeGlobal);
}

/* Another thread begins a Global capture of cap: what its
 * cudaStreamBeginCapture returned. */
static inline cudaError_t capture_elsewhere(cudaStream_t cap)
{
    pthread_t t;
    void *began;
    pthread_create(&t, NULL, alloc_pool_begin_global, cap);
    pthread_join(t, &began);
    return (cudaError_t)(intptr_t)began;
}

/* Ends cap's capture, intact or not, and destroys its graph if it made
 * one. */
static inline void end_capture_dropped(cudaStream_t cap)
{
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(cap, &g);
    if (g != NULL)
        cudaGraphDestroy(g);
}

#endif
