/* SPDX-License-Identifier: MIT */
/* defer_alloc at its limits: sizes no device holds (their rounding
 * must not wrap to a block of 0 bytes, "success" with NULL), and out of memory (the rounded size does not fit but the
 * exact one does; cached blocks are trimmed to make room; the pluggable
 * entry point, whose NULL PyTorch does not check, says so). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

/* How many lines of text start with "cudefer: ". */
static int said_lines(const char *text)
{
    int n = 0;
    for (const char *line = text; line != NULL && *line != '\0';) {
        n += strncmp(line, "cudefer: ", 9) == 0;
        line = strchr(line, '\n');
        line = line != NULL ? line + 1 : NULL;
    }
    return n;
}

static void test_sizes_no_device_holds(cudaStream_t s)
{
    uint64_t rejected = stats_now().rejected;
    void *p = &p;
    stderr_capture_begin();
    cudaError_t huge = defer_alloc(&p, SIZE_MAX, s);
    cudaError_t huge2 = defer_alloc(&p, SIZE_MAX - 100, s);
    ok(strstr(stderr_capture_end(), "more than any device holds") != NULL,
       "said");
    ok(huge == cudaErrorMemoryAllocation && huge2 == huge && p == NULL &&
           stats_now().rejected == rejected + 2,
       "SIZE_MAX and SIZE_MAX - 100 bytes: out of memory, NULL, rejected");
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(SIZE_MAX - 100, 0, s);
    const char *said = stderr_capture_end();
    ok(none == NULL, "defer_pluggable_alloc too: NULL");
    /* One error, one line, in the caller's words. */
    ok(said_lines(said) == 1 &&
           strstr(said, "cudefer: defer_pluggable_alloc: ") == said &&
           strstr(said, "more than any device holds") != NULL &&
           strstr(said, "returning NULL") != NULL,
       "said in one line naming defer_pluggable_alloc, and the NULL (%s)",
       said);
    void *q = &q;
    stderr_capture_begin();
    cudaError_t err = defer_pluggable_alloc_status(&q, SIZE_MAX - 100, 0, s);
    said = stderr_capture_end();
    ok(err == cudaErrorMemoryAllocation && q == NULL,
       "defer_pluggable_alloc_status too: out of memory, NULL");
    ok(said_lines(said) == 1 &&
           strstr(said, "cudefer: defer_pluggable_alloc_status: ") == said,
       "said in one line naming defer_pluggable_alloc_status (%s)", said);
}

/* defer_pluggable_alloc_status's other answers: a block and success; a
 * device that does not exist and a NULL ptr: the error, reported, the
 * current device unchanged. */
static void test_pluggable_status(cudaStream_t s)
{
    void *p = NULL;
    is_int(defer_pluggable_alloc_status(&p, 4096, 0, s), cudaSuccess,
           "defer_pluggable_alloc_status: success");
    ok(p != NULL, "with a block");
    defer_pluggable_free(p, 4096, 0, s);
    void *zero = &zero;
    is_int(defer_pluggable_alloc_status(&zero, 0, 0, s), cudaSuccess,
           "0 bytes: success");
    ok(zero == NULL, "and NULL");
    void *q = &q;
    stderr_capture_begin();
    cudaError_t err = defer_pluggable_alloc_status(&q, 4096, 7, 0);
    const char *said = stderr_capture_end();
    ok(err != cudaSuccess && q == NULL &&
           strstr(said, "cudaSetDevice failed") != NULL &&
           strstr(said, "(device 7)") != NULL,
       "device 7 of 2: %s, NULL, said (%s)", cudaGetErrorName(err), said);
    int current = -1;
    cudaGetDevice(&current);
    is_int(current, 0, "the current device unchanged");
    stderr_capture_begin();
    err = defer_pluggable_alloc_status(NULL, 4096, 0, s);
    said = stderr_capture_end();
    ok(err == cudaErrorInvalidValue && strstr(said, "ptr is NULL") != NULL,
       "a NULL ptr: refused, said");
    /* One error, one line: what failed and that NULL is returned (a
     * second line, "returning NULL", read as a second error before). */
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(4096, 7, 0);
    said = stderr_capture_end();
    ok(none == NULL && said_lines(said) == 1 &&
           has_line(said, "defer_pluggable_alloc: cudaSetDevice failed",
                    "; returning NULL for 4096 bytes on device 7", NULL),
       "defer_pluggable_alloc on device 7: NULL, said in one line (%s)",
       said);

    /* A created stream of device 0 with another device named (7, or 1 of
     * the 2): refused and said, not a block of device 0 (it got one
     * silently before), and counted. */
    for (int device = 7; device >= 1; device -= 6) {
        uint64_t rejected = stats_now().rejected;
        q = &q;
        stderr_capture_begin();
        err = defer_pluggable_alloc_status(&q, 4096, device, s);
        said = stderr_capture_end();
        ok(err == cudaErrorInvalidDevice && q == NULL &&
               strstr(said, "is on device 0: refused") != NULL &&
               stats_now().rejected == rejected + 1,
           "device %d with a stream of device 0: %s, NULL, said, counted",
           device, cudaGetErrorName(err));
    }
    /* A negative device with a created stream: no device, refused and
     * said (a block of the stream's device 0, silently, before), and
     * counted; with the legacy stream too. */
    for (int i = 0; i < 2; i++) {
        uint64_t rejected = stats_now().rejected;
        q = &q;
        stderr_capture_begin();
        err = defer_pluggable_alloc_status(&q, 4096, -1, i == 0 ? s : 0);
        said = stderr_capture_end();
        ok(err == cudaErrorInvalidDevice && q == NULL &&
               strstr(said, "device -1") != NULL &&
               stats_now().rejected == rejected + 1,
           "device -1 with %s: %s, NULL, said, counted",
           i == 0 ? "a created stream" : "the legacy stream",
           cudaGetErrorName(err));
        if (err == cudaSuccess)
            defer_pluggable_free(q, 4096, 0, s);
    }
    /* A free naming a device it cannot switch to, on the legacy stream:
     * freed on the block's own device, the mismatch said (it stayed
     * allocated before). */
    p = NULL;
    alloc_checked(&p, 4096, 0);
    stderr_capture_begin();
    defer_pluggable_free(p, 4096, 7, 0);
    said = stderr_capture_end();
    ok(strstr(said, "stays allocated") == NULL && strstr(said, "device") != NULL,
       "defer_pluggable_free on device 7 of a block of device 0: freed, the "
       "mismatch said (%s)", said);
    void *r = NULL;
    alloc_checked(&r, 4096, 0);
    ok(r == p, "its block serves the next request on the stream");
    defer_free(r, 0);
    cudaGetDevice(&current);
    is_int(current, 0, "the current device unchanged");
}

/* More than the whole device: out of memory at once, without emptying
 * the cache on the way (a hand-back to the pool and a trim gave up every
 * free block before), nothing said. */
static void test_beyond_device(cudaStream_t s)
{
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    void *b = NULL, *p = &p;
    is_int(alloc_checked(&b, 1 << 20, s), cudaSuccess, "a block");
    defer_free(b, s);
    defer_flush();
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, total + 1, s);
    const char *said = stderr_capture_end();
    ok(err == cudaErrorMemoryAllocation && p == NULL && said[0] == '\0',
       "the device's memory + 1 byte: out of memory, NULL, nothing said (%s)",
       said);
    is_int(stats_now().rejected - before.rejected, 1, "counted as rejected");
    ok(fake_is_released(b) == 0 &&
           stats_now().cache_free_bytes == before.cache_free_bytes,
       "the free block stayed in the cache");
    void *c = NULL;
    alloc_checked(&c, 1 << 20, s);
    ok(c == b, "and serves the next request");
    defer_free(c, s);
}

/* An allocation failing otherwise than out of memory: the error, said,
 * counted, the runtime's last error cleared (PyTorch would take it for its
 * next kernel's); and on a device the call switched to, the caller's
 * current device back. */
static void test_other_errors(cudaStream_t s)
{
    struct defer_stats before = stats_now();
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorInvalidValue, 0, 1);
    void *q = &q;
    stderr_capture_begin();
    cudaError_t err = defer_pluggable_alloc_status(&q, 8 << 20, 0, s);
    const char *said = stderr_capture_end();
    ok(err == cudaErrorInvalidValue && q == NULL && said_lines(said) == 1 &&
           strstr(said, "defer_pluggable_alloc_status: allocating a new "
                        "block failed") != NULL,
       "an injected cudaErrorInvalidValue: returned, said naming the call "
       "(%s)", said);
    is_int(stats_now().rejected - before.rejected, 1, "counted as rejected");
    is_int(cudaGetLastError(), cudaSuccess, "the last error cleared");
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorInvalidValue, 0, 1);
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(8 << 20, 0, s);
    said = stderr_capture_end();
    ok(none == NULL && said_lines(said) == 1 &&
           has_line(said, "defer_pluggable_alloc: allocating a new block "
                          "failed",
                    "; returning NULL for 8388608 bytes on device 0", NULL),
       "defer_pluggable_alloc: NULL, what failed and the NULL said in one "
       "line (%s)", said);
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    cudaSetDevice(0);
    stderr_capture_begin();
    err = defer_pluggable_alloc_status(&q, 8 << 20, 1, 0);
    stderr_capture_end();
    int current = -1;
    cudaGetDevice(&current);
    ok(err == cudaErrorMemoryAllocation && current == 0,
       "out of memory on device 1 through the legacy stream: device 0 "
       "current again (%d)", current);
    fake_fail_clear();
}

static void test_out_of_memory(cudaStream_t s)
{
    size_t free_b, total;
    defer_flush();
    defer_trim(NULL); /* nothing cached: the limit below is what is free */
    cudaMemGetInfo(&free_b, &total);
    /* 600 KiB rounds to 608 KiB; only 604 KiB are left. */
    fake_set_device_memory(0, total - free_b + (604 << 10));
    void *p = NULL;
    uint64_t before = stats_now().cache_bytes;
    is_int(defer_alloc(&p, 600 << 10, s), cudaSuccess,
           "the rounded size does not fit, the exact size does");
    is_int(stats_now().cache_bytes - before, 600 << 10, "a block of 600 KiB");
    defer_free(p, s);
    /* Cached free blocks are released to make room. */
    void *big = NULL;
    defer_flush();
    is_int(defer_alloc(&big, 602 << 10, s), cudaSuccess,
           "out of memory: the cache is trimmed, then it fits");
    ok(fake_is_released(p) == 1, "the cached block made room");
    /* Nothing fits: PyTorch does not check the NULL it gets, so the
     * pluggable entry point says so itself. */
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(64 << 10, 0, s);
    const char *said = stderr_capture_end();
    ok(none == NULL && strstr(said, "defer_pluggable_alloc: out of memory "
                                    "for 65536 bytes on device 0") != NULL,
       "defer_pluggable_alloc out of memory: NULL, said");
    /* The status entry point (behind cudefer.torch's allocator, which
     * raises torch.OutOfMemoryError): the error, nothing said. */
    void *q = &q;
    stderr_capture_begin();
    cudaError_t err = defer_pluggable_alloc_status(&q, 64 << 10, 0, s);
    said = stderr_capture_end();
    ok(err == cudaErrorMemoryAllocation && q == NULL && said[0] == '\0',
       "defer_pluggable_alloc_status out of memory: the error, NULL, "
       "nothing said (%s)", said);
    /* 600 bytes: 608 fails twice (before and after the trim); 1024, the
     * size rounded to 512 only, is more and is not tried (it was). */
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    unsigned long tries = fake_entered(FAKE_MALLOC_ASYNC);
    q = NULL;
    is_int(defer_alloc(&q, 600, s), cudaErrorMemoryAllocation,
           "600 bytes, nothing fits: out of memory");
    is_int(fake_entered(FAKE_MALLOC_ASYNC) - tries, 2,
           "608 bytes tried twice, no larger exact size after");
    /* 64 KiB: rounded, it is its exact size: not tried a third time (a
     * mutation test that tried the exact size when equal survived). */
    tries = fake_entered(FAKE_MALLOC_ASYNC);
    is_int(defer_alloc(&q, 64 << 10, s), cudaErrorMemoryAllocation,
           "64 KiB, nothing fits: out of memory");
    is_int(fake_entered(FAKE_MALLOC_ASYNC) - tries, 2,
           "64 KiB tried twice (before and after the trim), not again as "
           "its exact size");
    fake_fail_clear();
    defer_free(big, s);
    fake_set_device_memory(0, total);
}

/* A shutdown between an allocation that ran out of memory and its retry
 * the retry is refused at the gate, said once by the gate and counted once
 * in rejected; the allocation says nothing of its own (not "allocating a
 * new block failed: operation not permitted" too, counted twice), nor does
 * the trim before the retry (not "defer_trim called after defer_shutdown",
 * a call the caller never made).
 * In a child: a shutdown is for good. */
struct slow_request {
    cudaStream_t s;
    void *p;
    cudaError_t err;
};

static void *request_slowly(void *arg)
{
    struct slow_request *r = arg;
    r->err = defer_alloc(&r->p, 8 << 20, r->s);
    return NULL;
}

static void scenario_shutdown_before_retry(void)
{
    size_t free_b, total;
    cudaStream_t s = stream_new();
    void *warm = NULL;
    defer_alloc(&warm, 4096, s); /* the pool and the reclaimer exist */
    defer_free(warm, s);
    cudaMemGetInfo(&free_b, &total);
    fake_set_device_memory(0, total - free_b + (4 << 20)); /* 8 MiB: no */
    fake_set_latency(FAKE_MALLOC_ASYNC, 100000000); /* 100 ms */
    unsigned long entered = fake_entered(FAKE_MALLOC_ASYNC);
    struct slow_request r = {.s = s};
    pthread_t t;
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    pthread_create(&t, NULL, request_slowly, &r);
    for (int i = 0; i < 10000 && fake_entered(FAKE_MALLOC_ASYNC) == entered;
         i++)
        sleep_ms(1);
    cudaError_t shut = defer_shutdown();
    pthread_join(t, NULL);
    const char *said = stderr_capture_end();
    fake_set_latency(FAKE_MALLOC_ASYNC, 0);
    uint64_t counted = stats_now().rejected - rejected;
    int ok_all = warm != NULL && shut == cudaSuccess &&
                 r.err == cudaErrorNotPermitted && r.p == NULL &&
                 said_lines(said) == 1 &&
                 strstr(said, "allocating a new block") == NULL &&
                 strstr(said, "defer_trim") == NULL &&
                 strstr(said, "defer_alloc called after defer_shutdown") !=
                     NULL &&
                 counted == 1;
    if (!ok_all)
        printf("# shutdown %s, request %s, rejected +%llu, said: %s\n",
               cudaGetErrorName(shut), cudaGetErrorName(r.err), ULL(counted),
               said);
    child_end(ok_all ? 0 : 1);
}

/* A new block's size at CUDEFER_ROUND_DIVISIONS (read at start, hence a
 * child each): requests of 1 MiB + 1 and 1000 bytes, the blocks wanted,
 * and what the start says (a refused value: reported, the default kept). */
static struct {
    size_t mib_plus_one, thousand;
    const char *said;
} rounding;

static void scenario_rounding(void)
{
    cudaStream_t s = stream_new();
    const size_t sizes[2] = {((size_t)1 << 20) + 1, 1000};
    const size_t want[2] = {rounding.mib_plus_one, rounding.thousand};
    void *p[2] = {NULL, NULL}; /* both live: no hand-back in between */
    for (int i = 0; i < 2; i++) {
        uint64_t before = stats_now().cache_bytes;
        stderr_capture_begin();
        cudaError_t err = defer_alloc(&p[i], sizes[i], s);
        const char *said = stderr_capture_end();
        uint64_t got = stats_now().cache_bytes - before;
        CHECK(err == cudaSuccess && got == want[i],
              "%zu bytes: a block of %llu, want %zu", sizes[i], ULL(got),
              want[i]);
        CHECK(i > 0 || strcmp(said, rounding.said) == 0,
              "at start, said \"%s\", want \"%s\"", said, rounding.said);
    }
    for (int i = 0; i < 2; i++)
        CHECK(defer_free(p[i], s) == cudaSuccess, "defer_free");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* A device of 48 MiB and CUDEFER_ROUND_DIVISIONS=1: 40 MiB rounds to 64,
 * more than the device holds, so the block is the exact size at once.
 * Not: the 64 MiB try failing, everything cached trimmed, 64 MiB failing
 * again, and only then the exact size. */
static void scenario_coarse_beyond_device(void)
{
    fake_set_device_memory(0, (size_t)48 << 20);
    cudaStream_t s = stream_new();
    void *p = NULL;
    unsigned long tries = fake_entered(FAKE_MALLOC_ASYNC);
    uint64_t before = stats_now().cache_bytes;
    CHECK(defer_alloc(&p, (size_t)40 << 20, s) == cudaSuccess, "40 MiB");
    tries = fake_entered(FAKE_MALLOC_ASYNC) - tries;
    CHECK(tries == 1 && stats_now().cache_bytes - before == (40 << 20),
          "one allocation of 40 MiB (%lu tries, %llu bytes)", tries,
          ULL(stats_now().cache_bytes - before));
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* Out of memory where no cached block can help (the cache is empty) but
 * the release policy holds the application's own memory, deferred and
 * done: defer_alloc's trim releases it, and the retry fits.  (A mutation
 * test that dropped the trim survived the suite: in test_out_of_memory
 * the miss's hand-back of the cached block already made room.) */
static void scenario_trim_releases_held(void)
{
    const size_t MiB = (size_t)1 << 20;
    cudaStream_t s = stream_new();
    void *mine = device_alloc(8 * MiB);
    /* By serial: the block may take its address (FAKE_ADDRESS_REUSE). */
    unsigned long long serial = fake_allocation_serial(mine);
    CHECK(defer_free(mine, s) == cudaSuccess, "defer_free of plain memory");
    /* Its work (none) is done: the policy holds it (no age limit, no idle
     * release, far below the cap). */
    bool held = false;
    for (double until = now_ms() + 10000; !held && now_ms() < until;)
        if (!(held = stats_now().held == 1))
            sleep_ms(1);
    CHECK(held && fake_serial_released(serial) == 0,
          "the completed free is held (held %llu)", ULL(stats_now().held));
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    fake_set_device_memory(0, total - free_b + 4 * MiB); /* 4 MiB left */
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 8 * MiB, s);
    CHECK(err == cudaSuccess && p != NULL,
          "8 MiB with 4 MiB free and 8 MiB held: %s", cudaGetErrorName(err));
    CHECK(fake_serial_released(serial) == 1, "the held memory made room");
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free of the block");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* Out of memory in a defer_call callback, on the reclaimer thread, where
 * no trim can be had (it would wait for the reclaimer itself): out of
 * memory, returned and counted, nothing said, as anywhere else (a refusal
 * of a defer_trim the application never called was said). */
static struct {
    size_t bytes;
    cudaError_t err;
    void *p;
} in_callback;

static void alloc_in_callback(void *arg)
{
    in_callback.p = &in_callback;
    in_callback.err = defer_alloc(&in_callback.p, in_callback.bytes, arg);
}

static void scenario_out_of_memory_in_callback(void)
{
    const size_t MiB = (size_t)1 << 20;
    cudaStream_t s = stream_new();
    void *mine = device_alloc(64 * MiB); /* the device holds 8 MiB */
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    fake_set_device_memory(0, total - free_b + 4 * MiB); /* 4 MiB left */
    in_callback.bytes = 8 * MiB;
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    CHECK(defer_call(alloc_in_callback, s, s) == cudaSuccess, "defer_call");
    cudaError_t flushed = defer_flush();
    const char *said = stderr_capture_end();
    CHECK(flushed == cudaSuccess &&
              in_callback.err == cudaErrorMemoryAllocation &&
              in_callback.p == NULL,
          "8 MiB with 4 MiB free, in a callback: %s, %p",
          cudaGetErrorName(in_callback.err), in_callback.p);
    CHECK(said[0] == '\0', "nothing said (%s)", said);
    CHECK(stats_now().rejected - rejected == 1, "counted as rejected (%llu)",
          ULL(stats_now().rejected - rejected));
    CHECK(cudaFree(mine) == cudaSuccess, "cudaFree");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static void test_rounding_knob(void)
{
    rounding.mib_plus_one = ((size_t)1 << 20) + (32 << 10);
    rounding.thousand = 1024; /* finer than 16 stops at 512-byte steps */
    rounding.said = "";
    fork_scenario("a new block rounded to 32 sizes per power of two",
                  "CUDEFER_ROUND_DIVISIONS=32", 1, 30000, scenario_rounding);
    rounding.mib_plus_one = (size_t)2 << 20;
    rounding.thousand = 1024;
    fork_scenario("a new block rounded to a power of two",
                  "CUDEFER_ROUND_DIVISIONS=1", 1, 30000, scenario_rounding);
    rounding.mib_plus_one = ((size_t)1 << 20) + (64 << 10);
    rounding.thousand = 1024;
    rounding.said = "cudefer: CUDEFER_ROUND_DIVISIONS=\"24\" is not a power "
                    "of two: expected a power of two, 1..256 (a whole "
                    "number); using the default 16\n";
    fork_scenario("a rounding that is no power of two: said, the default "
                  "kept", "CUDEFER_ROUND_DIVISIONS=24", 1, 30000,
                  scenario_rounding);
    fork_scenario("out of memory in a callback: returned, nothing said",
                  "", 1, 30000, scenario_out_of_memory_in_callback);
    fork_scenario("coarse rounding beyond the device: the exact size at once",
                  "CUDEFER_ROUND_DIVISIONS=1", 1, 30000,
                  scenario_coarse_beyond_device);
}

/* defer_pluggable_free refused by defer_free's own checks (here its
 * stream's capture check fails): one error, one line, naming the entry
 * point PyTorch called and saying that the pointer stays allocated;
 * nothing released, the block the caller's to free again. */
static void test_pluggable_free_refused(cudaStream_t s)
{
    void *p = defer_pluggable_alloc(4096, 0, s);
    uint64_t rejected = stats_now().rejected;
    fake_fail(FAKE_STREAM_IS_CAPTURING, cudaErrorUnknown, 0, 1);
    stderr_capture_begin();
    defer_pluggable_free(p, 4096, 0, s);
    const char *said = stderr_capture_end();
    fake_fail_clear();
    char at[32];
    snprintf(at, sizeof at, "%p stays allocated", p);
    ok(p != NULL && said_lines(said) == 1 &&
           strstr(said, "cudefer: defer_pluggable_free: ") == said &&
           strstr(said, "cudaStreamIsCapturing") != NULL &&
           strstr(said, at) != NULL,
       "a refused pluggable free: one line naming defer_pluggable_free, the "
       "failed call and the pointer kept (%s)", said);
    ok(stats_now().rejected == rejected + 1, "counted rejected once");
    defer_pluggable_free(p, 4096, 0, s);
    is_int(defer_flush(), cudaSuccess, "the block freed again: flushed");
}

/* defer_pluggable_free of a block recorded on another stream, into a
 * capture: refused (the graph would not wait for the recorded stream) in
 * one line that says, as every refusal of that call does, that the
 * pointer stays allocated (PyTorch hears no error). */
static void test_pluggable_free_into_capture(cudaStream_t s)
{
    cudaStream_t side = stream_new(), cap = stream_new();
    void *p = defer_pluggable_alloc(4096, 0, s);
    is_int(defer_record_stream(p, side), cudaSuccess, "recorded on side");
    uint64_t rejected = stats_now().rejected;
    cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
    stderr_capture_begin();
    defer_pluggable_free(p, 4096, 0, cap);
    const char *said = stderr_capture_end();
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(cap, &g);
    cudaGraphDestroy(g);
    char at[32];
    snprintf(at, sizeof at, "%p stays allocated", p);
    ok(p != NULL && said_lines(said) == 1 &&
           strstr(said, "cudefer: defer_pluggable_free: ") == said &&
           strstr(said, "capture") != NULL && strstr(said, at) != NULL,
       "a recorded block's pluggable free into a capture: one line naming "
       "defer_pluggable_free and the pointer kept (%s)", said);
    ok(stats_now().rejected == rejected + 1, "counted rejected once");
    defer_pluggable_free(p, 4096, 0, s);
    is_int(defer_flush(), cudaSuccess, "the block freed again: flushed");
    cudaStreamDestroy(cap);
    cudaStreamDestroy(side);
}

/* Out of memory is the return value's alone (cudefer.h): whether a failed
 * allocation found it or no allocation was tried (a size above the device,
 * or above any device), the thread's last error is clear after it, so a
 * caller that handles the error is not told it again by its next
 * cudaGetLastError (PyTorch's launch check).  An error pending before the
 * call goes, as a failed cudaMalloc replaces it.  Before, a size no
 * allocation was tried for left the pending error, one tried for cleared
 * it: the answer hung on a path the caller cannot see. */
static void test_out_of_memory_last_error(cudaStream_t s)
{
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    fake_fail(FAKE_MALLOC_ASYNC, cudaErrorMemoryAllocation, 0, -1);
    fake_fail(FAKE_MALLOC, cudaErrorMemoryAllocation, 0, -1);
    const struct {
        const char *what;
        size_t bytes;
        bool pluggable;
    } cases[] = {
        {"defer_alloc, a failed allocation", 1 << 20, false},
        {"defer_alloc, above the device", total + 1, false},
        {"defer_alloc, above any device", SIZE_MAX, false},
        {"defer_pluggable_alloc_status, a failed allocation", 1 << 20, true},
        {"defer_pluggable_alloc_status, above the device", total + 1, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int pending = 0; pending < 2; pending++) {
            cudaGetLastError();
            if (pending)
                cudaSetDevice(99); /* the application's error, pending */
            void *p = &p;
            stderr_capture_begin();
            cudaError_t err =
                cases[i].pluggable
                    ? defer_pluggable_alloc_status(&p, cases[i].bytes, 0, s)
                    : defer_alloc(&p, cases[i].bytes, s);
            stderr_capture_end();
            cudaError_t last = cudaGetLastError();
            ok(err == cudaErrorMemoryAllocation && p == NULL &&
                   last == cudaSuccess,
               "%s%s: out of memory, the last error clear (%s, last %s)",
               cases[i].what, pending ? ", an error pending before" : "",
               cudaGetErrorName(err), cudaGetErrorName(last));
        }
    }
    cudaSetDevice(99);
    stderr_capture_begin();
    void *none = defer_pluggable_alloc(total + 1, 0, s);
    stderr_capture_end();
    cudaError_t last = cudaGetLastError();
    ok(none == NULL && last == cudaSuccess,
       "defer_pluggable_alloc above the device, an error pending before: "
       "NULL, the last error clear (last %s)", cudaGetErrorName(last));
    fake_fail_clear();
}

int main(void)
{
    plan_lazy();
    /* As t/alloc: no age limit, no idle release. */
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s");
    /* Before this process starts cudefer: the child shuts it down. */
    pid_t pid = fork_flushed();
    if (pid == 0) {
        fake_reset(1);
        scenario_shutdown_before_retry();
    }
    int status = 0;
    ok(wait_child(pid, 20000, &status) && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0,
       "a shutdown before an out-of-memory retry: refused at the gate, "
       "said once");
    test_rounding_knob();
    fork_scenario("out of memory, the policy holding deferred memory: the "
                  "trim releases it, the retry fits",
                  "CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s", 1, 30000,
                  scenario_trim_releases_held);
    fake_reset(2);
    cudaStream_t s = stream_new();
    test_sizes_no_device_holds(s);
    test_pluggable_status(s);
    test_pluggable_free_refused(s);
    test_pluggable_free_into_capture(s);
    test_beyond_device(s);
    test_other_errors(s);
    test_out_of_memory(s);
    test_out_of_memory_last_error(s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "nothing left");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
