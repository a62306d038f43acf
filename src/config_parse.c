/* SPDX-License-Identifier: MIT */
/* The syntax of a CUDEFER_* value (config_parse.h): trimming, digits,
 * durations with a time unit, sizes with a binary multiple, counts,
 * switches and policy names, each read whole and within bounds or refused
 * with the reason; and the tables of policy names and time units that
 * config.c's formatters spell values with.  No state, no lock. */
#include "config_parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const policy_names[] = {
    [DEFER_POLICY_BATCHED] = "batched",
    [DEFER_POLICY_EAGER] = "eager",
};
#define NPOLICIES (sizeof policy_names / sizeof *policy_names)
_Static_assert(NPOLICIES == CONFIG_PARSE_NPOLICIES, "policy names");

/* The time units, in any case (config_parse.h, the README, cudefer(7)). */
static const struct {
    const char *suffix;
    uint64_t us;
} time_units[] = {
    {"us", 1}, {"ms", 1000}, {"s", 1000000}, {"min", 60000000},
    {"h", UINT64_C(3600000000)},
};
#define NTIME_UNITS (sizeof time_units / sizeof *time_units)

/* Any thread; never blocks.  The name of policy i, or NULL: see
 * config_parse.h. */
const char *config_parse_policy_word(uint64_t i)
{
    return i < NPOLICIES ? policy_names[i] : NULL;
}

/* Any thread; never blocks.  Time unit i, or false past the last: see
 * config_parse.h. */
bool config_parse_time_unit(size_t i, const char **suffix, uint64_t *us)
{
    if (i >= NTIME_UNITS)
        return false;
    *suffix = time_units[i].suffix;
    *us = time_units[i].us;
    return true;
}

/* Any thread; never blocks.  text without the blanks around it, in buf
 * (len bytes); NULL when that is longer than any value cudefer takes (then
 * no value is understood). */
const char *config_parse_trim(const char *text, char *buf, size_t len)
{
    while (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r')
        text++;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t' ||
                     text[n - 1] == '\n' || text[n - 1] == '\r'))
        n--;
    if (n >= len)
        return NULL;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return buf;
}

/* The leading digits of text into *value, *end just after them.  False when
 * text does not start with a digit (strtoull would skip blanks and take a
 * sign); *huge when they overflow 64 bits (*value is then UINT64_MAX). */
static bool parse_digits(const char *text, uint64_t *value, const char **end,
                         bool *huge)
{
    if (text[0] < '0' || text[0] > '9')
        return false;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(text, &e, 10);
    *huge = errno == ERANGE;
    *value = v;
    *end = e;
    return true;
}

/* value * scale within [min, max] into *out; a product past 64 bits is out
 * of range. */
static enum config_parse_result scale_within(uint64_t value, uint64_t scale,
                                             uint64_t min, uint64_t max,
                                             uint64_t *out)
{
    if (value > UINT64_MAX / scale)
        return CONFIG_PARSE_OUT_OF_RANGE;
    value *= scale;
    if (value < min || value > max)
        return CONFIG_PARSE_OUT_OF_RANGE;
    *out = value;
    return CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  A duration counted in units of base_us
 * microseconds: digits alone (in that unit), or digits and a time unit, a
 * whole number of the base.  Returns CONFIG_PARSE_OK or why not. */
enum config_parse_result config_parse_duration(const char *text,
                                               uint64_t base_us, uint64_t min,
                                               uint64_t max, uint64_t *out)
{
    uint64_t value;
    const char *end;
    bool huge;
    if (!parse_digits(text, &value, &end, &huge))
        return CONFIG_PARSE_NOT_UNDERSTOOD;
    uint64_t unit_us = base_us;
    if (*end != '\0') {
        size_t i = 0;
        while (i < NTIME_UNITS && strcasecmp(end, time_units[i].suffix) != 0)
            i++;
        if (i == NTIME_UNITS)
            return CONFIG_PARSE_NOT_UNDERSTOOD;
        unit_us = time_units[i].us;
    }
    if (huge)
        return CONFIG_PARSE_OUT_OF_RANGE;
    if (unit_us >= base_us)
        return scale_within(value, unit_us / base_us, min, max, out);
    /* A finer unit than the knob's ("us" for milliseconds). */
    if (value % (base_us / unit_us) != 0)
        return CONFIG_PARSE_NOT_WHOLE;
    return scale_within(value / (base_us / unit_us), 1, min, max, out);
}

/* The multiple of a size suffix into *scale: an optional k, M, G, T or P
 * (any case), then an optional "B", or "iB" after a multiple (any case).
 * False if not one. */
static bool size_scale(const char *suffix, uint64_t *scale)
{
    static const char letters[] = "kmgtp";
    const char *hit = suffix[0] != '\0'
                          ? strchr(letters, tolower((unsigned char)suffix[0]))
                          : NULL;
    *scale = 1;
    if (hit != NULL) {
        *scale = UINT64_C(1) << (10 * (hit - letters + 1));
        suffix++;
        if (strcasecmp(suffix, "iB") == 0)
            return true;
    }
    return suffix[0] == '\0' || strcasecmp(suffix, "B") == 0;
}

/* Any thread; never blocks.  Bytes within [min, max].  Returns
 * CONFIG_PARSE_OK or why not. */
enum config_parse_result config_parse_size_within(const char *text,
                                                  uint64_t min, uint64_t max,
                                                  uint64_t *out)
{
    uint64_t value, scale;
    const char *end;
    bool huge;
    if (!parse_digits(text, &value, &end, &huge) || !size_scale(end, &scale))
        return CONFIG_PARSE_NOT_UNDERSTOOD;
    return huge ? CONFIG_PARSE_OUT_OF_RANGE
                : scale_within(value, scale, min, max, out);
}

/* Any thread; never blocks.  A plain number within [min, max].  Returns
 * CONFIG_PARSE_OK or why not. */
enum config_parse_result config_parse_count(const char *text, uint64_t min,
                                            uint64_t max, uint64_t *out)
{
    uint64_t value;
    const char *end;
    bool huge;
    if (!parse_digits(text, &value, &end, &huge) || *end != '\0')
        return CONFIG_PARSE_NOT_UNDERSTOOD;
    return huge ? CONFIG_PARSE_OUT_OF_RANGE
                : scale_within(value, 1, min, max, out);
}

/* Any thread; never blocks.  A switch: the number 0 or 1 ("01" too), or a
 * word of words (any case).  Returns CONFIG_PARSE_OK or
 * CONFIG_PARSE_NOT_UNDERSTOOD. */
enum config_parse_result config_parse_switch(const char *text, bool *out)
{
    static const char *const words[][2] = {
        {"false", "true"}, {"no", "yes"}, {"off", "on"},
    };
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        for (int v = 0; v < 2; v++) {
            if (strcasecmp(text, words[i][v]) == 0) {
                *out = v;
                return CONFIG_PARSE_OK;
            }
        }
    }
    uint64_t value;
    if (config_parse_count(text, 0, 1, &value) != CONFIG_PARSE_OK)
        return CONFIG_PARSE_NOT_UNDERSTOOD;
    *out = value == 1;
    return CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  A policy's name, in any case.  Returns
 * CONFIG_PARSE_OK or CONFIG_PARSE_NOT_UNDERSTOOD. */
enum config_parse_result config_parse_policy_name(const char *text,
                                                  enum defer_policy *out)
{
    for (size_t i = 0; i < NPOLICIES; i++) {
        if (strcasecmp(text, policy_names[i]) == 0) {
            *out = (enum defer_policy)i;
            return CONFIG_PARSE_OK;
        }
    }
    return CONFIG_PARSE_NOT_UNDERSTOOD;
}

/* Any thread; never blocks.  True with microseconds in *out: see
 * config_parse.h. */
bool config_parse_duration_us(const char *text, uint64_t min_us,
                              uint64_t max_us, uint64_t *out)
{
    char buf[64];
    const char *t = config_parse_trim(text, buf, sizeof buf);
    return t != NULL && config_parse_duration(t, 1, min_us, max_us, out) ==
                            CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  True with milliseconds in *out: see
 * config_parse.h. */
bool config_parse_duration_ms(const char *text, uint64_t min_ms,
                              uint64_t max_ms, uint64_t *out)
{
    char buf[64];
    const char *t = config_parse_trim(text, buf, sizeof buf);
    return t != NULL && config_parse_duration(t, 1000, min_ms, max_ms, out) ==
                            CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  True with bytes in [0, max] in *out; overflow
 * refused. */
bool config_parse_size(const char *text, uint64_t max, uint64_t *out)
{
    char buf[64];
    const char *t = config_parse_trim(text, buf, sizeof buf);
    return t != NULL && config_parse_size_within(t, 0, max, out) ==
                            CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  True with the switch in *out. */
bool config_parse_bool(const char *text, bool *out)
{
    char buf[64];
    const char *t = config_parse_trim(text, buf, sizeof buf);
    return t != NULL && config_parse_switch(t, out) == CONFIG_PARSE_OK;
}

/* Any thread; never blocks.  True with the policy named (any case) in
 * *out. */
bool config_parse_policy(const char *text, enum defer_policy *out)
{
    char buf[64];
    const char *t = config_parse_trim(text, buf, sizeof buf);
    return t != NULL && config_parse_policy_name(t, out) == CONFIG_PARSE_OK;
}

/* Any thread; never blocks (config_parse.h). */
size_t config_parse_distance(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b), row[64];
    if (n >= 64 || m >= 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[m];
}
