/* CUDEFER_* parsing: the whole string, within bounds, or a clear message and
 * the default.  Then defer_configure and the configuration settled at
 * start-up (config_at_start, called directly: once per process, so last). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "helpers.h"

#define T (UINT64_C(1) << 40)

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
static uint64_t field_of(const struct defer_config *c, const char *var)
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
static bool same_config(const struct defer_config *a,
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

/* ---- parsers ------------------------------------------------------------- */

static void test_duration_us(void)
{
    static const struct {
        const char *text;
        int valid;
        uint64_t us;
    } cases[] = {
        {"50", 1, 50},       {"50us", 1, 50},    {"2ms", 1, 2000},
        {"1s", 1, 1000000},  {"1", 1, 1},        {"1000000", 1, 1000000},
        {"0", 0, 0},         {"1000001", 0, 0},  {"abc", 0, 0},
        {"-5", 0, 0},        {"1e99", 0, 0},     {"", 0, 0},
        {" 5", 0, 0},        {"5 ", 0, 0},       {"+5", 0, 0},
        {"5m", 0, 0},        {"2s", 0, 0},       {"99999999999999999999", 0, 0},
        {"us", 0, 0},        {"5US", 0, 0},      {"5X", 0, 0},
        {"18446744073709551615s", 0, 0},         {"5uss", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t us = 7;
        int valid = config_parse_duration_us(cases[i].text, 1, 1000000, &us);
        if (cases[i].valid)
            ok(valid && us == cases[i].us, "\"%s\" is %llu us", cases[i].text,
               (unsigned long long)cases[i].us);
        else
            ok(!valid && us == 7, "\"%s\" is rejected, *out untouched",
               cases[i].text);
    }
}

static void test_duration_ms(void)
{
    static const struct {
        const char *text;
        int valid;
        uint64_t ms;
    } cases[] = {
        {"500", 1, 500},      {"500ms", 1, 500},  {"2s", 1, 2000},
        {"0", 1, 0},          {"3600s", 1, 3600000}, {"3600000", 1, 3600000},
        {"3601s", 0, 0},      {"3600001", 0, 0},  {"500us", 0, 0},
        {"1h", 0, 0},         {"", 0, 0},         {"ms", 0, 0},
        {"-1", 0, 0},         {"99999999999999999999ms", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t ms = 7;
        int valid = config_parse_duration_ms(cases[i].text, 0, 3600000, &ms);
        if (cases[i].valid)
            ok(valid && ms == cases[i].ms, "\"%s\" is %llu ms", cases[i].text,
               (unsigned long long)cases[i].ms);
        else
            ok(!valid && ms == 7, "\"%s\" is rejected as ms", cases[i].text);
    }
}

static void test_size(void)
{
    static const struct {
        const char *text;
        int valid;
        uint64_t bytes;
    } cases[] = {
        {"64M", 1, 67108864},        {"2G", 1, UINT64_C(2) << 30},
        {"512MiB", 1, UINT64_C(512) << 20}, {"1T", 1, T},
        {"4096", 1, 4096},           {"0", 1, 0},
        {"3GB", 1, UINT64_C(3) << 30}, {"4k", 1, 4096},
        {"4K", 1, 4096},             {"4KiB", 1, 4096},
        {"100B", 1, 100},            {"1024T", 1, 1024 * T},
        {"G", 0, 0},                 {"1.5G", 0, 0},
        {"-1", 0, 0},                {"1P", 0, 0},
        {"", 0, 0},                  {"abc", 0, 0},
        {"1025T", 0, 0},             {"99999999999999999999", 0, 0},
        {"16777216T", 0, 0},         {"5X", 0, 0},
        {"1m", 0, 0},                {"1g", 0, 0},
        {"1Mb", 0, 0},               {"1MBB", 0, 0},
        {"1iB", 0, 0},               {"1G ", 0, 0},
        {" 1G", 0, 0},               {"+1G", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t bytes = 7;
        int valid = config_parse_size(cases[i].text, UINT64_C(1) << 50, &bytes);
        if (cases[i].valid)
            ok(valid && bytes == cases[i].bytes, "size \"%s\" is %llu",
               cases[i].text, (unsigned long long)cases[i].bytes);
        else
            ok(!valid && bytes == 7, "size \"%s\" is rejected", cases[i].text);
    }
    uint64_t bytes;
    ok(config_parse_size("16777215T", UINT64_MAX, &bytes) &&
           bytes == UINT64_C(16777215) << 40,
       "the largest whole T below 2^64 fits");
    ok(!config_parse_size("16777216T", UINT64_MAX, &bytes),
       "2^64 bytes overflows");
}

static void test_bool_policy(void)
{
    static const char *const yes[] = {"1",    "yes", "YES", "true",
                                      "True", "on",  "ON"};
    static const char *const no[] = {"0",     "no",  "No", "false",
                                     "FALSE", "off", "Off"};
    static const char *const bad[] = {"", "2", "-1", "01", "y", "n", "yes ",
                                      " on", "enable", "t"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        bool b = false;
        ok(config_parse_bool(yes[i], &b) && b, "bool \"%s\" is true", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        bool b = true;
        ok(config_parse_bool(no[i], &b) && !b, "bool \"%s\" is false", no[i]);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bool b = true;
        ok(!config_parse_bool(bad[i], &b) && b, "bool \"%s\" is rejected",
           bad[i]);
    }
    enum defer_policy p = DEFER_POLICY_EAGER;
    ok(config_parse_policy("batched", &p) && p == DEFER_POLICY_BATCHED,
       "policy \"batched\"");
    ok(config_parse_policy("eager", &p) && p == DEFER_POLICY_EAGER,
       "policy \"eager\"");
    ok(config_parse_policy("Batched", &p) && p == DEFER_POLICY_BATCHED,
       "policy \"Batched\" (any case)");
    static const char *const badp[] = {"", "lazy", "0", "1", "eager ", "batch"};
    for (size_t i = 0; i < sizeof badp / sizeof *badp; i++) {
        p = DEFER_POLICY_EAGER;
        ok(!config_parse_policy(badp[i], &p) && p == DEFER_POLICY_EAGER,
           "policy \"%s\" is rejected", badp[i]);
    }
}

/* ---- the environment ----------------------------------------------------- */

/* var=value on its own: valid gives want quietly; invalid is reported with
 * expected and leaves the default. */
static void env_case(const char *var, const char *value, int valid,
                     uint64_t want, const char *expected)
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
    char msg[300];
    snprintf(msg, sizeof msg,
             "cudefer: invalid value for %s: \"%s\" (expected %s)\n", var,
             value, expected);
    ok(invalid == 1 && field_of(&cfg, var) == def && strcmp(err, msg) == 0,
       "%s=\"%s\" is reported once and the default kept", var, value);
}

struct var_cases {
    const char *var;
    const char *expected;
    struct {
        const char *text;
        uint64_t want;
    } good[8];
    const char *bad[8]; /* beyond the common ones */
};

static const struct var_cases var_cases[] = {
    {"CUDEFER_POLL_US", "microseconds, 1..1000000",
     {{"10", 10}, {"1", 1}, {"50us", 50}, {"1ms", 1000}},
     {"0", "1000001", "2s", "5ms5"}},
    {"CUDEFER_POLL_MAX_US", "microseconds, 1..1000000",
     {{"100", 100}, {"500ms", 500000}, {"1s", 1000000}, {"1000000", 1000000}},
     {"0", "1000001", "2s"}},
    {"CUDEFER_IDLE_US", "microseconds, 0..10000000",
     {{"0", 0}, {"250ms", 250000}, {"10s", 10000000}, {"7us", 7}},
     {"10000001", "11s"}},
    {"CUDEFER_MAX_PENDING",
     "bytes with an optional k/M/G/T suffix, e.g. 4G; 0 for auto",
     {{"4G", UINT64_C(4) << 30}, {"0", 0}, {"64M", 67108864},
      {"512MiB", UINT64_C(512) << 20}, {"1T", T}, {"4096", 4096},
      {"3GB", UINT64_C(3) << 30}, {"1024T", 1024 * T}},
     {"1025T", "G", "1.5G", "1P", "auto"}},
    {"CUDEFER_MAX_DELAY_MS", "milliseconds, 0..3600000",
     {{"500", 500}, {"500ms", 500}, {"2s", 2000}, {"0", 0},
      {"3600s", 3600000}},
     {"3601s", "3600001", "500us", "1h"}},
    {"CUDEFER_POLICY", "batched or eager",
     {{"batched", DEFER_POLICY_BATCHED}, {"eager", DEFER_POLICY_EAGER},
      {"EAGER", DEFER_POLICY_EAGER}},
     {"lazy", "1", "eager "}},
    {"CUDEFER_EVENT_POOL", "a count, 0..1048576",
     {{"0", 0}, {"4096", 4096}, {"1048576", 1048576}, {"12", 12}},
     {"1048577", "4k", "12us"}},
    {"CUDEFER_DISABLE", "0 or 1",
     {{"1", 1}, {"0", 0}, {"yes", 1}, {"NO", 0}, {"true", 1}, {"off", 0}},
     {"2", "y", "01"}},
    {"CUDEFER_VERBOSE", "0 or 1",
     {{"1", 1}, {"on", 1}, {"False", 0}},
     {"2", "verbose"}},
    {"CUDEFER_STATS", "0 or 1",
     {{"1", 1}, {"Yes", 1}, {"0", 0}},
     {"2", "-1"}},
    {"CUDEFER_CHECK", "0 or 1",
     {{"1", 1}, {"true", 1}, {"0", 0}},
     {"2", "check"}},
    {"CUDEFER_CACHE_KEEP_MS", "milliseconds, 0..3600000",
     {{"0", 0}, {"10s", 10000}, {"250", 250}, {"3600s", 3600000}},
     {"3601s", "3600001", "5us"}},
    {"CUDEFER_SPLIT_MIN",
     "bytes with an optional k/M/G/T suffix, e.g. 1M; 0 for never",
     {{"1M", UINT64_C(1) << 20}, {"0", 0}, {"64k", 65536},
      {"1024T", 1024 * T}},
     {"1025T", "1.5M", "never"}},
    {"CUDEFER_FREE_BATCH", "a count, 1..4096",
     {{"1", 1}, {"32", 32}, {"4096", 4096}},
     {"0", "4097", "32k"}},
    {"CUDEFER_ROUND_DIVISIONS", "a power of two, 1..256",
     {{"1", 1}, {"16", 16}, {"32", 32}, {"256", 256}},
     {"0", "3", "24", "512", "32k"}},
    {"CUDEFER_DRIVER_CALLS", "0 or 1",
     {{"0", 0}, {"1", 1}, {"no", 0}, {"on", 1}},
     {"2", "driver", "-1"}},
};

static void test_env_vars(void)
{
    static const char *const common_bad[] = {
        "abc", "-5", "1e99", "", "99999999999999999999", "5X", " 5", "5 ",
    };
    for (size_t i = 0; i < sizeof var_cases / sizeof *var_cases; i++) {
        const struct var_cases *v = &var_cases[i];
        for (size_t j = 0; j < 8 && v->good[j].text != NULL; j++)
            env_case(v->var, v->good[j].text, 1, v->good[j].want, NULL);
        for (size_t j = 0; j < 8 && v->bad[j] != NULL; j++)
            env_case(v->var, v->bad[j], 0, 0, v->expected);
        for (size_t j = 0; j < sizeof common_bad / sizeof *common_bad; j++)
            env_case(v->var, common_bad[j], 0, 0, v->expected);
    }
}

static void test_env_several(void)
{
    struct defer_config cfg, def;
    config_defaults(&cfg);
    def = cfg;
    setenv("CUDEFER_POLL_US", "abc", 1);
    setenv("CUDEFER_IDLE_US", "", 1);
    setenv("CUDEFER_EVENT_POOL", "64", 1);
    setenv("CUDEFER_POLICY", "eager", 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    set_cudefer_env("");
    is_int(invalid, 2, "two invalid values counted");
    is_str(err,
           "cudefer: invalid value for CUDEFER_POLL_US: \"abc\" (expected "
           "microseconds, 1..1000000)\n"
           "cudefer: invalid value for CUDEFER_IDLE_US: \"\" (expected "
           "microseconds, 0..10000000)\n",
           "each reported once, in order");
    ok(cfg.poll_us == def.poll_us && cfg.idle_us == def.idle_us &&
           cfg.event_pool_max == 64 && cfg.policy == DEFER_POLICY_EAGER,
       "the valid ones are applied, the invalid ones keep the default");

    config_defaults(&cfg);
    is_int(config_load_env(&cfg), 0, "no variable set: nothing reported");
    ok(same_config(&cfg, &def), "no variable set: the defaults");
}

static void test_poll_max_fixup(void)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    setenv("CUDEFER_POLL_US", "500", 1);
    setenv("CUDEFER_POLL_MAX_US", "100", 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    is_int(invalid, 0, "poll_max below poll: not an invalid value");
    is_str(err,
           "cudefer: CUDEFER_POLL_MAX_US (100us) is below CUDEFER_POLL_US "
           "(500us): using 500us\n",
           "poll_max below poll is reported");
    ok(cfg.poll_us == 500 && cfg.poll_max_us == 500, "poll_max raised to poll");

    set_cudefer_env("");
    config_defaults(&cfg);
    setenv("CUDEFER_POLL_US", "2ms", 1);
    stderr_capture_begin();
    config_load_env(&cfg);
    err = stderr_capture_end();
    set_cudefer_env("");
    is_str(err,
           "cudefer: CUDEFER_POLL_MAX_US (1000us) is below CUDEFER_POLL_US "
           "(2000us): using 2000us\n",
           "poll above the default poll_max is reported");
    ok(cfg.poll_us == 2000 && cfg.poll_max_us == 2000,
       "the default poll_max raised to poll");
}

/* ---- printing and validation --------------------------------------------- */

/* config_print of cfg into a static buffer. */
static const char *printed(const struct defer_config *cfg)
{
    static char text[4096];
    FILE *f = tmpfile();
    if (f == NULL)
        sysbail("tmpfile");
    config_print(cfg, f);
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

static void test_print(void)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    const char *text = printed(&cfg);
    for (size_t i = 0; i < NVARS; i++) {
        char line[64];
        snprintf(line, sizeof line, "cudefer: %s=", all_vars[i]);
        ok(strstr(text, line) != NULL, "config_print shows %s", all_vars[i]);
    }
    is_str(text,
           "cudefer: CUDEFER_POLL_US=50us\n"
           "cudefer: CUDEFER_POLL_MAX_US=1000us\n"
           "cudefer: CUDEFER_IDLE_US=2000us\n"
           "cudefer: CUDEFER_MAX_PENDING=auto (a quarter of device memory)\n"
           "cudefer: CUDEFER_MAX_DELAY_MS=1000ms\n"
           "cudefer: CUDEFER_POLICY=batched\n"
           "cudefer: CUDEFER_EVENT_POOL=4096\n"
           "cudefer: CUDEFER_DISABLE=0\n"
           "cudefer: CUDEFER_VERBOSE=0\n"
           "cudefer: CUDEFER_STATS=0\n"
           "cudefer: CUDEFER_CHECK=0\n"
           "cudefer: CUDEFER_CACHE_KEEP_MS=10000ms\n"
           "cudefer: CUDEFER_SPLIT_MIN=1M\n"
           "cudefer: CUDEFER_FREE_BATCH=32\n"
           "cudefer: CUDEFER_ROUND_DIVISIONS=16\n"
           "cudefer: CUDEFER_DRIVER_CALLS=1\n",
           "the defaults, one line per knob");

    /* Every value printed reads back the same through the environment. */
    struct defer_config odd = {
        .poll_us = 7, .poll_max_us = 999, .idle_us = 0,
        .max_pending_bytes = (UINT64_C(3) << 30) + 4096, .max_delay_ms = 1,
        .policy = DEFER_POLICY_EAGER, .event_pool_max = 0, .disable = 1,
        .verbose = 1, .print_stats = 1, .cache_keep_ms = 5,
        .split_min_bytes = UINT64_C(3) << 19, .free_batch = 7,
        .round_divisions = 64, .driver_calls = 0,
    };
    text = printed(&odd);
    ok(strstr(text, "cudefer: CUDEFER_MAX_PENDING=3145732K\n") != NULL,
       "a size prints with its largest exact multiple");
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", text);
    for (char *line = strtok(copy, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        char *eq = strchr(line, '=');
        if (strncmp(line, "cudefer: ", 9) != 0 || eq == NULL)
            bail("odd line: %s", line);
        *eq = '\0';
        setenv(line + 9, eq + 1, 1);
    }
    struct defer_config back;
    config_defaults(&back);
    is_int(config_load_env(&back), 0, "the printed values are all valid");
    set_cudefer_env("");
    ok(same_config(&back, &odd), "and read back the same");
}

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
    validate_case(poll_max_low, "poll_max_us (10) is below poll_us (20)");
    validate_case(idle_big,
                  "idle_us is 10000001 (expected microseconds, 0..10000000)");
    validate_case(pending_big,
                  "max_pending_bytes is 1125899906842625 (expected bytes with "
                  "an optional k/M/G/T suffix, e.g. 4G; 0 for auto)");
    validate_case(delay_big,
                  "max_delay_ms is 3600001 "
                  "(expected milliseconds, 0..3600000)");
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
    config_at_start(&got);
    const char *msg = stderr_capture_end();
    set_cudefer_env("");
    ok(same_config(&got, &want),
       "at start: defer_configure's values, the environment on top, the "
       "invalid call ignored");
    is_str(msg,
           "cudefer: invalid value for CUDEFER_IDLE_US: \"abc\" (expected "
           "microseconds, 0..10000000)\n"
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
           "cudefer: CUDEFER_CACHE_KEEP_MS=10000ms\n"
           "cudefer: CUDEFER_SPLIT_MIN=1M\n"
           "cudefer: CUDEFER_FREE_BATCH=32\n"
           "cudefer: CUDEFER_ROUND_DIVISIONS=16\n"
           "cudefer: CUDEFER_DRIVER_CALLS=1\n",
           "the invalid value reported, then (verbose) the values in force");

    /* A second start (the first one failed further on) settles nothing new. */
    setenv("CUDEFER_EVENT_POOL", "99", 1);
    struct defer_config again;
    stderr_capture_begin();
    config_at_start(&again);
    msg = stderr_capture_end();
    set_cudefer_env("");
    ok(same_config(&again, &want) && msg[0] == '\0',
       "a second config_at_start: the same values, nothing read or printed");

    struct defer_config c = configured();
    stderr_capture_begin();
    cudaError_t err = defer_configure(&c);
    msg = stderr_capture_end();
    is_int(err, cudaErrorNotPermitted,
           "defer_configure after start: NotPermitted");
    is_str(msg, "cudefer: defer_configure called after the first defer call: "
                "ignored\n",
           "defer_configure after start says so");
    config_at_start(&again);
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
    test_duration_us();
    test_duration_ms();
    test_size();
    test_bool_policy();
    test_env_vars();
    test_env_several();
    test_poll_max_fixup();
    test_print();
    test_validate();
    test_defaults_api();
    test_configure_before_start();
    test_start();
    return 0;
}
