/* defer_alloc: a completed, held allocation of the request's size class is
 * handed back instead of calling cudaMalloc; one still in use never is; out
 * of memory, held memory is trimmed and cudaMalloc tried again. */
#include "held.h"
#include "helpers.h"

static void test_classes(void)
{
    static const struct {
        size_t bytes, class_bytes;
    } cases[] = {
        {1, 512},       {512, 512},         {513, 640},
        {1000, 1024},   {1024, 1024},       {1025, 1280},
        {1536, 1536},   {1 << 20, 1 << 20}, {(1 << 20) + 1, 1310720},
    };
    int good = 1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t cb = 0;
        int cls = size_class_of(cases[i].bytes, &cb);
        if (cls < 0 || cb != cases[i].class_bytes) {
            diag("size_class_of(%zu) = %d, %zu; want %zu", cases[i].bytes, cls,
                 cb, cases[i].class_bytes);
            good = 0;
        }
    }
    ok(good, "size classes: four per power of two from 512 bytes");
    size_t cb;
    is_int(size_class_of((size_t)1 << 41, &cb), -1, "beyond 2^40: no class");
}

static void test_reuse(cudaStream_t s, cudaStream_t busy)
{
    void *p = NULL, *pending = NULL;
    unsigned long mallocs = fake_calls(FAKE_MALLOC);
    is_int(defer_alloc(&p, 1000, s), cudaSuccess, "defer_alloc(1000)");
    /* Both before anything is deferred: pending must be a buffer of its own
     * (once p is held, a defer_alloc may rightly hand p out). */
    defer_alloc(&pending, 1000, s);
    is_int(fake_calls(FAKE_MALLOC) - mallocs, 2,
           "with nothing held, each is a cudaMalloc");
    work_timed(s, 100, p);
    defer_free(p, s);
    /* Keep the device busy so the policy holds the completed entry. */
    fake_work *gate = work_held(busy, NULL);
    fake_work *w = work_held(s, pending);
    defer_free(pending, s);
    for (int i = 0; i < 2000 && stats_now().held == 0; i++)
        sleep_ms(1);
    is_int(stats_now().held, 1, "the completed one is held");
    void *q = NULL;
    mallocs = fake_calls(FAKE_MALLOC);
    is_int(defer_alloc(&q, 900, s), cudaSuccess, "defer_alloc(900): same class");
    ok(q == p, "it gets the held buffer back");
    is_int(fake_calls(FAKE_MALLOC) - mallocs, 0, "without cudaMalloc");
    is_int(fake_is_released(p), 0, "the buffer was never freed");
    void *r = NULL;
    defer_alloc(&r, 900, s);
    ok(r != pending && r != p, "a buffer still in use is never handed out");
    fake_complete(w);
    fake_complete(gate);
    work_timed(s, 10, q);
    defer_free(q, s);
    defer_free(r, s);
    is_int(defer_flush(), cudaSuccess, "flush");
    ok(fake_is_released(p) == 1 && fake_is_released(pending) == 1 &&
       fake_is_released(r) == 1, "everything released once in the end");
    is_int(stats_now().reused, 1, "stats count one reuse");
}

static void test_out_of_memory_trims(cudaStream_t s, cudaStream_t busy)
{
    /* 1 MiB of device memory left: three held 256 KiB buffers, then ask for
     * 768 KiB: cudaMalloc fails, the trim frees the held ones, it fits. */
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    fake_set_device_memory(0, total - free_b + (1 << 20));
    fake_work *gate = work_held(busy, NULL);
    void *b[3];
    for (int i = 0; i < 3; i++) {
        defer_alloc(&b[i], 256 << 10, s);
        work_timed(s, 10, b[i]);
        defer_free(b[i], s);
    }
    for (int i = 0; i < 2000 && stats_now().held < 3; i++)
        sleep_ms(1);
    void *big = NULL;
    cudaError_t err = defer_alloc(&big, 768 << 10, s);
    is_int(err, cudaSuccess, "out of memory: trimmed, then cudaMalloc succeeds");
    ok(fake_is_released(b[0]) == 1 && fake_is_released(b[2]) == 1,
       "the held buffers were released to make room");
    fake_complete(gate);
    defer_free(big, s);
    is_int(defer_flush(), cudaSuccess, "flush");
    fake_set_device_memory(0, total);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0");
    fake_reset(1);
    test_classes();
    cudaStream_t s = stream_new(), busy = stream_new();
    void *p = NULL;
    is_int(defer_alloc(&p, 0, s), cudaSuccess, "0 bytes: success");
    ok(p == NULL, "and NULL");
    stderr_capture_begin();
    is_int(defer_alloc(NULL, 8, s), cudaErrorInvalidValue, "NULL ptr: invalid");
    stderr_capture_end();
    test_reuse(s, busy);
    test_out_of_memory_trims(s, busy);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "no allocation left");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
