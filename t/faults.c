/* SPDX-License-Identifier: MIT */
/* Fault injection: every CUDA runtime call cudefer makes fails, once and
 * persistently, one scenario per process (the configuration is read once
 * per process, and a failed device stays failed).  Each scenario checks
 * that nothing crashes or hangs, that nothing is released early or twice
 * (the fake's oracle), that the caller gets the error or the entry is
 * released synchronously (or abandoned, or retried) as documented, that the
 * statistics count it, and that one line on stderr names the call and the
 * CUDA error.
 *
 * The calls, and who makes them:
 *   launching thread: cudaGetDeviceCount (start), cudaStreamGetDevice,
 *     cudaStreamGetId, cudaGetDevice + cudaSetDevice (creating an event for
 *     another device), cudaEventCreateWithFlags (empty pool),
 *     cudaEventRecord, cudaStreamSynchronize (synchronous release),
 *     cudaFree/cudaFreeHost (synchronous release);
 *   reclaimer: cudaSetDevice, cudaMemGetInfo, cudaGetDriverEntryPointByVersion
 *     and cuPointerGetAttributes, cudaEventQuery, cudaFree, cudaFreeHost,
 *     cudaFreeAsync, cudaStreamCreateWithFlags, cudaEventDestroy,
 *     cudaStreamDestroy, and cudaEventSynchronize, made only when the
 *     reclaimer is out of host memory, which t/host_alloc_filing makes
 *     it (its allocator replaced) and fails there;
 *   process exit: any of the reclaimer's, failing with
 *     cudaErrorCudartUnloading.
 *
 * fake_fail counts calls of a kind across all threads, so each scenario arms
 * an injection at a moment when only the thread it aims at can make that
 * call. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faults.h"

/* ---- the scenarios ---------------------------------------------------------- */

#define NONE FAKE_NCALLS

static const struct scenario scenarios[] = {
    /* start */
    {"cudaGetDeviceCount fails once at start: returned, the next call starts",
     "", 1, s_device_count, FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, ONCE,
     cudaSuccess, NULL},
    {"cudaGetDeviceCount fails persistently: every call returns it", "", 1,
     s_device_count, FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, ALWAYS,
     cudaSuccess, NULL},
    /* launching thread */
    {"cudaStreamGetDevice fails once: returned, caller keeps the pointer", "",
     1, s_stream_identity, FAKE_STREAM_GET_DEVICE, cudaErrorContextIsDestroyed,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamGetDevice fails persistently", "", 1, s_stream_identity,
     FAKE_STREAM_GET_DEVICE, cudaErrorContextIsDestroyed, ALWAYS, cudaSuccess,
     NULL},
    {"cudaStreamGetId fails once: returned, caller keeps the pointer", "", 1,
     s_stream_identity, FAKE_STREAM_GET_ID, cudaErrorInvalidResourceHandle,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamGetId fails persistently", "", 1, s_stream_identity,
     FAKE_STREAM_GET_ID, cudaErrorInvalidResourceHandle, ALWAYS, cudaSuccess,
     NULL},
    {"cudaEventRecord fails once: returned; an invalid handle is retried once",
     "", 1, s_record, FAKE_EVENT_RECORD, cudaErrorNotSupported, ONCE,
     cudaSuccess, NULL},
    {"cudaEventRecord fails persistently", "", 1, s_record, FAKE_EVENT_RECORD,
     cudaErrorNotSupported, ALWAYS, cudaSuccess, NULL},
    {"cudaEventRecord meets a sticky error, nothing pending: the device "
     "fails, defer_flush returns it", "", 1, s_record_sticky,
     FAKE_EVENT_RECORD, cudaErrorIllegalAddress, ALWAYS,
     cudaErrorIllegalAddress, NULL},
    {"no event, cudaStreamSynchronize meets a sticky error, nothing pending: "
     "the device fails, defer_flush returns it", "CUDEFER_EVENT_POOL=0", 1,
     s_record_sticky, FAKE_STREAM_SYNCHRONIZE, cudaErrorIllegalAddress,
     ALWAYS, cudaErrorIllegalAddress, NULL},
    {"cudaEventCreateWithFlags fails once: waits and releases synchronously",
     "", 1, s_create_fails, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, ONCE,
     cudaSuccess, NULL},
    {"cudaEventCreateWithFlags fails persistently: every call synchronous", "",
     1, s_create_fails, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation, ALWAYS,
     cudaSuccess, NULL},
    {"cudaEventCreateWithFlags and cudaStreamSynchronize fail once: returned",
     "", 1, s_create_and_sync_fail, FAKE_EVENT_CREATE, cudaErrorNotSupported,
     ONCE, cudaSuccess, NULL},
    {"cudaEventCreateWithFlags and cudaStreamSynchronize fail persistently", "",
     1, s_create_and_sync_fail, FAKE_EVENT_CREATE, cudaErrorNotSupported,
     ALWAYS, cudaSuccess, NULL},
    {"cudaGetDevice fails once while creating an event: synchronous", "", 1,
     s_create_fails, FAKE_GET_DEVICE, cudaErrorInitializationError, ONCE,
     cudaSuccess, NULL},
    {"cudaGetDevice fails persistently while creating events", "", 1,
     s_create_fails, FAKE_GET_DEVICE, cudaErrorInitializationError, ALWAYS,
     cudaSuccess, NULL},
    {"cudaSetDevice to the stream's device fails once while creating an event",
     "", 2, s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ONCE, cudaSuccess, NULL},
    {"cudaSetDevice to the stream's device fails persistently", "", 2,
     s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ALWAYS, cudaSuccess, NULL},
    {"cudaSetDevice back to the caller's device fails once after creating",
     "", 2, s_create_other_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ONCE, cudaSuccess, "back"},
    /* CUDEFER_EVENT_POOL=32: the first miss stocks 32, which the first
     * 33 entries in flight take (the reserve too: plain frees may). */
    {"out of memory during event-pool growth, once: that call synchronous",
     "CUDEFER_EVENT_POOL=32", 1, s_pool_growth_oom, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation,
     ONCE, cudaSuccess, NULL},
    {"out of memory during event-pool growth, persistently: all synchronous",
     "CUDEFER_EVENT_POOL=32", 1, s_pool_growth_oom, FAKE_EVENT_CREATE, cudaErrorMemoryAllocation,
     ALWAYS, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: cudaStreamSynchronize fails once: returned",
     "CUDEFER_DISABLE=1", 1, s_disable_sync_fails, FAKE_STREAM_SYNCHRONIZE,
     cudaErrorNotSupported, ONCE, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: cudaStreamSynchronize fails persistently",
     "CUDEFER_DISABLE=1", 1, s_disable_sync_fails, FAKE_STREAM_SYNCHRONIZE,
     cudaErrorNotSupported, ALWAYS, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree fails once: counted, reported",
     "CUDEFER_DISABLE=1", 1, s_disable_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree fails persistently",
     "CUDEFER_DISABLE=1", 1, s_disable_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree fails once on device 1: the "
     "message names device 1", "CUDEFER_DISABLE=1", 2, s_disable_free_fails,
     FAKE_FREE, cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"CUDEFER_DISABLE: the caller's cudaFree meets a sticky error: its "
     "device fails, one line", "CUDEFER_DISABLE=1", 2, s_disable_free_sticky,
     FAKE_FREE, cudaErrorIllegalAddress, ONCE, cudaErrorIllegalAddress, NULL},
    /* reclaimer */
    {"cudaEventQuery fails once: device 0 abandoned, device 1 carries on",
     "CUDEFER_MAX_DELAY_MS=0", 2, s_query_fails, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ONCE, cudaErrorIllegalAddress, NULL},
    {"cudaEventQuery fails persistently: each device abandoned, one line each",
     "CUDEFER_MAX_DELAY_MS=0", 2, s_query_fails, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"sticky error: every query fails after a fault, 51 entries, one line",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_sticky, FAKE_EVENT_QUERY,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"reclaimer's cudaSetDevice fails once: device 0 fails, device 1 carries on",
     "", 2, s_reclaimer_set_device, FAKE_SET_DEVICE,
     cudaErrorDevicesUnavailable, ONCE, cudaErrorDevicesUnavailable, NULL},
    {"reclaimer's cudaSetDevice fails persistently", "", 2,
     s_reclaimer_set_device, FAKE_SET_DEVICE, cudaErrorDevicesUnavailable,
     ALWAYS, cudaErrorDevicesUnavailable, NULL},
    {"cudaFree fails once: counted, named with the pointer, not released",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails, FAKE_FREE,
     cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"cudaFree fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE, cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    {"cudaFree fails once: defer_trim's bytes and demand_releases count "
     "only what was released", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE, cudaErrorInvalidValue, ONCE, cudaSuccess, "accounting"},
    {"defer_free_n: the first pointer's cudaFree fails, the last one's "
     "works: the entry failed", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_free_n_first_fails, FAKE_FREE, cudaErrorInvalidValue, ONCE,
     cudaSuccess, NULL},
    {"defer_free_n: the first pointer refused, the second meets a sticky "
     "error: the device fails", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_free_n_sticky_after_refused, FAKE_FREE, cudaErrorIllegalAddress, ONCE,
     cudaErrorIllegalAddress, NULL},
    {"defer_free_n: the first pointer refused, the second meets a "
     "device-side assert (sticky, as an illegal address): the device fails",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_free_n_sticky_after_refused, FAKE_FREE,
     cudaErrorAssert, ONCE, cudaErrorAssert, NULL},
    {"cudaFreeHost fails once", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_fails,
     FAKE_FREE_HOST, cudaErrorInvalidValue, ONCE, cudaSuccess, NULL},
    {"cudaFreeHost fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_free_fails, FAKE_FREE_HOST, cudaErrorInvalidValue, ALWAYS, cudaSuccess,
     NULL},
    {"cudaFree fails with a sticky error: the device fails, one line",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_free_sticky, FAKE_FREE,
     cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress, NULL},
    {"after a sticky error shutdown forgets the events it cannot destroy, "
     "no line more", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_sticky_shutdown,
     FAKE_FREE, cudaErrorIllegalAddress, ALWAYS, cudaSuccess, NULL},
    /* IDLE_US=10s: the held entry must wait for the trim (a TSan run once
     * released it as idle, 2 ms after the wait saw it held, before the
     * failure was armed; the test's cudaFree then freed it twice). */
    {"after a sticky error a thread's exit forgets its lanes' events, no "
     "line more", "CUDEFER_MAX_DELAY_MS=0 CUDEFER_EVENT_POOL=0 "
     "CUDEFER_IDLE_US=10s", 1,
     s_sticky_thread_exit, FAKE_FREE, cudaErrorIllegalAddress, ALWAYS,
     cudaErrorIllegalAddress, NULL},
    {"cudaFreeAsync of cudaMalloc memory fails once: cudaFree instead, "
     "silently, released", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_async_fails,
     FAKE_FREE_ASYNC, cudaErrorNotSupported, ONCE, cudaSuccess, "malloc"},
    {"cudaFreeAsync of cudaMalloc memory fails persistently: cudaFree "
     "instead", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_async_fails,
     FAKE_FREE_ASYNC, cudaErrorNotSupported, ALWAYS, cudaSuccess, "malloc"},
    {"cudaFreeAsync of cudaMalloc memory meets a sticky error: the device "
     "fails, one line, no cudaFree", "CUDEFER_MAX_DELAY_MS=0", 1, s_free_sticky,
     FAKE_FREE_ASYNC, cudaErrorIllegalAddress, ALWAYS, cudaErrorIllegalAddress,
     NULL},
    {"the reclaimer's cudaStreamSynchronize of its frees fails: said, the "
     "memory counted released", "CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s",
     1, s_malloc_free_sync_fails, FAKE_STREAM_SYNCHRONIZE, cudaErrorNotReady,
     ALWAYS, cudaSuccess, NULL},
    {"cudaFreeAsync fails once: cudaFree instead, released", "", 1,
     s_free_async_fails, FAKE_FREE_ASYNC, cudaErrorNotSupported, ONCE,
     cudaSuccess, NULL},
    {"cudaFreeAsync fails persistently: cudaFree instead", "", 1,
     s_free_async_fails, FAKE_FREE_ASYNC, cudaErrorNotSupported, ALWAYS,
     cudaSuccess, NULL},
    {"cudaFreeAsync rejects the pointer: no cudaFree tried, failed", "", 1,
     s_free_async_rejected, FAKE_FREE_ASYNC, cudaErrorInvalidValue, ONCE,
     cudaSuccess, NULL},
    {"reclaimer's cudaStreamCreateWithFlags fails once: cudaFree instead", "",
     1, s_free_stream_fails, FAKE_STREAM_CREATE, cudaErrorMemoryAllocation,
     ONCE, cudaSuccess, NULL},
    {"reclaimer's cudaStreamCreateWithFlags fails persistently", "", 1,
     s_free_stream_fails, FAKE_STREAM_CREATE, cudaErrorMemoryAllocation, ALWAYS,
     cudaSuccess, NULL},
    {"cudaGetDriverEntryPointByVersion fails (asked once): sizes unknown",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_entry_point_fails, FAKE_DRIVER_ENTRY_POINT,
     cudaErrorInsufficientDriver, ONCE, cudaSuccess, NULL},
    {"cudaGetDriverEntryPointByVersion fails persistently",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_entry_point_fails, FAKE_DRIVER_ENTRY_POINT,
     cudaErrorInsufficientDriver, ALWAYS, cudaSuccess, NULL},
    {"cuPointerGetAttributes fails once: that entry's size and pool unknown",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_pointer_attributes_fail,
     FAKE_CU_POINTER_GET_ATTRIBUTES, cudaErrorInvalidValue, ONCE, cudaSuccess,
     NULL},
    {"cuPointerGetAttributes fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_pointer_attributes_fail, FAKE_CU_POINTER_GET_ATTRIBUTES,
     cudaErrorInvalidValue, ALWAYS, cudaSuccess, NULL},
    {"cudaMemGetInfo works (control): a 4 MiB device's cap is 1 MiB",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_mem_get_info, FAKE_MEM_GET_INFO,
     cudaErrorInitializationError, 0, cudaSuccess, NULL},
    {"cudaMemGetInfo fails once: the cap assumes 80 GiB",
     "CUDEFER_MAX_DELAY_MS=0", 1, s_mem_get_info, FAKE_MEM_GET_INFO,
     cudaErrorInitializationError, ONCE, cudaSuccess, NULL},
    {"cudaMemGetInfo fails persistently", "CUDEFER_MAX_DELAY_MS=0", 1,
     s_mem_get_info, FAKE_MEM_GET_INFO, cudaErrorInitializationError, ALWAYS,
     cudaSuccess, NULL},
    {"cudaMemGetInfo fails persistently: a set cap never asks it",
     "CUDEFER_MAX_DELAY_MS=0 CUDEFER_MAX_PENDING=1M", 1,
     s_mem_get_info_set_cap, FAKE_MEM_GET_INFO, cudaErrorInitializationError,
     ALWAYS, cudaSuccess, NULL},
    {"cudaEventDestroy fails once at shutdown: shutdown succeeds", "", 1,
     s_event_destroy_at_shutdown, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaEventDestroy fails persistently at shutdown", "", 1,
     s_event_destroy_at_shutdown, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ALWAYS, cudaSuccess, NULL},
    {"cudaEventDestroy fails once on pool overflow", "CUDEFER_EVENT_POOL=0", 1,
     s_event_destroy_overflow, FAKE_EVENT_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaEventDestroy fails persistently on pool overflow",
     "CUDEFER_EVENT_POOL=0", 1, s_event_destroy_overflow, FAKE_EVENT_DESTROY,
     cudaErrorLaunchFailure, ALWAYS, cudaSuccess, NULL},
    {"cudaStreamDestroy fails once at shutdown: shutdown succeeds", "", 1,
     s_stream_destroy_at_shutdown, FAKE_STREAM_DESTROY, cudaErrorLaunchFailure,
     ONCE, cudaSuccess, NULL},
    {"cudaStreamDestroy fails persistently at shutdown", "", 1,
     s_stream_destroy_at_shutdown, FAKE_STREAM_DESTROY, cudaErrorLaunchFailure,
     ALWAYS, cudaSuccess, NULL},
    /* exit */
    {"exit: cudaEventQuery says cudaErrorCudartUnloading: quiet, quick",
     "CUDEFER_STATS=1", 1, s_exit_unloading, NONE, cudaErrorCudartUnloading,
     ALWAYS, cudaSuccess, "query"},
    {"exit: every call says cudaErrorCudartUnloading, entries pending",
     "CUDEFER_STATS=1", 1, s_exit_unloading, NONE, cudaErrorCudartUnloading,
     ALWAYS, cudaSuccess, "pending"},
    {"exit: every call says cudaErrorCudartUnloading, entries held only",
     "CUDEFER_STATS=1 CUDEFER_IDLE_US=10s CUDEFER_MAX_DELAY_MS=0", 1,
     s_exit_unloading, NONE, cudaErrorCudartUnloading, ALWAYS, cudaSuccess,
     "held"},
};
#define NSCENARIOS (sizeof scenarios / sizeof *scenarios)

/* Run a scenario in a child process: fresh configuration and fake; the
 * child shuts cudefer down, checks the counters and the oracle, and exits
 * with its number of failed checks. */
static void run(const struct scenario *sc)
{
    double t0 = now_ms();
    pid_t pid = fork_flushed();
    if (pid == 0) {
        set_cudefer_env(sc->env);
        fake_reset(sc->ndevices);
        /* The reclaimer gives cudaMalloc memory back with cudaFreeAsync
         * where the device has memory pools: a scenario of cudaFree's
         * failures runs on devices without them, where cudaFree is it. */
        if (sc->call == FAKE_FREE)
            for (int d = 0; d < sc->ndevices; d++)
                fake_set_memory_pools(d, 0);
        failed_checks = 0;
        sc->fn(sc);
        fake_fail_clear();
        cudaError_t err = defer_shutdown();
        CHECK(err == sc->shutdown_err, "defer_shutdown at the end: %s, want %s",
              EN(err), EN(sc->shutdown_err));
        struct defer_stats st = stats_now();
        CHECK(st.pending == 0 && st.deferred == st.released + st.failed,
              "after shutdown: deferred %llu, released %llu, failed %llu, "
              "pending %llu", ULL(st.deferred), ULL(st.released),
              ULL(st.failed), ULL(st.pending));
        scenario_child_end();
    }
    int status = 0;
    bool ended = wait_child(pid, SCENARIO_TIMEOUT_MS, &status);
    if (!ended)
        diag("no end after %d s: killed (a hang)", SCENARIO_TIMEOUT_MS / 1000);
    else if (WIFSIGNALED(status))
        diag("killed by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        diag("%d check(s) failed", WEXITSTATUS(status));
    ok(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "%s [%s] (%.0f ms)", sc->title, *sc->env != '\0' ? sc->env : "defaults",
       now_ms() - t0);
}

int main(int argc, char **argv)
{
    faults_argv0 = argv[0];
    if (argc == 3 && strcmp(argv[1], "--exit-worker") == 0)
        return run_exit_worker(argv[2]);
    plan_lazy();
    for (size_t i = 0; i < NSCENARIOS; i++)
        run(&scenarios[i]);
    return 0;
}
