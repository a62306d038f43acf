/* SPDX-License-Identifier: MIT */
/* defer_configure through the library: the values given before the first
 * defer call whose start succeeds are the ones the reclaimer starts with
 * (shown by CUDEFER_VERBOSE=1, the environment on top), and a later call is
 * refused; starts that fail say the environment's warnings once.
 * Every refusal, of these calls and of the sized struct calls, is counted
 * in rejected, as every other call's is. */
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static void expect_line(const char *text, const char *line)
{
    ok(strstr(text, line) != NULL, "start-up print has \"%.*s\"",
       (int)strcspn(line, "\n"), line);
}

static uint64_t rejected_now(void)
{
    struct defer_stats st;
    defer_stats_get(&st);
    return st.rejected;
}

/* Refusals before anything started: each said (stderr not checked here:
 * t/unit_config does) and counted once. */
static void test_counted_before_start(void)
{
    struct defer_config cfg;
    uint64_t before = rejected_now();
    stderr_capture_begin();
    cudaError_t null_err = defer_configure(NULL);
    cudaError_t small_err = defer_configure_sized(&cfg, 4);
    defer_config_defaults_sized(&cfg, 4);
    struct defer_stats st;
    defer_stats_get_sized(&st, 4);
    (void)stderr_capture_end();
    is_int(null_err, cudaErrorInvalidValue, "defer_configure(NULL) refused");
    is_int(small_err, cudaErrorInvalidValue,
           "defer_configure_sized of 4 bytes refused");
    is_int((int)(rejected_now() - before), 4,
           "defer_configure(NULL), defer_configure_sized, "
           "defer_config_defaults_sized and defer_stats_get_sized of 4 bytes: "
           "4 counted in rejected");
}

/* Lines of text that contain needle. */
static int lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL;
         at += strlen(needle))
        n++;
    return n;
}

/* Starts that keep failing (no GPU, say) each say their failure, and what
 * the environment holds (an invalid value, a name that is no setting)
 * once: each call repeated the warnings before. */
static void test_failed_starts_say_the_environment_once(void)
{
    setenv("CUDEFER_POLL_US", "5s", 1);
    setenv("CUDEFER_NO_SUCH_KNOB", "1", 1);
    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, 3);
    stderr_capture_begin();
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        failed += defer_alloc(&p, 64, NULL) == cudaErrorNoDevice;
    }
    const char *said = stderr_capture_end();
    fake_fail_clear();
    unsetenv("CUDEFER_POLL_US");
    unsetenv("CUDEFER_NO_SUCH_KNOB");
    is_int(failed, 3, "three calls whose start fails");
    is_int(lines_with(said, "cudaGetDeviceCount failed"), 3,
           "each says its failure");
    is_int(lines_with(said, "CUDEFER_POLL_US=\"5s\" is out of range"), 1,
           "the invalid value is said once");
    is_int(lines_with(said, "CUDEFER_NO_SUCH_KNOB is not a cudefer setting"),
           1, "the unknown name is said once");
}

/* A start that failed (cudaGetDeviceCount) started nothing: defer_configure
 * is still accepted afterwards, and the next start uses what it gave (the
 * start-up print below). */
static void test_failed_start_leaves_it_open(void)
{
    fake_fail(FAKE_GET_DEVICE_COUNT, cudaErrorNoDevice, 0, 1);
    void *p = NULL;
    stderr_capture_begin();
    cudaError_t err = defer_alloc(&p, 64, NULL);
    (void)stderr_capture_end();
    fake_fail_clear();
    is_int(err, cudaErrorNoDevice, "a first call whose start fails");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_counted_before_start();
    test_failed_starts_say_the_environment_once();
    test_failed_start_leaves_it_open();

    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.poll_us = 20;
    cfg.poll_max_us = 400;
    cfg.idle_us = 0;
    cfg.max_pending_bytes = UINT64_C(64) << 20;
    cfg.max_delay_ms = 250;
    cfg.policy = DEFER_POLICY_EAGER;
    cfg.event_pool_max = 8;
    is_int(defer_configure(&cfg), cudaSuccess,
           "defer_configure after a start that failed, before any other "
           "defer call");
    cfg.poll_us = 0;
    uint64_t before = rejected_now();
    stderr_capture_begin();
    cudaError_t err = defer_configure(&cfg);
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "an invalid configuration is refused");
    is_str(msg, "cudefer: defer_configure: poll_us is 0 (expected "
                "microseconds, 1..1000000)\n", "and reported");
    is_int((int)(rejected_now() - before), 1, "and counted in rejected");

    setenv("CUDEFER_VERBOSE", "1", 1);
    setenv("CUDEFER_MAX_DELAY_MS", "2s", 1);
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    stderr_capture_begin();
    err = defer_free(p, s);
    const char *text = stderr_capture_end();
    is_int(err, cudaSuccess, "the first defer_free starts the reclaimer");
    expect_line(text, "cudefer: CUDEFER_POLL_US=20us\n");
    expect_line(text, "cudefer: CUDEFER_POLL_MAX_US=400us\n");
    expect_line(text, "cudefer: CUDEFER_IDLE_US=0us\n");
    expect_line(text, "cudefer: CUDEFER_MAX_PENDING=64M\n");
    expect_line(text, "cudefer: CUDEFER_MAX_DELAY_MS=2s\n");
    expect_line(text, "cudefer: CUDEFER_POLICY=eager\n");
    expect_line(text, "cudefer: CUDEFER_EVENT_POOL=8\n");
    expect_line(text, "cudefer: CUDEFER_VERBOSE=1\n");
    ok(strstr(text, "expected") == NULL, "nothing refused");
    ok(wait_released(p, 10000), "the buffer is released");

    defer_config_defaults(&cfg);
    before = rejected_now();
    stderr_capture_begin();
    err = defer_configure(&cfg);
    msg = stderr_capture_end();
    is_int(err, cudaErrorNotPermitted,
           "defer_configure after the first defer call");
    is_str(msg, "cudefer: defer_configure called after cudefer started (at "
                "the first call that defers, allocates or records, or "
                "defer_peer_access): ignored\n", "is reported");
    is_int((int)(rejected_now() - before), 1, "and counted in rejected");

    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    cudaStreamDestroy(s);
    return 0;
}
