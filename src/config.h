/* SPDX-License-Identifier: MIT */
/*
 * Configuration: the built-in defaults, the application's defer_configure,
 * the CUDEFER_* environment variables on top, and the values in force.  The
 * environment is read once, when the reclaimer starts (configure.h).
 */
#ifndef CUDEFER_CONFIG_H
#define CUDEFER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cudefer.h"

/* Any thread.  Fills *cfg with the built-in defaults (the public
 * defer_config_defaults does the same). */
void config_defaults(struct defer_config *cfg);

/* Any thread.  Overrides fields of *cfg from the CUDEFER_* environment.  A
 * variable set to nothing (or blanks only) counts as unset.  Each invalid
 * value is reported on stderr, one line naming the variable, the value, the
 * values it takes and the value kept ("cudefer: CUDEFER_POLL_US="5s" is out
 * of range: expected 1us..1s (...); using the default 50us"), and leaves
 * that field unchanged.  Then a poll_max_us below poll_us is reported and
 * raised to poll_us (not counted as invalid).  Returns the number of
 * invalid values. */
int config_load_env(struct defer_config *cfg);

/* Any thread.  As config_load_env, saying nothing. */
int config_load_env_quietly(struct defer_config *cfg);

/* Any thread.  Whether every knob of a and b has the same value. */
bool config_equal(const struct defer_config *a, const struct defer_config *b);

/* Any thread.  True when every field of *cfg is within its range, the policy
 * is known, the booleans are 0 or 1 and poll_max_us >= poll_us; otherwise
 * false with the first problem written to why (len bytes, NUL-terminated;
 * nothing printed). */
bool config_validate(const struct defer_config *cfg, char *why, size_t len);

/* Any thread.  Writes the configuration, one "cudefer: CUDEFER_X=value" line
 * per knob, to out. */
void config_print(const struct defer_config *cfg, FILE *out);

/* Any thread.  *full = the defaults, then the value of every knob of the
 * caller's cfg (size bytes, at least 0.1.0's fields: CONFIG_END_0_1_0)
 * whose field fits in size bytes. */
void config_from_caller(struct defer_config *full,
                        const struct defer_config *cfg, size_t size);

/* Where the fields of cudefer 0.1.0's struct defer_config end (check was
 * its last): the plain 0.1.0 symbols read and write no further, and a
 * smaller size is refused.  (0.1.0's sizeof is larger: cache_keep_ms went
 * into its tail padding, which is why the end of the fields is used.)  A new
 * knob goes at the end of struct defer_config, at or past the sizeof of the
 * last release's struct (add an explicit padding field if need be): the
 * size a caller passes must never cover a field lying in its padding. */
#define CONFIG_END_0_1_0 \
    (offsetof(struct defer_config, check) + sizeof(((struct defer_config *)0)->check))

/* What the documentation says of a knob, as the environment spells it. */
struct config_knob_text {
    const char *name; /* "CUDEFER_POLL_US" */
    char def[48];     /* the default: "50us" */
    char range[96];   /* the values it takes: "1us..1s", "a power of two,
                         1..256", "0/1, false/true, no/yes, off/on" */
    char expected[256]; /* what a refusal says it takes: the range, then how
                           it is written and what 0 means, in brackets */
};

/* Any thread.  Fills *out for knob i (0, 1, ... in the table's order);
 * false past the last. */
bool config_knob_text(size_t i, struct config_knob_text *out);

#endif
