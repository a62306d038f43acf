/* SPDX-License-Identifier: MIT */
/* Calls after defer_shutdown, and a shutdown before any defer call: every
 * call is refused with cudaErrorNotPermitted, explained on stderr and
 * counted; the caller keeps its pointers; the no-ops stay no-ops.  Each
 * scenario runs in a child (a shutdown is for good), forked before this
 * process uses cudefer.  (Out of t/lifecycle.c, whose scenarios exit.) */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"
#include "cache.h"
#include "lifecycle.h"

static void never_called(void *arg)
{
    *(int *)arg = 1;
}

static void s_after_shutdown(void)
{
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    work_timed(s, 1000, p);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_is_released(p) == 1, "shutdown released the entry");

    uint64_t rejected = stats_now().rejected;
    void *q[2] = {device_alloc(64), device_alloc(64)};
    stderr_capture_begin();
    cudaError_t err = defer_free_n(q, 2, s);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_free_n after shutdown: %s",
          cudaGetErrorName(err));
    CHECK(has_line(msg, "defer_free_n", "shutdown", NULL),
          "defer_free_n: the refusal is explained on stderr");
    size_t bytes = 99;
    stderr_capture_begin();
    err = defer_trim(&bytes);
    msg = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_trim after shutdown: %s",
          cudaGetErrorName(err));
    CHECK(bytes == 0, "defer_trim after shutdown: %zu bytes", bytes);
    CHECK(has_line(msg, "defer_trim", "shutdown", NULL),
          "defer_trim: the refusal is explained on stderr");
    stderr_capture_begin();
    err = defer_trim(NULL);
    CHECK(err == cudaErrorNotPermitted, "defer_trim(NULL) after shutdown: %s",
          cudaGetErrorName(err));
    void *h = host_alloc(64);
    err = defer_free_host(h, s);
    CHECK(err == cudaErrorNotPermitted, "defer_free_host after shutdown: %s",
          cudaGetErrorName(err));
    int ran = 0;
    err = defer_call(never_called, &ran, s);
    CHECK(err == cudaErrorNotPermitted, "defer_call after shutdown: %s",
          cudaGetErrorName(err));
    stderr_capture_end();
    CHECK(stats_now().rejected - rejected == 5, "5 refusals counted (%llu)",
          ULL(stats_now().rejected - rejected));
    CHECK(fake_is_released(q[0]) == 0 && fake_is_released(q[1]) == 0 &&
              fake_is_released(h) == 0,
          "the caller keeps its pointers");
    CHECK(cudaFree(q[0]) == cudaSuccess && cudaFree(q[1]) == cudaSuccess &&
              cudaFreeHost(h) == cudaSuccess,
          "and frees them itself");
    CHECK(defer_free(NULL, s) == cudaSuccess, "defer_free(NULL) is still a no-op");
    CHECK(defer_free_n(q, 0, s) == cudaSuccess, "defer_free_n of 0 is still a "
          "no-op");
    void *none = &none;
    CHECK(defer_alloc(&none, 0, s) == cudaSuccess && none == NULL,
          "defer_alloc of 0 bytes is still a no-op, NULL");
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    stderr_capture_begin();
    err = defer_configure(&cfg);
    stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_configure after shutdown: %s",
          cudaGetErrorName(err));
    CHECK(defer_shutdown() == cudaSuccess, "a second shutdown: cudaSuccess");
    sleep_ms(10);
    CHECK(!ran, "the refused callback never runs");
}

static void s_shutdown_first(void)
{
    CHECK(defer_shutdown() == cudaSuccess, "shutdown before any defer call");
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    cudaError_t ferr = defer_flush();
    size_t bytes = 99;
    cudaError_t terr = defer_trim(&bytes);
    stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_free after it: %s",
          cudaGetErrorName(err));
    CHECK(ferr == cudaErrorNotPermitted, "defer_flush after it: %s",
          cudaGetErrorName(ferr));
    CHECK(terr == cudaErrorNotPermitted && bytes == 0,
          "defer_trim after it: %s, %zu bytes", cudaGetErrorName(terr), bytes);
    CHECK(fake_is_released(p) == 0, "the caller keeps its pointer");
    CHECK(fake_calls(FAKE_EVENT_CREATE) == 0 && fake_live_events() == 0,
          "nothing was started: no event created (%lu)",
          fake_calls(FAKE_EVENT_CREATE));
    cudaFree(p);
}

/* s_free_during_shutdown: the free's look-up, paused with the address
 * map's lock held, and what it found once it went on. */
static atomic_bool in_lookup, shutdown_returned, cleared_meanwhile;

static void pause_in_lookup(void)
{
    atomic_store(&in_lookup, true);
    sleep_ms(200);
    /* defer_shutdown empties the map: it must wait for this lock. */
    if (atomic_load(&shutdown_returned))
        atomic_store(&cleared_meanwhile, true);
}

static void *free_on_legacy(void *ptr)
{
    defer_pluggable_free(ptr, 256, 0, NULL);
    return NULL;
}

/* defer_pluggable_free looks the block's device up before its admission
 * (with two devices, on a special stream), which defer_shutdown does not
 * wait for: shutdown must not free the map under that look-up. */
static void s_free_during_shutdown(void)
{
    fake_reset(2);
    void *p = defer_pluggable_alloc(256, 0, NULL);
    CHECK(p != NULL, "defer_pluggable_alloc");
    cache_test_set_map_hook(pause_in_lookup);
    pthread_t t;
    pthread_create(&t, NULL, free_on_legacy, p);
    while (!atomic_load(&in_lookup))
        sleep_ms(1);
    cache_test_set_map_hook(NULL);
    stderr_capture_begin();
    cudaError_t err = defer_shutdown();
    atomic_store(&shutdown_returned, true);
    pthread_join(t, NULL);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaSuccess, "shutdown: %s", cudaGetErrorName(err));
    CHECK(!atomic_load(&cleared_meanwhile),
          "defer_shutdown emptied the address map only once the free's "
          "look-up had let go of it");
    CHECK(has_line(msg, "defer_pluggable_free", "shutdown", NULL),
          "the free, admitted after the shutdown, is refused and said");
}

/* s_alloc_miss_during_shutdown: the device's size, asked (with
 * cudaGetDeviceProperties) for a miss's new block, and a shutdown run from
 * that call wherever it is not admitted. */
static pthread_t alloc_thread;
static atomic_bool size_asked, size_asked_admitted;

static void shut_down_in_size_query(enum fake_call c, cudaError_t r,
                                    void *arg)
{
    (void)c;
    (void)arg;
    /* cudaGetDeviceProperties counts as cudaDeviceGetAttribute: the miss's
     * first one fails (injected), so its size is asked again. */
    if (r != cudaSuccess || !pthread_equal(pthread_self(), alloc_thread) ||
        atomic_exchange(&size_asked, true))
        return;
    atomic_store(&size_asked_admitted, lifecycle_in_callback());
    /* Not admitted, nothing keeps defer_shutdown from freeing the device
     * pools' records, which the call goes on to write (the size it got). */
    if (!lifecycle_in_callback())
        defer_shutdown();
}

/* A miss of defer_alloc leaves its admission before its new block (a trim
 * there must not wait behind it): what it reads of the cache's upstream
 * pools, which defer_shutdown destroys, must be read while admitted. */
static void s_alloc_miss_during_shutdown(void)
{
    cudaStream_t s = stream_new();
    alloc_thread = pthread_self();
    fake_fail(FAKE_DEVICE_GET_ATTRIBUTE, cudaErrorInvalidValue, 0, 1);
    fake_set_return_hook(FAKE_DEVICE_GET_ATTRIBUTE, shut_down_in_size_query,
                         NULL);
    void *p = NULL;
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, 1 << 20, s);
    stderr_capture_end();
    fake_set_return_hook(FAKE_DEVICE_GET_ATTRIBUTE, NULL, NULL);
    CHECK(atomic_load(&size_asked),
          "the device's size was asked again after the failed query");
    CHECK(atomic_load(&size_asked_admitted),
          "the miss asked the device's size while admitted");
    CHECK(err == cudaSuccess && p != NULL, "defer_alloc: %s",
          cudaGetErrorName(err));
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* An exit handler run after cudefer's (registered before its start): a
 * call there is refused in words that say exit stopped cudefer, not a
 * defer_shutdown the program never called. */
static cudaStream_t exit_stream;

static void call_after_exit(void)
{
    void *p = device_alloc(64);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, exit_stream);
    const char *said = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_free after exit: %s",
          cudaGetErrorName(err));
    CHECK(has_line(said, "defer_free called after exit", "refused", NULL) &&
              strstr(said, "defer_shutdown") == NULL,
          "refused as after exit, naming no defer_shutdown: %s", said);
    scenario_child_end();
}

static void s_after_exit(void)
{
    atexit(call_after_exit); /* before cudefer's: runs after it */
    exit_stream = stream_new();
    void *p = device_alloc(64);
    CHECK(defer_free(p, exit_stream) == cudaSuccess, "defer_free");
    exit(0);
}

int main(void)
{
    plan_lazy();
    fork_scenario("calls after shutdown are refused", "", 1, 30000,
                  s_after_shutdown);
    fork_scenario("shutdown before any defer call: later calls refused", "", 1,
                  30000, s_shutdown_first);
    fork_scenario(
        "a pluggable free's look-up of its block's device while "
        "defer_shutdown empties the address map: shutdown waits for it",
        "", 1, 30000, s_free_during_shutdown);
    fork_scenario("a defer_alloc miss sizes its new block while admitted, so "
                  "defer_shutdown cannot free the pools' records under it",
                  "", 1, 30000, s_alloc_miss_during_shutdown);
    fork_scenario(
        "a call in an exit handler after cudefer's is refused as after "
        "exit, not after a defer_shutdown never called",
        "", 1, 30000, s_after_exit);
    return 0;
}
