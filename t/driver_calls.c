/* SPDX-License-Identifier: MIT */
/* The launching thread's CUDA calls through the driver's entry points
 * (src/cuda.h): a defer call makes its capture check and its event
 * record through them, once each (not again through the runtime); a failed
 * one leaves the thread's last error as it was, where the runtime's call
 * left its error for the application's next cudaGetLastError (PyTorch's
 * launch checks read it); and on a thread with no current context (the
 * fake's fake_set_no_context) the runtime's calls are made instead, and
 * every free, allocation and event creation still works, the oracle
 * checking every release and hand-out.  CUDEFER_DRIVER_CALLS=0 makes the
 * runtime's calls only. */
#include "helpers.h"

/* Driver calls and runtime records since the last mark. */
static unsigned long base_driver, base_record, base_capturing;

static void mark(void)
{
    base_driver = fake_driver_calls();
    base_record = fake_calls(FAKE_EVENT_RECORD);
    base_capturing = fake_calls(FAKE_STREAM_IS_CAPTURING);
}

/* A defer_free on a created stream, after a first one (which starts the
 * library and stocks the event pool, its creations through the driver
 * too): its capture check and its record through the driver, each made
 * once, and no other CUDA call. */
static void test_free_uses_driver(cudaStream_t s)
{
    void *first = device_alloc(256), *p = device_alloc(256);
    unsigned long before_start = fake_driver_calls();
    unsigned long created = fake_calls(FAKE_EVENT_CREATE);
    is_int(defer_free(first, s), cudaSuccess, "a first defer_free");
    /* Each creation asks the current device and creates: two apiece. */
    ok(fake_driver_calls() - before_start >=
           2 * (fake_calls(FAKE_EVENT_CREATE) - created) + 2,
       "it went through the driver, the pool's %lu event creations too (%lu "
       "driver calls)", fake_calls(FAKE_EVENT_CREATE) - created,
       fake_driver_calls() - before_start);
    fake_work *w = work_held(s, p);
    mark();
    is_int(defer_free(p, s), cudaSuccess, "defer_free");
    is_int((int)(fake_driver_calls() - base_driver), 2,
           "its capture check and record went through the driver");
    is_int((int)(fake_calls(FAKE_EVENT_RECORD) - base_record), 1,
           "one record, not one more through the runtime");
    is_int((int)(fake_calls(FAKE_STREAM_IS_CAPTURING) - base_capturing), 1,
           "one capture check");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(first) == 1,
       "released once their work completed");
}

/* A record that fails: the call returns the error, and the caller keeps
 * the pointer; the thread's last error is left as it was. */
static void test_failed_record_leaves_last_error(cudaStream_t s)
{
    void *p = device_alloc(256);
    cudaGetLastError();
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 0, 1);
    cudaError_t err = defer_free(p, s);
    fake_fail_clear();
    stderr_capture_end();
    is_int(err, cudaErrorNotSupported, "the failed record's error "
           "is returned");
    is_int(cudaGetLastError(), cudaSuccess, "and not left as the thread's "
           "last error");
    is_int(fake_is_released(p), 0, "the pointer is still the caller's");
    cudaFree(p);
}

/* No current context (from the library's start on, and CUDEFER_EVENT_POOL=0:
 * no stock, every free creates its event): the driver's calls answer so,
 * and the runtime's are made: frees and their event creations, an
 * allocation on the legacy stream (its current device) and its free. */
static void no_context(void)
{
    enum { N = 300 };
    cudaStream_t s = stream_new();
    void *p[N];
    fake_work *w = fake_launch_held(s, NULL, 0);
    fake_set_no_context(1);
    unsigned long created = fake_calls(FAKE_EVENT_CREATE);
    mark();
    int accepted = 0;
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc(64);
        accepted += defer_free(p[i], s) == cudaSuccess;
    }
    void *b = NULL;
    cudaError_t alloc_err = alloc_checked(&b, 4096, 0);
    cudaError_t free_err = defer_free(b, 0);
    unsigned long driver = fake_driver_calls() - base_driver;
    unsigned long records = fake_calls(FAKE_EVENT_RECORD) - base_record;
    created = fake_calls(FAKE_EVENT_CREATE) - created;
    fake_set_no_context(0);
    CHECK(accepted == N, "every free accepted with no current context (%d)",
          accepted);
    CHECK(alloc_err == cudaSuccess && free_err == cudaSuccess,
          "defer_alloc and defer_free on the legacy stream too (%s, %s)",
          cudaGetErrorName(alloc_err), cudaGetErrorName(free_err));
    CHECK(driver == 0, "no driver call answered (%lu)", driver);
    CHECK(records >= N, "the runtime recorded their events (%lu records)",
          records);
    CHECK(created >= N, "and created them (%lu events)", created);
    sleep_ms(10);
    CHECK(count_released(p, N) == 0, "none released while the work runs");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(count_released(p, N) == N, "all released once it completed (%d)",
          count_released(p, N));
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* CUDEFER_DRIVER_CALLS=0: the runtime's calls, no driver call. */
static void runtime_only(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(256);
    fake_work *w = work_held(s, p);
    unsigned long driver = fake_driver_calls();
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(fake_driver_calls() == driver, "no driver call answered (%lu)",
          fake_driver_calls() - driver);
    CHECK(fake_calls(FAKE_EVENT_RECORD) - records == 1,
          "its record made through the runtime (%lu records)",
          fake_calls(FAKE_EVENT_RECORD) - records);
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1,
          "released once its work completed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static void note_ran(void *arg) { *(int *)arg = 1; }

/* A thread with no current context whose free, allocation and callback go
 * to a stream of device 1: each is accepted, its runtime device still 0
 * after (cudefer.h's limit: the context the runtime's calls make current
 * is that device's), and released once the work is done. */
static void bare_on_device_1(void)
{
    cudaSetDevice(1);
    cudaStream_t s1 = stream_new();
    void *p = device_alloc(256);
    cudaSetDevice(0);
    fake_work *w = work_held(s1, p);
    int ran = 0, dev = -1;
    fake_set_no_context(1);
    cudaError_t freed = defer_free(p, s1);
    cudaError_t called = defer_call(note_ran, &ran, s1);
    void *b = NULL;
    cudaError_t got = alloc_checked(&b, 4096, s1);
    cudaGetDevice(&dev);
    fake_set_no_context(0);
    CHECK(freed == cudaSuccess && called == cudaSuccess && got == cudaSuccess,
          "free, callback and allocation accepted (%s, %s, %s)",
          cudaGetErrorName(freed), cudaGetErrorName(called),
          cudaGetErrorName(got));
    CHECK(dev == 0, "the runtime's device still 0 (%d)", dev);
    CHECK(defer_free(b, s1) == cudaSuccess, "the block freed");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess && fake_is_released(p) == 1 && ran,
          "released and called once the work completed");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

int main(void)
{
    plan_lazy();
    fork_scenario("no current context, a stream of device 1",
                  "", 2, 10000, bare_on_device_1);
    fork_scenario("no current context, a stream of device 1, through the "
                  "runtime", "CUDEFER_DRIVER_CALLS=0", 2, 10000,
                  bare_on_device_1);
    fork_scenario("CUDEFER_DRIVER_CALLS=0: the runtime's calls only",
                  "CUDEFER_DRIVER_CALLS=0", 1, 10000, runtime_only);
    fork_scenario("no current context: the runtime's calls, events created "
                  "too", "CUDEFER_EVENT_POOL=0", 1, 10000, no_context);
    fake_reset(1);
    cudaStream_t s = stream_new();
    test_free_uses_driver(s);
    test_failed_record_leaves_last_error(s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    fake_oracle_forgive();
    return 0;
}
