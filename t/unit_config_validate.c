/* SPDX-License-Identifier: MIT */
/* defer_configure's check of a struct defer_config (config_validate): every
 * field at the least and the most its range documents is taken, one past
 * either end refused with one line naming the field, the value and what it
 * takes; poll_max_us below poll_us refused in the same words, naming both
 * fields and values. */
#include <stdio.h>
#include <string.h>

#include "unit_config.h"

static void validate_case(void (*change)(struct defer_config *),
                          const char *want)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    change(&cfg);
    char why[200] = "untouched";
    ok(!config_validate(&cfg, why, sizeof why) && strcmp(why, want) == 0,
       "config_validate: %s", want);
    if (strcmp(why, want) != 0)
        diag("why: %s", why);
}

static void poll_zero(struct defer_config *c) { c->poll_us = 0; }
static void poll_big(struct defer_config *c) { c->poll_us = 1000001; }
static void poll_max_low(struct defer_config *c)
{
    c->poll_us = 20;
    c->poll_max_us = 10;
}
static void idle_big(struct defer_config *c) { c->idle_us = 10000001; }
static void pending_big(struct defer_config *c)
{
    c->max_pending_bytes = (UINT64_C(1) << 50) + 1;
}
static void delay_big(struct defer_config *c) { c->max_delay_ms = 3600001; }
static void policy_bad(struct defer_config *c)
{
    c->policy = (enum defer_policy)7;
}
static void pool_big(struct defer_config *c) { c->event_pool_max = 1048577; }
static void disable_neg(struct defer_config *c) { c->disable = -1; }
static void verbose_two(struct defer_config *c) { c->verbose = 2; }
static void stats_two(struct defer_config *c) { c->print_stats = 2; }
static void batch_zero(struct defer_config *c) { c->free_batch = 0; }
static void divisions_zero(struct defer_config *c) { c->round_divisions = 0; }
static void divisions_odd(struct defer_config *c) { c->round_divisions = 24; }
static void divisions_big(struct defer_config *c) { c->round_divisions = 512; }

static void keep_big(struct defer_config *c) { c->cache_keep_ms = 3600001; }
static void split_big(struct defer_config *c)
{
    c->split_min_bytes = (UINT64_C(1) << 50) + 1;
}
static void batch_big(struct defer_config *c) { c->free_batch = 4097; }
static void poll_max_big(struct defer_config *c)
{
    c->poll_max_us = 1000001;
}
static void check_two(struct defer_config *c) { c->check = 2; }
static void driver_neg(struct defer_config *c) { c->driver_calls = -1; }
static void policy_neg(struct defer_config *c)
{
    c->policy = (enum defer_policy)-1;
}

/* Every field at the least, then at the most, its range documents: each
 * taken by defer_configure's check; one past either end: the cases of
 * test_validate. */
static void test_validate_bounds(void)
{
    struct defer_config lo = {
        .poll_us = 1, .poll_max_us = 1, .idle_us = 0, .max_pending_bytes = 0,
        .max_delay_ms = 0, .policy = DEFER_POLICY_BATCHED,
        .event_pool_max = 0, .disable = 0, .verbose = 0, .print_stats = 0,
        .check = 0, .cache_keep_ms = 0, .split_min_bytes = 0,
        .free_batch = 1, .round_divisions = 1, .driver_calls = 0,
    };
    struct defer_config hi = {
        .poll_us = 1000000, .poll_max_us = 1000000, .idle_us = 10000000,
        .max_pending_bytes = UINT64_C(1) << 50, .max_delay_ms = 3600000,
        .policy = DEFER_POLICY_EAGER, .event_pool_max = 1048576,
        .disable = 1, .verbose = 1, .print_stats = 1, .check = 1,
        .cache_keep_ms = 3600000, .split_min_bytes = UINT64_C(1) << 50,
        .free_batch = 4096, .round_divisions = 256, .driver_calls = 1,
    };
    char why[200] = "untouched";
    ok(config_validate(&lo, why, sizeof why) && why[0] == '\0',
       "every field at its least: valid");
    if (why[0] != '\0')
        diag("why: %s", why);
    ok(config_validate(&hi, why, sizeof why) && why[0] == '\0',
       "every field at its most: valid");
    if (why[0] != '\0')
        diag("why: %s", why);
    validate_case(keep_big, "cache_keep_ms is 3600001 (expected "
                            "milliseconds, 0..3600000; 0: kept until "
                            "defer_trim)");
    validate_case(split_big, "split_min_bytes is 1125899906842625 (expected "
                             "bytes, 0..1125899906842624; 0: never)");
    validate_case(batch_big, "free_batch is 4097 (expected a count, 1..4096)");
    validate_case(poll_max_big,
                  "poll_max_us is 1000001 (expected microseconds, "
                  "1..1000000)");
    validate_case(check_two, "check is 2 (expected 0 or 1)");
    validate_case(driver_neg, "driver_calls is -1 (expected 0 or 1)");
    validate_case(policy_neg, "policy is -1 (expected batched or eager)");
}

static void test_validate(void)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    char why[200] = "untouched";
    ok(config_validate(&cfg, why, sizeof why) && why[0] == '\0',
       "the defaults are valid");
    ok(config_validate(&cfg, NULL, 0), "why may be NULL with len 0");
    validate_case(poll_zero,
                  "poll_us is 0 (expected microseconds, 1..1000000)");
    validate_case(poll_big,
                  "poll_us is 1000001 (expected microseconds, 1..1000000)");
    validate_case(poll_max_low, "poll_max_us is 10 with poll_us 20 (expected "
                                "microseconds, at least poll_us: "
                                "20..1000000)");
    validate_case(idle_big,
                  "idle_us is 10000001 (expected microseconds, 0..10000000)");
    validate_case(pending_big,
                  "max_pending_bytes is 1125899906842625 (expected bytes, "
                  "0..1125899906842624; 0: auto, a sixth of what the application uses on the device, 512M..a quarter of the device)");
    validate_case(delay_big,
                  "max_delay_ms is 3600001 "
                  "(expected milliseconds, 0..3600000; 0: no limit)");
    validate_case(policy_bad, "policy is 7 (expected batched or eager)");
    validate_case(pool_big,
                  "event_pool_max is 1048577 (expected a count, 0..1048576)");
    validate_case(disable_neg, "disable is -1 (expected 0 or 1)");
    validate_case(verbose_two, "verbose is 2 (expected 0 or 1)");
    validate_case(stats_two, "print_stats is 2 (expected 0 or 1)");
    validate_case(batch_zero, "free_batch is 0 (expected a count, 1..4096)");
    validate_case(divisions_zero,
                  "round_divisions is 0 (expected a power of two, 1..256)");
    validate_case(divisions_odd,
                  "round_divisions is 24 (expected a power of two, 1..256)");
    validate_case(divisions_big,
                  "round_divisions is 512 (expected a power of two, 1..256)");
}

int main(void)
{
    plan_lazy();
    test_validate();
    test_validate_bounds();
    return 0;
}
