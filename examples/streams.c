/* SPDX-License-Identifier: MIT */
/*
 * streams.c: one buffer used by several streams, released with
 * defer_free_streams, without making the streams wait for each other.
 *
 * Each iteration allocates a 1 MiB device buffer.  A producer stream fills
 * it (cudaMemsetAsync); two consumer streams each wait for the fill (an
 * event) and copy a different end of it into pinned host memory.  The
 * buffer is then handed to defer_free_streams with all three streams:
 * cudefer frees it once the work enqueued so far on every one of them is
 * done.  With defer_free on one stream, the program would first have to
 * make that stream wait for the others.  defer_call_streams checks each
 * iteration's copies once both consumers are done with them, and the
 * pinned results are released with defer_free_host_streams.
 *
 * Needs no kernel of its own: build it against an installed cudefer with
 *   cc streams.c $(pkg-config --cflags --libs cudefer) \
 *      -L/usr/local/cuda/lib64 -lcudart
 *
 * usage: streams [-n ITER]    (default 1000 iterations, at most 10000)
 * Exits 0 when every byte copied is right and cudefer released everything;
 * 1 on any failure, or with "streams: no CUDA device found (...)".
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"

#define BUF_BYTES ((size_t)1 << 20)
#define SLICE 4096 /* bytes each consumer copies back per iteration */
#define MAX_ITERS 10000

static unsigned char *results;     /* pinned: 2 slices per iteration */
static atomic_uint checked, wrong; /* written by the callbacks */

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "streams: %s: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

static unsigned char fill_value(unsigned i)
{
    return (unsigned char)(i * 7 + 1);
}

/* On cudefer's reclaimer thread, once both consumers copied iteration i's
 * slices: they must hold the value the producer wrote. */
static void check_iteration(void *arg)
{
    unsigned i = (unsigned)(uintptr_t)arg;
    const unsigned char *r = results + (size_t)i * 2 * SLICE;
    unsigned char want = fill_value(i);
    int bad = 0;

    for (size_t k = 0; k < 2 * SLICE; k++)
        bad |= r[k] != want;
    atomic_fetch_add(&wrong, (unsigned)bad);
    atomic_fetch_add(&checked, 1);
}

static unsigned parse_args(int argc, char **argv)
{
    unsigned long iters = 1000;
    char *end;
    int opt;

    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt != 'n')
            goto usage;
        errno = 0;
        iters = strtoul(optarg, &end, 10);
        if (errno || *end || end == optarg || iters == 0 ||
            iters > MAX_ITERS)
            goto usage;
    }
    if (optind == argc)
        return (unsigned)iters;
usage:
    fprintf(stderr, "usage: streams [-n ITER]   (1 <= ITER <= %d, "
            "default 1000)\n", MAX_ITERS);
    exit(2);
}

static void require_device(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);

    if (err == cudaSuccess && count == 0)
        err = cudaErrorNoDevice;
    if (err != cudaSuccess) {
        fprintf(stderr, "streams: no CUDA device found (cudaGetDeviceCount: "
                "%s)\n", cudaGetErrorString(err));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    unsigned iters = parse_args(argc, argv);
    cudaStream_t producer, consumer[2], all[3];
    cudaEvent_t filled;
    struct defer_stats st;

    require_device();
    printf("cudefer %s: %u buffers, each filled on one stream and read on "
           "two\n", defer_version(), iters);
    check(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
    for (int c = 0; c < 2; c++)
        check(cudaStreamCreateWithFlags(&consumer[c], cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
    all[0] = producer, all[1] = consumer[0], all[2] = consumer[1];
    check(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    check(cudaMallocHost((void **)&results, (size_t)iters * 2 * SLICE),
          "cudaMallocHost");

    for (unsigned i = 0; i < iters; i++) {
        unsigned char *buf;
        unsigned char *out = results + (size_t)i * 2 * SLICE;

        check(cudaMalloc((void **)&buf, BUF_BYTES), "cudaMalloc");
        check(cudaMemsetAsync(buf, fill_value(i), BUF_BYTES, producer),
              "cudaMemsetAsync");
        /* Re-recording one event is fine: each wait takes its state now. */
        check(cudaEventRecord(filled, producer), "cudaEventRecord");
        for (int c = 0; c < 2; c++) {
            const unsigned char *src = c == 0 ? buf : buf + BUF_BYTES - SLICE;

            check(cudaStreamWaitEvent(consumer[c], filled, 0),
                  "cudaStreamWaitEvent");
            check(cudaMemcpyAsync(out + c * SLICE, src, SLICE,
                                  cudaMemcpyDeviceToHost, consumer[c]),
                  "cudaMemcpyAsync");
        }
        /* Used by three streams: freed once all three are past this point.
         * The consumers do not wait for each other; this thread waits for
         * none of them. */
        check(defer_free_streams(buf, all, 3), "defer_free_streams");
        check(defer_call_streams(check_iteration, (void *)(uintptr_t)i,
                                 consumer, 2),
              "defer_call_streams");
    }
    /* The results buffer is read by the callbacks, which run before the
     * flush returns; the copies into it are the consumers' work. */
    check(defer_flush(), "defer_flush");
    check(defer_free_host_streams(results, consumer, 2),
          "defer_free_host_streams");
    check(defer_flush(), "defer_flush");

    defer_stats_get(&st);
    printf("checked %u iterations, %u with a wrong byte; cudefer: deferred "
           "%llu, released %llu, pending %llu, failed %llu\n",
           atomic_load(&checked), atomic_load(&wrong),
           (unsigned long long)st.deferred, (unsigned long long)st.released,
           (unsigned long long)st.pending, (unsigned long long)st.failed);
    check(defer_shutdown(), "defer_shutdown");
    check(cudaEventDestroy(filled), "cudaEventDestroy");
    check(cudaStreamDestroy(producer), "cudaStreamDestroy");
    for (int c = 0; c < 2; c++)
        check(cudaStreamDestroy(consumer[c]), "cudaStreamDestroy");

    /* iters buffers, iters callbacks, the results. */
    if (atomic_load(&checked) != iters || atomic_load(&wrong) != 0 ||
        st.deferred != 2ull * iters + 1 || st.released != st.deferred ||
        st.pending != 0 || st.failed != 0) {
        fprintf(stderr, "streams: FAILED\n");
        return 1;
    }
    printf("streams: ok\n");
    return 0;
}
