/* SPDX-License-Identifier: MIT */
/* The literal deferred-free design: see naive_reclaimer.h. */
#define _GNU_SOURCE
#include "naive_reclaimer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct naive_entry {
    void *ptr;
    cudaEvent_t event;
    struct naive_entry *next;
};

struct naive_reclaimer {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;     /* signalled when entries were freed */
    struct naive_entry *head;     /* FIFO list of pending entries */
    struct naive_entry **tail;
    int stop;
    int device;
    unsigned poll_us;
    pid_t tid;
    pthread_t thread;
    struct naive_stats st;        /* under lock */
};

static void *naive_thread(void *arg)
{
    struct naive_reclaimer *nr = arg;
    struct timespec nap = { 0, (long)nr->poll_us * 1000L };

    pthread_setname_np(pthread_self(), "naive-reclaim");
    pthread_mutex_lock(&nr->lock);
    nr->tid = (pid_t)syscall(SYS_gettid);
    pthread_cond_broadcast(&nr->done_cond);
    pthread_mutex_unlock(&nr->lock);
    cudaSetDevice(nr->device);

    for (;;) {
        struct naive_entry *done = NULL, **done_tail = &done;
        uint64_t n_ok = 0, n_fail = 0;

        nanosleep(&nap, NULL);

        pthread_mutex_lock(&nr->lock);
        if (nr->stop && nr->head == NULL) {
            pthread_mutex_unlock(&nr->lock);
            break;
        }
        nr->st.polls++;
        struct naive_entry **pp = &nr->head;
        while (*pp) {
            struct naive_entry *e = *pp;
            cudaError_t q = cudaEventQuery(e->event);
            nr->st.event_queries++;
            if (q == cudaErrorNotReady) {
                pp = &e->next;
                continue;
            }
            if (q != cudaSuccess) {
                fprintf(stderr, "naive_reclaimer: cudaEventQuery: %s\n",
                        cudaGetErrorString(q));
                e->ptr = NULL;  /* cannot know the work is done: leak it */
            }
            *pp = e->next;      /* unlink */
            e->next = NULL;
            *done_tail = e;
            done_tail = &e->next;
        }
        nr->tail = pp;          /* pp now points at the last next field */
        pthread_mutex_unlock(&nr->lock);

        while (done) {
            struct naive_entry *e = done;
            done = e->next;
            if (e->ptr) {
                cudaError_t rc = cudaFree(e->ptr);
                if (rc == cudaSuccess) {
                    n_ok++;
                } else {
                    fprintf(stderr, "naive_reclaimer: cudaFree: %s\n",
                            cudaGetErrorString(rc));
                    n_fail++;
                }
            } else {
                n_fail++;
            }
            cudaEventDestroy(e->event);
            free(e);
        }

        if (n_ok || n_fail) {
            pthread_mutex_lock(&nr->lock);
            nr->st.released += n_ok;
            nr->st.failed += n_fail;
            pthread_cond_broadcast(&nr->done_cond);
            pthread_mutex_unlock(&nr->lock);
        }
    }
    return NULL;
}

int naive_start(struct naive_reclaimer **out, unsigned poll_us)
{
    struct naive_reclaimer *nr = calloc(1, sizeof *nr);
    int rc;

    *out = NULL;
    if (!nr) {
        fprintf(stderr, "naive_reclaimer: out of memory\n");
        return -1;
    }
    pthread_mutex_init(&nr->lock, NULL);
    pthread_cond_init(&nr->done_cond, NULL);
    nr->tail = &nr->head;
    nr->poll_us = poll_us ? poll_us : 1;
    if (cudaGetDevice(&nr->device) != cudaSuccess)
        nr->device = 0;
    rc = pthread_create(&nr->thread, NULL, naive_thread, nr);
    if (rc) {
        fprintf(stderr, "naive_reclaimer: pthread_create: %s\n", strerror(rc));
        free(nr);
        return -1;
    }
    pthread_mutex_lock(&nr->lock);
    while (nr->tid == 0)
        pthread_cond_wait(&nr->done_cond, &nr->lock);
    pthread_mutex_unlock(&nr->lock);
    *out = nr;
    return 0;
}

cudaError_t naive_free(struct naive_reclaimer *nr, void *ptr,
                       cudaStream_t stream)
{
    struct naive_entry *e;
    cudaError_t rc;

    if (ptr == NULL)
        return cudaSuccess;
    e = malloc(sizeof *e);
    if (!e)
        return cudaErrorMemoryAllocation;
    rc = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
    if (rc != cudaSuccess) {
        free(e);
        return rc;
    }
    rc = cudaEventRecord(e->event, stream);
    if (rc != cudaSuccess) {
        cudaEventDestroy(e->event);
        free(e);
        return rc;
    }
    e->ptr = ptr;
    e->next = NULL;
    pthread_mutex_lock(&nr->lock);
    *nr->tail = e;
    nr->tail = &e->next;
    nr->st.deferred++;
    pthread_mutex_unlock(&nr->lock);
    return cudaSuccess;
}

void naive_drain(struct naive_reclaimer *nr)
{
    pthread_mutex_lock(&nr->lock);
    uint64_t target = nr->st.deferred;
    while (nr->st.released + nr->st.failed < target)
        pthread_cond_wait(&nr->done_cond, &nr->lock);
    pthread_mutex_unlock(&nr->lock);
}

void naive_stats_get(struct naive_reclaimer *nr, struct naive_stats *out)
{
    pthread_mutex_lock(&nr->lock);
    *out = nr->st;
    pthread_mutex_unlock(&nr->lock);
}

pid_t naive_tid(struct naive_reclaimer *nr)
{
    return nr->tid;
}

void naive_stop(struct naive_reclaimer *nr)
{
    if (!nr)
        return;
    naive_drain(nr);
    pthread_mutex_lock(&nr->lock);
    nr->stop = 1;
    pthread_mutex_unlock(&nr->lock);
    pthread_join(nr->thread, NULL);
    pthread_cond_destroy(&nr->done_cond);
    pthread_mutex_destroy(&nr->lock);
    free(nr);
}
