/* SPDX-License-Identifier: MIT */
/* The ABI that can grow (cudefer.h, "Structs that grow"): a caller whose
 * struct defer_stats or struct defer_config is smaller than the library's
 * (built against an older header) gets no byte written past its struct and
 * its missing knobs take their defaults.  Callers are simulated with local
 * copies of cudefer 0.1.0's structs, and of this header's struct less its
 * last counter, at the start of canary-filled buffers. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

/* cudefer 0.1.0's structs, as that release's include/cudefer.h declared
 * them. */
struct defer_config_0_1_0 {
    uint32_t poll_us;
    uint32_t poll_max_us;
    uint32_t idle_us;
    uint64_t max_pending_bytes;
    uint32_t max_delay_ms;
    enum defer_policy policy;
    uint32_t event_pool_max;
    int disable;
    int verbose;
    int print_stats;
    int check;
};

struct defer_stats_0_1_0 {
    uint64_t deferred, released, pending, failed, rejected, sync_releases,
        event_queries, wakeups, batches, largest_batch, events_created,
        events_in_pool, held, held_bytes, idle_releases, cap_releases,
        age_releases, demand_releases, latency_p50_us, latency_max_us,
        leaked_at_exit, reused;
};

/* Where each struct's fields end (the 0.1.0 config has 4 bytes of tail
 * padding, which the library must not touch either). */
#define CONFIG_0_1_0_END                                 \
    (offsetof(struct defer_config_0_1_0, check) + sizeof(int))
#define STATS_0_1_0_END sizeof(struct defer_stats_0_1_0)
/* This header's defer_stats without its last counter: a program built
 * against it, running with this library (one counter more). */
#define STATS_ONE_LESS (sizeof(struct defer_stats) - sizeof(uint64_t))

#define CANARY 0xA5
#define ROOM 64 /* canary bytes past the largest struct tried */

static _Alignas(8) unsigned char buf[sizeof(struct defer_stats) + ROOM];
static _Alignas(8) unsigned char cbuf[sizeof(struct defer_config) + ROOM];

/* Fill b with the canary; returns b. */
static void *canary_fill(unsigned char *b, size_t len)
{
    memset(b, CANARY, len);
    return b;
}

/* True when b[from, len) is all canary. */
static bool canary_intact(const unsigned char *b, size_t from, size_t len)
{
    for (size_t i = from; i < len; i++) {
        if (b[i] != CANARY) {
            diag("byte %zu was written (0x%02x)", i, b[i]);
            return false;
        }
    }
    return true;
}

/* True when b[from, to) is all zero. */
static bool zeroed(const unsigned char *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        if (b[i] != 0)
            return false;
    }
    return true;
}

/* n buffers deferred on one stream and released: known counters. */
static void make_traffic(unsigned n)
{
    cudaStream_t s = stream_new();
    for (unsigned i = 0; i < n; i++) {
        void *p = device_alloc(4096);
        if (defer_free(p, s) != cudaSuccess)
            bail("defer_free failed");
    }
    if (defer_flush() != cudaSuccess)
        bail("defer_flush failed");
}

static void test_stats(void)
{
    struct defer_stats full;
    defer_stats_get(&full); /* the header's macro: this header's size */
    is_int((long long)full.deferred, 7, "the macro: deferred counted");
    is_int((long long)full.released, 7, "the macro: released counted");

    struct defer_stats_0_1_0 *old = canary_fill(buf, sizeof buf);
    defer_stats_get_sized((struct defer_stats *)old, sizeof *old);
    ok(canary_intact(buf, STATS_0_1_0_END, sizeof buf),
       "sized, a 0.1.0 struct: nothing written past it");
    is_int((long long)old->deferred, 7, "... its deferred is right");
    is_int((long long)old->pending, 0, "... its pending (a gauge) is right");
    ok(old->reused == full.reused && old->demand_releases ==
       full.demand_releases, "... its last fields are right");

    old = canary_fill(buf, sizeof buf);
    (defer_stats_get)((struct defer_stats *)old);
    ok(canary_intact(buf, STATS_0_1_0_END, sizeof buf),
       "the 0.1.0 symbol: nothing written past 0.1.0's struct");
    ok(old->deferred == 7 && old->released == 7 && old->reused == full.reused,
       "... and its fields are written");

    struct defer_stats *less = canary_fill(buf, sizeof buf);
    defer_stats_get_sized(less, STATS_ONE_LESS);
    ok(canary_intact(buf, STATS_ONE_LESS, sizeof buf),
       "sized, this header less a counter: nothing written past it");
    is_int((long long)less->deferred, 7, "... and its fields are written");

    /* A program built against a later header: the counters this library
     * does not keep read 0, and nothing past the caller's size is written. */
    size_t later = sizeof(struct defer_stats) + 2 * sizeof(uint64_t);
    struct defer_stats *more = canary_fill(buf, sizeof buf);
    defer_stats_get_sized(more, later);
    ok(zeroed(buf, sizeof(struct defer_stats), later),
       "sized, a later header: the unknown counters read 0");
    ok(canary_intact(buf, later, sizeof buf), "... and no byte more");
    is_int((long long)more->cache_releases, (long long)full.cache_releases,
           "... the known ones are written");

    canary_fill(buf, sizeof buf);
    stderr_capture_begin();
    defer_stats_get_sized((struct defer_stats *)buf, STATS_0_1_0_END - 8);
    const char *msg = stderr_capture_end();
    ok(canary_intact(buf, 0, sizeof buf),
       "a size below 0.1.0's struct: nothing written");
    char want[160];
    snprintf(want, sizeof want, "cudefer: defer_stats_get_sized: size %zu is "
             "smaller than any struct defer_stats (%zu bytes in cudefer "
             "0.1.0): nothing written\n", STATS_0_1_0_END - 8, STATS_0_1_0_END);
    is_str(msg, want, "... and reported");
    stderr_capture_begin();
    defer_stats_get_sized(NULL, sizeof(struct defer_stats));
    msg = stderr_capture_end();
    is_str(msg, "", "a NULL out does nothing, silently");
}

static void test_config_defaults(void)
{
    struct defer_config want;
    defer_config_defaults_sized(&want, sizeof want);

    struct defer_config_0_1_0 *old = canary_fill(cbuf, sizeof cbuf);
    defer_config_defaults_sized((struct defer_config *)old, CONFIG_0_1_0_END);
    ok(canary_intact(cbuf, CONFIG_0_1_0_END, sizeof cbuf),
       "defaults, sized to 0.1.0's fields: nothing written past check");
    ok(memcmp(old, &want, CONFIG_0_1_0_END) == 0,
       "... and 0.1.0's fields hold the defaults");

    old = canary_fill(cbuf, sizeof cbuf);
    (defer_config_defaults)((struct defer_config *)old);
    ok(canary_intact(cbuf, CONFIG_0_1_0_END, sizeof cbuf),
       "the 0.1.0 symbol: nothing written past check");
    ok(memcmp(old, &want, CONFIG_0_1_0_END) == 0,
       "... and 0.1.0's fields hold the defaults");

    struct defer_config *cfg = canary_fill(cbuf, sizeof cbuf);
    defer_config_defaults(cfg);
    ok(canary_intact(cbuf, sizeof *cfg, sizeof cbuf) &&
       cfg->cache_keep_ms == 10000 && cfg->poll_us == 50,
       "the macro fills this header's struct, and no byte more");

    canary_fill(cbuf, sizeof cbuf);
    stderr_capture_begin();
    defer_config_defaults_sized((struct defer_config *)cbuf, 8);
    const char *msg = stderr_capture_end();
    ok(canary_intact(cbuf, 0, sizeof cbuf),
       "defaults with a size below 0.1.0's fields: nothing written");
    ok(strstr(msg, "cudefer: defer_config_defaults_sized: size 8 is smaller "
                   "than any struct defer_config") != NULL,
       "... and reported: %s", msg);
}

/* A 0.1.0 struct with the defaults, poll_us set, and 0xff bytes past its
 * fields (where cache_keep_ms would be read: out of range). */
static struct defer_config *old_config_with_garbage(uint32_t poll_us)
{
    memset(cbuf, 0xff, sizeof cbuf);
    struct defer_config_0_1_0 *old = (struct defer_config_0_1_0 *)cbuf;
    (defer_config_defaults)((struct defer_config *)old);
    old->poll_us = poll_us;
    return (struct defer_config *)cbuf;
}

static void test_configure(void)
{
    /* Not vacuous: read at this header's size, the garbage is refused. */
    stderr_capture_begin();
    cudaError_t err = defer_configure_sized(old_config_with_garbage(20),
                                            sizeof(struct defer_config));
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue,
           "full size: the bytes past 0.1.0's fields are read (refused)");
    ok(strstr(msg, "cache_keep_ms is 4294967295") != NULL, "... as %s", msg);

    is_int(defer_configure_sized(old_config_with_garbage(20),
                                 CONFIG_0_1_0_END),
           cudaSuccess, "sized to 0.1.0's fields: the bytes past are not read");
    /* A program built against a later header: knobs this library does
     * not know (0xff past its struct) are ignored. */
    memset(cbuf, 0xff, sizeof cbuf);
    defer_config_defaults((struct defer_config *)cbuf);
    is_int(defer_configure_sized((struct defer_config *)cbuf,
                                 sizeof(struct defer_config) + ROOM / 2),
           cudaSuccess, "a later header's size: its unknown knobs ignored");

    stderr_capture_begin();
    err = defer_configure_sized(old_config_with_garbage(20),
                                CONFIG_0_1_0_END - 1);
    msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "a size below 0.1.0's fields refused");
    /* Only a direct call passes a size (the macro passes sizeof, the
     * 0.1.0 symbol 0.1.0's): the line names the call made, as
     * defer_config_defaults_sized's and defer_stats_get_sized's do. */
    ok(strstr(msg, "cudefer: defer_configure_sized: size ") != NULL &&
       strstr(msg, "is smaller than any struct defer_config") != NULL,
       "... and reported, naming defer_configure_sized: %s", msg);

    /* The last accepted configuration is the one in force: the 0.1.0
     * symbol's, with cache_keep_ms at its default although 0xff follows. */
    is_int((defer_configure)(old_config_with_garbage(30)), cudaSuccess,
           "the 0.1.0 symbol: the bytes past check are not read");

    setenv("CUDEFER_VERBOSE", "1", 1);
    cudaStream_t s = stream_new();
    void *p = device_alloc(4096);
    stderr_capture_begin();
    err = defer_free(p, s);
    const char *text = stderr_capture_end();
    unsetenv("CUDEFER_VERBOSE");
    is_int(err, cudaSuccess, "the first defer_free starts the reclaimer");
    ok(strstr(text, "cudefer: CUDEFER_POLL_US=30us\n") != NULL,
       "the 0.1.0 caller's poll_us is in force");
    ok(strstr(text, "cudefer: CUDEFER_CACHE_KEEP_MS=10s\n") != NULL,
       "the knob its struct lacks has its default");
    ok(wait_released(p, 10000), "the buffer is released");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    test_config_defaults();
    test_configure(); /* before any defer call: it starts the reclaimer */
    make_traffic(6);
    test_stats();
    return defer_shutdown() == cudaSuccess ? 0 : 1;
}
