/* SPDX-License-Identifier: MIT */
/* Double frees of defer_alloc's blocks: a second free of a block, whatever
 * way each free takes (stream-ordered, recorded, another device's stream,
 * defer_free_streams, defer_free_n, into a graph capture), is refused
 * (cudaErrorInvalidValue, counted, saying why) and defers nothing; a
 * refused free leaves the block as it was; of two threads freeing one
 * block at once, exactly one is accepted.  The oracle checks that nothing
 * is released or handed out twice. */
#include <pthread.h>
#include <string.h>

#include "helpers.h"

static void test_double_free(cudaStream_t s)
{
    void *p = NULL;
    alloc_checked(&p, 512, s);
    defer_free(p, s);
    stderr_capture_begin();
    is_int(defer_free(p, s), cudaErrorInvalidValue, "a second defer_free");
    const char *said = stderr_capture_end();
    ok(strstr(said, "already free") != NULL, "is refused, saying why");
}

/* A block freed one way, its work held, then freed again another way: the
 * second free is refused (cudaErrorInvalidValue, counted in rejected,
 * saying why) and defers nothing, whatever the two ways (the first cases
 * are in t/alloc_stress_found.c, where the stress test found them). */
enum first_free {
    FIRST_STREAM_ORDERED, FIRST_RECORDED, FIRST_OTHER_DEVICE, FIRST_STREAMS,
    FIRST_N, NFIRST
};
enum second_free { SECOND_FREE, SECOND_FREE_N, SECOND_STREAMS, SECOND_CAPTURE,
                   NSECOND };
static const char *const first_names[NFIRST] = {
    "a stream-ordered defer_free", "defer_free of a recorded block",
    "defer_free on another device's stream", "defer_free_streams",
    "defer_free_n of two blocks"};
static const char *const second_names[NSECOND] = {
    "defer_free", "defer_free_n beside other memory", "defer_free_streams",
    "defer_free into a graph capture"};

static void free_first(enum first_free way, void *p, cudaStream_t s,
                       cudaStream_t side, cudaStream_t dev1, void **other)
{
    cudaError_t err = cudaSuccess;
    if (way == FIRST_STREAM_ORDERED) {
        err = defer_free(p, s);
    } else if (way == FIRST_RECORDED) {
        defer_record_stream(p, side);
        err = defer_free(p, s);
    } else if (way == FIRST_OTHER_DEVICE) {
        err = defer_free(p, dev1);
    } else if (way == FIRST_STREAMS) {
        cudaStream_t both[2] = {s, side};
        err = defer_free_streams(p, both, 2);
    } else {
        alloc_checked(other, 4096, s);
        void *two[2] = {*other, p};
        err = defer_free_n(two, 2, s);
    }
    if (err != cudaSuccess)
        diag("the first free (%s) failed: %s", first_names[way],
             cudaGetErrorName(err));
}

static cudaError_t free_second(enum second_free way, void *p, void *plain,
                               cudaStream_t s, cudaStream_t side)
{
    if (way == SECOND_FREE)
        return defer_free(p, side);
    if (way == SECOND_FREE_N) {
        void *two[2] = {plain, p};
        return defer_free_n(two, 2, s);
    }
    if (way == SECOND_STREAMS)
        return defer_free_streams(p, &side, 1);
    cudaStream_t cap = stream_new();
    cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
    cudaError_t err = defer_free(p, cap);
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(cap, &g);
    cudaGraphDestroy(g);
    cudaStreamDestroy(cap);
    return err;
}

static void test_double_free_every_path(cudaStream_t s, cudaStream_t side)
{
    cudaSetDevice(1);
    cudaStream_t dev1 = stream_new();
    cudaSetDevice(0);
    for (int first = 0; first < NFIRST; first++) {
        for (int second = 0; second < NSECOND; second++) {
            void *p = NULL, *other = NULL, *plain = device_alloc(256);
            alloc_checked(&p, 4096, s);
            fake_work *held = work_held(s, p), *held_side = work_held(side, p),
                      *held1 = work_held(dev1, NULL);
            free_first((enum first_free)first, p, s, side, dev1, &other);
            uint64_t rejected = stats_now().rejected;
            stderr_capture_begin();
            cudaError_t err = free_second((enum second_free)second, p, plain,
                                          s, side);
            const char *said = stderr_capture_end();
            ok(err == cudaErrorInvalidValue &&
                   stats_now().rejected == rejected + 1 &&
                   strstr(said, "already free") != NULL,
               "after %s, a second free with %s is refused (%s), counted, "
               "reported", first_names[first], second_names[second],
               cudaGetErrorName(err));
            fake_complete(held);
            fake_complete(held_side);
            fake_complete(held1);
            defer_flush();
            if (second == SECOND_FREE_N)
                ok(fake_is_released(plain) == 0, "the other memory of the "
                   "refused defer_free_n is still the caller's");
            cudaFree(plain);
        }
    }
    defer_flush();
    cudaStreamDestroy(dev1);
}

/* A free refused after it claimed its block (its event could not be
 * recorded, or another pointer of its defer_free_n is already free or
 * named twice) leaves the block the caller's: live, recordable, freeable;
 * and the refused calls defer nothing. */
static void test_refused_free_keeps_block(cudaStream_t s, cudaStream_t side)
{
    void *p = NULL, *freed = NULL, *plain = device_alloc(256);
    alloc_checked(&p, 2048, s);
    alloc_checked(&freed, 2048, s);
    fake_work *held = work_held(s, freed);
    defer_free(freed, s);
    cudaStream_t both[2] = {s, side};
    void *two[2] = {plain, p}, *dup[2] = {p, p}, *with_freed[3] = {p, plain,
                                                                    freed};
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 0, 1);
    cudaError_t e1 = defer_free(p, s);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 0, 1);
    cudaError_t e2 = defer_free_n(two, 2, s);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorNotSupported, 1, 1);
    cudaError_t e3 = defer_free_streams(p, both, 2);
    fake_fail_clear();
    cudaError_t e4 = defer_free_n(dup, 2, s);
    cudaError_t e5 = defer_free_n(with_freed, 3, s);
    stderr_capture_end();
    is_int(e1, cudaErrorNotSupported, "defer_free whose event cannot be "
           "recorded is refused");
    is_int(e2, cudaErrorNotSupported, "so is defer_free_n");
    is_int(e3, cudaErrorNotSupported, "and defer_free_streams (its second "
           "stream's event)");
    is_int(e4, cudaErrorInvalidValue, "defer_free_n naming a block twice is "
           "refused");
    is_int(e5, cudaErrorInvalidValue, "defer_free_n with a block already "
           "free is refused");
    is_int((long long)(stats_now().rejected - rejected), 5,
           "all five counted in rejected");
    is_int(defer_record_stream(p, side), cudaSuccess,
           "the block is still live after them: it can be recorded");
    is_int(defer_free(p, s), cudaSuccess, "and freed");
    fake_complete(held);
    defer_flush();
    ok(fake_is_released(plain) == 0,
       "none of the refused calls deferred the other memory");
    cudaFree(plain);
}

/* Two threads free one block at once, each its own way: exactly one is
 * accepted, every time. */
struct racer {
    pthread_barrier_t *start;
    void *p, *mine;
    cudaStream_t stream;
    int way;
    cudaError_t err;
};

static void *race_free(void *arg)
{
    struct racer *r = arg;
    pthread_barrier_wait(r->start);
    if (r->way == 0) {
        r->err = defer_free(r->p, r->stream);
    } else if (r->way == 1) {
        r->err = defer_free_streams(r->p, &r->stream, 1);
    } else {
        void *two[2] = {r->mine, r->p};
        r->err = defer_free_n(two, 2, r->stream);
    }
    return NULL;
}

static void test_double_free_race(cudaStream_t s, cudaStream_t s2)
{
    enum { ROUNDS = 60 };
    int exactly_one = 0;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    stderr_capture_begin();
    for (int i = 0; i < ROUNDS; i++) {
        void *p = NULL, *mine = NULL;
        alloc_checked(&p, 1024, s);
        alloc_checked(&mine, 1024, s2);
        struct racer a = {&start, p, NULL, s, i % 3, cudaSuccess};
        struct racer b = {&start, p, mine, s2, (i / 3) % 3, cudaSuccess};
        if (a.way == 2)
            a.mine = device_alloc(64);
        pthread_t ta, tb;
        pthread_create(&ta, NULL, race_free, &a);
        pthread_create(&tb, NULL, race_free, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        exactly_one += (a.err == cudaSuccess) + (b.err == cudaSuccess) == 1;
        if (b.err != cudaSuccess || b.way != 2)
            defer_free(mine, s2);
        if (a.mine != NULL && a.err != cudaSuccess)
            cudaFree(a.mine);
    }
    defer_flush();
    stderr_capture_end();
    pthread_barrier_destroy(&start);
    is_int(exactly_one, ROUNDS, "of two threads freeing a block at once, "
           "each its own way, exactly one is accepted");
}



int main(void)
{
    plan_lazy();
    /* No age limit and no idle release: a slow run must not see memory
     * released for its age while a test expects it held. */
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s");
    fake_reset(2);
    cudaStream_t s = stream_new(), s2 = stream_new();
    test_double_free(s);
    test_double_free_every_path(s, s2);
    test_refused_free_keeps_block(s, s2);
    test_double_free_race(s, s2);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
