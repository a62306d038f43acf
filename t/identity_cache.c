/* SPDX-License-Identifier: MIT */
/* The launching thread's stream identities: a thread
 * that round-robins 16 streams, or frees on stream 0 (as PyTorch does),
 * looks each stream up once, not at every call; stream 0 and
 * cudaStreamPerThread still mean the stream of the caller's current device
 * and thread (also for two devices whose stream 0 shares a cache set); a
 * thread keeps the identities of both on each of 16 devices at once; a
 * callback's stream is checked with one cudaStreamGetId
 * (callbacks keep an order per stream), never two look-up calls. */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"
#include "stream_identity.h"

#define RR 16
#define ROUNDS 8

/* Look-up calls since the last mark. */
static unsigned long base_get_device, base_get_id;

static void mark(void)
{
    base_get_device = fake_calls(FAKE_STREAM_GET_DEVICE);
    base_get_id = fake_calls(FAKE_STREAM_GET_ID);
}

static unsigned long get_device_calls(void)
{
    return fake_calls(FAKE_STREAM_GET_DEVICE) - base_get_device;
}

static unsigned long get_id_calls(void)
{
    return fake_calls(FAKE_STREAM_GET_ID) - base_get_id;
}

/* defer_free round robin over 16 streams: after the first round, no
 * look-up call at all. */
static void test_round_robin_free(void)
{
    cudaStream_t s[RR];
    void *p[ROUNDS][RR];
    for (int i = 0; i < RR; i++)
        s[i] = stream_new();
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < RR; i++)
            p[r][i] = device_alloc(64);
    bool refused = false;
    for (int i = 0; i < RR; i++)
        refused |= defer_free(p[0][i], s[i]) != cudaSuccess;
    mark();
    for (int r = 1; r < ROUNDS; r++)
        for (int i = 0; i < RR; i++) {
            work_timed(s[i], 200, p[r][i]);
            refused |= defer_free(p[r][i], s[i]) != cudaSuccess;
        }
    ok(!refused, "defer_free round robin over %d streams", RR);
    ok(get_device_calls() == 0 && get_id_calls() == 0,
       "%d more calls looked up no stream (cudaStreamGetDevice %lu, "
       "cudaStreamGetId %lu)", (ROUNDS - 1) * RR, get_device_calls(),
       get_id_calls());
    is_int(defer_flush(), cudaSuccess, "flush");
    int released = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < RR; i++)
            released += fake_is_released(p[r][i]) == 1;
    is_int(released, ROUNDS * RR, "all released after their work");
    for (int i = 0; i < RR; i++)
        cudaStreamDestroy(s[i]);
}

static atomic_int order_errors, next_of[RR];

/* Callback of stream (v >> 16), its (v & 0xffff)-th. */
static void in_order(void *arg)
{
    unsigned long v = (unsigned long)arg;
    if (atomic_fetch_add(&next_of[v >> 16], 1) != (int)(v & 0xffff))
        atomic_fetch_add(&order_errors, 1);
}

/* defer_call round robin: one cudaStreamGetId per call (the check of its
 * cached identity), no cudaStreamGetDevice. */
static void test_round_robin_call(void)
{
    cudaStream_t s[RR];
    for (int i = 0; i < RR; i++)
        s[i] = stream_new();
    bool refused = false;
    for (int i = 0; i < RR; i++)
        refused |= defer_call(in_order, (void *)((unsigned long)i << 16),
                              s[i]) != cudaSuccess;
    mark();
    for (int r = 1; r < ROUNDS; r++)
        for (int i = 0; i < RR; i++) {
            work_timed(s[i], 100, NULL);
            refused |= defer_call(in_order,
                                  (void *)(((unsigned long)i << 16) |
                                           (unsigned long)r),
                                  s[i]) != cudaSuccess;
        }
    unsigned long calls = (ROUNDS - 1) * RR;
    ok(!refused, "defer_call round robin over %d streams", RR);
    ok(get_device_calls() == 0 && get_id_calls() == calls,
       "%lu more calls: cudaStreamGetDevice %lu times (want 0), "
       "cudaStreamGetId %lu (want %lu)", calls, get_device_calls(),
       get_id_calls(), calls);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(atomic_load(&order_errors), 0, "every callback in its stream's order");
    for (int i = 0; i < RR; i++)
        cudaStreamDestroy(s[i]);
}

/* Stream 0 on two devices, in turn: looked up once per device, and each
 * free waits for the legacy stream of the device current at its call. */
static void test_stream_zero(void)
{
    void *p[2][4];
    fake_work *w[2];
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        for (int k = 0; k < 4; k++)
            p[d][k] = device_alloc(64);
        w[d] = fake_launch_held(0, p[d], 4);
    }
    cudaSetDevice(0);
    bool refused = false;
    refused |= defer_free(p[0][0], 0) != cudaSuccess;
    cudaSetDevice(1);
    refused |= defer_free(p[1][0], 0) != cudaSuccess;
    mark();
    for (int k = 1; k < 4; k++)
        for (int d = 0; d < 2; d++) {
            cudaSetDevice(d);
            refused |= defer_free(p[d][k], 0) != cudaSuccess;
        }
    cudaSetDevice(0);
    ok(!refused, "defer_free on stream 0 of device 0 and device 1, in turn");
    ok(get_device_calls() == 0 && get_id_calls() == 0,
       "6 more calls looked up no stream (cudaStreamGetDevice %lu, "
       "cudaStreamGetId %lu)", get_device_calls(), get_id_calls());
    sleep_ms(20);
    fake_complete(w[1]);
    ok(wait_released(p[1][3], 10000), "device 1's legacy stream done: its "
       "pointers are released");
    int held = 0;
    for (int k = 0; k < 4; k++)
        held += fake_is_released(p[0][k]) == 0;
    is_int(held, 4, "device 0's are held: its legacy stream still works");
    fake_complete(w[0]);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(p[0][3]), 1, "then released");
}

/* A thread's cudaStreamPerThread is its own, though each thread caches it. */
struct per_thread {
    void *p[3];
    fake_work *w;
    bool refused;
};

static void *free_on_per_thread(void *arg)
{
    struct per_thread *t = arg;
    t->w = fake_launch_held(cudaStreamPerThread, t->p, 3);
    for (int k = 0; k < 3; k++)
        t->refused |= defer_free(t->p[k], cudaStreamPerThread) != cudaSuccess;
    return NULL;
}

static void test_per_thread(void)
{
    struct per_thread t[2] = {0};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++)
            t[i].p[k] = device_alloc(64);
    for (int i = 0; i < 2; i++) {
        pthread_t th;
        if (pthread_create(&th, NULL, free_on_per_thread, &t[i]) != 0)
            bail("pthread_create");
        pthread_join(th, NULL);
    }
    ok(!t[0].refused && !t[1].refused,
       "two threads free on their cudaStreamPerThread");
    fake_complete(t[1].w);
    ok(wait_released(t[1].p[2], 10000), "the second thread's stream is done: "
       "its pointers are released");
    ok(fake_is_released(t[0].p[0]) == 0 && fake_is_released(t[0].p[2]) == 0,
       "the first thread's are held");
    fake_complete(t[0].w);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_is_released(t[0].p[2]), 1, "then released");
}

/* The legacy stream's identity, asked for without a CUDA call (the
 * allocation path's): known only once looked up, per current device. */
static void test_cached_special(void)
{
    int device = -1, looked_device = -1;
    unsigned long long id = 0, looked_id = 0;
    bool cached;
    const char *call = NULL;
    ok(!stream_identity_cached_special(cudaStreamLegacy, 1, &device, &id),
       "the legacy stream of device 1: not cached before a look-up");
    is_int(cudaSetDevice(1), cudaSuccess, "device 1 current");
    is_int(stream_identity_lookup_on(cudaStreamLegacy, true, 1,
                                     &looked_device, &looked_id, &cached,
                                     &call),
           cudaSuccess, "looked up");
    ok(stream_identity_cached_special(cudaStreamLegacy, 1, &device, &id) &&
           device == 1 && looked_device == 1 && id == looked_id,
       "then cached: the look-up's device and id");
    ok(!stream_identity_cached_special(cudaStreamLegacy, 0, &device, &id),
       "device 0's legacy stream is another: not cached");
    /* Answered as the cache would, the thread's copy of the last one found
     * included (thread_shard.h, struct thread_special): gone once
     * forgotten, or once its slot went to other streams. */
    stream_identity_forget(cudaStreamLegacy);
    ok(!stream_identity_cached_special(cudaStreamLegacy, 1, &device, &id),
       "forgotten: not cached");
    stream_identity_lookup_on(cudaStreamLegacy, true, 1, &looked_device,
                              &looked_id, &cached, &call);
    ok(stream_identity_cached_special(cudaStreamLegacy, 1, &device, &id),
       "looked up again: cached");
    enum { MANY = 256 }; /* four times the cache's 64 slots */
    cudaStream_t many[MANY];
    for (int i = 0; i < MANY; i++) {
        cudaStreamCreate(&many[i]);
        stream_identity_lookup(many[i], false, &looked_device, &looked_id,
                               &cached, &call);
    }
    ok(!stream_identity_cached_special(cudaStreamLegacy, 1, &device, &id),
       "after %d other streams' look-ups its slot went to one of them: "
       "not cached", MANY);
    for (int i = 0; i < MANY; i++)
        cudaStreamDestroy(many[i]);
    is_int(cudaSetDevice(0), cudaSuccess, "device 0 current again");
}

/* Stream 0 and cudaStreamPerThread on each of 16 devices, looked up by a
 * thread that knows its current device (stream_identity_lookup_on, as the
 * pluggable entry points: no cudaGetDevice, device 0's included): 32
 * identities, which the hash spreads over the cache's 16 sets at most 4
 * to a set (its ways), so all stay cached; each answered as its own, not
 * as the special handle found last on that device. */
enum { SPECIAL_DEVICES = 16 };

struct specials {
    int wrong;            /* look-ups failed or not on their device */
    unsigned long get_device; /* cudaGetDevice calls among them */
    int not_cached;       /* identities not cached, or another's */
};

static void *look_up_specials(void *arg)
{
    struct specials *r = arg;
    static const cudaStream_t handle[2] = {0, cudaStreamPerThread};
    int dev[SPECIAL_DEVICES][2];
    unsigned long long id[SPECIAL_DEVICES][2];
    bool cached;
    const char *call;
    unsigned long get_device = fake_calls(FAKE_GET_DEVICE);
    for (int d = 0; d < SPECIAL_DEVICES; d++) {
        cudaSetDevice(d);
        for (int h = 0; h < 2; h++)
            if (stream_identity_lookup_on(handle[h], true, d, &dev[d][h],
                                          &id[d][h], &cached,
                                          &call) != cudaSuccess ||
                dev[d][h] != d)
                r->wrong++;
        if (id[d][0] == id[d][1])
            r->wrong++;
    }
    r->get_device = fake_calls(FAKE_GET_DEVICE) - get_device;
    for (int d = 0; d < SPECIAL_DEVICES; d++)
        for (int h = 0; h < 2; h++) {
            int device = -1;
            unsigned long long ident = 0;
            if (!stream_identity_cached_special(handle[h], d, &device,
                                                &ident) ||
                device != d || ident != id[d][h])
                r->not_cached++;
        }
    cudaSetDevice(0);
    return NULL;
}

/* In a thread of its own: a cache that holds nothing else. */
static void test_specials_of_16_devices(void)
{
    struct specials r = {0, 0, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, look_up_specials, &r) != 0)
        bail("pthread_create");
    pthread_join(th, NULL);
    is_int(r.wrong, 0, "stream 0 and cudaStreamPerThread of %d devices "
           "looked up: two streams of each device", SPECIAL_DEVICES);
    is_int((long)r.get_device, 0, "the current device known: no "
           "cudaGetDevice");
    is_int(r.not_cached, 0, "all %d cached at once, each its own identity",
           2 * SPECIAL_DEVICES);
}

/* Stream 0 on device 0 and on device 7: one handle, looked up by
 * (handle, current device), and the hash puts both keys in one set of the
 * cache (device 7 is the first whose stream 0 shares device 0's set), so
 * only the device in the key tells them apart.  Each block is made on its
 * own device and goes back to its own device's cache. */
static void test_stream_zero_shared_set(void)
{
    static const int dev[2] = {0, 7};
    void *p[2] = {NULL, NULL}, *again[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        cudaSetDevice(dev[k]);
        is_int(alloc_checked(&p[k], 64 * 1024, 0), cudaSuccess,
               "defer_alloc on stream 0 of device %d", dev[k]);
    }
    for (int k = 0; k < 2; k++) {
        struct cudaPointerAttributes at = {0};
        cudaPointerGetAttributes(&at, p[k]);
        is_int(at.device, dev[k], "the block asked for on device %d's "
               "stream 0 is device %d's memory", dev[k], dev[k]);
    }
    for (int k = 0; k < 2; k++) {
        cudaSetDevice(dev[k]);
        is_int(defer_free(p[k], 0), cudaSuccess,
               "defer_free on stream 0 of device %d", dev[k]);
    }
    for (int k = 1; k >= 0; k--) {
        cudaSetDevice(dev[k]);
        alloc_checked(&again[k], 64 * 1024, 0);
        ok(again[k] == p[k], "device %d's stream 0 gets its own block back "
           "at once (its own device's cache, its own stream)", dev[k]);
    }
    for (int k = 0; k < 2; k++) {
        cudaSetDevice(dev[k]);
        defer_free(again[k], 0);
    }
    cudaSetDevice(0);
    is_int(defer_flush(), cudaSuccess, "flush");
}

int main(void)
{
    plan_lazy();
    /* 16 devices: stream 0 of device 7 shares a cache set with device
     * 0's; test_specials_of_16_devices fills the cache. */
    fake_reset(SPECIAL_DEVICES);
    test_cached_special();
    test_specials_of_16_devices();
    test_round_robin_free();
    test_round_robin_call();
    test_stream_zero();
    test_per_thread();
    /* Last: once defer_alloc made a block, frees ask for more (the cache). */
    test_stream_zero_shared_set();
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released early or twice");
    return 0;
}
