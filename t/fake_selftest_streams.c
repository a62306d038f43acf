/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_streams.c — self-test of the fake CUDA runtime:
 * devices, streams (legacy, per-thread, user), the order in which
 * simulated work completes, and events.
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

/* ---- Devices ---------------------------------------------------------- */

static void *get_device_main(void *arg)
{
    int *dev = arg;

    cudaGetDevice(dev);
    return NULL;
}

/* Poll until w is done, at most timeout_ms; whether it is. */
static bool wait_done(fake_work *w, unsigned timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (!fake_work_done(w) && now_ms() < end)
        sleep_ms(1);
    return fake_work_done(w);
}

void test_devices(void)
{
    int n = -1, d = -1;

    diag("devices");
    fake_reset(4);
    is_int(cudaGetDeviceCount(&n), cudaSuccess, "cudaGetDeviceCount");
    is_int(n, 4, "4 devices after fake_reset(4)");
    cudaGetDevice(&d);
    is_int(d, 0, "current device defaults to 0");
    ok(!fake_device_touched(3), "device 3 not touched yet");
    is_int(cudaSetDevice(3), cudaSuccess, "cudaSetDevice(3)");
    cudaGetDevice(&d);
    is_int(d, 3, "current device is 3");
    ok(fake_device_touched(3) && fake_device_touched_by_app(3),
       "setting device 3 touched it");
    ok(!fake_device_touched_by_app(2), "device 2 untouched");
    is_int(cudaSetDevice(4), cudaErrorInvalidDevice, "device 4 is invalid");
    is_int(cudaSetDevice(-1), cudaErrorInvalidDevice, "device -1 is invalid");
    cudaGetDevice(&d);
    is_int(d, 3, "failed cudaSetDevice left the current device");
    d = -1;
    on_thread(get_device_main, &d);
    is_int(d, 0, "another thread's current device is 0 (thread-local)");
    is_int(cudaGetDeviceCount(NULL), cudaErrorInvalidValue,
           "cudaGetDeviceCount(NULL)");
    ok(!fake_device_touched(-1) && !fake_device_touched(99),
       "out-of-range devices are never touched");
    fake_reset(2);
    cudaGetDevice(&d);
    is_int(d, 0, "fake_reset makes the current device 0 again");
    ok(!fake_device_touched(1), "fake_reset clears touched devices");
}

/* ---- Streams ---------------------------------------------------------- */

struct ids { unsigned long long legacy0, per_thread, per_thread2; };

static void *ids_main(void *arg)
{
    struct ids *ids = arg;

    ids->legacy0 = stream_id(0);
    ids->per_thread = stream_id(cudaStreamPerThread);
    ids->per_thread2 = stream_id(cudaStreamPerThread);
    return NULL;
}

void test_streams(void)
{
    cudaStream_t s1, s2, s3, bogus = (cudaStream_t)(uintptr_t)0xdeadbeef0;
    unsigned long long id0, idl, id1, idpt, idpt1, id;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
    struct ids other;
    cudaEvent_t e;
    void *p;
    int d = -1;

    diag("streams");
    fake_reset(2);
    is_int(cudaStreamCreate(&s1), cudaSuccess, "cudaStreamCreate");
    is_int(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess,
           "cudaStreamCreateWithFlags");
    ok(s1 != s2 && stream_id(s1) != stream_id(s2) && stream_id(s1) != 0,
       "distinct streams, distinct ids");
    ok((uintptr_t)s1 > 2 && (uintptr_t)s2 > 2, "handles are not special");
    is_int(cudaStreamGetDevice(s1, &d), cudaSuccess, "cudaStreamGetDevice");
    is_int(d, 0, "stream on device 0");
    cudaSetDevice(1);
    is_int(cudaStreamCreateWithPriority(&s3, 0, -1), cudaSuccess,
           "cudaStreamCreateWithPriority on device 1");
    cudaStreamGetDevice(s3, &d);
    is_int(d, 1, "stream created on the current device (1)");
    is_int(cudaStreamGetDevice(s1, &d), cudaSuccess, "device of s1 from dev 1");
    is_int(d, 0, "s1 is still on device 0");

    id1 = stream_id(0);
    idpt1 = stream_id(cudaStreamPerThread);
    cudaSetDevice(0);
    id0 = stream_id(0);
    idl = stream_id(cudaStreamLegacy);
    idpt = stream_id(cudaStreamPerThread);
    ok(id0 != 0 && id0 == idl, "0 and cudaStreamLegacy are the same stream");
    ok(id1 != 0 && id1 != id0, "legacy stream differs per device");
    cudaStreamGetDevice(0, &d);
    is_int(d, 0, "legacy stream of the current device");
    ok(idpt != 0 && idpt != id0 && idpt != id1, "per-thread stream is not legacy");
    ok(idpt1 != idpt, "per-thread stream differs per device");
    is_int((long long)stream_id(cudaStreamPerThread), (long long)idpt,
           "per-thread stream is stable");
    on_thread(ids_main, &other);
    is_int((long long)other.legacy0, (long long)id0,
           "legacy stream shared by all threads");
    ok(other.per_thread != 0 && other.per_thread != idpt &&
       other.per_thread != idpt1, "per-thread stream differs per thread");
    is_int((long long)other.per_thread2, (long long)other.per_thread,
           "per-thread stream stable within that thread");
    is_int(cudaStreamGetId_ptsz(0, &id), cudaSuccess, "cudaStreamGetId_ptsz");
    is_int((long long)id, (long long)idpt, "_ptsz: stream 0 is per-thread");

    is_int(cudaStreamIsCapturing(s1, &cs), cudaSuccess, "cudaStreamIsCapturing");
    is_int(cs, cudaStreamCaptureStatusNone, "never capturing");
    is_int(cudaStreamQuery(s1), cudaSuccess, "idle stream: query success");
    is_int(cudaStreamSynchronize(s1), cudaSuccess, "idle stream: sync");
    is_int(cudaStreamGetId(s1, NULL), cudaErrorInvalidValue, "GetId(NULL)");

    is_int(cudaStreamDestroy(s2), cudaSuccess, "cudaStreamDestroy");
    cudaEventCreate(&e);
    is_int(cudaStreamQuery(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamQuery");
    is_int(cudaStreamSynchronize(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamSynchronize");
    is_int(cudaStreamGetId(s2, &id), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamGetId");
    is_int(cudaStreamGetDevice(s2, &d), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamGetDevice");
    is_int(cudaStreamIsCapturing(s2, &cs), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamIsCapturing");
    is_int(cudaEventRecord(e, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventRecord");
    is_int(cudaStreamWaitEvent(s2, e, 0), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamWaitEvent");
    is_int(cudaMallocAsync(&p, 16, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaMallocAsync");
    is_int(cudaFreeAsync(NULL, s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaFreeAsync");
    is_int(cudaStreamDestroy(s2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamDestroy again");
    ok(fake_launch(s2, 1, NULL, 0) == NULL, "destroyed: fake_launch NULL");
    is_int(cudaStreamQuery(bogus), cudaErrorInvalidResourceHandle,
           "made-up handle: invalid");
    is_int(cudaStreamQuery((cudaStream_t)(uintptr_t)0x10),
           cudaErrorInvalidResourceHandle, "small made-up handle: invalid");
    ok(fake_launch(bogus, 1, NULL, 0) == NULL, "made-up: fake_launch NULL");
    is_int(cudaStreamDestroy(0), cudaErrorInvalidResourceHandle,
           "cannot destroy the legacy stream");
    is_int(cudaStreamDestroy(cudaStreamPerThread),
           cudaErrorInvalidResourceHandle, "cannot destroy per-thread stream");
    cudaEventDestroy(e);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s3);
}

/* ---- Work ordering ---------------------------------------------------- */

void test_work(void)
{
    cudaStream_t s, t;
    fake_work *w1, *w2, *w3, *h, *w4, *other;

    diag("work ordering");
    fake_reset(1);
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    /* Timed work of 500 ms: a loaded machine may stall this thread tens of
     * ms between a launch and a "not done yet" check (30 ms failed). */
    w1 = fake_launch(s, 500000, NULL, 0);
    w2 = fake_launch_held(s, NULL, 0);
    w3 = fake_launch(s, 500000, NULL, 0);
    ok(w1 && w2 && w3, "fake_launch / fake_launch_held");
    ok(fake_work_id(w2) == fake_work_id(w1) + 1 &&
       fake_work_id(w3) == fake_work_id(w2) + 1, "work ids are sequential");
    ok(!fake_work_done(w1) && !fake_work_done(w2) && !fake_work_done(w3),
       "nothing done at launch");
    is_int(cudaStreamQuery(s), cudaErrorNotReady, "busy stream: NotReady");
    other = fake_launch(t, 0, NULL, 0);
    ok(fake_work_done(other), "zero-length work on another stream is done");
    ok(wait_done(w1, 10000), "timed work done after its duration");
    ok(!fake_work_done(w2), "held work not done");
    ok(!fake_work_done(w3), "later timed work waits for held work");
    fake_complete(w1);
    ok(!fake_work_done(w2), "fake_complete of timed work: no effect");
    double released = now_ms();
    fake_complete(w2);
    ok(fake_work_done(w2), "held work done once completed");
    ok(!fake_work_done(w3), "next work starts only at the release");
    ok(wait_done(w3, 10000) && now_ms() - released >= 500,
       "and completes its duration later");
    is_int(cudaStreamQuery(s), cudaSuccess, "idle again: query success");
    fake_complete(w2);
    ok(fake_work_done(w2), "completing twice is harmless");

    h = fake_launch_held(s, NULL, 0);
    w4 = fake_launch(s, 500000, NULL, 0);
    sleep_ms(30);
    released = now_ms();
    fake_complete(h);
    ok(!fake_work_done(w4), "timed work starts when the held work completes");
    ok(wait_done(w4, 10000) && now_ms() - released >= 500,
       "... and is done its duration after");

    h = fake_launch_held(s, NULL, 0);
    other = fake_launch(t, 0, NULL, 0);
    ok(fake_work_done(other), "held work on s does not block stream t");
    cudaStreamDestroy(s);
    ok(!fake_work_done(h), "work on a destroyed stream stays pending");
    fake_complete(h);
    ok(fake_work_done(h), "... and still completes");
    ok(!fake_work_done(NULL), "fake_work_done(NULL) is 0");
    cudaStreamDestroy(t);
}

/* ---- Events ----------------------------------------------------------- */

void test_events(void)
{
    cudaStream_t s, s2, s_dev1;
    cudaEvent_t e, e2, e_dev1;
    fake_work *h, *w, *b;
    struct completer c;
    double t0;

    diag("events");
    fake_reset(2);
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    is_int(cudaEventCreate(&e), cudaSuccess, "cudaEventCreate");
    is_int(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming), cudaSuccess,
           "cudaEventCreateWithFlags");
    ok(e != e2, "distinct events");
    is_int((long long)fake_live_events(), 2, "2 live events");
    is_int(cudaEventQuery(e), cudaSuccess, "never recorded: success");
    is_int(cudaEventRecord(e, s), cudaSuccess, "record on an idle stream");
    is_int(cudaEventQuery(e), cudaSuccess, "... is complete");

    h = fake_launch_held(s, NULL, 0);
    is_int(cudaEventRecord(e, s), cudaSuccess, "record after held work");
    w = fake_launch(s, 0, NULL, 0);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "... NotReady");
    is_int(cudaEventRecordWithFlags(e2, s2, 0), cudaSuccess,
           "cudaEventRecordWithFlags on idle s2");
    is_int(cudaEventQuery(e2), cudaSuccess, "... complete");
    fake_complete(h);
    is_int(cudaEventQuery(e), cudaSuccess, "complete once the work is");
    ok(fake_work_done(w), "work after it done too");

    h = fake_launch_held(s, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaEventQuery(e), cudaErrorNotReady, "recorded on held work");
    cudaEventRecord(e, s2);
    is_int(cudaEventQuery(e), cudaSuccess, "re-record overwrites the capture");
    cudaEventRecord(e, s);
    fake_launch(s, 0, NULL, 0);
    fake_fail(FAKE_EVENT_RECORD, cudaErrorLaunchFailure, 0, 1);
    cudaEventRecord(e2, s);
    is_int(cudaEventQuery(e2), cudaSuccess, "failed record left e2 as it was");

    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaEventSynchronize(e), cudaSuccess, "cudaEventSynchronize");
    ok(completed_before_now(&c), "... blocked until the work completed "
       "(%.1f ms)", now_ms() - t0);
    pthread_join(c.t, NULL);
    is_int(cudaEventSynchronize(e), cudaSuccess, "sync on a complete event");

    h = fake_launch_held(s, NULL, 0);
    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaStreamSynchronize(s), cudaSuccess, "cudaStreamSynchronize");
    ok(completed_before_now(&c), "... blocked until the work completed");
    pthread_join(c.t, NULL);

    fake_launch(s2, 20000, NULL, 0);
    h = fake_launch_held(0, NULL, 0);
    complete_later(&c, h, 30);
    t0 = now_ms();
    is_int(cudaDeviceSynchronize(), cudaSuccess, "cudaDeviceSynchronize");
    ok(completed_before_now(&c), "... waited for the legacy stream's held work");
    is_int(cudaStreamQuery(s2), cudaSuccess, "... and for the other streams");
    pthread_join(c.t, NULL);

    t0 = now_ms();
    fake_launch(s, 30000, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaEventSynchronize(e), cudaSuccess, "sync on timed work");
    ok(now_ms() - t0 >= 29, "... took its duration (%.1f ms)", now_ms() - t0);

    /* Device mismatch */
    cudaSetDevice(1);
    cudaStreamCreate(&s_dev1);
    cudaEventCreate(&e_dev1);
    is_int(cudaEventRecord(e, s_dev1), cudaErrorInvalidResourceHandle,
           "event of device 0 on a stream of device 1");
    is_int(cudaEventRecord(e, 0), cudaErrorInvalidResourceHandle,
           "event of device 0 on device 1's legacy stream");
    is_int(cudaEventRecord(e_dev1, 0), cudaSuccess,
           "event of device 1 on device 1's legacy stream");
    is_int(cudaEventRecord_ptsz(e_dev1, 0), cudaSuccess,
           "cudaEventRecord_ptsz on the per-thread stream");
    is_int(cudaEventRecord(e, s), cudaSuccess,
           "event of device 0 on a device-0 stream, from device 1");
    cudaSetDevice(0);

    /* cudaStreamWaitEvent */
    h = fake_launch_held(s, NULL, 0);
    cudaEventRecord(e, s);
    is_int(cudaStreamWaitEvent(s2, e, 0), cudaSuccess, "cudaStreamWaitEvent");
    w = fake_launch(s2, 0, NULL, 0);
    cudaEventRecord(e2, s2);
    b = fake_launch(s, 0, NULL, 0);
    ok(!fake_work_done(w), "work after the wait is blocked");
    is_int(cudaEventQuery(e2), cudaErrorNotReady,
           "event after the wait is not ready");
    is_int(cudaStreamWaitEvent(s_dev1, e, 0), cudaSuccess,
           "waiting on another device's event is allowed");
    fake_complete(h);
    ok(fake_work_done(w) && fake_work_done(b), "released with the event");
    is_int(cudaEventQuery(e2), cudaSuccess, "... event ready too");
    h = fake_launch_held(s, NULL, 0);
    cudaStreamWaitEvent(s2, e, 0);       /* e's capture is complete */
    ok(fake_work_done(fake_launch(s2, 0, NULL, 0)),
       "waiting on a complete event does not block");
    fake_complete(h);
    {
        cudaEvent_t fresh;

        cudaEventCreate(&fresh);
        cudaStreamWaitEvent(s2, fresh, 0);
        ok(fake_work_done(fake_launch(s2, 0, NULL, 0)),
           "waiting on a never-recorded event is a no-op");
        cudaEventDestroy(fresh);
    }

    /* Destroyed and made-up events */
    is_int(cudaEventDestroy(e2), cudaSuccess, "cudaEventDestroy");
    is_int(cudaEventQuery(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventQuery");
    is_int(cudaEventRecord(e2, s), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventRecord");
    is_int(cudaEventSynchronize(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventSynchronize");
    is_int(cudaStreamWaitEvent(s, e2, 0), cudaErrorInvalidResourceHandle,
           "destroyed: cudaStreamWaitEvent");
    is_int(cudaEventDestroy(e2), cudaErrorInvalidResourceHandle,
           "destroyed: cudaEventDestroy");
    is_int(cudaEventQuery((cudaEvent_t)(uintptr_t)0x1234560),
           cudaErrorInvalidResourceHandle, "made-up event: invalid");
    is_int(cudaEventQuery(NULL), cudaErrorInvalidResourceHandle,
           "NULL event: invalid");
    is_int(cudaEventCreate(NULL), cudaErrorInvalidValue, "cudaEventCreate(NULL)");
    is_int((long long)fake_live_events(), 2, "2 live events left");
    cudaEventDestroy(e);
    cudaEventDestroy(e_dev1);
    is_int((long long)fake_live_events(), 0, "0 live events left");
}

/* ---- Ordering through many waits -------------------------------------- */

#define LATTICE 60

/* Whether handing out p for stream s is a violation now (forgiven), and
 * how long the oracle took to tell, in *ms. */
static bool handout_violates(void *p, cudaStream_t s, double *ms)
{
    long before = fake_violations();
    double t0 = now_ms();

    fake_oracle_handout(p, s);
    *ms = now_ms() - t0;
    if (fake_violations() == before)
        return false;
    fake_oracle_forgive();
    return true;
}

/* The oracle asks whether pending work is ordered before a stream's later
 * work by walking the stream's pending cudaStreamWaitEvent barriers to the
 * streams they wait on.  In a lattice where each stream waits on the two
 * before it, held work keeping every wait pending, the paths from the last
 * stream back to the first number as Fibonacci's: a walk that scanned a
 * stream again for each path had not answered after 30 s at 60 streams (a
 * probe of 16 threads chaining events spun 300 s so).  Each stream is
 * scanned once a question now: microseconds, the same answers. */
void test_wait_lattice(void)
{
    cudaStream_t s[LATTICE], z, a, t1, t2;
    cudaEvent_t e[LATTICE], ez, ea1, ea2;
    fake_work *h[LATTICE], *u, *hz, *ha;
    void *p;
    double ms, slowest = 0;
    bool violated;
    int i;

    diag("ordering through a lattice of waits (violations below are on "
         "purpose)");
    fake_reset(1);
    cudaMalloc(&p, 4096);
    cudaStreamCreate(&z);
    u = fake_launch_held(z, &p, 1);     /* on no stream of the lattice */
    for (i = 0; i < LATTICE; i++) {
        cudaStreamCreate(&s[i]);
        cudaEventCreate(&e[i]);
        h[i] = fake_launch_held(s[i], i == 0 ? &p : NULL, i == 0);
        if (i >= 1)
            cudaStreamWaitEvent(s[i], e[i - 1], 0);
        if (i >= 2)
            cudaStreamWaitEvent(s[i], e[i - 2], 0);
        cudaEventRecord(e[i], s[i]);
    }

    violated = handout_violates(p, s[LATTICE - 1], &ms);
    slowest = ms > slowest ? ms : slowest;
    ok(violated, "work on a stream outside the lattice is not ordered "
       "before its last stream");
    ok(last_violation_has("not ordered before"), "... said so");
    fake_complete(u);
    violated = handout_violates(p, s[LATTICE - 1], &ms);
    slowest = ms > slowest ? ms : slowest;
    ok(!violated, "work on the first stream before its event: ordered "
       "before the last stream, through %d waits", LATTICE - 1);
    ok(!handout_violates(p, s[1], &ms) && !handout_violates(p, s[2], &ms),
       "... and before the second and the third");
    u = fake_launch_held(s[0], &p, 1);  /* after e[0]'s record */
    violated = handout_violates(p, s[LATTICE - 1], &ms);
    slowest = ms > slowest ? ms : slowest;
    ok(violated, "work on the first stream after its event: not ordered "
       "before the last stream");
    ok(slowest < 1000, "each answer took well under a second (slowest "
       "%.3f ms)", slowest);
    fake_complete(u);
    for (i = 0; i < LATTICE; i++)
        fake_complete(h[i]);
    is_int(cudaStreamQuery(s[LATTICE - 1]), cudaSuccess,
           "the lattice completes once its held work did");

    /* A stream met twice in one walk, through an early item and then a
     * later one (or the other way round): its items between the two are
     * walked too.  Stream a: held work, event ea1, a wait on z's event
     * (recorded after the work that uses p), event ea2.  t1 waits on ea1
     * then ea2, t2 on ea2 then ea1: both are ordered after the use of p,
     * through ea2 only. */
    cudaStreamCreate(&a);
    cudaStreamCreate(&t1);
    cudaStreamCreate(&t2);
    cudaEventCreate(&ez);
    cudaEventCreate(&ea1);
    cudaEventCreate(&ea2);
    hz = fake_launch_held(z, &p, 1);
    cudaEventRecord(ez, z);
    ha = fake_launch_held(a, NULL, 0);
    cudaEventRecord(ea1, a);
    cudaStreamWaitEvent(a, ez, 0);
    cudaEventRecord(ea2, a);
    cudaStreamWaitEvent(t1, ea1, 0);
    cudaStreamWaitEvent(t1, ea2, 0);
    cudaStreamWaitEvent(t2, ea2, 0);
    cudaStreamWaitEvent(t2, ea1, 0);
    ok(!handout_violates(p, t1, &ms),
       "ordered through the later of two waits on one stream");
    ok(!handout_violates(p, t2, &ms),
       "... and through the earlier of two");
    ok(!handout_violates(p, a, &ms),
       "... and the stream waited on, after its wait");
    ok(handout_violates(p, 0, &ms),
       "the legacy stream, which waited on nothing: not ordered");
    fake_complete(ha);
    fake_complete(hz);
    for (i = 0; i < LATTICE; i++) {
        cudaEventDestroy(e[i]);
        cudaStreamDestroy(s[i]);
    }
    cudaEventDestroy(ez);
    cudaEventDestroy(ea1);
    cudaEventDestroy(ea2);
    cudaStreamDestroy(a);
    cudaStreamDestroy(t1);
    cudaStreamDestroy(t2);
    cudaStreamDestroy(z);
    cudaFree(p);
}
