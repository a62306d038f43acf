/* SPDX-License-Identifier: MIT */
/*
 * cpp_raii.cpp: cudefer from C++ (include/cudefer.hpp).  Device and pinned
 * memory owned by std::unique_ptr and std::shared_ptr, whose deleters hand
 * it to defer_free on the stream that uses it: dropping the last owner right
 * after a launch returns at once, and the memory is freed once the kernel
 * is done.
 *
 *   1. a loop of {make_device_unique, kernel, drop at the end of the scope};
 *   2. a buffer shared by two stages on two streams (std::shared_ptr);
 *   3. a pinned host flag written by a kernel (make_host_unique);
 *   4. an exception thrown after a launch: unwinding frees the buffer, and
 *      still not before the kernel is done.
 *
 * usage: cpp_raii [-n ITER]    (default 1000 iterations)
 * Exits 0 when every check passed and cudefer released everything; 1 on a
 * failure, or with "cpp_raii: no CUDA device found (...)".
 */
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cudefer.hpp"
#include "gpu_kernels.h"

namespace {

const std::size_t buf_bytes = std::size_t(1) << 20;
const unsigned long long spin_ns = 50000; /* each kernel: ~50 us */
int failures = 0;

void check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        std::fprintf(stderr, "cpp_raii: %s: %s\n", what,
                     cudaGetErrorString(err));
        std::exit(1);
    }
}

void expect(bool cond, const char *what)
{
    std::printf("%s %s\n", cond ? "  ok  " : "  FAIL", what);
    failures += !cond;
}

double ms_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - t0).count();
}

struct stream_owner { /* RAII for the stream itself */
    cudaStream_t s;
    stream_owner()
    {
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
    }
    ~stream_owner() { cudaStreamDestroy(s); }
    stream_owner(const stream_owner &) = delete;
    stream_owner &operator=(const stream_owner &) = delete;
};

/* 1. Each iteration's buffer dies at the end of its scope, right after the
 * kernel that fills it was launched: the loop never waits for the GPU. */
void loop(cudaStream_t s, unsigned iters)
{
    double longest_drop = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (unsigned i = 0; i < iters; i++) {
        auto t_drop = t0;
        {
            cudefer::device_array<unsigned char> buf =
                cudefer::make_device_unique<unsigned char>(buf_bytes, s);
            check(gpu_spin_fill(s, spin_ns, buf.get(), buf_bytes,
                                (unsigned char)i),
                  "gpu_spin_fill");
            t_drop = std::chrono::steady_clock::now();
        } /* ~unique_ptr: defer_free(buf, s) */
        double d = ms_since(t_drop);
        if (d > longest_drop)
            longest_drop = d;
    }
    double issue = ms_since(t0);
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    double gpu = ms_since(t0);
    std::printf("1. %u x {make_device_unique 1 MiB, %llu us kernel, drop}: "
                "issued in %.1f ms, GPU done at %.1f ms; longest drop "
                "%.3f ms\n", iters, spin_ns / 1000, issue, gpu, longest_drop);
}

/* 2. Stage A fills a buffer on stream a, stage B copies it to the host on
 * stream b after A's fill (an event).  Both stages own it; the deleter's
 * stream is b, the stream of the last use, since b's work comes after a's. */
void shared_stages(cudaStream_t a, cudaStream_t b)
{
    unsigned char *raw = nullptr;
    check(cudaMalloc(reinterpret_cast<void **>(&raw), buf_bytes),
          "cudaMalloc");
    std::shared_ptr<unsigned char> stage_a(raw, cudefer::deleter{b});
    std::shared_ptr<unsigned char> stage_b = stage_a;
    cudefer::host_array<unsigned char> out =
        cudefer::make_host_unique<unsigned char>(buf_bytes, b);
    cudaEvent_t filled;

    check(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    check(gpu_spin_fill(a, 10 * spin_ns, stage_a.get(), buf_bytes, 0x5a),
          "gpu_spin_fill");
    check(cudaEventRecord(filled, a), "cudaEventRecord");
    stage_a.reset(); /* stage A is done with it: nothing is freed yet */
    check(cudaStreamWaitEvent(b, filled, 0), "cudaStreamWaitEvent");
    check(cudaMemcpyAsync(out.get(), stage_b.get(), buf_bytes,
                          cudaMemcpyDeviceToHost, b),
          "cudaMemcpyAsync");
    stage_b.reset(); /* the last owner: defer_free(raw, b) */
    check(cudaEventDestroy(filled), "cudaEventDestroy");
    check(cudaStreamSynchronize(b), "cudaStreamSynchronize");
    bool right = true;
    for (std::size_t k = 0; k < buf_bytes; k++)
        right &= out[k] == 0x5a;
    std::printf("2. a buffer shared by two stages on two streams\n");
    expect(right, "stage B read what stage A wrote");
} /* ~host_array: defer_free_host(out, b) */

/* 3. A kernel sets a flag in pinned host memory. */
void pinned_flag(cudaStream_t s)
{
    cudefer::host_array<int> flag = cudefer::make_host_unique<int>(1, s);
    flag[0] = 0;
    check(gpu_spin_set_flag(s, spin_ns, flag.get(), 42), "gpu_spin_set_flag");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    std::printf("3. a pinned host flag written by a kernel\n");
    expect(flag[0] == 42, "the kernel set the flag");
}

/* 4. A stage throws after launching work on its buffer. */
void stage_that_throws(cudaStream_t s, volatile int *flag)
{
    cudefer::device_array<float> tmp = cudefer::make_device_unique<float>(
        buf_bytes / sizeof(float), s);
    check(gpu_spin_fill(s, 400 * spin_ns, tmp.get(), buf_bytes, 0), /* 20 ms */
          "gpu_spin_fill");
    check(gpu_spin_set_flag(s, 0, flag, 1), "gpu_spin_set_flag");
    throw std::runtime_error("the stage failed");
}

void unwinding(cudaStream_t s)
{
    cudefer::host_array<int> flag = cudefer::make_host_unique<int>(1, s);
    struct defer_stats before, after;
    flag[0] = 0;
    defer_stats_get(&before);
    std::string what;
    try {
        stage_that_throws(s, flag.get());
    } catch (const std::runtime_error &e) {
        what = e.what();
    }
    defer_stats_get(&after);
    std::printf("4. an exception after a launch (\"%s\")\n", what.c_str());
    expect(after.deferred - before.deferred == 1,
           "unwinding handed the buffer to cudefer");
    expect(*static_cast<volatile int *>(flag.get()) == 0,
           "without waiting for the kernel (its 20 ms are not over)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

unsigned parse_args(int argc, char **argv)
{
    unsigned long iters = 1000;
    char *end;
    int opt;

    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt != 'n')
            goto usage;
        errno = 0;
        iters = std::strtoul(optarg, &end, 10);
        if (errno || *end || end == optarg || iters == 0 || iters > 1000000)
            goto usage;
    }
    if (optind == argc)
        return static_cast<unsigned>(iters);
usage:
    std::fprintf(stderr, "usage: cpp_raii [-n ITER]   (1 <= ITER <= 1000000, "
                 "default 1000)\n");
    std::exit(2);
}

void require_device()
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);

    if (err == cudaSuccess && count == 0)
        err = cudaErrorNoDevice;
    if (err != cudaSuccess) {
        std::fprintf(stderr, "cpp_raii: no CUDA device found "
                     "(cudaGetDeviceCount: %s)\n", cudaGetErrorString(err));
        std::exit(1);
    }
}

} // namespace

int main(int argc, char **argv)
{
    unsigned iters = parse_args(argc, argv);
    require_device();
    std::printf("cudefer %s, C++ RAII\n", defer_version());
    {
        stream_owner a, b;
        loop(a.s, iters);
        shared_stages(a.s, b.s);
        pinned_flag(a.s);
        unwinding(b.s);
        check(defer_flush(), "defer_flush"); /* before the streams go */
    }
    struct defer_stats st;
    defer_stats_get(&st);
    std::printf("cudefer: deferred %llu, released %llu, pending %llu, "
                "failed %llu\n",
                (unsigned long long)st.deferred,
                (unsigned long long)st.released,
                (unsigned long long)st.pending, (unsigned long long)st.failed);
    expect(st.released == st.deferred && st.pending == 0 && st.failed == 0,
           "everything deferred was released");
    check(defer_shutdown(), "defer_shutdown");
    if (failures != 0) {
        std::fprintf(stderr, "cpp_raii: %d check(s) FAILED\n", failures);
        return 1;
    }
    std::printf("cpp_raii: ok\n");
    return 0;
}
