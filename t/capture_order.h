/* SPDX-License-Identifier: MIT */
/* What t/capture_order.c and t/capture_again.c share: a capture of a
 * stream begun and ended, or bail, and a wait for the graphs' user objects
 * to go (a graph's death, as cudefer hears it). */
#ifndef CUDEFER_T_CAPTURE_ORDER_H
#define CUDEFER_T_CAPTURE_ORDER_H

#include <stdbool.h>

#include "helpers.h"

static inline void begin_capture(cudaStream_t s)
{
    cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (err != cudaSuccess)
        bail("cudaStreamBeginCapture: %s", cudaGetErrorName(err));
}

static inline cudaGraph_t end_capture(cudaStream_t s)
{
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(s, &graph);
    if (err != cudaSuccess)
        bail("cudaStreamEndCapture: %s", cudaGetErrorName(err));
    return graph;
}

/* Poll until fake_live_user_objects() == 0, at most timeout_ms. */
static inline bool wait_no_user_objects(unsigned timeout_ms)
{
    for (unsigned waited = 0; fake_live_user_objects() > 0; waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

#endif
