/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_memory.c — self-test of the fake CUDA runtime:
 * allocations of every kind, the oracle that checks each release, and
 * fake_oracle_handout(_range), which checks each block an allocator hands
 * out, whole allocations or blocks cut from one (pools and frees in stream
 * order: fake_selftest_async.c).
 */
#define _GNU_SOURCE
#include "fake_selftest.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Allocations ------------------------------------------------------ */

void test_allocations(void)
{
    void *a, *b, *h, *big, *pool, *zero = &zero, *again;
    size_t fr = 0, tot = 0;
    struct cudaPointerAttributes at;
    cudaStream_t s1;
    int local;

    diag("allocations");
    fake_reset(2);
    fake_set_address_reuse(0); /* whatever FAKE_ADDRESS_REUSE says */
    is_int(cudaMalloc(&a, 1000), cudaSuccess, "cudaMalloc");
    is_int(cudaMalloc(&b, 5000), cudaSuccess, "cudaMalloc again");
    ok(a != NULL && b != NULL && a != b, "distinct non-NULL addresses");
    ok((uintptr_t)a % 4096 == 0 && (uintptr_t)b % 4096 == 0, "page aligned");
    is_int(cudaMallocHost(&h, 100), cudaSuccess, "cudaMallocHost");
    is_int((long long)fake_live_allocations(), 3, "3 live allocations");
    is_int(cudaMemGetInfo(&fr, &tot), cudaSuccess, "cudaMemGetInfo");
    is_hex(tot, 80 * GiB, "80 GiB total");
    is_hex(fr, 80 * GiB - 6000, "free = total - device allocations");
    is_int(cudaMalloc(&zero, 0), cudaSuccess, "cudaMalloc of 0 bytes");
    ok(zero == NULL, "... gives NULL");
    is_int(cudaMalloc(NULL, 8), cudaErrorInvalidValue, "cudaMalloc(NULL)");

    is_int(cudaPointerGetAttributes(&at, a), cudaSuccess,
           "cudaPointerGetAttributes(device)");
    ok(at.type == cudaMemoryTypeDevice && at.device == 0 &&
       at.devicePointer == a, "device memory on device 0");
    cudaPointerGetAttributes(&at, (char *)b + 4999);
    ok(at.type == cudaMemoryTypeDevice, "interior pointer is found");
    cudaPointerGetAttributes(&at, (char *)b + 5000);
    ok(at.type == cudaMemoryTypeUnregistered, "one past the end is not");
    cudaPointerGetAttributes(&at, h);
    ok(at.type == cudaMemoryTypeHost && at.hostPointer == h, "host memory");
    is_int(cudaPointerGetAttributes(&at, &local), cudaSuccess,
           "unknown pointer: cudaSuccess");
    ok(at.type == cudaMemoryTypeUnregistered, "... unregistered");

    is_int(fake_is_released(a), 0, "fake_is_released: live");
    is_int(fake_is_released(&local), -1, "fake_is_released: unknown");
    is_int(cudaFree(NULL), cudaSuccess, "cudaFree(NULL)");
    is_int(cudaFreeHost(NULL), cudaSuccess, "cudaFreeHost(NULL)");
    is_int(cudaFree(h), cudaErrorInvalidValue, "cudaFree of host memory");
    is_int(cudaFreeHost(a), cudaErrorInvalidValue, "cudaFreeHost of device memory");
    is_int(cudaFree(&local), cudaErrorInvalidValue, "cudaFree of unknown");
    is_int(cudaFree((char *)a + 8), cudaErrorInvalidValue,
           "cudaFree of an interior pointer");
    is_int((long long)fake_invalid_releases(), 4, "4 invalid releases");
    is_int((long long)fake_live_allocations(), 3, "... nothing released");
    is_int(fake_violations(), 0, "... and no violations");
    is_int(cudaFree(a), cudaSuccess, "cudaFree");
    is_int(cudaFreeHost(h), cudaSuccess, "cudaFreeHost");
    is_int(fake_is_released(a), 1, "fake_is_released: released");
    cudaPointerGetAttributes(&at, a);
    ok(at.type == cudaMemoryTypeUnregistered, "released: unregistered");
    cudaMalloc(&again, 1000);
    ok((uintptr_t)again > (uintptr_t)b,
       "addresses are never reused (unless asked: test_address_reuse)");
    cudaFree(again);
    cudaFree(b);

    fake_set_device_memory(1, 1 << 20);
    cudaSetDevice(1);
    cudaMemGetInfo(&fr, &tot);
    is_hex(tot, 1 << 20, "fake_set_device_memory");
    is_int(cudaMalloc(&big, 2 << 20), cudaErrorMemoryAllocation,
           "cudaMalloc beyond the device's memory");
    is_int(cudaMalloc(&a, 600 << 10), cudaSuccess, "600 KiB fits");
    is_int(cudaMalloc(&b, 600 << 10), cudaErrorMemoryAllocation,
           "another 600 KiB does not");
    cudaStreamCreate(&s1);
    is_int(cudaMallocAsync(&pool, 100 << 10, s1), cudaSuccess,
           "cudaMallocAsync");
    cudaPointerGetAttributes(&at, pool);
    ok(at.type == cudaMemoryTypeDevice && at.device == 1,
       "pool memory on the stream's device");
    cudaMemGetInfo(&fr, &tot);
    is_hex(fr, (1 << 20) - (700 << 10), "pool memory counts as used");
    cudaFree(a);
    is_int(cudaMalloc(&b, 600 << 10), cudaSuccess, "fits after a free");
    is_int(cudaFree(pool), cudaSuccess, "cudaFree of pool memory");
    is_int(cudaMalloc(&a, 300 << 10), cudaSuccess, "300 KiB more fits");
    fake_set_device_memory(1, 100 << 10);
    cudaMemGetInfo(&fr, &tot);
    is_hex(fr, 0, "memory shrunk below use: 0 free");
    is_int(cudaMalloc(&pool, 1), cudaErrorMemoryAllocation,
           "... and no allocation fits");
    cudaFree(a);
    cudaFree(b);
    cudaSetDevice(0);
    cudaMemGetInfo(&fr, &tot);
    is_hex(tot, 80 * GiB, "device 0 keeps its memory");
    is_int(cudaHostAlloc(&h, 64, cudaHostAllocPortable), cudaSuccess,
           "cudaHostAlloc");
    cudaFreeHost(h);
    is_int((long long)fake_live_allocations(), 0, "all released");
    cudaMalloc(&a, 1);
    cudaMallocHost(&h, 1);
    is_int((long long)fake_live_allocations(), 2,
           "never-freed allocations are counted");
    cudaStreamDestroy(s1);
}

/* ---- Oracle ----------------------------------------------------------- */

struct reclaim_probe { int dev; cudaError_t r; };

static void *reclaimer_main(void *arg)
{
    struct reclaim_probe *p = arg;

    pthread_setname_np(pthread_self(), FAKE_RECLAIMER_THREAD_NAME);
    p->r = cudaSetDevice(p->dev);
    return NULL;
}

void test_oracle(void)
{
    cudaStream_t s, t;
    cudaEvent_t e;
    void *p, *q, *h, *uses[2];
    fake_work *w, *w2;
    struct reclaim_probe probe;
    char msg[128];

    diag("oracle (violations below are on purpose)");
    fake_reset(3);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    cudaEventCreate(&e);

    cudaMalloc(&p, 256);
    w = fake_launch_held(s, &p, 1);
    is_int(cudaFree(p), cudaSuccess, "premature cudaFree still succeeds");
    is_int(fake_violations(), 1, "premature release is a violation");
    snprintf(msg, sizeof msg, "work #%llu", fake_work_id(w));
    ok(last_violation_has("premature release") && last_violation_has(msg),
       "message names the pending work");
    is_int(fake_is_released(p), 1, "... the pointer is released");
    fake_oracle_forgive();
    is_int(fake_violations(), 0, "fake_oracle_forgive");
    fake_complete(w);

    is_int(cudaFree(p), cudaErrorInvalidValue, "double cudaFree fails");
    is_int(fake_violations(), 1, "double release is a violation");
    ok(last_violation_has("double release"), "... with a clear message");
    fake_oracle_forgive();
    fake_fail(FAKE_FREE, cudaErrorLaunchFailure, 0, 1);
    is_int(cudaFree(p), cudaErrorLaunchFailure, "double cudaFree, failing");
    fake_fail_clear();
    is_int(fake_violations(), 1, "... is a violation all the same (an "
                                 "injected error hid it before)");
    fake_oracle_forgive();

    cudaMalloc(&p, 256);
    cudaMalloc(&q, 256);
    uses[0] = (char *)p + 100;  /* interior pointer names p */
    uses[1] = q;
    w = fake_launch(s, 1000, uses, 2);
    sleep_ms(5);
    cudaFree(p);
    cudaFree(q);
    is_int(fake_violations(), 0, "release after the work completed: fine");

    cudaMallocHost(&h, 64);
    w = fake_launch_held(t, &h, 1);
    cudaFreeHost(h);
    is_int(fake_violations(), 1, "premature cudaFreeHost is a violation");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    w2 = fake_launch(t, 0, &p, 1);
    ok(fake_work_done(w2), "done users don't matter");
    is_int(cudaFreeAsync(p, s), cudaSuccess, "cudaFreeAsync on the same stream");
    is_int(fake_violations(), 0, "... ordered after the use: fine");
    fake_launch(s, 0, &p, 1);
    is_int(fake_violations(), 1, "launching work that uses a released pointer");
    ok(last_violation_has("already released"), "... is a violation");
    fake_oracle_forgive();
    is_int(cudaFreeAsync(p, s), cudaErrorInvalidValue, "double cudaFreeAsync");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    cudaFreeAsync(p, t);
    is_int(fake_violations(), 1, "cudaFreeAsync on an unordered stream");
    fake_oracle_forgive();
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(t, e, 0);
    cudaFreeAsync(p, t);
    is_int(fake_violations(), 0,
           "cudaFreeAsync ordered through cudaStreamWaitEvent: fine");
    fake_complete(w);

    cudaMalloc(&p, 64);
    w = fake_launch_held(s, &p, 1);
    fake_fail(FAKE_FREE, cudaErrorLaunchFailure, 0, 1);
    is_int(cudaFree(p), cudaErrorLaunchFailure, "injected cudaFree failure");
    is_int(fake_violations(), 0, "... is not checked by the oracle");
    is_int(fake_is_released(p), 0, "... and leaves the allocation live");
    fake_complete(w);
    cudaFree(p);
    is_int(fake_violations(), 0, "release after completion: fine");

    /* The reclaimer must not create contexts on unused devices. */
    cudaSetDevice(1);
    cudaSetDevice(0);
    probe.dev = 1;
    on_thread(reclaimer_main, &probe);
    is_int(probe.r, cudaSuccess, "reclaimer sets a device the app used");
    is_int(fake_violations(), 0, "... no violation");
    probe.dev = 2;
    on_thread(reclaimer_main, &probe);
    is_int(probe.r, cudaSuccess, "reclaimer sets a device the app never used");
    is_int(fake_violations(), 1, "... is a violation");
    ok(last_violation_has("reclaimer"), "... with a clear message");
    ok(fake_device_touched(2) && !fake_device_touched_by_app(2),
       "touched, but not by the app");
    fake_oracle_forgive();

    is_int((long long)fake_invalid_releases(), 0,
           "violations are not invalid releases");
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
}

/* fake_oracle_handout: a block handed out for a stream must be free of work
 * on other streams that is pending and not ordered before the stream. */
void test_handout(void)
{
    cudaStream_t s, t, u, c;
    cudaEvent_t e, f;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *p, *q, *uses[1];
    fake_work *w, *w2;
    char msg[160];
    int local;

    diag("oracle: handouts (violations below are on purpose)");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    cudaStreamCreate(&u);
    cudaStreamCreate(&c);
    cudaEventCreate(&e);
    cudaEventCreate(&f);
    cudaMalloc(&p, 4096);

    w = fake_launch_held(t, &p, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "handout for s while work on t still uses the block: a violation");
    snprintf(msg, sizeof msg, "work #%llu on stream id %llu",
             fake_work_id(w), stream_id(t));
    ok(last_violation_has("premature reuse") && last_violation_has(msg),
       "... premature reuse, naming the work and its stream");
    snprintf(msg, sizeof msg, "handed out for stream id %llu", stream_id(s));
    ok(last_violation_has(msg), "... and the stream it was handed out for");
    fake_oracle_forgive();
    fake_oracle_handout(p, t);
    is_int(fake_violations(), 0,
           "handout for the stream the work is pending on: fine (stream "
           "order)");
    fake_complete(w);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0,
           "handout for another stream once the work completed: fine");

    uses[0] = (char *)p + 2048;
    w = fake_launch_held(t, uses, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "work on a pointer inside the block handed out counts for all of "
           "the block");
    fake_oracle_forgive();
    cudaEventRecord(e, t);
    cudaStreamWaitEvent(u, e, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "a wait by a third stream does not order the work before s");
    fake_oracle_forgive();
    cudaStreamWaitEvent(s, e, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0,
           "after s waited on an event recorded after the work: fine");
    w2 = fake_launch_held(t, &p, 1);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "... but not for work enqueued on t after that event");
    fake_oracle_forgive();
    cudaEventRecord(e, t);
    cudaStreamWaitEvent(u, e, 0);
    cudaEventRecord(f, u);
    cudaStreamWaitEvent(s, f, 0);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0, "ordered through a chain of waits: fine");
    fake_complete(w);
    fake_complete(w2);

    w = fake_launch_held(0, &p, 1);
    fake_oracle_handout(p, 0);
    fake_oracle_handout(p, cudaStreamLegacy);
    is_int(fake_violations(), 0,
           "pending on the legacy stream, handed out for 0 or "
           "cudaStreamLegacy: the same stream");
    fake_oracle_handout(p, cudaStreamPerThread);
    is_int(fake_violations(), 1,
           "... for the per-thread stream: another stream, a violation");
    fake_oracle_forgive();
    fake_complete(w);

    w = fake_launch_held(c, &p, 1);
    cudaStreamBeginCapture(c, cudaStreamCaptureModeRelaxed);
    fake_oracle_handout(p, c);
    is_int(fake_violations(), 1,
           "handout for a capturing stream with its own work pending: a "
           "violation");
    ok(last_violation_has("captures"), "... saying the stream captures");
    fake_oracle_forgive();
    fake_complete(w);
    fake_oracle_handout(p, c);
    is_int(fake_violations(), 0, "... fine once that work completed");
    fake_launch(c, 10, &p, 1);
    cudaStreamEndCapture(c, &graph);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1,
           "handout while a graph that uses the block exists: a violation");
    ok(last_violation_has("graph"), "... naming the graph");
    fake_oracle_forgive();
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1, "... or an executable graph");
    ok(last_violation_has("executable graph"), "... naming it");
    fake_oracle_forgive();
    cudaGraphExecDestroy(exec);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 0, "fine once the graphs are destroyed");

    cudaFree(p);
    fake_oracle_handout(p, s);
    is_int(fake_violations(), 1, "handout of released memory: a violation");
    ok(last_violation_has("already released"), "... saying so");
    fake_oracle_forgive();
    fake_oracle_handout(NULL, s);
    is_int(fake_violations(), 0, "handout of NULL: nothing checked");
    fake_oracle_handout(&local, s);
    is_int(fake_violations(), 1,
           "handout of a pointer the fake never allocated: a violation");
    fake_oracle_forgive();
    cudaMalloc(&q, 64);
    fake_oracle_handout(q, (cudaStream_t)(uintptr_t)0x1230);
    is_int(fake_violations(), 1, "handout for an invalid stream: a violation");
    ok(last_violation_has("not a live stream"), "... saying so");
    fake_oracle_forgive();
    cudaFree(q);
    cudaEventDestroy(e);
    cudaEventDestroy(f);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
    cudaStreamDestroy(u);
    cudaStreamDestroy(c);
}

/* fake_oracle_handout_range: blocks cut from one allocation.  Work uses
 * the block that contains its pointer; a hand-out is checked against the
 * work on the bytes it overlaps only; a release against all. */
void test_handout_ranges(void)
{
    cudaStream_t s, t, u, c;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    void *p, *base = NULL, *uses[1];
    char *a, *b, *mid;
    fake_work *wa, *wb, *w;
    size_t size = 0;
    char msg[160];
    int local;

    diag("oracle: blocks of one allocation (violations below are on "
         "purpose)");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    cudaStreamCreate(&u);
    cudaStreamCreate(&c);
    cudaMalloc(&p, 8192);
    a = p;                      /* [0, 4096) */
    b = (char *)p + 4096;       /* [4096, 8192) */

    is_int(fake_allocation_of(b + 10, &base, &size), 1,
           "fake_allocation_of an interior pointer: live");
    ok(base == p && size == 8192, "... its allocation's start and size");
    is_int(fake_allocation_of(&local, &base, &size), -1,
           "... of a pointer the fake never allocated: -1");
    ok(base == NULL && size == 0, "... NULL and 0");

    fake_oracle_handout_range(a, 4096, s);
    fake_oracle_handout_range(b, 4096, t);
    is_int(fake_violations(), 0, "two blocks of one allocation handed out");
    wa = fake_launch_held(s, (void **)&a, 1);
    uses[0] = b + 100;
    wb = fake_launch_held(t, uses, 1);
    fake_oracle_handout_range(a, 4096, u);
    is_int(fake_violations(), 1,
           "block a again, for u, while s's work on it is pending: a "
           "violation");
    snprintf(msg, sizeof msg, "work #%llu on stream id %llu",
             fake_work_id(wa), stream_id(s));
    ok(last_violation_has("premature reuse") && last_violation_has(msg),
       "... naming a's work, not b's");
    fake_oracle_forgive();
    fake_oracle_handout_range(a, 4096, s);
    is_int(fake_violations(), 0,
           "block a for s itself: fine, though t's work on b is pending");
    fake_oracle_handout_range(b + 2048, 2048, s);
    is_int(fake_violations(), 1,
           "the second half of b for s while t's work on (a pointer inside) "
           "b is pending: a violation");
    fake_oracle_forgive();
    mid = a + 2048;
    fake_oracle_handout_range(mid, 4096, u);
    is_int(fake_violations(), 1,
           "a block over the end of a and the start of b, for u: a "
           "violation");
    fake_oracle_forgive();
    fake_complete(wa);
    fake_complete(wb);

    /* The block over a and b replaced them: work on a pointer in it uses
     * all of it. */
    uses[0] = mid + 3000;
    w = fake_launch_held(u, uses, 1);
    fake_oracle_handout_range(a, 1024, t);
    is_int(fake_violations(), 0,
           "[0, 1024) for t while u's work on [2048, 6144) is pending: "
           "disjoint, fine");
    fake_oracle_handout_range(a + 1024, 2048, t);
    is_int(fake_violations(), 1, "[1024, 3072) overlaps it: a violation");
    fake_oracle_forgive();
    fake_oracle_handout(b + 2048, t);
    is_int(fake_violations(), 0,
           "fake_oracle_handout: the rest of the allocation, [6144, 8192), "
           "is disjoint too");
    fake_oracle_handout(b, t);
    is_int(fake_violations(), 1, "from 4096 it is not");
    fake_oracle_forgive();
    fake_complete(w);

    /* Past the end, 0 bytes: the allocator's and the test's mistakes. */
    fake_oracle_handout_range(b, 4097, s);
    is_int(fake_violations(), 1, "a block ending past its allocation: a "
                                 "violation");
    ok(last_violation_has("past the end"), "... saying so");
    fake_oracle_forgive();
    fake_oracle_handout_range(a, 0, s);
    is_int(fake_violations(), 1, "0 bytes: a violation");
    fake_oracle_forgive();

    /* Memory the test allocated itself and no allocator handed out: work
     * on any pointer of it uses all of it. */
    cudaMalloc(&p, 8192);
    uses[0] = (char *)p + 6000;
    w = fake_launch_held(t, uses, 1);
    fake_oracle_handout_range(p, 1024, s);
    is_int(fake_violations(), 1,
           "work before any hand-out uses the whole allocation");
    fake_oracle_forgive();
    fake_complete(w);
    fake_oracle_handout_range(p, 4096, s);
    fake_oracle_handout_range((char *)p + 4096, 4096, t);

    /* Graphs keep the bytes their capture used. */
    cudaStreamBeginCapture(c, cudaStreamCaptureModeRelaxed);
    fake_launch(c, 10, &p, 1);
    cudaStreamEndCapture(c, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    fake_oracle_handout_range((char *)p + 4096, 4096, u);
    is_int(fake_violations(), 0,
           "the other block while an executable graph uses the first: fine");
    fake_oracle_handout_range(p, 4096, u);
    is_int(fake_violations(), 1, "the block the graph uses: a violation");
    ok(last_violation_has("executable graph"), "... naming the graph");
    fake_oracle_forgive();
    fake_oracle_handout_range(p, 2048, u);
    fake_oracle_forgive();      /* the graph again */
    w = fake_graph_launch_held(exec, s);
    cudaGraphExecDestroy(exec);
    fake_oracle_handout_range((char *)p + 2048, 2048, u);
    is_int(fake_violations(), 1,
           "its launch uses what the capture used, [0, 4096), whatever was "
           "handed out since: [2048, 4096) is a violation");
    snprintf(msg, sizeof msg, "work #%llu", fake_work_id(w));
    ok(last_violation_has(msg), "... naming the launch");
    fake_oracle_forgive();
    fake_complete(w);

    /* A release returns all of the allocation. */
    uses[0] = (char *)p + 5000;
    w = fake_launch_held(t, uses, 1);
    cudaFree(p);
    is_int(fake_violations(), 1,
           "releasing the allocation while work on one block is pending: a "
           "violation");
    ok(last_violation_has("premature release"), "... a premature release");
    is_int(fake_allocation_of((char *)p + 5000, &base, NULL), 0,
           "fake_allocation_of after the release: 0");
    fake_oracle_forgive();
    fake_complete(w);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
    cudaStreamDestroy(u);
    cudaStreamDestroy(c);
}
