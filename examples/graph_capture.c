/* SPDX-License-Identifier: MIT */
/*
 * graph_capture.c: defer_free inside a CUDA graph capture.
 *
 * A kernel that fills a buffer is captured into a graph, and defer_free(buf)
 * is called right after it, on the capturing stream, as anywhere else.
 * cudefer records no event into the capture: it ties the buffer to the
 * graph.  The graph is launched a few times and then destroyed; the buffer
 * is released once the graph and its executable graph are gone and their
 * launches have completed, never before.
 *
 * usage: graph_capture [-n LAUNCHES]    (default 10)
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"

#define BUF_BYTES ((size_t)64 << 20)
#define SPIN_NS 1000000ull /* each launch: 1 ms, then the fill */

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "graph_capture: %s: %s\n", what,
                cudaGetErrorString(err));
        exit(1);
    }
}

static unsigned long long released(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    return (unsigned long long)st.released;
}

int main(int argc, char **argv)
{
    int launches = 10, opt;
    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt != 'n' || (launches = atoi(optarg)) < 1) {
            fprintf(stderr, "usage: graph_capture [-n LAUNCHES]\n");
            return 2;
        }
    }

    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        fprintf(stderr, "graph_capture: no CUDA device found "
                "(cudaGetDeviceCount: %s)\n",
                cudaGetErrorString(err != cudaSuccess ? err : cudaErrorNoDevice));
        return 1;
    }

    cudaStream_t s;
    void *buf;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    check(cudaMalloc(&buf, BUF_BYTES), "cudaMalloc");

    /* Capture: the kernel, and the buffer's release after it. */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal),
          "cudaStreamBeginCapture");
    check(gpu_spin_fill(s, SPIN_NS, buf, BUF_BYTES, 1), "gpu_spin_fill");
    check(defer_free(buf, s), "defer_free"); /* tied to the graph */
    check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");

    for (int i = 0; i < launches; i++)
        check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check(defer_flush(), "defer_flush");
    printf("%d launches done, graph alive: %llu released (the buffer is "
           "the graph's)\n", launches, released());

    /* The graph's end: CUDA hands the buffer to cudefer, from a thread of
     * its own, once the launches are done. */
    check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    check(cudaGraphDestroy(graph), "cudaGraphDestroy");
    struct timespec ms = {.tv_sec = 0, .tv_nsec = 1000000};
    int waited = 0;
    while (released() == 0 && waited < 5000) {
        nanosleep(&ms, NULL);
        check(defer_flush(), "defer_flush");
        waited++;
    }
    printf("graph destroyed: %llu released (after about %d ms)\n", released(),
           waited);
    check(cudaStreamDestroy(s), "cudaStreamDestroy");
    return released() == 1 ? 0 : 1;
}
