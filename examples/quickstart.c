/* SPDX-License-Identifier: MIT */
/* quickstart.c: free device memory without waiting for the GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include <cudefer.h>

/* Every CUDA and cudefer call returns a cudaError_t: stop at the first. */
#define CHECK(call)                                                       \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) {                                          \
            fprintf(stderr, "quickstart: %s: %s\n", #call,                \
                    cudaGetErrorString(e_));                              \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

enum { N = 200, BYTES = 1 << 20 };

int main(void)
{
    cudaStream_t stream;
    unsigned char *host, *buf;
    struct defer_stats st;

    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaMallocHost((void **)&host, N));
    for (int i = 0; i < N; i++) {
        /* The first half with cudaMalloc, the second from cudefer's cache. */
        if (i < N / 2)
            CHECK(cudaMalloc((void **)&buf, BYTES));
        else
            CHECK(defer_alloc((void **)&buf, BYTES, stream));
        CHECK(cudaMemsetAsync(buf, i, BYTES, stream));
        CHECK(cudaMemcpyAsync(host + i, buf + BYTES - 1, 1,
                              cudaMemcpyDeviceToHost, stream));
        /* Returns at once: buf is freed once the work above is done. */
        CHECK(defer_free(buf, stream));
    }
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < N; i++)
        if (host[i] != (unsigned char)i) {
            fprintf(stderr, "quickstart: byte %d is %d\n", i, host[i]);
            return 1;
        }
    CHECK(defer_flush()); /* everything deferred so far is released */
    defer_stats_get(&st);
    printf("quickstart: ok, %llu released, %llu blocks reused\n",
           (unsigned long long)st.released, (unsigned long long)st.reused);
    CHECK(defer_shutdown());
    CHECK(cudaFreeHost(host));
    CHECK(cudaStreamDestroy(stream));
    return 0;
}
