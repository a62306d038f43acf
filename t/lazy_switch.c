/* SPDX-License-Identifier: MIT */
/* The pluggable entry points' device switch, with device 1 current and a
 * block of device 0 (src/alloc.c, request_args.h lazy_switch): on the
 * legacy stream the request makes device 0 current only before its first
 * CUDA call.  A free whose batch is sealed records its event on device 0's
 * legacy stream (the fake refuses an event of one device recorded on
 * another's stream) and leaves device 1 current; a seal whose switch fails
 * leaves the batch for the flush; a free after defer_record_stream waits
 * for the recorded stream too.  A switch that fails refuses the free in
 * one line naming defer_pluggable_free and saying the memory stays
 * allocated, counted once in rejected, whether the switch came first (a
 * created handle's special stream, cudaStreamPerThread) or was put off (the
 * legacy stream, on a thread that has not asked for its identity yet); an
 * allocation's the same, saying NULL is returned.  A shutdown during the
 * switch refuses the free at its admission in the line its own check
 * would have said. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

static const size_t KiB = 1024;

/* The calling thread's current device. */
static int current(void)
{
    int d = -1;
    cudaGetDevice(&d);
    return d;
}

/* The lines of text. */
static int lines_of(const char *text)
{
    int n = 0;
    for (; *text != '\0'; text++)
        n += *text == '\n';
    return n;
}

/* Blocks of 256 KiB on device 0's legacy stream, from device 1 through
 * defer_pluggable_alloc, each used by held work there (w). */
static void alloc_used_on_0(void **p, fake_work **w, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = defer_pluggable_alloc(256 * KiB, 0, 0);
        CHECK(p[i] != NULL && current() == 1,
              "a block of device 0 from device 1 (current %d)", current());
        cudaSetDevice(0);
        w[i] = work_held(0, p[i]);
        cudaSetDevice(1);
    }
}

/* A batch (of 2) sealed by a free from device 1: its event is device 0's,
 * recorded on device 0's legacy stream, no synchronous release. */
static void seal_from_other_device(void)
{
    cudaSetDevice(1);
    void *p[2];
    fake_work *w[2];
    alloc_used_on_0(p, w, 2);
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    stderr_capture_begin();
    for (int i = 0; i < 2; i++)
        defer_pluggable_free(p[i], 256 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0', "nothing said");
    CHECK(current() == 1, "device 1 current again (%d)", current());
    CHECK(fake_calls(FAKE_EVENT_RECORD) - records == 1,
          "one event for the batch (%lu)",
          fake_calls(FAKE_EVENT_RECORD) - records);
    CHECK(stats_now().sync_releases == 0, "no synchronous release");
    for (int i = 0; i < 2; i++)
        fake_complete(w[i]);
    CHECK(defer_flush() == cudaSuccess && current() == 1, "flush");
    struct defer_stats st = stats_now();
    CHECK(st.pending == 0 && st.rejected == 0, "nothing pending or refused");
}

/* The seal's switch fails: said once, the free accepted, its batch left
 * for the flush, which seals it on device 0. */
static void seal_switch_fails(void)
{
    cudaSetDevice(1);
    void *p[2];
    fake_work *w[2];
    alloc_used_on_0(p, w, 2);
    defer_pluggable_free(p[0], 256 * KiB, 0, 0);
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    defer_pluggable_free(p[1], 256 * KiB, 0, 0);
    fake_fail_clear();
    const char *said = stderr_capture_end();
    CHECK(lines_of(said) == 1 &&
              has_line(said, "cudaSetDevice", "waits for a later", NULL),
          "the failed seal said in one line");
    CHECK(stats_now().rejected == 0, "the free accepted");
    CHECK(current() == 1, "device 1 current (%d)", current());
    for (int i = 0; i < 2; i++)
        fake_complete(w[i]);
    CHECK(defer_flush() == cudaSuccess && current() == 1, "flush");
    CHECK(stats_now().pending == 0, "both released");
}

/* A block recorded on a created stream of device 0: its free from device
 * 1 waits for both streams and leaves device 1 current. */
static void recorded_from_other_device(void)
{
    cudaSetDevice(0);
    cudaStream_t s0 = stream_new();
    cudaSetDevice(1);
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    fake_work *w = work_held(s0, p);
    CHECK(defer_record_stream(p, s0) == cudaSuccess, "recorded on s0");
    stderr_capture_begin();
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0', "nothing said");
    CHECK(current() == 1, "device 1 current (%d)", current());
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().pending == 0, "released");
}

/* defer_pluggable_free(p, size, 0, stream) on a thread of its own, device
 * 1 current, its first cudaSetDevice failing. */
struct free_args {
    void *p;
    cudaStream_t stream;
};

static void *free_switch_failing(void *arg)
{
    struct free_args *f = arg;
    cudaSetDevice(1);
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    defer_pluggable_free(f->p, 256 * KiB, 0, f->stream);
    fake_fail_clear();
    return NULL;
}

/* A free of p on stream whose switch to device 0 fails: one line naming
 * defer_pluggable_free that says p stays allocated; rejected once. */
static void check_free_refused(void *p, cudaStream_t stream)
{
    uint64_t rejected = stats_now().rejected;
    struct free_args f = {p, stream};
    pthread_t t;
    stderr_capture_begin();
    if (pthread_create(&t, NULL, free_switch_failing, &f) != 0)
        bail("pthread_create");
    pthread_join(t, NULL);
    const char *said = stderr_capture_end();
    CHECK(lines_of(said) == 1, "said in one line (%d)", lines_of(said));
    CHECK(has_line(said, "defer_pluggable_free: cudaSetDevice failed",
                   "stays allocated", NULL),
          "naming defer_pluggable_free and the memory it leaves allocated");
    CHECK(stats_now().rejected == rejected + 1, "counted once in rejected "
          "(%llu)", ULL(stats_now().rejected - rejected));
    CHECK(fake_is_released(p) == 0, "p stays allocated");
}

/* The switch put off (the legacy stream, on a thread that has no identity
 * of it cached: the request's first CUDA call asks the stream). */
static void lazy_free_switch_fails(void)
{
    cudaSetDevice(1);
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    CHECK(p != NULL && current() == 1, "a block of device 0");
    check_free_refused(p, 0);
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess && current() == 1, "a free after it "
          "works");
}

/* The switch made first (cudaStreamPerThread). */
static void per_thread_free_switch_fails(void)
{
    cudaSetDevice(1);
    void *p = defer_pluggable_alloc(256 * KiB, 0, cudaStreamPerThread);
    CHECK(p != NULL && current() == 1, "a block of device 0");
    check_free_refused(p, cudaStreamPerThread);
}

/* An allocation's miss whose switch fails: one line saying NULL is
 * returned; rejected once; device 1 still current. */
static void lazy_alloc_switch_fails(void)
{
    cudaSetDevice(1);
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    CHECK(p != NULL, "a block of device 0");
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, cudaErrorNotPermitted, 0, 1);
    void *q = defer_pluggable_alloc(4096 * KiB, 0, 0); /* a miss */
    fake_fail_clear();
    const char *said = stderr_capture_end();
    CHECK(q == NULL, "NULL");
    CHECK(lines_of(said) == 1 &&
              has_line(said, "defer_pluggable_alloc: cudaSetDevice failed",
                       "returning NULL for 4194304 bytes on device 0", NULL),
          "said in one line");
    CHECK(stats_now().rejected == rejected + 1, "counted once in rejected");
    CHECK(current() == 1, "device 1 current (%d)", current());
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* The hook of the switch's cudaSetDevice: defer_shutdown, once, between
 * defer_pluggable_free's own shutdown check and its admission. */
static void shut_down_in_switch(enum fake_call c, cudaError_t r, void *arg)
{
    (void)c;
    (void)r;
    (void)arg;
    fake_set_return_hook(FAKE_SET_DEVICE, NULL, NULL);
    defer_shutdown();
}

/* A shutdown that closes the gate during the switch (cudaStreamPerThread,
 * switched first): the free refused at its admission in the one line its
 * own check says, naming the memory it leaves allocated. */
static void shutdown_during_switch(void)
{
    cudaSetDevice(1);
    void *p = defer_pluggable_alloc(256 * KiB, 0, cudaStreamPerThread);
    CHECK(p != NULL && current() == 1, "a block of device 0");
    uint64_t rejected = stats_now().rejected;
    fake_set_return_hook(FAKE_SET_DEVICE, shut_down_in_switch, NULL);
    stderr_capture_begin();
    defer_pluggable_free(p, 256 * KiB, 0, cudaStreamPerThread);
    const char *said = stderr_capture_end();
    fake_set_return_hook(FAKE_SET_DEVICE, NULL, NULL);
    char want[160];
    snprintf(want, sizeof want, "cudefer: defer_pluggable_free called after "
             "defer_shutdown: refused; %p stays allocated\n", p);
    CHECK(strcmp(said, want) == 0, "said in one line, naming p (%s)", said);
    CHECK(stats_now().rejected == rejected + 1, "counted once in rejected "
          "(%llu)", ULL(stats_now().rejected - rejected));
    CHECK(fake_is_released(p) == 0, "p stays allocated");
    CHECK(current() == 1, "device 1 current (%d)", current());
}

int main(void)
{
    plan_lazy();
    fork_scenario("a batch sealed from another device records on the "
                  "block's", "CUDEFER_FREE_BATCH=2", 2, 30000,
                  seal_from_other_device);
    fork_scenario("a seal whose switch fails leaves its batch for the flush",
                  "CUDEFER_FREE_BATCH=2", 2, 30000, seal_switch_fails);
    fork_scenario("a free from another device after defer_record_stream",
                  "", 2, 30000, recorded_from_other_device);
    fork_scenario("a put-off switch that fails refuses the free in one line",
                  "", 2, 30000, lazy_free_switch_fails);
    fork_scenario("a first switch that fails refuses the free, counted",
                  "", 2, 30000, per_thread_free_switch_fails);
    fork_scenario("an allocation's put-off switch that fails, in one line",
                  "", 2, 30000, lazy_alloc_switch_fails);
    fork_scenario("a shutdown during the switch: the refusal names the "
                  "memory", "", 2, 30000, shutdown_during_switch);
    return 0;
}
