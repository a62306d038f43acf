/* SPDX-License-Identifier: MIT */
/* defer_configure and the configuration in force (configure.h). */
#include "configure.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "config.h"
#include "report.h"
#include "stats.h"

static struct {
    pthread_mutex_t lock;
    bool configured;              /* defer_configure stored app */
    bool started; /* in_force settled by a start that succeeded or is under
                     way: too late to configure */
    bool shut_down;               /* defer_shutdown came first: never starts */
    bool said; /* a start settled in_force and said what it found (in
                  in_force, kept though the start failed) */
    struct defer_config app;      /* from defer_configure */
    struct defer_config in_force; /* app or defaults, then the environment */
} state = {.lock = PTHREAD_MUTEX_INITIALIZER};

void configure_fork_child(void)
{
    pthread_mutex_init(&state.lock, NULL);
}

/* Take state.lock (a fork child gets it unlocked: configure_fork_child). */
static void state_lock(void)
{
    pthread_mutex_lock(&state.lock);
}

/* state.lock held.  The first start: settle in_force, once (again after a
 * start that failed).  What the environment holds is said (its invalid
 * values, unknown names, CUDEFER_VERBOSE's print) at the first settle, and
 * at a later one only if it settles other values: a program that calls on
 * while every start fails (no GPU) hears the start's failure each time,
 * not the same warnings with it. */
static void settle_locked(void)
{
    struct defer_config cfg;
    if (state.configured)
        cfg = state.app;
    else
        config_defaults(&cfg);
    struct defer_config base = cfg;
    config_load_env_quietly(&cfg);
    if (!state.said || !config_equal(&cfg, &state.in_force)) {
        cfg = base;
        config_load_env(&cfg);
        if (cfg.verbose)
            config_print(&cfg, stderr);
    }
    state.in_force = cfg;
    state.said = true;
    state.started = true;
}

/* The reclaimer's start-up, any number of times.  Returns nothing: the
 * configuration in force is copied into *out. */
void configure_at_start(struct defer_config *out)
{
    state_lock();
    if (!state.started)
        settle_locked();
    *out = state.in_force;
    pthread_mutex_unlock(&state.lock);
}

/* A start that failed: the configuration is open again (defer_configure
 * accepted), and the next start settles it anew. */
void configure_start_failed(void)
{
    state_lock();
    state.started = false;
    pthread_mutex_unlock(&state.lock);
}

/* defer_shutdown before any start: from now on defer_configure is refused
 * (the reclaimer will never start to use it). */
void configure_refuse_from_now(void)
{
    state_lock();
    state.shut_down = true;
    pthread_mutex_unlock(&state.lock);
}

/* Public, any thread, before the first call that defers, allocates or
 * records, or defer_peer_access; never blocks on the GPU.
 * *cfg is size bytes (the knobs that do not fit take their defaults).
 * Returns cudaSuccess, or the first that applies: cudaErrorInvalidValue for
 * NULL or a size below 0.1.0's fields, cudaErrorNotPermitted once started or
 * after defer_shutdown, cudaErrorInvalidValue when out of range; each
 * reported. */
cudaError_t defer_configure_sized(const struct defer_config *cfg, size_t size)
{
    if (cfg == NULL) {
        stats_add(&stats.rejected, 1);
        report("defer_configure: cfg is NULL: ignored");
        return cudaErrorInvalidValue;
    }
    if (size < CONFIG_END_0_1_0) {
        stats_add(&stats.rejected, 1);
        report("defer_configure_sized: size %zu is smaller than any struct "
               "defer_config (%zu bytes in cudefer 0.1.0): ignored",
               size, (size_t)CONFIG_END_0_1_0);
        return cudaErrorInvalidValue;
    }
    struct defer_config full;
    config_from_caller(&full, cfg, size);
    char why[256];
    bool valid = config_validate(&full, why, sizeof why);
    state_lock();
    bool started = state.started, shut_down = state.shut_down;
    if (!started && !shut_down && valid) {
        state.app = full;
        state.configured = true;
    }
    pthread_mutex_unlock(&state.lock);
    if (started || shut_down || !valid)
        stats_add(&stats.rejected, 1);
    if (started) {
        report("defer_configure called after cudefer started (at the first "
               "call that defers, allocates or records, or defer_peer_access): "
               "ignored");
        return cudaErrorNotPermitted;
    }
    if (shut_down) {
        report("defer_configure called after defer_shutdown: ignored");
        return cudaErrorNotPermitted;
    }
    if (!valid) {
        report("defer_configure: %s", why);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

/* Public, any thread: cudefer 0.1.0's symbol (programs built against it,
 * callers that bypass the header's macro).  Reads 0.1.0's fields only; the
 * later knobs take their defaults.  Returns as defer_configure_sized. */
cudaError_t (defer_configure)(const struct defer_config *cfg)
{
    return defer_configure_sized(cfg, CONFIG_END_0_1_0);
}
