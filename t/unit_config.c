/* CUDEFER_* parsing: the whole string, within bounds, or a clear message and
 * the default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "helpers.h"

static void test_duration(void)
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
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t us = 0;
        int valid = config_parse_duration_us(cases[i].text, 1, 1000000, &us);
        if (cases[i].valid)
            ok(valid && us == cases[i].us, "\"%s\" is %llu us", cases[i].text,
               (unsigned long long)cases[i].us);
        else
            ok(!valid, "\"%s\" is rejected", cases[i].text);
    }
}

static void test_env(const char *value, int want_valid, uint32_t want_us)
{
    struct config cfg;
    config_defaults(&cfg);
    uint32_t def = cfg.poll_us;
    setenv("CUDEFER_POLL_US", value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    const char *err = stderr_capture_end();
    if (want_valid) {
        ok(invalid == 0 && cfg.poll_us == want_us && err[0] == '\0',
           "CUDEFER_POLL_US=\"%s\" gives %u us, quietly", value, want_us);
    } else {
        char want[200];
        snprintf(want, sizeof want,
                 "cudefer: invalid value for CUDEFER_POLL_US: \"%s\" "
                 "(expected microseconds, 1..1000000)\n", value);
        ok(invalid == 1 && cfg.poll_us == def && strcmp(err, want) == 0,
           "CUDEFER_POLL_US=\"%s\" is reported and the default kept", value);
    }
}

int main(void)
{
    plan_lazy();
    test_duration();
    test_env("10", 1, 10);
    test_env("3ms", 1, 3000);
    test_env("abc", 0, 0);
    test_env("-5", 0, 0);
    test_env("1e99", 0, 0);
    test_env("", 0, 0);
    unsetenv("CUDEFER_POLL_US");
    struct config cfg;
    config_defaults(&cfg);
    is_int(config_load_env(&cfg), 0, "no variable set: nothing reported");
    return 0;
}
