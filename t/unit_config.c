/* SPDX-License-Identifier: MIT */
/* CUDEFER_* read from the environment: the whole string, within bounds, or
 * refused and the default kept, every knob (the lines said, word by word:
 * t/unit_config_report.c; the value parsers alone: t/unit_config_parse.c;
 * the README's and cudefer(7)'s tables against the knobs:
 * t/unit_config_docs.c; defer_configure's range check:
 * t/unit_config_validate.c).  Then defer_configure and the
 * configuration settled at start-up (configure_at_start, called directly:
 * once per process, so last). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit_config.h"
#include "configure.h"

#define T (UINT64_C(1) << 40)

/* ---- the environment ----------------------------------------------------- */

/* var=value on its own: valid gives want quietly; invalid (problem, e.g.
 * "is out of range") is reported in one line and leaves the default. */
static void env_case(const char *var, const char *value, int valid,
                     uint64_t want, const char *problem)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    uint64_t def = field_of(&cfg, var);
    setenv(var, value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    unsetenv(var);
    if (valid) {
        ok(invalid == 0 && field_of(&cfg, var) == want && err[0] == '\0',
           "%s=\"%s\" gives %llu, quietly", var, value,
           (unsigned long long)want);
        return;
    }
    char msg[600];
    refusal(msg, sizeof msg, var, value, problem);
    ok(invalid == 1 && field_of(&cfg, var) == def && strcmp(err, msg) == 0,
       "%s=\"%s\" %s: reported in one line, the default kept", var, value,
       problem);
}

#define RANGE "is out of range"
#define WHOLE "is not a whole number of milliseconds"
#define POW2 "is not a power of two"

struct var_cases {
    const char *var;
    const char *noun; /* "is not <noun>" for a value it cannot read */
    struct {
        const char *text;
        uint64_t want;
    } good[14];
    struct {
        const char *text;
        const char *problem; /* NULL: "is not <noun>" */
    } bad[12]; /* beyond the common ones */
};

static const struct var_cases var_cases[] = {
    {"CUDEFER_POLL_US", "a duration",
     {{"10", 10}, {"1", 1}, {"50us", 50}, {"1ms", 1000}, {" 7US ", 7}},
     {{"0", RANGE}, {"1000001", RANGE}, {"2s", RANGE}, {"1min", RANGE},
      {"5ms5", NULL}, {"99999999999999999999", RANGE}, {"1001ms", RANGE},
      {"0ms", RANGE}, {"4294967297", RANGE}, {"1000001us", RANGE}}},
    {"CUDEFER_POLL_MAX_US", "a duration",
     {{"100", 100}, {"500ms", 500000}, {"1s", 1000000}, {"1000000", 1000000},
      {"1000ms", 1000000}, {"1S", 1000000}},
     {{"0", RANGE}, {"1000001", RANGE}, {"2s", RANGE}, {"1001ms", RANGE},
      {"0us", RANGE}}},
    {"CUDEFER_IDLE_US", "a duration",
     {{"0", 0}, {"250ms", 250000}, {"10s", 10000000}, {"7us", 7},
      {"10000ms", 10000000}, {"0ms", 0}, {"0h", 0}, {"010", 10},
      {"2MS", 2000}},
     {{"10000001", RANGE}, {"11s", RANGE}, {"1min", RANGE},
      {"10001ms", RANGE}, {"10000001us", RANGE}}},
    {"CUDEFER_MAX_PENDING", "a size",
     {{"4G", UINT64_C(4) << 30}, {"0", 0}, {"64M", 67108864},
      {"512MiB", UINT64_C(512) << 20}, {"1T", T}, {"4096", 4096},
      {"3GB", UINT64_C(3) << 30}, {"1024T", 1024 * T}, {"1P", 1024 * T},
      {"2g", UINT64_C(2) << 30}, {"1125899906842624", 1024 * T},
      {"1048576G", 1024 * T}, {"0B", 0}, {"1kB", 1024}},
     {{"1025T", RANGE}, {"2P", RANGE}, {"G", NULL}, {"1.5G", NULL},
      {"auto", NULL}, {"99999999999999999999", RANGE},
      {"1125899906842625", RANGE}, {"1048577G", RANGE},
      {"18446744073709551615", RANGE}, {"16384P", RANGE}, {"4GiBs", NULL},
      {"1KiBB", NULL}}},
    {"CUDEFER_MAX_DELAY_MS", "a duration",
     {{"500", 500}, {"500ms", 500}, {"2s", 2000}, {"0", 0},
      {"3600s", 3600000}, {"1h", 3600000}, {"30min", 1800000},
      {"2000us", 2}, {"3600000000us", 3600000}, {"60MIN", 3600000}},
     {{"3601s", RANGE}, {"3600001", RANGE}, {"2h", RANGE}, {"61min", RANGE},
      {"500us", WHOLE}, {"1 h", NULL}, {"3600001000us", RANGE},
      {"3600000500us", WHOLE}, {"4294967296", RANGE}}},
    {"CUDEFER_POLICY", "a policy",
     {{"batched", DEFER_POLICY_BATCHED}, {"eager", DEFER_POLICY_EAGER},
      {"EAGER", DEFER_POLICY_EAGER}, {"eager ", DEFER_POLICY_EAGER},
      {"Eager", DEFER_POLICY_EAGER}, {"BATCHED", DEFER_POLICY_BATCHED}},
     {{"lazy", NULL}, {"1", NULL}, {"eagerly", NULL},
      {"batched,eager", NULL}}},
    {"CUDEFER_EVENT_POOL", "a number",
     {{"0", 0}, {"4096", 4096}, {"1048576", 1048576}, {"12", 12},
      {"01048576", 1048576}},
     {{"1048577", RANGE}, {"4k", NULL}, {"12us", NULL},
      {"4294967296", RANGE}, {"99999999999999999999", RANGE}}},
    {"CUDEFER_DISABLE", "a switch",
     {{"1", 1}, {"0", 0}, {"yes", 1}, {"NO", 0}, {"true", 1}, {"off", 0},
      {"01", 1}, {" 1", 1}, {"On\n", 1}},
     {{"2", NULL}, {"y", NULL}, {"10", NULL}, {"0x1", NULL},
      {"1.0", NULL}, {"truee", NULL}, {"4294967297", NULL}}},
    {"CUDEFER_VERBOSE", "a switch",
     {{"1", 1}, {"on", 1}, {"False", 0}, {"01", 1}, {" 1", 1}, {"TRUE", 1}},
     {{"2", NULL}, {"verbose", NULL}}},
    {"CUDEFER_STATS", "a switch",
     {{"1", 1}, {"Yes", 1}, {"0", 0}},
     {{"2", NULL}}},
    {"CUDEFER_CHECK", "a switch",
     {{"1", 1}, {"true", 1}, {"0", 0}},
     {{"2", NULL}, {"check", NULL}}},
    {"CUDEFER_CACHE_KEEP_MS", "a duration",
     {{"0", 0}, {"10s", 10000}, {"250", 250}, {"3600s", 3600000},
      {"1h", 3600000}, {"60min", 3600000}, {"0h", 0},
      {"3600000000us", 3600000}},
     {{"3601s", RANGE}, {"3600001", RANGE}, {"5us", WHOLE},
      {"3600001000us", RANGE}, {"1h1", NULL}, {"4294967296", RANGE}}},
    {"CUDEFER_SPLIT_MIN", "a size",
     {{"1M", UINT64_C(1) << 20}, {"0", 0}, {"64k", 65536},
      {"1024T", 1024 * T}, {"1P", 1024 * T}, {"1PiB", 1024 * T},
      {"1125899906842624", 1024 * T}},
     {{"1025T", RANGE}, {"1.5M", NULL}, {"never", NULL},
      {"1125899906842625", RANGE}, {"99999999999999999999", RANGE}}},
    {"CUDEFER_FREE_BATCH", "a number",
     {{"1", 1}, {"32", 32}, {"4096", 4096}},
     {{"0", RANGE}, {"4097", RANGE}, {"32k", NULL}, {"4294967297", RANGE},
      {"99999999999999999999", RANGE}}},
    {"CUDEFER_ROUND_DIVISIONS", "a number",
     {{"1", 1}, {"16", 16}, {"32", 32}, {"256", 256}, {"0256", 256},
      {"2", 2}},
     {{"0", RANGE}, {"3", POW2}, {"24", POW2}, {"512", RANGE},
      {"32k", NULL}, {"257", RANGE}, {"4294967312", RANGE},
      {"99999999999999999999", RANGE}}},
    {"CUDEFER_DRIVER_CALLS", "a switch",
     {{"0", 0}, {"1", 1}, {"no", 0}, {"on", 1}},
     {{"2", NULL}, {"driver", NULL}, {"-1", NULL},
      {"99999999999999999999", NULL}}},
};

/* var set to nothing, or to blanks only: as if unset, said nowhere. */
static void env_unset_case(const char *var, const char *value)
{
    struct defer_config cfg, def;
    config_defaults(&cfg);
    def = cfg;
    setenv(var, value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    unsetenv(var);
    ok(invalid == 0 && field_of(&cfg, var) == field_of(&def, var) &&
           err[0] == '\0',
       "%s=\"%s\" is taken as unset: the default, quietly", var, value);
}

static void test_env_vars(void)
{
    static const char *const common_bad[] = {"abc", "-5", "1e99", "5X", "+5",
                                              "5 5", "0x10", "0X1F", "-0",
                                              "5;"};
    for (size_t i = 0; i < sizeof var_cases / sizeof *var_cases; i++) {
        const struct var_cases *v = &var_cases[i];
        char not_one[64];
        snprintf(not_one, sizeof not_one, "is not %s", v->noun);
        for (size_t j = 0; j < 14 && v->good[j].text != NULL; j++)
            env_case(v->var, v->good[j].text, 1, v->good[j].want, NULL);
        for (size_t j = 0; j < 12 && v->bad[j].text != NULL; j++)
            env_case(v->var, v->bad[j].text, 0, 0,
                     v->bad[j].problem != NULL ? v->bad[j].problem : not_one);
        for (size_t j = 0; j < sizeof common_bad / sizeof *common_bad; j++)
            env_case(v->var, common_bad[j], 0, 0, not_one);
        env_unset_case(v->var, "");
        env_unset_case(v->var, " \t ");
    }
}

/* A value is read whole, however long: a number padded with zeros is
 * that number, one of more digits than 64 bits hold is out of range; a
 * value longer than the 63 characters once read into a fixed buffer was
 * "not a duration" (a wrong reason) or, padded, refused for good. */
static void test_env_long_numbers(void)
{
    char padded[100], huge[100];
    memset(padded, '0', 70);
    snprintf(padded + 70, sizeof padded - 70, "250");
    env_case("CUDEFER_POLL_US", padded, 1, 250, NULL);
    memset(padded, '0', 80);
    snprintf(padded + 80, sizeof padded - 80, "4M");
    env_case("CUDEFER_MAX_PENDING", padded, 1, UINT64_C(4) << 20, NULL);
    /* Shown cut at 64 characters, as every long value. */
    static const char *const vars[2] = {"CUDEFER_MAX_DELAY_MS",
                                        "CUDEFER_EVENT_POOL"};
    for (int i = 0; i < 2; i++) {
        memset(huge, '7', 70);
        snprintf(huge + 70, sizeof huge - 70, "%s", i == 0 ? "ms" : "");
        struct defer_config cfg;
        config_defaults(&cfg);
        setenv(vars[i], huge, 1);
        stderr_capture_begin();
        int invalid = config_load_env(&cfg);
        const char *err = stderr_capture_end();
        unsetenv(vars[i]);
        char shown[80], line[700];
        snprintf(shown, sizeof shown, "%.64s...", huge);
        refusal(line, sizeof line, vars[i], shown, RANGE);
        ok(invalid == 1 && strcmp(err, line) == 0,
           "%s=<70 digits%s> %s: reported in one line", vars[i],
           i == 0 ? "ms" : "", RANGE);
    }
}

/* A variable set to nothing (or blanks) is as if unset over any value,
 * not only the default: what defer_configure gave stays, every knob. */
static void test_env_empty_keeps_configured(void)
{
    struct defer_config cfg, want;
    config_defaults(&cfg);
    cfg.poll_us = 123;
    cfg.poll_max_us = 4567;
    cfg.idle_us = 89;
    cfg.max_pending_bytes = UINT64_C(64) << 20;
    cfg.max_delay_ms = 250;
    cfg.policy = DEFER_POLICY_EAGER;
    cfg.event_pool_max = 12;
    cfg.disable = 1;
    cfg.verbose = 1;
    cfg.print_stats = 1;
    cfg.check = 1;
    cfg.cache_keep_ms = 77;
    cfg.split_min_bytes = 4096;
    cfg.free_batch = 5;
    cfg.round_divisions = 4;
    cfg.driver_calls = 0;
    want = cfg;
    static const char *const vars[] = {
        "CUDEFER_POLL_US", "CUDEFER_POLL_MAX_US", "CUDEFER_IDLE_US",
        "CUDEFER_MAX_PENDING", "CUDEFER_MAX_DELAY_MS", "CUDEFER_POLICY",
        "CUDEFER_EVENT_POOL", "CUDEFER_DISABLE", "CUDEFER_VERBOSE",
        "CUDEFER_STATS", "CUDEFER_CHECK", "CUDEFER_CACHE_KEEP_MS",
        "CUDEFER_SPLIT_MIN", "CUDEFER_FREE_BATCH", "CUDEFER_ROUND_DIVISIONS",
        "CUDEFER_DRIVER_CALLS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        setenv(vars[i], i % 2 == 0 ? "" : " \t ", 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    set_cudefer_env("");
    is_int(invalid, 0, "every knob set to nothing: none invalid");
    is_str(err, "", "every knob set to nothing: quietly");
    ok(same_config(&cfg, &want),
       "every knob set to nothing: the values given before kept (not the "
       "defaults)");
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (field_of(&cfg, vars[i]) != field_of(&want, vars[i]))
            diag("%s is %llu, was %llu", vars[i],
                 (unsigned long long)field_of(&cfg, vars[i]),
                 (unsigned long long)field_of(&want, vars[i]));
}

/* ---- defer_configure and start-up ---------------------------------------- */

static void test_defaults_api(void)
{
    struct defer_config a, b;
    memset(&a, 0xa5, sizeof a);
    memset(&b, 0x5a, sizeof b);
    defer_config_defaults(&a);
    config_defaults(&b);
    ok(same_config(&a, &b), "defer_config_defaults is config_defaults");
    ok(a.poll_us == 50 && a.poll_max_us == 1000 && a.idle_us == 2000 &&
           a.max_pending_bytes == 0 && a.max_delay_ms == 1000 &&
           a.policy == DEFER_POLICY_BATCHED && a.event_pool_max == 4096 &&
           a.disable == 0 && a.verbose == 0 && a.print_stats == 0,
       "the documented defaults");
    defer_config_defaults(NULL);
    ok(1, "defer_config_defaults(NULL) does nothing");
}

static struct defer_config configured(void)
{
    struct defer_config c;
    defer_config_defaults(&c);
    c.poll_us = 123;
    c.poll_max_us = 4567;
    c.idle_us = 89;
    c.max_pending_bytes = UINT64_C(64) << 20;
    c.max_delay_ms = 250;
    c.policy = DEFER_POLICY_EAGER;
    c.event_pool_max = 12;
    c.print_stats = 1;
    c.verbose = 1;
    return c;
}

static void test_configure_before_start(void)
{
    stderr_capture_begin();
    cudaError_t err = defer_configure(NULL);
    const char *msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "defer_configure(NULL): InvalidValue");
    is_str(msg, "cudefer: defer_configure: cfg is NULL: ignored\n",
           "defer_configure(NULL) says so");

    struct defer_config c = configured();
    stderr_capture_begin();
    err = defer_configure(&c);
    msg = stderr_capture_end();
    is_int(err, cudaSuccess, "defer_configure(valid): cudaSuccess");
    is_str(msg, "", "quietly");

    struct defer_config bad = configured();
    bad.idle_us = 777;
    bad.event_pool_max = 2000000;
    stderr_capture_begin();
    err = defer_configure(&bad);
    msg = stderr_capture_end();
    is_int(err, cudaErrorInvalidValue,
           "defer_configure(invalid): InvalidValue");
    is_str(msg, "cudefer: defer_configure: event_pool_max is 2000000 "
                "(expected a count, 0..1048576)\n",
           "defer_configure(invalid) says why");
}

static void test_start(void)
{
    struct defer_config want = configured();
    setenv("CUDEFER_EVENT_POOL", "77", 1);   /* overrides defer_configure */
    setenv("CUDEFER_IDLE_US", "abc", 1);     /* reported, configured kept */
    want.event_pool_max = 77;

    struct defer_config got;
    memset(&got, 0, sizeof got);
    stderr_capture_begin();
    configure_at_start(&got);
    const char *msg = stderr_capture_end();
    set_cudefer_env("");
    ok(same_config(&got, &want),
       "at start: defer_configure's values, the environment on top, the "
       "invalid call ignored");
    is_str(msg,
           "cudefer: CUDEFER_IDLE_US=\"abc\" is not a duration: expected "
           "0us..10s (a whole number with an optional unit us, ms, s, min or "
           "h; plain: microseconds); using 89us\n"
           "cudefer: CUDEFER_POLL_US=123us\n"
           "cudefer: CUDEFER_POLL_MAX_US=4567us\n"
           "cudefer: CUDEFER_IDLE_US=89us\n"
           "cudefer: CUDEFER_MAX_PENDING=64M\n"
           "cudefer: CUDEFER_MAX_DELAY_MS=250ms\n"
           "cudefer: CUDEFER_POLICY=eager\n"
           "cudefer: CUDEFER_EVENT_POOL=77\n"
           "cudefer: CUDEFER_DISABLE=0\n"
           "cudefer: CUDEFER_VERBOSE=1\n"
           "cudefer: CUDEFER_STATS=1\n"
           "cudefer: CUDEFER_CHECK=0\n"
           "cudefer: CUDEFER_CACHE_KEEP_MS=10s\n"
           "cudefer: CUDEFER_SPLIT_MIN=1M\n"
           "cudefer: CUDEFER_FREE_BATCH=32\n"
           "cudefer: CUDEFER_ROUND_DIVISIONS=16\n"
           "cudefer: CUDEFER_DRIVER_CALLS=1\n",
           "the invalid value reported, then (verbose) the values in force");

    /* A second start (the first one failed further on) settles nothing new. */
    setenv("CUDEFER_EVENT_POOL", "99", 1);
    struct defer_config again;
    stderr_capture_begin();
    configure_at_start(&again);
    msg = stderr_capture_end();
    set_cudefer_env("");
    ok(same_config(&again, &want) && msg[0] == '\0',
       "a second configure_at_start: the same values, nothing read or printed");

    struct defer_config c = configured();
    stderr_capture_begin();
    cudaError_t err = defer_configure(&c);
    msg = stderr_capture_end();
    is_int(err, cudaErrorNotPermitted,
           "defer_configure after start: NotPermitted");
    is_str(msg, "cudefer: defer_configure called after cudefer started (at "
                "the first call that defers, allocates or records, or "
                "defer_peer_access): ignored\n",
           "defer_configure after start says so");
    configure_at_start(&again);
    ok(same_config(&again, &want), "and changes nothing");
    stderr_capture_begin();
    err = defer_configure(NULL);
    stderr_capture_end();
    is_int(err, cudaErrorInvalidValue,
           "defer_configure(NULL) after start: InvalidValue");
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("");
    test_env_vars();
    test_env_long_numbers();
    test_env_empty_keeps_configured();
    test_defaults_api();
    test_configure_before_start();
    test_start();
    return 0;
}
