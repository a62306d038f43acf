/* SPDX-License-Identifier: MIT */
/* include/cudefer.hpp on the fake runtime, built with the C++ compiler:
 * std::unique_ptr and std::shared_ptr owning device and pinned memory
 * release it through cudefer — held while work that uses it is pending,
 * released after (by defer_flush: the configuration below never releases on
 * its own while the test runs; defer_trim shows that pending work, not the
 * policy, holds it) — the allocation helpers, their defer_trim
 * retry and std::bad_alloc, and the synchronous fallback of a refused
 * pointer.  The fake's oracle fails the test on any premature or double
 * release. */
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

#include <time.h>

#include "cudefer.hpp"
#include "fake_cuda.h"
#include "tap.h"

static_assert(noexcept(std::declval<const cudefer::deleter &>()(
                  static_cast<float *>(nullptr))),
              "deleter::operator() is noexcept");
static_assert(noexcept(std::declval<const cudefer::host_deleter &>()(
                  static_cast<char *>(nullptr))),
              "host_deleter::operator() is noexcept");
static_assert(std::is_nothrow_default_constructible<cudefer::deleter>::value,
              "a unique_ptr with a deleter can be default-constructed");
static_assert(std::is_nothrow_copy_constructible<cudefer::deleter>::value,
              "a shared_ptr's deleter is copied");
static_assert(!std::is_convertible<cudaStream_t, cudefer::deleter>::value,
              "a stream does not turn into a deleter by accident");
static_assert(std::is_same<cudefer::device_array<int>,
                           std::unique_ptr<int[], cudefer::deleter>>::value,
              "device_array is a unique_ptr<T[]>");

#define MIB ((size_t)1 << 20)
#define DEVICE_MEMORY (64 * MIB)

struct particle {
    float x, y, z;
    int id;
};

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *device_alloc(size_t bytes)
{
    void *p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMalloc: %s", cudaGetErrorString(err));
    return p;
}

static void *host_alloc(size_t bytes)
{
    void *p = nullptr;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMallocHost: %s", cudaGetErrorString(err));
    return p;
}

static cudaStream_t stream_new()
{
    cudaStream_t s;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess)
        bail("cudaStreamCreate: %s", cudaGetErrorString(err));
    return s;
}

/* Simulated work on s that uses p, pending until fake_complete. */
static fake_work *work_held(cudaStream_t s, const void *p)
{
    void *use = const_cast<void *>(p);
    fake_work *w = fake_launch_held(s, &use, 1);
    if (w == nullptr)
        bail("fake_launch_held on an invalid stream");
    return w;
}

static struct defer_stats stats_now()
{
    struct defer_stats st;
    defer_stats_get(&st);
    return st;
}

/* Held while w is pending, even by defer_trim (which releases whatever has
 * completed: a deleter that recorded on the wrong stream is caught here),
 * released by defer_flush once w completes. */
static void check_deferred(const void *p, fake_work *w, const char *what)
{
    is_int(defer_trim(NULL), cudaSuccess, "%s: defer_trim", what);
    is_int(fake_is_released(p), 0, "%s: held while its work is pending",
           what);
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "%s: defer_flush", what);
    is_int(fake_is_released(p), 1, "%s: released once its work is done",
           what);
}

static void test_unique_ptr(cudaStream_t s)
{
    uint64_t before = stats_now().deferred;
    float *raw = static_cast<float *>(device_alloc(256 * sizeof(float)));
    std::unique_ptr<float, cudefer::deleter> p(raw, cudefer::deleter{s});
    is_int(p.get_deleter().stream == s, 1, "unique_ptr: the deleter holds s");
    fake_work *w = work_held(s, raw);
    p.reset();
    is_int(stats_now().deferred - before, 1,
           "unique_ptr: reset hands the pointer to defer_free");
    check_deferred(raw, w, "unique_ptr<float>");

    /* Any T: a const element type and an array of structs. */
    const int *craw = static_cast<const int *>(device_alloc(64));
    fake_work *cw = work_held(s, craw);
    {
        std::unique_ptr<const int, cudefer::deleter> c(craw,
                                                       cudefer::deleter(s));
    }
    check_deferred(craw, cw, "unique_ptr<const int> out of scope");

    particle *praw = static_cast<particle *>(device_alloc(100 * sizeof(particle)));
    fake_work *pw = work_held(s, praw);
    {
        std::unique_ptr<particle[], cudefer::deleter> a(praw,
                                                        cudefer::deleter{s});
    }
    check_deferred(praw, pw, "unique_ptr<particle[]> out of scope");

    std::unique_ptr<float, cudefer::deleter> empty;
    is_int(empty.get_deleter().stream == nullptr, 1,
           "a default deleter uses stream 0");
}

static void test_moved_stream(cudaStream_t s1, cudaStream_t s2)
{
    cudefer::device_array<float> a(
        static_cast<float *>(device_alloc(1024 * sizeof(float))),
        cudefer::deleter{s1});
    const float *raw = a.get();
    fake_work *w = work_held(s2, raw); /* the last use is on s2 */
    a.get_deleter().stream = s2;
    a.reset();
    check_deferred(raw, w, "deleter moved to the stream of the last use");
}

static void test_shared_ptr(cudaStream_t s)
{
    float *raw = static_cast<float *>(device_alloc(4096));
    std::shared_ptr<float> p(raw, cudefer::deleter{s});
    std::shared_ptr<float> q = p;
    fake_work *w = work_held(s, raw);
    uint64_t before = stats_now().deferred;
    p.reset();
    is_int(stats_now().deferred - before, 0,
           "shared_ptr: nothing deferred while another owner is left");
    is_int(fake_is_released(raw), 0, "shared_ptr: still allocated");
    q.reset();
    is_int(stats_now().deferred - before, 1,
           "shared_ptr: the last owner defers it");
    check_deferred(raw, w, "shared_ptr<float>");

    /* The last owner drops it on another thread: deferred there. */
    float *raw2 = static_cast<float *>(device_alloc(4096));
    std::shared_ptr<float> r(raw2, cudefer::deleter{s});
    fake_work *w2 = work_held(s, raw2);
    before = stats_now().deferred;
    std::thread t([](std::shared_ptr<float> mine) { mine.reset(); },
                  std::move(r));
    t.join();
    is_int(stats_now().deferred - before, 1,
           "shared_ptr: dropped last on another thread, deferred there");
    check_deferred(raw2, w2, "shared_ptr dropped on another thread");

    /* shared_ptr(nullptr, d) calls d with a std::nullptr_t: nothing to do. */
    before = stats_now().deferred;
    {
        std::shared_ptr<float> none(nullptr, cudefer::deleter{s});
        std::shared_ptr<char> hnone(nullptr, cudefer::host_deleter{s});
    }
    is_int(stats_now().deferred - before, 0,
           "shared_ptr(nullptr, deleter): nothing deferred");
}

static void test_host(cudaStream_t s)
{
    size_t invalid = fake_invalid_releases();
    char *raw = static_cast<char *>(host_alloc(8192));
    fake_work *w = work_held(s, raw);
    {
        std::unique_ptr<char[], cudefer::host_deleter> h(
            raw, cudefer::host_deleter{s});
    }
    check_deferred(raw, w, "unique_ptr<char[], host_deleter>");

    double *raw2 = static_cast<double *>(host_alloc(8192));
    fake_work *w2 = work_held(s, raw2);
    std::shared_ptr<double> sh(raw2, cudefer::host_deleter{s});
    sh.reset();
    check_deferred(raw2, w2, "shared_ptr<double> with host_deleter");
    is_int((long long)(fake_invalid_releases() - invalid), 0,
           "pinned memory released with cudaFreeHost, not cudaFree");
}

static void test_make_unique(cudaStream_t s)
{
    size_t live = fake_live_allocations();
    cudefer::device_array<particle> d = cudefer::make_device_unique<particle>(1000, s);
    ok(d != nullptr, "make_device_unique<particle>(1000) allocates");
    is_int(d.get_deleter().stream == s, 1, "... with a deleter bound to s");
    is_int((long long)(fake_live_allocations() - live), 1,
           "... one allocation");
    const particle *draw = d.get();
    fake_work *w = work_held(s, draw);
    d.reset();
    check_deferred(draw, w, "make_device_unique's array");

    cudefer::host_array<int> h = cudefer::make_host_unique<int>(64, s);
    ok(h != nullptr, "make_host_unique<int>(64) allocates");
    const int *hraw = h.get();
    fake_work *hw = work_held(s, hraw);
    h = nullptr;
    check_deferred(hraw, hw, "make_host_unique's array");

    cudefer::device_array<float> none = cudefer::make_device_unique<float>(0, s);
    ok(none == nullptr, "make_device_unique(0) is empty");
    is_int((long long)fake_live_allocations(), (long long)live,
           "no allocation is left");
}

static int throws_bad_alloc(size_t n)
{
    try {
        cudefer::device_array<double> d = cudefer::make_device_unique<double>(n);
    } catch (const std::bad_alloc &) {
        return 1;
    }
    return 0;
}

static void test_bad_alloc(void)
{
    size_t live = fake_live_allocations();
    ok(throws_bad_alloc(std::numeric_limits<size_t>::max() / 4),
       "make_device_unique: n * sizeof(T) overflowing throws std::bad_alloc");
    ok(throws_bad_alloc(2 * DEVICE_MEMORY / sizeof(double)),
       "make_device_unique: more than the device has throws std::bad_alloc");
    is_int((long long)fake_live_allocations(), (long long)live,
           "nothing allocated by the failed calls");
}

/* Completed memory that the policy holds is released by defer_trim when
 * make_device_unique runs out, and the allocation then succeeds. */
static void test_trim_retry(cudaStream_t s)
{
    size_t big = DEVICE_MEMORY * 3 / 4;
    cudefer::device_array<char> a = cudefer::make_device_unique<char>(big, s);
    ok(a != nullptr, "make_device_unique: 3/4 of the device");
    const char *first = a.get();
    /* By identity: the second buffer may get the first one's address. */
    unsigned long long first_serial = fake_my_allocation_serial(first);
    fake_work *w = work_held(s, first);
    a.reset();
    fake_complete(w);
    bool held = false;
    for (int i = 0; i < 2000 && !held; i++, sleep_ms(1))
        held = stats_now().held == 1;
    ok(held, "completed, and held by the release policy");
    uint64_t demand = stats_now().demand_releases;
    bool thrown = false;
    try {
        a = cudefer::make_device_unique<char>(big, s);
    } catch (const std::bad_alloc &) {
        thrown = true;
    }
    ok(!thrown && a != nullptr,
       "a second 3/4 of the device: allocated after a defer_trim");
    is_int(fake_serial_released(first_serial), 1,
           "the first buffer was released");
    is_int((long long)(stats_now().demand_releases - demand), 1,
           "by the trim (a demand release)");
    a.reset();
    is_int(defer_flush(), cudaSuccess, "flush");
}

/* A refused pointer is freed at once, after its stream's work: no leak, no
 * premature release. */
static void test_fallback(cudaStream_t s)
{
    void *uses;

    cudaStream_t gone = stream_new();
    cudaStreamDestroy(gone);
    float *raw = static_cast<float *>(device_alloc(512));
    {
        std::unique_ptr<float, cudefer::deleter> p(raw, cudefer::deleter{gone});
    }
    is_int(fake_is_released(raw), 1,
           "destroyed stream: defer_free refuses, the deleter frees at once");

    float *raw2 = static_cast<float *>(device_alloc(512));
    uses = raw2;
    fake_launch(s, 30000, &uses, 1); /* 30 ms */
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchOutOfResources, 0, 1);
    {
        std::unique_ptr<float, cudefer::deleter> p(raw2, cudefer::deleter{s});
    }
    fake_fail_clear();
    is_int(fake_is_released(raw2), 1,
           "no event recorded: freed at once, after the stream's work "
           "(the oracle checks)");

    /* A block of defer_alloc owned twice (the caller's bug): the second
     * deleter's defer_free is refused (already being freed) and must not
     * free the cache's memory, which the block's next owner may hold
     * (before: cudaFree'd by the fallback). */
    void *block = nullptr;
    is_int(defer_alloc(&block, 4096, s), cudaSuccess, "a block");
    {
        std::unique_ptr<char, cudefer::deleter> a(static_cast<char *>(block),
                                                  cudefer::deleter{s});
        std::unique_ptr<char, cudefer::deleter> b(static_cast<char *>(block),
                                                  cudefer::deleter{s});
    }
    is_int(fake_is_released(block), 0,
           "a block deleted twice: the second refusal frees nothing");
    is_int(defer_flush(), cudaSuccess, "flush");
    void *again = nullptr;
    is_int(defer_alloc(&again, 4096, s), cudaSuccess, "the cache still "
           "hands it out");
    ok(again == block, "the same block");
    is_int(defer_free(again, s), cudaSuccess, "and takes it back");

    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    char *raw3 = static_cast<char *>(host_alloc(256));
    uses = raw3;
    fake_launch(s, 30000, &uses, 1);
    std::shared_ptr<char> h(raw3, cudefer::host_deleter{s});
    h.reset();
    is_int(fake_is_released(raw3), 1,
           "after defer_shutdown: pinned memory freed at once, after the "
           "stream's work");
    cudefer::device_array<int> d = cudefer::make_device_unique<int>(16, s);
    const int *draw = d.get();
    d.reset();
    is_int(fake_is_released(draw), 1,
           "after defer_shutdown: device memory freed at once");
}

/* t/cxx_per_thread.cpp's defer_free(p, 0), built per-thread. */
cudaError_t cxx_per_thread_free(void *p);

/* A pointer freed with stream 0 by a per-thread translation unit is
 * deferred on the thread's per-thread stream: held behind work there,
 * released once it is done. */
static void test_per_thread_unit()
{
    void *p = nullptr;
    if (cudaMalloc(&p, 4096) != cudaSuccess)
        bail("cudaMalloc");
    fake_work *w = fake_launch_held(cudaStreamPerThread, &p, 1);
    is_int(cxx_per_thread_free(p), cudaSuccess,
           "a per-thread unit's defer_free(p, 0)");
    std::size_t released = 0;
    is_int(defer_trim(&released), cudaSuccess, "trim");
    ok(fake_is_released(p) == 0, "... held behind its per-thread stream");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1, "... released once that work is done");
}

int main()
{
    plan_lazy();
    fake_reset(1);
    fake_set_device_memory(0, DEVICE_MEMORY);

    /* Nothing is released on its own while the test runs: not when quiet,
     * not by age, not by the cap. */
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.idle_us = 10000000;
    cfg.max_delay_ms = 0;
    cfg.max_pending_bytes = (uint64_t)1 << 40;
    is_int(defer_configure(&cfg), cudaSuccess, "configure");

    cudaStream_t s1 = stream_new(), s2 = stream_new();
    test_unique_ptr(s1);
    test_moved_stream(s1, s2);
    test_shared_ptr(s1);
    test_host(s2);
    test_make_unique(s1);
    test_bad_alloc();
    test_trim_retry(s2);
    test_per_thread_unit();
    test_fallback(s1); /* last: it shuts cudefer down */

    struct defer_stats st = stats_now();
    is_int((long long)st.failed, 0, "nothing failed");
    is_int((long long)fake_live_allocations(), 0, "no allocation is left");
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
