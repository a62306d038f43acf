/* SPDX-License-Identifier: MIT */
/* What configuration says, line by line: a refused CUDEFER_* value's
 * whole line (what the knob takes, the value kept), a long or unprintable
 * value shown escaped and cut short, several refusals each said once and
 * in order, a poll_max_us below the poll raised and said, a name of no
 * setting said with the knob it was likely meant to be, report's cut of a
 * message longer than its line, and config_print's lines, which read back
 * the same (each knob's values taken or refused: t/unit_config.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit_config.h"
#include "report.h"

/* ---- refusals and warnings ---------------------------------------------- */

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

int main(void)
{
    plan_lazy();
    set_cudefer_env("");
    test_env_messages();
    test_env_escaped_long();
    test_env_several();
    test_poll_max_fixup();
    test_unknown_names();
    test_unknown_long_name();
    test_report_long_line();
    test_print();
    return 0;
}
