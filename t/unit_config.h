/* SPDX-License-Identifier: MIT */
/* What t/unit_config, t/unit_config_report, t/unit_config_docs and
 * t/unit_config_validate share: every CUDEFER_* variable, the field each
 * sets, and the line a refused value is said in (config_knob_text's
 * words). */
#ifndef CUDEFER_T_UNIT_CONFIG_H
#define CUDEFER_T_UNIT_CONFIG_H

#include <stdio.h>
#include <string.h>

#include "config.h"
#include "helpers.h"

static const char *const all_vars[] = {
    "CUDEFER_POLL_US",      "CUDEFER_POLL_MAX_US", "CUDEFER_IDLE_US",
    "CUDEFER_MAX_PENDING",  "CUDEFER_MAX_DELAY_MS", "CUDEFER_POLICY",
    "CUDEFER_EVENT_POOL",   "CUDEFER_DISABLE",     "CUDEFER_VERBOSE",
    "CUDEFER_STATS",        "CUDEFER_CHECK",       "CUDEFER_CACHE_KEEP_MS",
    "CUDEFER_SPLIT_MIN",    "CUDEFER_FREE_BATCH",  "CUDEFER_ROUND_DIVISIONS",
    "CUDEFER_DRIVER_CALLS",
};
#define NVARS (sizeof all_vars / sizeof *all_vars)

/* The field a variable sets, widened. */
static inline uint64_t field_of(const struct defer_config *c,
                                const char *var)
{
    static const struct {
        const char *var;
        size_t offset, size;
    } fields[] = {
#define F(var, f) {var, offsetof(struct defer_config, f), sizeof c->f}
        F("CUDEFER_POLL_US", poll_us),
        F("CUDEFER_POLL_MAX_US", poll_max_us),
        F("CUDEFER_IDLE_US", idle_us),
        F("CUDEFER_MAX_PENDING", max_pending_bytes),
        F("CUDEFER_MAX_DELAY_MS", max_delay_ms),
        F("CUDEFER_POLICY", policy),
        F("CUDEFER_EVENT_POOL", event_pool_max),
        F("CUDEFER_DISABLE", disable),
        F("CUDEFER_VERBOSE", verbose),
        F("CUDEFER_STATS", print_stats),
        F("CUDEFER_CHECK", check),
        F("CUDEFER_CACHE_KEEP_MS", cache_keep_ms),
        F("CUDEFER_SPLIT_MIN", split_min_bytes),
        F("CUDEFER_FREE_BATCH", free_batch),
        F("CUDEFER_ROUND_DIVISIONS", round_divisions),
        F("CUDEFER_DRIVER_CALLS", driver_calls),
#undef F
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (strcmp(fields[i].var, var) != 0)
            continue;
        const char *p = (const char *)c + fields[i].offset;
        if (fields[i].size == sizeof(uint64_t)) {
            uint64_t v;
            memcpy(&v, p, sizeof v);
            return v;
        }
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    bail("no field for %s", var);
}

/* Every field of a and b equal (padding aside). */
static inline bool same_config(const struct defer_config *a,
                               const struct defer_config *b)
{
    for (size_t i = 0; i < NVARS; i++) {
        if (field_of(a, all_vars[i]) != field_of(b, all_vars[i])) {
            diag("%s differs", all_vars[i]);
            return false;
        }
    }
    return true;
}


/* config_knob_text of the knob of var, or bail. */
static inline struct config_knob_text text_of(const char *var)
{
    struct config_knob_text t;
    for (size_t i = 0; config_knob_text(i, &t); i++) {
        if (strcmp(t.name, var) == 0)
            return t;
    }
    bail("no knob %s", var);
}

/* The line config_load_env writes when var=value is refused for problem
 * and the default is kept. */
static inline void refusal(char *buf, size_t len, const char *var,
                           const char *value, const char *problem)
{
    struct config_knob_text t = text_of(var);
    int n = snprintf(buf, len, "cudefer: %s=\"%s\" %s: expected %s; using "
                     "the default %s\n", var, value, problem, t.expected,
                     t.def);
    if (n < 0 || (size_t)n >= len)
        bail("the refusal of %s=%s does not fit in %zu bytes", var, value,
             len);
}

#endif
