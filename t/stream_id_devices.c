/* SPDX-License-Identifier: MIT */
/* Two streams of two devices that report one id (cudaStreamGetId's ids are
 * unique only within a device's context, as far as cudefer may assume;
 * the fake's fake_set_stream_id makes them collide).  cudefer must tell
 * them apart by device everywhere it keys by stream: the reclaimer's
 * FIFOs of pending entries (a free on the idle one completing must not
 * mark the busy one's entries complete), the lanes whose entries share an
 * event (a callback on the busy one must not ride on an event of the idle
 * one), the blocks of defer_alloc.  Before fake_set_stream_id the fake
 * gave every stream an id of its own, so the device half of those
 * comparisons was never tested (mutation round 3 said so).  Without the
 * device half in the stream table's key, callback_lanes fails (device 1's
 * callbacks wait behind device 0's busy stream).  Without it in the lanes'
 * key every test here still passes, and must: the lanes' set is chosen by
 * a hash that mixes in the device (stream_lane.c, set_of), and devices 0
 * and 1 never share a set, whatever the id, so no lane of one is ever
 * compared with the other's (equivalent for two devices).  The oracle
 * checks every release and hand-out. */
#include "helpers.h"

#include <stdatomic.h>

#define SHARED_ID 0x5eedULL

/* Stream a on device 0 and stream b on device 1, both reporting
 * SHARED_ID; device 0 current on return. */
static void two_streams(cudaStream_t *a, cudaStream_t *b)
{
    cudaSetDevice(1);
    *b = stream_new();
    cudaSetDevice(0);
    *a = stream_new();
    if (fake_set_stream_id(*a, SHARED_ID) != 0 ||
        fake_set_stream_id(*b, SHARED_ID) != 0)
        bail("fake_set_stream_id");
    unsigned long long ida = 0, idb = 0;
    cudaStreamGetId(*a, &ida);
    cudaStreamGetId(*b, &idb);
    ok(ida == idb && ida == SHARED_ID,
       "device 0's and device 1's streams report one id");
}

/* defer_free of cudaMalloc memory: the busy stream's free first, then the
 * idle one's, twice.  The idle ones are released by a trim; the busy one
 * waits for its work. */
static void memory_fifos(void)
{
    cudaStream_t a, b;
    two_streams(&a, &b);
    void *busy = device_alloc(65536);
    fake_work *w = work_held(a, busy);
    is_int(defer_free(busy, a), cudaSuccess, "free on device 0's busy stream");
    cudaSetDevice(1);
    void *idle[2] = {device_alloc(65536), device_alloc(65536)};
    for (int i = 0; i < 2; i++) {
        is_int(defer_free(idle[i], b), cudaSuccess,
               "free %d on device 1's idle stream", i);
        size_t trimmed = 0;
        is_int(defer_trim(&trimmed), cudaSuccess, "trim %d", i);
    }
    is_int(count_released(idle, 2), 2,
           "device 1's frees are released: they wait for nothing");
    ok(fake_is_released(busy) == 0 && fake_violations() == 0,
       "device 0's free still waits for its stream's work");
    cudaSetDevice(0);
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush once the work is done");
    ok(fake_is_released(busy) == 1, "then it is released");
    cudaStreamDestroy(a);
    cudaSetDevice(1);
    cudaStreamDestroy(b);
    cudaSetDevice(0);
}

static atomic_int calls_a, calls_b;
static void count_a(void *arg) { (void)arg; atomic_fetch_add(&calls_a, 1); }
static void count_b(void *arg) { (void)arg; atomic_fetch_add(&calls_b, 1); }

/* defer_call: once a thread has 8 events pending on a stream, its next
 * callbacks there share the newest (a lane's); the busy stream's 12 do,
 * so device 1's, on the stream of the same id, must not join them: the
 * idle stream's run, the busy one's wait for its work. */
static void callback_lanes(void)
{
    cudaStream_t a, b;
    two_streams(&a, &b);
    fake_work *w = work_held(a, NULL);
    for (int i = 0; i < 12; i++)
        is_int(defer_call(count_a, NULL, a), cudaSuccess,
               "callback %d on device 0's busy stream", i);
    cudaSetDevice(1);
    for (int i = 0; i < 3; i++)
        is_int(defer_call(count_b, NULL, b), cudaSuccess,
               "callback %d on device 1's idle stream", i);
    size_t trimmed = 0;
    is_int(defer_trim(&trimmed), cudaSuccess, "trim");
    is_int(atomic_load(&calls_b), 3, "device 1's callbacks ran");
    is_int(atomic_load(&calls_a), 0, "device 0's wait for its work");
    cudaSetDevice(0);
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush once the work is done");
    is_int(atomic_load(&calls_a), 12, "then they ran");
    cudaStreamDestroy(a);
    cudaSetDevice(1);
    cudaStreamDestroy(b);
    cudaSetDevice(0);
}

/* defer_alloc blocks (they share events too): the busy stream's block is
 * not handed to another stream of device 0 while its work runs, though
 * device 1's stream of the same id freed its block and moved on. */
static void block_events(void)
{
    const size_t bytes = 65536;
    cudaStream_t a, b;
    two_streams(&a, &b);
    cudaStream_t other = stream_new();
    void *pa = NULL, *pb = NULL, *q = NULL, *r = NULL;
    alloc_checked(&pa, bytes, a);
    fake_work *w = work_held(a, pa);
    is_int(defer_free(pa, a), cudaSuccess, "block freed on device 0's busy stream");
    cudaSetDevice(1);
    alloc_checked(&pb, bytes, b);
    is_int(defer_free(pb, b), cudaSuccess, "block freed on device 1's idle stream");
    size_t trimmed = 0;
    is_int(defer_trim(&trimmed), cudaSuccess, "trim");
    cudaSetDevice(0);
    alloc_checked(&q, bytes, other);
    ok(q != pa && fake_violations() == 0,
       "device 0's busy block is not handed to another stream");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush once the work is done");
    alloc_checked(&r, bytes, other);
    ok(r == pa, "then another stream gets it");
    defer_free(q, other);
    defer_free(r, other);
    is_int(defer_flush(), cudaSuccess, "flush");
    cudaStreamDestroy(a);
    cudaStreamDestroy(other);
    cudaSetDevice(1);
    cudaStreamDestroy(b);
    cudaSetDevice(0);
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s");
    fake_reset(2);
    memory_fifos();
    callback_lanes();
    block_events();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
