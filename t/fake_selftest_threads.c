/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_threads.c — self-test of the fake CUDA runtime:
 * the fake under concurrency (producers and a reclaimer-like consumer) and
 * across fork.
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

/* ---- Concurrency ------------------------------------------------------ */

#define NPRODUCERS 8
#define PER_PRODUCER 300

struct pending { void *p; cudaEvent_t e; int host; };

static struct {
    pthread_mutex_t lock;
    struct pending q[NPRODUCERS * PER_PRODUCER];
    size_t head, tail;
    int producers_left;
} rq = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Application thread: allocate, launch work using it, defer the release to
 * the reclaimer (record an event, queue it) — the cudefer pattern. */
static void *producer_main(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg, fails = 0;
    cudaStream_t own;
    int i;

    cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
    for (i = 0; i < PER_PRODUCER; i++) {
        struct pending pe;
        cudaStream_t s = (i % 3 == 0) ? own
                       : (i % 3 == 1) ? cudaStreamPerThread : 0;

        pe.host = (i % 5 == 0);
        if (pe.host)
            fails += cudaMallocHost(&pe.p, 64) != cudaSuccess;
        else
            fails += cudaMalloc(&pe.p, 64) != cudaSuccess;
        fake_launch(s, (unsigned)(rand_r(&seed) % 200), &pe.p, 1);
        fails += cudaEventCreateWithFlags(&pe.e, cudaEventDisableTiming)
                 != cudaSuccess;
        fails += cudaEventRecord(pe.e, s) != cudaSuccess;
        pthread_mutex_lock(&rq.lock);
        rq.q[rq.tail++] = pe;
        pthread_mutex_unlock(&rq.lock);
    }
    ok(fails == 0, "producer %u: all calls succeeded",
       (unsigned)(uintptr_t)arg);
    cudaStreamSynchronize(own);
    cudaStreamDestroy(own);
    pthread_mutex_lock(&rq.lock);
    rq.producers_left--;
    pthread_mutex_unlock(&rq.lock);
    return NULL;
}

/* Reclaimer thread: poll the oldest entries' events, release when done. */
static void *consumer_main(void *arg)
{
    size_t released = 0, polls = 0;

    (void)arg;
    pthread_setname_np(pthread_self(), FAKE_RECLAIMER_THREAD_NAME);
    cudaSetDevice(0);
    for (;;) {
        struct pending pe;
        int have, left;

        pthread_mutex_lock(&rq.lock);
        have = rq.head < rq.tail;
        if (have)
            pe = rq.q[rq.head];
        left = rq.producers_left;
        pthread_mutex_unlock(&rq.lock);
        if (!have) {
            if (left == 0)
                break;
            sched_yield();
            continue;
        }
        polls++;
        if (cudaEventQuery(pe.e) == cudaErrorNotReady) {
            sched_yield();
            continue;
        }
        if (pe.host)
            cudaFreeHost(pe.p);
        else
            cudaFree(pe.p);
        cudaEventDestroy(pe.e);
        released++;
        pthread_mutex_lock(&rq.lock);
        rq.head++;
        pthread_mutex_unlock(&rq.lock);
    }
    ok(released == NPRODUCERS * PER_PRODUCER,
       "reclaimer released %zu entries (%zu polls)", released, polls);
    return NULL;
}

void test_concurrency(void)
{
    pthread_t prod[NPRODUCERS], cons;
    int i;

    diag("concurrency: %d producers, one reclaimer", NPRODUCERS);
    fake_reset(1);
    cudaSetDevice(0);   /* the app uses device 0 before the reclaimer */
    rq.producers_left = NPRODUCERS;
    for (i = 0; i < NPRODUCERS; i++)
        if (pthread_create(&prod[i], NULL, producer_main,
                           (void *)(uintptr_t)(i + 1)) != 0)
            sysbail("pthread_create");
    if (pthread_create(&cons, NULL, consumer_main, NULL) != 0)
        sysbail("pthread_create");
    for (i = 0; i < NPRODUCERS; i++)
        pthread_join(prod[i], NULL);
    pthread_join(cons, NULL);
    is_int(fake_violations(), 0, "no violations");
    is_int((long long)fake_live_allocations(), 0, "everything released");
    is_int((long long)fake_live_events(), 0, "every event destroyed");
    is_int((long long)fake_invalid_releases(), 0, "no invalid releases");
}

/* ---- per-thread accessors ---------------------------------------------- */

static void *record_twice_main(void *arg)
{
    cudaEvent_t e = arg;

    cudaEventRecord(e, 0);
    cudaEventRecord(e, 0);
    return fake_take_last_recorded();
}

/* fake_thread_calls counts the calling thread's calls only, and
 * fake_take_last_recorded says the event the thread last recorded, once;
 * a reset clears both. */
void test_thread_accessors(void)
{
    cudaEvent_t a, b;
    pthread_t t;
    void *other = NULL;

    diag("per-thread call counts and the last recorded event");
    fake_reset(1);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    is_int((long long)fake_thread_calls(FAKE_EVENT_CREATE), 2,
           "two cudaEventCreate on this thread");
    ok(fake_take_last_recorded() == NULL, "nothing recorded yet");
    cudaEventRecord(a, 0);
    if (pthread_create(&t, NULL, record_twice_main, b) != 0)
        sysbail("pthread_create");
    pthread_join(t, &other);
    ok(other == (void *)b, "the other thread's last record: its event");
    is_int((long long)fake_thread_calls(FAKE_EVENT_RECORD), 1,
           "this thread's records: 1 (of %lu in all)",
           fake_calls(FAKE_EVENT_RECORD));
    ok(fake_take_last_recorded() == a, "this thread's last record: a");
    ok(fake_take_last_recorded() == NULL, "said once");
    is_int(cudaEventRecord(NULL, 0), cudaErrorInvalidResourceHandle,
           "a failed record");
    ok(fake_take_last_recorded() == NULL, "is no record");
    cudaEventRecord(a, 0);
    fake_reset(1);
    ok(fake_take_last_recorded() == NULL &&
           fake_thread_calls(FAKE_EVENT_RECORD) == 0,
       "a reset clears both");
}

/* ---- fork ------------------------------------------------------------- */

static atomic_int hammer_stop;

static void *hammer_main(void *arg)
{
    cudaEvent_t e = arg;

    while (!atomic_load(&hammer_stop))
        cudaEventQuery(e);
    return NULL;
}

/* A fork while another thread is inside the fake leaves the child a usable
 * fake (the lock is held across fork). */
void test_fork(void)
{
    pthread_t t;
    cudaEvent_t e;
    int i, good = 0, status, n;

    diag("fork while another thread uses the fake");
    fake_reset(1);
    cudaEventCreate(&e);
    if (pthread_create(&t, NULL, hammer_main, e) != 0)
        sysbail("pthread_create");
    for (i = 0; i < 20; i++) {
        pid_t pid;

        fflush(stdout);
        pid = fork();
        if (pid < 0)
            sysbail("fork");
        if (pid == 0) {
            void *p;

            alarm(10);      /* a deadlock ends as a failure, not a hang */
            _exit(cudaGetDeviceCount(&n) == cudaSuccess && n == 1 &&
                  cudaMalloc(&p, 8) == cudaSuccess &&
                  cudaFree(p) == cudaSuccess ? 0 : 1);
        }
        if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0)
            good++;
    }
    atomic_store(&hammer_stop, 1);
    pthread_join(t, NULL);
    is_int(good, 20, "20 forked children could use the fake");
    cudaEventDestroy(e);
}
