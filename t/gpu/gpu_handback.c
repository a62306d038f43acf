/* SPDX-License-Identifier: MIT */
/*
 * gpu_handback.c: a miss that hands blocks back to cudefer's pool, on a
 * real GPU.  Two 64 MiB blocks are freed on stream s while a 200 ms kernel
 * still writes the first one (their work is pending), then a request on s
 * of 96 MiB fits neither: the pool lacks the memory, so the blocks go back
 * to it ordered on s (cudaFreeAsync on s) and the new block may reuse their
 * memory.  Stream order must keep every byte: a copy of the first block
 * enqueued before the free holds the kernel's bytes, and the new block
 * holds its own kernel's bytes only.  Then the same on a second stream s2:
 * its request must not take s's pending blocks (it lets the pool grow
 * instead).  Skipped without a CUDA device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"
#include "gpu_kernels.h"
#include "tap.h"

#define MIB ((size_t)1 << 20)
#define BLOCK (64 * MIB)
#define REQUEST (96 * MIB) /* fits neither block, lacks more than any slack
                              a pool keeps after a trim */
#define SPIN_NS 200000000ull /* the first block's kernel: 200 ms */

/* Whether the n bytes at device ptr all hold value (copied on stream). */
static int holds(const void *ptr, size_t n, unsigned char value,
                 cudaStream_t stream)
{
    unsigned char *host = malloc(n);
    if (host == NULL)
        bail("malloc");
    int good = cudaMemcpyAsync(host, ptr, n, cudaMemcpyDeviceToHost,
                               stream) == cudaSuccess &&
               cudaStreamSynchronize(stream) == cudaSuccess;
    for (size_t i = 0; good && i < n; i++)
        good = host[i] == value;
    free(host);
    return good;
}

/* Trim, then free a and b (BLOCK each) on s while a 200 ms kernel writes a,
 * and ask for REQUEST on `on`; returns the new block, *copy the pinned copy
 * of a taken on s before the free, *before the statistics after the trim
 * (the trim's own releases are not the miss's). */
static void *miss_after_pending(cudaStream_t s, cudaStream_t on,
                                unsigned char **copy,
                                struct defer_stats *before)
{
    size_t trimmed = 0;
    defer_trim(&trimmed); /* the pool holds only what is in use */
    defer_stats_get(before);
    void *a = NULL, *b = NULL, *c = NULL;
    if (defer_alloc(&a, BLOCK, s) != cudaSuccess ||
        defer_alloc(&b, BLOCK, s) != cudaSuccess)
        bail("defer_alloc");
    if (cudaMallocHost((void **)copy, BLOCK) != cudaSuccess)
        bail("cudaMallocHost");
    gpu_spin_fill(s, 0, b, BLOCK, 0x11);
    gpu_spin_fill(s, SPIN_NS, a, BLOCK, 0xAA);
    cudaMemcpyAsync(*copy, a, BLOCK, cudaMemcpyDeviceToHost, s);
    defer_free(a, s);
    defer_free(b, s); /* both pending on s: the kernel still runs */
    if (defer_alloc(&c, REQUEST, on) != cudaSuccess)
        bail("defer_alloc of 24 MiB");
    gpu_spin_fill(on, 0, c, REQUEST, 0x55);
    return c;
}

/* What a stream-ordered pool reserves for small requests: the fake
 * runtime's pools reserve in 2 MiB granules in bench/replay-trace (an
 * assumption, t/fake/fake_cuda.h fake_set_pool_granularity): printed here
 * for the record, checked only to cover what is used. */
static void pool_granule(cudaStream_t s)
{
    struct cudaMemPoolProps props = {
        .allocType = cudaMemAllocationTypePinned,
        .location = {.type = cudaMemLocationTypeDevice, .id = 0}};
    cudaMemPool_t pool;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess)
        bail("cudaMemPoolCreate");
    size_t sizes[] = {3072, MIB + 4096, 5 * MIB};
    void *p[3];
    uint64_t used = 0, reserved[3] = {0};
    int fits = 1;
    for (int i = 0; i < 3; i++) {
        if (cudaMallocFromPoolAsync(&p[i], sizes[i], pool, s) != cudaSuccess)
            bail("cudaMallocFromPoolAsync");
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent,
                                &reserved[i]);
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
        fits &= reserved[i] >= used;
    }
    diag("a new pool reserves %llu, %llu, %llu bytes after requests of "
         "3 KiB, 1 MiB + 4 KiB and 5 MiB more (fake: 2 MiB granules)",
         (unsigned long long)reserved[0], (unsigned long long)reserved[1],
         (unsigned long long)reserved[2]);
    ok(fits, "a pool reserves at least what it lends");
    for (int i = 0; i < 3; i++)
        cudaFreeAsync(p[i], s);
    cudaStreamSynchronize(s);
    cudaMemPoolDestroy(pool);
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        skip_all("no CUDA device");
    gpu_tests_serialize();
    plan(9);
    cudaStream_t s, s2;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) != cudaSuccess)
        bail("cudaStreamCreateWithFlags");
    gpu_spin(s, 1000); /* load the kernels, start the context */
    cudaStreamSynchronize(s);
    pool_granule(s);

    struct defer_stats s0, s1;
    unsigned char *copy = NULL;
    void *c = miss_after_pending(s, s, &copy, &s0);
    cudaStreamSynchronize(s);
    defer_stats_get(&s1);
    diag("handed back %llu blocks, %llu new",
         (unsigned long long)(s1.cache_releases - s0.cache_releases),
         (unsigned long long)(s1.cache_mallocs - s0.cache_mallocs));
    ok(s1.cache_releases - s0.cache_releases >= 1,
       "the miss on s handed s's pending blocks back to the pool");
    int good = 1;
    for (size_t i = 0; i < BLOCK; i++)
        good &= copy[i] == 0xAA;
    ok(good, "the copy enqueued before the free holds the 200 ms kernel's "
             "bytes: the new block's kernel ran after it");
    ok(holds(c, REQUEST, 0x55, s), "the new block holds its own bytes");
    defer_free(c, s);
    cudaFreeHost(copy);
    is_int(defer_flush(), cudaSuccess, "flush");

    /* The same with the request on s2: s's pending blocks are not its. */
    c = miss_after_pending(s, s2, &copy, &s0);
    defer_stats_get(&s1);
    is_int((long long)(s1.cache_releases - s0.cache_releases), 0,
           "a miss on s2 hands none of s's pending blocks back");
    cudaStreamSynchronize(s);
    good = 1;
    for (size_t i = 0; i < BLOCK; i++)
        good &= copy[i] == 0xAA;
    ok(good, "and s's kernel's bytes are intact");
    ok(holds(c, REQUEST, 0x55, s2), "s2's block holds its own bytes");
    defer_free(c, s2);
    cudaFreeHost(copy);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    cudaStreamDestroy(s);
    cudaStreamDestroy(s2);
    return 0;
}
