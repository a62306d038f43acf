/*
 * Configuration: defaults, CUDEFER_* environment variables, and the values in
 * force.  Read once, when the reclaimer starts.
 */
#ifndef CUDEFER_CONFIG_H
#define CUDEFER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

struct config {
    uint32_t poll_us; /* CUDEFER_POLL_US: wait between polls while work is pending */
};

/* Any thread.  The built-in defaults. */
void config_defaults(struct config *cfg);

/* Any thread.  Overrides fields of *cfg from the environment.  Each invalid
 * value is reported on stderr ("cudefer: invalid value for CUDEFER_X: ...")
 * and leaves that field unchanged.  Returns the number of invalid values. */
int config_load_env(struct config *cfg);

/* Any thread.  Parses a whole string as a duration in microseconds: digits
 * with an optional unit "us", "ms" or "s"; true when it is within
 * [min_us, max_us].  Exposed for the tests. */
bool config_parse_duration_us(const char *text, uint64_t min_us,
                              uint64_t max_us, uint64_t *out);

#endif
