/* SPDX-License-Identifier: MIT */
/* The CUDEFER_* value parsers alone (config_parse.h): durations, sizes,
 * switches and the policy, each taken whole and within its bounds or
 * refused; and the edit distance that names the knob a misspelt variable
 * meant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"
#include "helpers.h"

#define T (UINT64_C(1) << 40)

static void test_duration_us(void)
{
    static const struct {
        const char *text;
        int valid;
        uint64_t us;
    } cases[] = {
        {"50", 1, 50},       {"50us", 1, 50},    {"2ms", 1, 2000},
        {"1s", 1, 1000000},  {"1", 1, 1},        {"1000000", 1, 1000000},
        {"5US", 1, 5},       {"2Ms", 1, 2000},   {" 5", 1, 5},
        {"5 ", 1, 5},        {"\t7us\n", 1, 7},  {"0", 0, 0},
        {"1000001", 0, 0},   {"abc", 0, 0},      {"-5", 0, 0},
        {"1e99", 0, 0},      {"", 0, 0},         {"  ", 0, 0},
        {"+5", 0, 0},        {"5m", 0, 0},       {"2s", 0, 0},
        {"1min", 0, 0},      {"1h", 0, 0},       {"99999999999999999999", 0, 0},
        {"us", 0, 0},        {"5X", 0, 0},       {"5 us", 0, 0},
        {"18446744073709551615s", 0, 0},         {"5uss", 0, 0},
        {"1.5ms", 0, 0},
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
    uint64_t us = 7;
    ok(config_parse_duration_us("2h", 0, UINT64_C(7200000000), &us) &&
           us == UINT64_C(7200000000),
       "\"2h\" is 7200000000 us");
    ok(config_parse_duration_us("3min", 0, UINT64_C(7200000000), &us) &&
           us == 180000000,
       "\"3min\" is 180000000 us");
}

static void test_duration_ms(void)
{
    static const struct {
        const char *text;
        int valid;
        uint64_t ms;
    } cases[] = {
        {"500", 1, 500},      {"500ms", 1, 500},     {"2s", 1, 2000},
        {"0", 1, 0},          {"3600s", 1, 3600000}, {"3600000", 1, 3600000},
        {"1h", 1, 3600000},   {"1H", 1, 3600000},    {"60min", 1, 3600000},
        {"2min", 1, 120000},  {"2000us", 1, 2},      {"0us", 1, 0},
        {" 1h ", 1, 3600000}, {"3601s", 0, 0},       {"3600001", 0, 0},
        {"500us", 0, 0},      {"1500us", 0, 0},      {"2h", 0, 0},
        {"61min", 0, 0},      {"", 0, 0},            {"ms", 0, 0},
        {"-1", 0, 0},         {"1 h", 0, 0},         {"99999999999999999999ms", 0, 0},
        {"18446744073709551615h", 0, 0},
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
        {"1P", 1, 1024 * T},         {"1PiB", 1, 1024 * T},
        {"1m", 1, UINT64_C(1) << 20}, {"1g", 1, UINT64_C(1) << 30},
        {"1mb", 1, UINT64_C(1) << 20}, {"1gib", 1, UINT64_C(1) << 30},
        {"1G ", 1, UINT64_C(1) << 30}, {" 1G", 1, UINT64_C(1) << 30},
        {"G", 0, 0},                 {"1.5G", 0, 0},
        {"-1", 0, 0},                {"2P", 0, 0},
        {"", 0, 0},                  {"abc", 0, 0},
        {"1025T", 0, 0},             {"99999999999999999999", 0, 0},
        {"16777216T", 0, 0},         {"5X", 0, 0},
        {"1E", 0, 0},                {"1MBB", 0, 0},
        {"1iB", 0, 0},               {"1 G", 0, 0},
        {"+1G", 0, 0},
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
    ok(!config_parse_size("16384P", UINT64_MAX, &bytes),
       "so does 16384P");
}

static void test_bool_policy(void)
{
    static const char *const yes[] = {"1",  "yes", "YES", "true", "True",
                                      "on", "ON",  "01",  " 1",   "yes\n",
                                      "\ton "};
    static const char *const no[] = {"0",     "no",  "No", "false", "FALSE",
                                     "off",   "Off", "00", "0 ",    " no"};
    static const char *const bad[] = {"",  "  ", "2", "-1",     "y", "n",
                                      "t", "f",  "+1", "enable", "1 1",
                                      "99999999999999999999"};
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
    ok(config_parse_policy(" eager ", &p) && p == DEFER_POLICY_EAGER,
       "policy \" eager \" (blanks around)");
    static const char *const badp[] = {"", "lazy", "0", "1", "batch",
                                       "eag er"};
    for (size_t i = 0; i < sizeof badp / sizeof *badp; i++) {
        p = DEFER_POLICY_EAGER;
        ok(!config_parse_policy(badp[i], &p) && p == DEFER_POLICY_EAGER,
           "policy \"%s\" is rejected", badp[i]);
    }
}

/* The edit distance that names the knob a misspelt variable meant. */
static void test_distance(void)
{
    static const struct {
        const char *a, *b;
        size_t want;
    } cases[] = {
        {"CUDEFER_STATS", "CUDEFER_STATS", 0},
        {"CUDEFER_STAT", "CUDEFER_STATS", 1},        /* one deleted */
        {"CUDEFER_STATSS", "CUDEFER_STATS", 1},      /* one inserted */
        {"CUDEFER_STATZ", "CUDEFER_STATS", 1},       /* one replaced */
        {"CUDEFER_MAX_PENDNG", "CUDEFER_MAX_PENDING", 1},
        {"CUDEFER_POLL_SU", "CUDEFER_POLL_US", 2},   /* a swap: two */
        {"", "abc", 3},
        {"abc", "", 3},
        {"kitten", "sitting", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        is_int((long long)config_parse_distance(cases[i].a,
                                                strlen(cases[i].a),
                                                cases[i].b),
               (long long)cases[i].want, "distance \"%s\" to \"%s\": %zu",
               cases[i].a, cases[i].b, cases[i].want);
    /* Only the first n bytes of a count (a variable's name before '='). */
    is_int((long long)config_parse_distance("CUDEFER_STATS=1", 13,
                                            "CUDEFER_STATS"),
           0, "the name before '=' only");
    char big[80];
    memset(big, 'A', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ok(config_parse_distance(big, strlen(big), "CUDEFER_STATS") == SIZE_MAX &&
           config_parse_distance("A", 1, big) == SIZE_MAX,
       "64 bytes or longer: SIZE_MAX");
}

int main(void)
{
    plan_lazy();
    test_duration_us();
    test_duration_ms();
    test_size();
    test_bool_policy();
    test_distance();
    return 0;
}
