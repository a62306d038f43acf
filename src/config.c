/* Configuration from CUDEFER_* environment variables: each value is parsed in
 * full (the whole string, within bounds) or reported and ignored. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POLL_US_DEFAULT 50u
#define POLL_US_MIN 1u
#define POLL_US_MAX 1000000u

void config_defaults(struct config *cfg)
{
    cfg->poll_us = POLL_US_DEFAULT;
}

/* Multiplier of a time unit suffix, or 0 when it is not one. */
static uint64_t duration_unit_us(const char *unit)
{
    if (*unit == '\0' || strcmp(unit, "us") == 0)
        return 1;
    if (strcmp(unit, "ms") == 0)
        return 1000;
    if (strcmp(unit, "s") == 0)
        return 1000000;
    return 0;
}

bool config_parse_duration_us(const char *text, uint64_t min_us,
                              uint64_t max_us, uint64_t *out)
{
    /* strtoull accepts a sign and leading blanks: only digits may start. */
    if (text[0] < '0' || text[0] > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    uint64_t unit = duration_unit_us(end);
    if (unit == 0 || value > max_us / unit)
        return false;
    uint64_t us = (uint64_t)value * unit;
    if (us < min_us || us > max_us)
        return false;
    *out = us;
    return true;
}

static void report_invalid(const char *name, const char *value,
                           const char *expected)
{
    fprintf(stderr, "cudefer: invalid value for %s: \"%s\" (expected %s)\n",
            name, value, expected);
}

int config_load_env(struct config *cfg)
{
    int invalid = 0;
    const char *value = getenv("CUDEFER_POLL_US");
    if (value != NULL) {
        uint64_t us;
        if (config_parse_duration_us(value, POLL_US_MIN, POLL_US_MAX, &us)) {
            cfg->poll_us = (uint32_t)us;
        } else {
            report_invalid("CUDEFER_POLL_US", value,
                           "microseconds, 1..1000000");
            invalid++;
        }
    }
    return invalid;
}
