/* SPDX-License-Identifier: MIT */
/* include/cudefer.hpp's deleters while a graph capture is under way: a
 * refusal that comes from the capture leaves the pointer alone (the
 * header's promise), for waiting or freeing then would break the capture,
 * which the application goes on to end. */
#include <cstdio>
#include <memory>

#include "cudefer.hpp"
#include "fake_cuda.h"
#include "tap.h"

static cudaStream_t stream_new(unsigned flags)
{
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, flags) != cudaSuccess)
        bail("cudaStreamCreateWithFlags");
    return s;
}

/* A deleter on the legacy stream while a blocking stream of its device
 * captures (global mode): defer_free cannot record on the legacy stream,
 * and neither may the fallback wait for it or free. */
static void test_legacy_beside_capture()
{
    cudaStream_t cap = stream_new(cudaStreamDefault);
    void *raw = nullptr;
    if (cudaMalloc(&raw, 4096) != cudaSuccess)
        bail("cudaMalloc");
    is_int(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal),
           cudaSuccess, "a blocking stream begins a capture");
    {
        std::unique_ptr<float, cudefer::deleter> p(static_cast<float *>(raw),
                                                   cudefer::deleter{});
    }
    is_int(fake_is_released(raw), 0, "the pointer is left alone");
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaStreamEndCapture(cap, &graph);
    is_int(ended, cudaSuccess,
           "the capture is intact after the deleter ran (%s)",
           cudaGetErrorName(ended));
    if (graph != nullptr)
        cudaGraphDestroy(graph);
    is_int(cudaFree(raw), cudaSuccess, "the caller frees it after the capture");
    cudaStreamDestroy(cap);
}

int main()
{
    plan_lazy();
    fake_reset(1);
    test_legacy_beside_capture();
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
