/* SPDX-License-Identifier: MIT */
/* defer_configure against the lifecycle and the environment: after a
 * defer_shutdown that came before any defer call it is refused (nothing
 * will ever start to use it); after a defer_alloc alone it is refused in
 * words that name what started cudefer, while the calls that start nothing
 * (defer_flush, defer_trim, the counters) leave it taken; defer_peer_access
 * starts cudefer as an allocation does, and the refusal after it says so;
 * and a bad
 * CUDEFER_* value keeps the value given to defer_configure, not the
 * built-in default.
 * Each scenario runs in a child process: the configuration is settled once
 * per process. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "helpers.h"

static void s_configure_after_early_shutdown(void)
{
    CHECK(defer_shutdown() == cudaSuccess, "shutdown before any defer call");
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.poll_us = 20;
    stderr_capture_begin();
    cudaError_t err = defer_configure(&cfg);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_configure after it: %s",
          cudaGetErrorName(err));
    CHECK(strstr(msg, "cudefer: defer_configure called after defer_shutdown: "
                      "ignored") != NULL,
          "the refusal is explained; stderr: %s", msg);
}

/* The first call that allocates starts cudefer as a free does: the
 * refusal says so in words that fit a program that never freed. */
static void s_configure_after_alloc(void)
{
    cudaStream_t s = stream_new();
    void *p = NULL;
    cudaError_t err = defer_alloc(&p, 64, s);
    CHECK(err == cudaSuccess && p != NULL, "defer_alloc: %s",
          cudaGetErrorName(err));
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    stderr_capture_begin();
    err = defer_configure(&cfg);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_configure after it: %s",
          cudaGetErrorName(err));
    CHECK(strcmp(msg, "cudefer: defer_configure called after cudefer "
                      "started (at the first call that defers, allocates "
                      "or records, or defer_peer_access): ignored\n") == 0,
          "the refusal names what started cudefer; stderr: %s", msg);
    CHECK(defer_free(p, s) == cudaSuccess, "defer_free");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* defer_peer_access starts cudefer (it makes the device's memory pool):
 * the refusal after it names it among the calls that start cudefer, in
 * words that fit a program that never deferred, allocated or recorded. */
static void s_configure_after_peer_access(void)
{
    cudaError_t err = defer_peer_access(0, 0);
    CHECK(err == cudaSuccess, "defer_peer_access: %s", cudaGetErrorName(err));
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    stderr_capture_begin();
    err = defer_configure(&cfg);
    const char *msg = stderr_capture_end();
    CHECK(err == cudaErrorNotPermitted, "defer_configure after it: %s",
          cudaGetErrorName(err));
    CHECK(strcmp(msg, "cudefer: defer_configure called after cudefer "
                      "started (at the first call that defers, allocates "
                      "or records, or defer_peer_access): ignored\n") == 0,
          "the refusal names what started cudefer; stderr: %s", msg);
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

/* defer_flush, defer_trim and the counters start nothing: defer_configure
 * after them is still taken. */
static void s_configure_after_calls_that_start_nothing(void)
{
    struct defer_stats st;
    struct defer_device_stats ds;
    size_t bytes = 1;
    CHECK(defer_flush() == cudaSuccess, "defer_flush before any defer call");
    CHECK(defer_trim(&bytes) == cudaSuccess && bytes == 0,
          "defer_trim before any defer call");
    defer_stats_get(&st);
    CHECK(defer_device_stats_get(0, &ds) == cudaSuccess, "device stats");
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.poll_us = 20;
    CHECK(defer_configure(&cfg) == cudaSuccess, "defer_configure after them");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

static void s_bad_env_keeps_configured_value(void)
{
    struct defer_config cfg;
    defer_config_defaults(&cfg);
    cfg.poll_us = 20;
    cfg.max_delay_ms = 250;
    CHECK(defer_configure(&cfg) == cudaSuccess, "defer_configure");
    setenv("CUDEFER_VERBOSE", "1", 1);
    setenv("CUDEFER_POLL_US", "abc", 1);
    setenv("CUDEFER_MAX_DELAY_MS", "-5", 1);
    cudaStream_t s = stream_new();
    void *p = device_alloc(64);
    stderr_capture_begin();
    cudaError_t err = defer_free(p, s);
    const char *text = stderr_capture_end();
    CHECK(err == cudaSuccess, "defer_free: %s", cudaGetErrorName(err));
    CHECK(strstr(text, "cudefer: CUDEFER_POLL_US=\"abc\" is not a duration: "
                       "expected 1us..1s") != NULL &&
              strstr(text, "; using 20us\n") != NULL,
          "the bad CUDEFER_POLL_US is reported, with the value kept");
    CHECK(strstr(text, "cudefer: CUDEFER_POLL_US=20us\n") != NULL,
          "and defer_configure's poll_us (20us, not the default 50us) is "
          "kept");
    CHECK(strstr(text, "cudefer: CUDEFER_MAX_DELAY_MS=250ms\n") != NULL,
          "likewise defer_configure's max_delay_ms (250ms, not 1s)");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    CHECK(fake_is_released(p) == 1, "released");
}

int main(void)
{
    plan_lazy();
    fork_scenario(
        "defer_configure after a defer_shutdown that came before any "
        "defer call: refused",
        "", 1, 15000, s_configure_after_early_shutdown);
    fork_scenario("defer_configure after a defer_alloc alone: refused, naming "
                  "what started cudefer",
                  "", 1, 15000, s_configure_after_alloc);
    fork_scenario("defer_configure after a defer_peer_access alone: refused, "
                  "naming what started cudefer",
                  "", 1, 15000, s_configure_after_peer_access);
    fork_scenario("defer_configure after defer_flush, defer_trim and the "
                  "counters: taken",
                  "", 1, 15000, s_configure_after_calls_that_start_nothing);
    fork_scenario("a bad CUDEFER_* value keeps the defer_configure value", "",
                  1, 15000, s_bad_env_keeps_configured_value);
    return 0;
}
