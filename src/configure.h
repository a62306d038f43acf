/* SPDX-License-Identifier: MIT */
/*
 * defer_configure and the configuration's life: what the application gave
 * before the start, settled with the environment on top at the start (the
 * values in force from then on), and refused once started or shut down.
 * The knobs, their parsing and validation are config.h's.
 */
#ifndef CUDEFER_CONFIGURE_H
#define CUDEFER_CONFIGURE_H

#include "cudefer.h"

/* The reclaimer, when it starts (any thread, any number of times).  The first
 * call settles the configuration in force: the one given to defer_configure
 * (or the defaults), then the environment on top, printed when verbose; from
 * then on defer_configure is refused (but after configure_start_failed).
 * Every call copies it into *out. */
void configure_at_start(struct defer_config *out);

/* Any thread, under the lifecycle's start lock, after configure_at_start:
 * the start failed (nothing of it stays), so defer_configure is accepted
 * again until the next start settles the configuration anew (the
 * environment read again, printed again when verbose). */
void configure_start_failed(void);

/* Any thread (defer_shutdown, when nothing was started).  From then on
 * defer_configure returns cudaErrorNotPermitted: nothing will use it. */
void configure_refuse_from_now(void);

/* Fork child only, from the library's one fork handler
 * (lifecycle_hooks.c): the configuration lock made usable again (its
 * holder may not exist there). */
void configure_fork_child(void);

#endif
