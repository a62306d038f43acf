/* SPDX-License-Identifier: MIT */
/* CUDEFER_* read from the environment: the whole string, within bounds, or
 * a clear message and the default (the value parsers alone:
 * t/unit_config_parse.c; the README's and cudefer(7)'s tables against the
 * knobs: t/unit_config_docs.c; defer_configure's range check:
 * t/unit_config_validate.c).  Then defer_configure and the
 * configuration settled at start-up (configure_at_start, called directly:
 * once per process, so last). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit_config.h"
#include "configure.h"
#include "report.h"

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

/* The wording of a refusal, whole: the variable, the value, what it takes
 * (its range, how it is written, what 0 means) and the value kept. */
static void test_env_messages(void)
{
    static const struct {
        const char *var, *value, *line;
    } cases[] = {
        {"CUDEFER_POLL_US", "5s",
         "cudefer: CUDEFER_POLL_US=\"5s\" is out of range: expected 1us..1s "
         "(a whole number with an optional unit us, ms, s, min or h; plain: "
         "microseconds); using the default 50us\n"},
        {"CUDEFER_MAX_DELAY_MS", "500us",
         "cudefer: CUDEFER_MAX_DELAY_MS=\"500us\" is not a whole number of "
         "milliseconds: expected 0ms..1h (a whole number with an optional "
         "unit us, ms, s, min or h; plain: milliseconds; 0ms: no limit); "
         "using the default 1s\n"},
        {"CUDEFER_IDLE_US", "0.5ms",
         "cudefer: CUDEFER_IDLE_US=\"0.5ms\" is not a duration: expected "
         "0us..10s (a whole number with an optional unit us, ms, s, min or "
         "h; plain: microseconds); using the default 2ms\n"},
        {"CUDEFER_VERBOSE", "maybe",
         "cudefer: CUDEFER_VERBOSE=\"maybe\" is not a switch: expected 0/1, "
         "false/true, no/yes, off/on (any case); using the default 0\n"},
        {"CUDEFER_POLICY", "lazy",
         "cudefer: CUDEFER_POLICY=\"lazy\" is not a policy: expected "
         "batched, eager (any case); using the default batched\n"},
        {"CUDEFER_MAX_PENDING", "1.5G",
         "cudefer: CUDEFER_MAX_PENDING=\"1.5G\" is not a size: expected "
         "0..1P (a whole number of bytes with an optional k, M, G, T or P "
         "suffix, powers of 1024; 0: auto, a sixth of what the application uses on the device, 512M..a quarter of the device); using the default "
         "0\n"},
        {"CUDEFER_ROUND_DIVISIONS", "24",
         "cudefer: CUDEFER_ROUND_DIVISIONS=\"24\" is not a power of two: "
         "expected a power of two, 1..256 (a whole number); using the "
         "default 16\n"},
        {"CUDEFER_FREE_BATCH", "0",
         "cudefer: CUDEFER_FREE_BATCH=\"0\" is out of range: expected 1..4096 "
         "(a whole number); using the default 32\n"},
        /* A unit outside ASCII: refused, its bytes escaped. */
        {"CUDEFER_IDLE_US", "5\xc2\xb5s",
         "cudefer: CUDEFER_IDLE_US=\"5\\xc2\\xb5s\" is not a duration: expected "
         "0us..10s (a whole number with an optional unit us, ms, s, min or "
         "h; plain: microseconds); using the default 2ms\n"},
        /* Overflow of 64 bits: out of range, not unreadable. */
        {"CUDEFER_EVENT_POOL", "99999999999999999999",
         "cudefer: CUDEFER_EVENT_POOL=\"99999999999999999999\" is out of "
         "range: expected 0..1048576 (a whole number); using the default "
         "4096\n"},
        /* What cannot be shown on one line is escaped. */
        {"CUDEFER_STATS", "1\n\"2\"\\",
         "cudefer: CUDEFER_STATS=\"1\\x0a\\x222\\x22\\x5c\" is not a switch: "
         "expected 0/1, false/true, no/yes, off/on (any case); using the "
         "default 0\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct defer_config cfg;
        config_defaults(&cfg);
        setenv(cases[i].var, cases[i].value, 1);
        stderr_capture_begin();
        config_load_env(&cfg);
        const char *err = stderr_capture_end();
        unsetenv(cases[i].var);
        is_str(err, cases[i].line, "%s refused: the whole line",
               cases[i].var);
    }
    /* A value past what any knob takes is cut short in the line. */
    char long_value[200];
    memset(long_value, 'x', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    struct defer_config cfg;
    config_defaults(&cfg);
    setenv("CUDEFER_POLL_US", long_value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    unsetenv("CUDEFER_POLL_US");
    char want[600];
    snprintf(want, sizeof want, "%.64s...", long_value);
    char line[700];
    refusal(line, sizeof line, "CUDEFER_POLL_US", want, "is not a duration");
    ok(invalid == 1 && strcmp(err, line) == 0,
       "a 199-byte value is refused, shown as its first 64 bytes and ...");
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

/* A value of bytes that each take four characters escaped (text in
 * another encoding, a binary pasted by mistake) is shown cut short, so
 * that the line still says, whole, what the knob takes and the value
 * kept: cut at 64 bytes, 256 characters of escapes and the longest
 * expectation (CUDEFER_MAX_PENDING's) overflowed the line and lost its
 * end. */
static void test_env_escaped_long(void)
{
    char value[101];
    memset(value, 0xff, sizeof value - 1);
    value[sizeof value - 1] = '\0';
    struct defer_config cfg;
    config_defaults(&cfg);
    setenv("CUDEFER_MAX_PENDING", value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    unsetenv("CUDEFER_MAX_PENDING");
    const char *tail = "; using the default 0\n";
    size_t n = strlen(err), t = strlen(tail);
    ok(invalid == 1 && n > t && strcmp(err + n - t, tail) == 0 &&
           strchr(err, '\n') == err + n - 1,
       "100 bytes of 0xff: one line, whole to its end (%zu bytes)", n);
    char shown[80] = "";
    for (int i = 0; i < 16; i++)
        strcat(shown, "\\xff");
    strcat(shown, "...");
    char want[700];
    refusal(want, sizeof want, "CUDEFER_MAX_PENDING", shown, "is not a size");
    is_str(err, want, "shown as 64 characters of escapes and ...");
}

static void test_env_several(void)
{
    struct defer_config cfg, def;
    config_defaults(&cfg);
    def = cfg;
    setenv("CUDEFER_POLL_US", "abc", 1);
    setenv("CUDEFER_IDLE_US", "", 1);
    setenv("CUDEFER_MAX_DELAY_MS", "2h", 1);
    setenv("CUDEFER_EVENT_POOL", "64", 1);
    setenv("CUDEFER_POLICY", "eager", 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    set_cudefer_env("");
    is_int(invalid, 2, "two invalid values counted (the empty one is unset)");
    is_str(err,
           "cudefer: CUDEFER_POLL_US=\"abc\" is not a duration: expected "
           "1us..1s (a whole number with an optional unit us, ms, s, min or "
           "h; plain: microseconds); using the default 50us\n"
           "cudefer: CUDEFER_MAX_DELAY_MS=\"2h\" is out of range: expected "
           "0ms..1h (a whole number with an optional unit us, ms, s, min or "
           "h; plain: milliseconds; 0ms: no limit); using the default 1s\n",
           "each reported once, in order");
    ok(cfg.poll_us == def.poll_us && cfg.idle_us == def.idle_us &&
           cfg.max_delay_ms == def.max_delay_ms &&
           cfg.event_pool_max == 64 && cfg.policy == DEFER_POLICY_EAGER,
       "the valid ones are applied, the invalid ones keep the default");

    config_defaults(&cfg);
    is_int(config_load_env(&cfg), 0, "no variable set: nothing reported");
    ok(same_config(&cfg, &def), "no variable set: the defaults");
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
           "cudefer: CUDEFER_POLL_MAX_US (the default 1ms) is below "
           "CUDEFER_POLL_US (2ms): using 2ms\n",
           "poll above the default poll_max is reported, as the default");
    ok(cfg.poll_us == 2000 && cfg.poll_max_us == 2000,
       "the default poll_max raised to poll");

    /* A poll_max_us of defer_configure's is named as the field given, not
     * as a variable the user did not set. */
    config_defaults(&cfg);
    cfg.poll_us = 100;
    cfg.poll_max_us = 200;
    setenv("CUDEFER_POLL_US", "300", 1);
    stderr_capture_begin();
    config_load_env(&cfg);
    err = stderr_capture_end();
    set_cudefer_env("");
    is_str(err,
           "cudefer: poll_max_us (200us, given to defer_configure) is below "
           "CUDEFER_POLL_US (300us): using 300us\n",
           "poll above defer_configure's poll_max is reported, as that field");
    ok(cfg.poll_us == 300 && cfg.poll_max_us == 300,
       "defer_configure's poll_max raised to poll");
}

/* A CUDEFER_* variable that names no setting: said in one line each, with
 * the knob it was likely meant to be, not counted as an invalid value and
 * changing nothing; the names the rest of cudefer reads (the Python
 * package's, the bench shims', the tests') are no setting's typo. */
static void test_unknown_names(void)
{
    struct defer_config cfg, def;
    config_defaults(&def);
    set_cudefer_env("CUDEFER_POLL=5 CUDEFER_MAX_PENDNG=1G CUDEFER_FROBNICATE=1 "
                    "CUDEFER_LIB=/opt/libcudefer.so CUDEFER_CXX=g++ "
                    "CUDEFER_TRACE_FILE=/tmp/t CUDEFER_TEST_SCALE=2 "
                    "CUDEFER_STATS=1 CUDEFER_poll_us=5 "
                    "cudefer_max_pending=1G");
    config_defaults(&cfg);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    set_cudefer_env("");
    is_int(invalid, 0, "names of no setting are not invalid values");
    ok(strstr(err, "cudefer: CUDEFER_POLL is not a cudefer setting: ignored "
                   "(did you mean CUDEFER_POLL_US?)\n") != NULL,
       "a knob's name cut short: said, with the knob it begins");
    ok(strstr(err, "cudefer: CUDEFER_MAX_PENDNG is not a cudefer setting: "
                   "ignored (did you mean CUDEFER_MAX_PENDING?)\n") != NULL,
       "a misspelt knob: said, with the nearest knob");
    ok(strstr(err, "cudefer: CUDEFER_FROBNICATE is not a cudefer setting: "
                   "ignored (man cudefer lists them)\n") != NULL,
       "a name near no knob: said, with where the settings are listed");
    int lines = 0;
    for (const char *c = err; *c != '\0'; c++)
        lines += *c == '\n';
    ok(strstr(err, "cudefer: CUDEFER_poll_us is not a cudefer setting: "
                   "ignored (did you mean CUDEFER_POLL_US?)\n") != NULL,
       "a knob's name in the wrong case: said, with the knob");
    ok(strstr(err, "cudefer: cudefer_max_pending is not a cudefer setting: "
                   "ignored (did you mean CUDEFER_MAX_PENDING?)\n") != NULL,
       "a knob's name in lower case: said, with the knob");
    is_int(lines, 5, "one line each, nothing said of CUDEFER_LIB, _CXX, "
           "_TRACE_FILE, _TEST_* or a knob");
    def.print_stats = 1;
    ok(same_config(&cfg, &def), "the knobs set are applied, nothing else");
}

/* A name of no setting longer than a line shows is cut as a long value
 * is: its first 64 characters, then "...", so the line never passes a cut
 * name off as the whole one the user set. */
static void test_unknown_long_name(void)
{
    char name[120];
    memset(name, 'X', sizeof name - 1);
    memcpy(name, "CUDEFER_", 8);
    name[sizeof name - 1] = '\0';
    set_cudefer_env("");
    setenv(name, "1", 1);
    struct defer_config cfg;
    config_defaults(&cfg);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    unsetenv(name);
    char want[256];
    snprintf(want, sizeof want,
             "cudefer: %.64s... is not a cudefer setting: ignored (man "
             "cudefer lists them)\n", name);
    is_int(invalid, 0, "a long name of no setting is no invalid value");
    is_str(err, want, "a 119-character name of no setting is shown as its "
           "first 64 characters and ...");
}

/* ---- printing ------------------------------------------------------------- */

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
           "cudefer: CUDEFER_POLL_MAX_US=1ms\n"
           "cudefer: CUDEFER_IDLE_US=2ms\n"
           "cudefer: CUDEFER_MAX_PENDING=0 (auto, a sixth of what the application uses on the device, 512M..a quarter of the device)\n"
           "cudefer: CUDEFER_MAX_DELAY_MS=1s\n"
           "cudefer: CUDEFER_POLICY=batched\n"
           "cudefer: CUDEFER_EVENT_POOL=4096\n"
           "cudefer: CUDEFER_DISABLE=0\n"
           "cudefer: CUDEFER_VERBOSE=0\n"
           "cudefer: CUDEFER_STATS=0\n"
           "cudefer: CUDEFER_CHECK=0\n"
           "cudefer: CUDEFER_CACHE_KEEP_MS=10s\n"
           "cudefer: CUDEFER_SPLIT_MIN=1M\n"
           "cudefer: CUDEFER_FREE_BATCH=32\n"
           "cudefer: CUDEFER_ROUND_DIVISIONS=16\n"
           "cudefer: CUDEFER_DRIVER_CALLS=1\n",
           "the defaults, one line per knob, each in its largest exact unit");

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

/* A message longer than report's line (512 bytes) is cut, and is still
 * one whole line: "cudefer: ", as much of it as fits, a newline, 511
 * bytes in all, no NUL byte among them. */
static void test_report_long_line(void)
{
    char text[700];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    stderr_capture_begin();
    report("%s", text);
    const char *err = stderr_capture_end();
    size_t len = strlen(err);
    is_int((long long)len, 511, "a 699-character message: 511 bytes written "
           "(as many before any NUL byte)");
    ok(len > 0 && err[len - 1] == '\n' && strncmp(err, "cudefer: aaa", 12) == 0 &&
           strspn(err + 9, "a") == len - 10,
       "\"cudefer: \", the message cut, then its newline");
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("");
    test_env_vars();
    test_env_messages();
    test_env_escaped_long();
    test_env_long_numbers();
    test_env_several();
    test_env_empty_keeps_configured();
    test_poll_max_fixup();
    test_unknown_names();
    test_unknown_long_name();
    test_report_long_line();
    test_print();
    test_defaults_api();
    test_configure_before_start();
    test_start();
    return 0;
}
