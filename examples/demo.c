/* SPDX-License-Identifier: MIT */
/*
 * demo.c: the same small GPU pipeline, timed with three ways of releasing.
 *
 * Each iteration allocates a 1 MiB device buffer, runs a ~50 us kernel that
 * fills it on a non-blocking stream, and releases the buffer:
 *   limit   buffers preallocated, nothing released (reference)
 *   inline  cudaFree right after the launch
 *   defer   defer_free right after the launch, defer_flush at the end
 * Each pass is timed until all its GPU work is done; the wall times and
 * their ratios are printed.
 *
 * usage: demo [-n ITER]    (default 2000 iterations)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"

#define BUF_BYTES ((size_t)1 << 20)
#define SPIN_NS 50000ull
#define LIMIT_RING 64     /* preallocated buffers the limit pass cycles over */
#define WARMUP_ITERS 20

static void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "demo: %s: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void launch(cudaStream_t s, void *buf, unsigned i)
{
    check(gpu_spin_fill(s, SPIN_NS, buf, BUF_BYTES, (unsigned char)i),
          "gpu_spin_fill");
}

static double pass_limit(cudaStream_t s, unsigned iters)
{
    void *ring[LIMIT_RING];
    double t0;

    for (int i = 0; i < LIMIT_RING; i++)
        check(cudaMalloc(&ring[i], BUF_BYTES), "cudaMalloc");
    t0 = now_ms();
    for (unsigned i = 0; i < iters; i++)
        launch(s, ring[i % LIMIT_RING], i);
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    t0 = now_ms() - t0;
    for (int i = 0; i < LIMIT_RING; i++)
        check(cudaFree(ring[i]), "cudaFree");
    return t0;
}

static double pass_inline(cudaStream_t s, unsigned iters)
{
    double t0 = now_ms();

    for (unsigned i = 0; i < iters; i++) {
        void *buf;

        check(cudaMalloc(&buf, BUF_BYTES), "cudaMalloc");
        launch(s, buf, i);
        check(cudaFree(buf), "cudaFree");
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return now_ms() - t0;
}

static double pass_defer(cudaStream_t s, unsigned iters)
{
    double t0 = now_ms();

    for (unsigned i = 0; i < iters; i++) {
        void *buf;

        check(cudaMalloc(&buf, BUF_BYTES), "cudaMalloc");
        launch(s, buf, i);
        check(defer_free(buf, s), "defer_free");
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check(defer_flush(), "defer_flush");
    return now_ms() - t0;
}

static unsigned parse_args(int argc, char **argv)
{
    unsigned long iters = 2000;
    char *end;
    int opt;

    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt != 'n')
            goto usage;
        errno = 0;
        iters = strtoul(optarg, &end, 10);
        if (errno || *end || end == optarg || iters == 0 || iters > 1000000)
            goto usage;
    }
    if (optind == argc)
        return (unsigned)iters;
usage:
    fprintf(stderr, "usage: demo [-n ITER]   (1 <= ITER <= 1000000, "
            "default 2000)\n");
    exit(2);
}

static void require_device(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);

    if (err == cudaSuccess && count == 0)
        err = cudaErrorNoDevice;
    if (err != cudaSuccess) {
        fprintf(stderr, "demo: no CUDA device found (cudaGetDeviceCount: "
                "%s)\n", cudaGetErrorString(err));
        exit(1);
    }
}

static void print_results(unsigned iters, double limit, double inl,
                          double def)
{
    struct defer_stats st;

    printf("%-7s %-22s %10s %10s\n", "pass", "release", "wall ms",
           "us/iter");
    printf("%-7s %-22s %10.1f %10.2f\n", "limit", "none (preallocated)",
           limit, limit * 1e3 / iters);
    printf("%-7s %-22s %10.1f %10.2f\n", "inline", "cudaFree", inl,
           inl * 1e3 / iters);
    printf("%-7s %-22s %10.1f %10.2f\n", "defer", "defer_free + flush", def,
           def * 1e3 / iters);
    printf("\n");
    printf("inline/limit %6.2f\n", inl / limit);
    printf("defer/limit  %6.2f\n", def / limit);
    printf("inline/defer %6.2f\n", inl / def);

    defer_stats_get(&st);
    printf("\ncudefer stats: deferred %llu, released %llu, failed %llu, "
           "batches %llu, largest batch %llu\n",
           (unsigned long long)st.deferred, (unsigned long long)st.released,
           (unsigned long long)st.failed, (unsigned long long)st.batches,
           (unsigned long long)st.largest_batch);
}

int main(int argc, char **argv)
{
    unsigned iters = parse_args(argc, argv);
    cudaStream_t s;
    double limit, inl, def;

    require_device();
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");

    /* Load the kernel and start the reclaimer outside the timed passes. */
    pass_limit(s, WARMUP_ITERS);
    pass_inline(s, WARMUP_ITERS);
    pass_defer(s, WARMUP_ITERS);

    printf("cudefer %s demo: %u iterations of {cudaMalloc 1 MiB, "
           "%llu us kernel, release}\n\n", defer_version(), iters,
           SPIN_NS / 1000);
    inl = pass_inline(s, iters);
    def = pass_defer(s, iters);
    limit = pass_limit(s, iters);
    print_results(iters, limit, inl, def);

    check(defer_shutdown(), "defer_shutdown");
    check(cudaStreamDestroy(s), "cudaStreamDestroy");
    return 0;
}
