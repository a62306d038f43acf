/* SPDX-License-Identifier: MIT */
/* Process exit while the process's first defer call, on another thread,
 * is still starting cudefer (src/lifecycle.c, start_locked; exit:
 * src/lifecycle_hooks.c): its cudaGetDeviceCount is held, and life_lock
 * with it.  Exit waits for the start at most its drain's 2 s; past them it
 * gives up and says so in one line.  Either way the start, once its call
 * returns, sees that exit began: it is refused ("called after exit
 * began"), starts no reclaimer thread and makes no CUDA call more.  Each
 * scenario is a child that calls exit(); an exit handler registered before
 * cudefer's (so run after it) waits for the held call to return and for
 * the start to end, then checks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

/* How long the start's cudaGetDeviceCount is held (ms): past exit's drain,
 * or within it. */
static unsigned hold_ms;

/* Set by the hook once the held call is about to return; the CUDA calls
 * made so far, by every thread, then. */
static atomic_int call_returned;
static unsigned long calls_at_return;

/* The first call's thread, and what its defer_free returned. */
static pthread_t caller;
static atomic_int caller_err = -1;

/* Every CUDA call made so far, by any thread (graph calls included). */
static unsigned long all_calls(void)
{
    unsigned long n = 0;
    for (int c = 0; c < FAKE_NCALLS; c++)
        n += fake_calls(c);
    for (int c = 0; c < FAKE_GRAPH_NCALLS; c++)
        n += fake_graph_calls(c);
    return n;
}

/* Whether a thread of this process is named as cudefer's reclaimer. */
static bool reclaimer_thread_exists(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL)
        return false;
    bool found = false;
    for (struct dirent *d; !found && (d = readdir(dir)) != NULL;) {
        if (d->d_name[0] == '.')
            continue;
        char path[300], name[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", d->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(name, sizeof name, f) != NULL)
            found = strncmp(name, FAKE_RECLAIMER_THREAD_NAME,
                            strlen(FAKE_RECLAIMER_THREAD_NAME)) == 0;
        fclose(f);
    }
    closedir(dir);
    return found;
}

/* The return hook of cudaGetDeviceCount: the first call (the start's) is
 * held hold_ms, as a runtime that hangs in its initialization would. */
static atomic_int count_calls;

static void hold_device_count(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (atomic_fetch_add(&count_calls, 1) != 0)
        return;
    sleep_ms(hold_ms);
    calls_at_return = all_calls();
    atomic_store(&call_returned, 1);
}

static void *first_call(void *p)
{
    atomic_store(&caller_err, (int)defer_free(p, NULL));
    return NULL;
}

/* Runs after cudefer's exit handler (registered by the start, after this
 * one): the held call returns, the start ends; then what was said, what
 * the first call got, and that nothing was started nor called. */
static void check_after_start(bool gave_up)
{
    for (int i = 0; i < 5000 && !atomic_load(&call_returned); i++)
        sleep_ms(1);
    CHECK(atomic_load(&call_returned), "the held cudaGetDeviceCount "
          "returned");
    for (int i = 0; i < 2000 && atomic_load(&caller_err) == -1; i++)
        sleep_ms(1);
    cudaError_t err = (cudaError_t)atomic_load(&caller_err);
    if (err != (cudaError_t)-1)
        pthread_join(caller, NULL);
    sleep_ms(300); /* a reclaimer, if one was started, is up and polling */
    unsigned long after = all_calls() - calls_at_return;
    bool thread = reclaimer_thread_exists();
    const char *said = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "the first call is refused "
          "(cudaErrorNotPermitted): %s",
          err == (cudaError_t)-1 ? "it never returned"
                                 : cudaGetErrorName(err));
    CHECK(has_line(said, "defer_free called after exit began: refused",
                   NULL, NULL),
          "its refusal says exit began: %s", said);
    CHECK(!thread, "no reclaimer thread started after exit began");
    CHECK(after == 0, "no CUDA call after the held one returned: %lu made",
          after);
    if (gave_up)
        CHECK(has_line(said, "exit: ", "after 2000 ms", NULL) &&
                  has_line(said, "exit: ", "start", NULL),
              "exit says in one line that it gave up on the start: %s",
              said);
    else
        CHECK(strstr(said, "exit: ") == NULL,
              "exit, whose wait the start did not outlast, says nothing: "
              "%s", said);
    scenario_child_end();
}

static void check_gave_up(void)
{
    check_after_start(true);
}

static void check_waited(void)
{
    check_after_start(false);
}

/* The first defer call starts cudefer on another thread, held in its
 * cudaGetDeviceCount for hold; exit meanwhile, then running after
 * cudefer's exit handler. */
static void exit_during_start(unsigned hold, void (*then)(void))
{
    atexit(then); /* before cudefer's: run after it */
    hold_ms = hold;
    fake_set_return_hook(FAKE_GET_DEVICE_COUNT, hold_device_count, NULL);
    void *p = device_alloc(4096);
    pthread_create(&caller, NULL, first_call, p);
    for (int i = 0; i < 5000 && fake_calls(FAKE_GET_DEVICE_COUNT) == 0; i++)
        sleep_ms(1);
    CHECK(fake_calls(FAKE_GET_DEVICE_COUNT) == 1, "the start is under way");
    sleep_ms(50); /* in the hook, life_lock held */
    stderr_capture_begin();
    exit(0);
}

static void exit_past_start(void)
{
    exit_during_start(2500, check_gave_up); /* the drain gives up at 2 s */
}

static void exit_within_start(void)
{
    exit_during_start(500, check_waited);
}

int main(void)
{
    plan(2);
    fork_scenario("exit gives up on a first call's start held past its "
                  "drain: said; the start, refused, starts no reclaimer "
                  "and makes no CUDA call", "", 1, 20000, exit_past_start);
    fork_scenario("exit waits for a first call's start held within its "
                  "drain: the start, refused, starts no reclaimer and "
                  "makes no CUDA call", "", 1, 20000, exit_within_start);
    return 0;
}
