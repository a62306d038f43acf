/* SPDX-License-Identifier: MIT */
/* Configuration: one table of knobs (variable, field, kind, default, range,
 * what 0 means) drives the defaults, the CUDEFER_* environment, the checks
 * of defer_configure, the verbose print and every range a message states;
 * the tests hold the README's and cudefer(7)'s tables to it
 * (config_knob_text).  Here: the table, the formatting of its values and
 * messages, the environment and defer_configure.  Each value is parsed in
 * full (the whole string but the blanks around it, within bounds: the
 * syntax is config_parse.c's) or reported and ignored. */
#include "config.h"
#include "config_parse.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ; /* POSIX: the process's environment */

#include "report.h"
#include "stats.h"

/* How a knob's value is written and what its field holds. */
enum kind {
    KIND_US,     /* a duration in microseconds (uint32_t) */
    KIND_MS,     /* a duration in milliseconds (uint32_t) */
    KIND_SIZE,   /* bytes, with an optional binary multiple (uint64_t) */
    KIND_COUNT,  /* a plain number (uint32_t) */
    KIND_POW2,   /* a plain number, a power of two (uint32_t) */
    KIND_BOOL,   /* 0 or 1 (int) */
    KIND_POLICY, /* a policy name (enum defer_policy) */
};

/* One knob.  Everything said about it (the range in a message, the value
 * printed, the help text config_knob_text gives the tests, which hold the
 * README and the manual to it) is made from these fields. */
struct knob {
    const char *name;     /* the environment variable */
    const char *field;    /* the field of struct defer_config */
    size_t offset, size;  /* of that field: 4 or 8 bytes */
    enum kind kind;
    uint64_t def, min, max; /* in the field's unit */
    const char *zero;     /* what 0 means ("no limit"), or NULL */
};

/* Every field is 32 or 64 bits wide: see field_get. */
_Static_assert(sizeof(enum defer_policy) == sizeof(uint32_t), "policy width");
_Static_assert(sizeof(int) == sizeof(uint32_t), "int width");

#define KNOB(var, field, kind, def, min, max, zero)                            \
    {"CUDEFER_" #var, #field, offsetof(struct defer_config, field),            \
     sizeof(((struct defer_config *)0)->field), kind, def, min, max, zero}

static const struct knob knobs[] = {
    KNOB(POLL_US, poll_us, KIND_US, 50, 1, 1000000, NULL),
    KNOB(POLL_MAX_US, poll_max_us, KIND_US, 1000, 1, 1000000, NULL),
    KNOB(IDLE_US, idle_us, KIND_US, 2000, 0, 10000000, NULL),
    KNOB(MAX_PENDING, max_pending_bytes, KIND_SIZE, 0, 0, UINT64_C(1) << 50,
         "auto, a sixth of what the application uses on the device, 512M..a quarter of the device"),
    KNOB(MAX_DELAY_MS, max_delay_ms, KIND_MS, 1000, 0, 3600000, "no limit"),
    KNOB(POLICY, policy, KIND_POLICY, DEFER_POLICY_BATCHED, 0,
         CONFIG_PARSE_NPOLICIES - 1,
         NULL),
    KNOB(EVENT_POOL, event_pool_max, KIND_COUNT, 4096, 0, 1048576, NULL),
    KNOB(DISABLE, disable, KIND_BOOL, 0, 0, 1, NULL),
    KNOB(VERBOSE, verbose, KIND_BOOL, 0, 0, 1, NULL),
    KNOB(STATS, print_stats, KIND_BOOL, 0, 0, 1, NULL),
    KNOB(CHECK, check, KIND_BOOL, 0, 0, 1, NULL),
    KNOB(CACHE_KEEP_MS, cache_keep_ms, KIND_MS, 10000, 0, 3600000,
         "kept until defer_trim"),
    KNOB(SPLIT_MIN, split_min_bytes, KIND_SIZE, UINT64_C(1) << 20, 0,
         UINT64_C(1) << 50, "never"),
    KNOB(FREE_BATCH, free_batch, KIND_COUNT, 32, 1, 4096, NULL),
    KNOB(ROUND_DIVISIONS, round_divisions, KIND_POW2, 16, 1, 256, NULL),
    KNOB(DRIVER_CALLS, driver_calls, KIND_BOOL, 1, 0, 1, NULL),
};
#define NKNOBS (sizeof knobs / sizeof *knobs)

/* ---- fields by the table ------------------------------------------------ */

/* The field of k in *cfg, widened (an int or enum as its 32 bits). */
static uint64_t field_get(const struct defer_config *cfg, const struct knob *k)
{
    const char *p = (const char *)cfg + k->offset;
    if (k->size == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Sets the field of k in *cfg to value, which is within k's range. */
static void field_set(struct defer_config *cfg, const struct knob *k,
                      uint64_t value)
{
    char *p = (char *)cfg + k->offset;
    if (k->size == sizeof(uint64_t)) {
        memcpy(p, &value, sizeof value);
    } else {
        uint32_t v = (uint32_t)value;
        memcpy(p, &v, sizeof v);
    }
}

/* ---- structs of other sizes (cudefer.h: "Structs that grow") ------------ */

/* True when knob k's field lies wholly within the first size bytes. */
static bool knob_fits(const struct knob *k, size_t size)
{
    return k->offset + k->size <= size;
}

/* Any thread.  *cfg zeroed, then every knob's default from the table. */
void config_defaults(struct defer_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < NKNOBS; i++)
        field_set(cfg, &knobs[i], knobs[i].def);
}

/* Public, any thread; never blocks.  The size bytes of *cfg zeroed, then
 * the default of every knob whose field fits.  A NULL cfg does nothing; a
 * size below 0.1.0's fields writes nothing (reported). */
void defer_config_defaults_sized(struct defer_config *cfg, size_t size)
{
    if (cfg == NULL)
        return;
    if (size < CONFIG_END_0_1_0) {
        stats_add(&stats.rejected, 1);
        report("defer_config_defaults_sized: size %zu is smaller than any "
               "struct defer_config (%zu bytes in cudefer 0.1.0): nothing "
               "written", size, (size_t)CONFIG_END_0_1_0);
        return;
    }
    memset(cfg, 0, size);
    for (size_t i = 0; i < NKNOBS; i++) {
        if (knob_fits(&knobs[i], size))
            field_set(cfg, &knobs[i], knobs[i].def);
    }
}

/* Public, any thread: cudefer 0.1.0's symbol (programs built against it,
 * callers that bypass the header's macro).  Writes 0.1.0's fields only. */
void (defer_config_defaults)(struct defer_config *cfg)
{
    defer_config_defaults_sized(cfg, CONFIG_END_0_1_0);
}

/* Any thread (config.h). */
void config_from_caller(struct defer_config *full,
                               const struct defer_config *cfg, size_t size)
{
    config_defaults(full);
    for (size_t i = 0; i < NKNOBS; i++) {
        if (knob_fits(&knobs[i], size))
            field_set(full, &knobs[i], field_get(cfg, &knobs[i]));
    }
}

/* ---- a knob's value (its syntax: config_parse.c) ------------------------ */

/* Whether v is a value knob k takes: within its range, and a power of two
 * where it must be. */
static bool knob_takes(const struct knob *k, uint64_t v)
{
    return v >= k->min && v <= k->max &&
           (k->kind != KIND_POW2 || (v & (v - 1)) == 0);
}

/* text (trimmed) as a value of knob k, within its range, into *out. */
static enum config_parse_result parse_knob(const struct knob *k,
                                           const char *text, uint64_t *out)
{
    bool b;
    enum defer_policy p;
    enum config_parse_result r;
    switch (k->kind) {
    case KIND_US:
        return config_parse_duration(text, 1, k->min, k->max, out);
    case KIND_MS:
        return config_parse_duration(text, 1000, k->min, k->max, out);
    case KIND_SIZE:
        return config_parse_size_within(text, k->min, k->max, out);
    case KIND_COUNT:
        return config_parse_count(text, k->min, k->max, out);
    case KIND_POW2:
        r = config_parse_count(text, k->min, k->max, out);
        return r == CONFIG_PARSE_OK && !knob_takes(k, *out)
                   ? CONFIG_PARSE_NOT_POW2
                   : r;
    case KIND_BOOL:
        if ((r = config_parse_switch(text, &b)) == CONFIG_PARSE_OK)
            *out = b;
        return r;
    case KIND_POLICY:
        if ((r = config_parse_policy_name(text, &p)) == CONFIG_PARSE_OK)
            *out = (uint64_t)p;
        return r;
    }
    return CONFIG_PARSE_NOT_UNDERSTOOD;
}

/* ---- what is said of a knob --------------------------------------------- */

/* bytes with the largest binary multiple that divides them: "64M". */
static void format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char letters[] = "PTGMK";
    for (int i = 0; i < 5; i++) {
        uint64_t unit = UINT64_C(1) << (10 * (5 - i));
        if (bytes != 0 && bytes % unit == 0) {
            snprintf(buf, len, "%" PRIu64 "%c", bytes / unit, letters[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, bytes);
}

/* A duration of v units of base_us microseconds with the largest time unit
 * that divides it ("2ms", "1h"); 0 in the knob's own unit ("0ms"). */
static void format_duration(uint64_t v, uint64_t base_us, char *buf,
                            size_t len)
{
    const char *suffix, *best = "";
    uint64_t u, best_us = 1;
    for (size_t i = 0; config_parse_time_unit(i, &suffix, &u); i++) {
        /* The finest unit, then each coarser one that fits. */
        if (i == 0 || u == base_us ||
            (u > base_us && v != 0 && v % (u / base_us) == 0)) {
            best = suffix;
            best_us = u;
        }
    }
    snprintf(buf, len, "%" PRIu64 "%s", v / (best_us / base_us), best);
}

/* A value of knob k as the environment spells it, with no word for 0. */
static void format_plain(const struct knob *k, uint64_t v, char *buf,
                         size_t len)
{
    if (k->kind == KIND_US) {
        format_duration(v, 1, buf, len);
    } else if (k->kind == KIND_MS) {
        format_duration(v, 1000, buf, len);
    } else if (k->kind == KIND_SIZE) {
        format_size(v, buf, len);
    } else if (k->kind == KIND_POLICY && config_parse_policy_word(v) != NULL) {
        snprintf(buf, len, "%s", config_parse_policy_word(v));
    } else {
        snprintf(buf, len, "%" PRIu64, v);
    }
}

/* A valid value of knob k as the environment would spell it, 0 with what
 * it means: "0ms (no limit)". */
static void format_value(const struct knob *k, uint64_t v, char *buf,
                         size_t len)
{
    char plain[48];
    format_plain(k, v, plain, sizeof plain);
    if (v == 0 && k->zero != NULL)
        snprintf(buf, len, "%s (%s)", plain, k->zero);
    else
        snprintf(buf, len, "%s", plain);
}

/* The values knob k takes, as the environment spells them: "1us..1s",
 * "a power of two, 1..256", "0/1, false/true, no/yes, off/on". */
static void format_range(const struct knob *k, char *buf, size_t len)
{
    char lo[32], hi[32];
    if (k->kind == KIND_BOOL) {
        snprintf(buf, len, "0/1, false/true, no/yes, off/on");
        return;
    }
    if (k->kind == KIND_POLICY) {
        snprintf(buf, len, "%s, %s", config_parse_policy_word(0),
                 config_parse_policy_word(1));
        return;
    }
    format_plain(k, k->min, lo, sizeof lo);
    format_plain(k, k->max, hi, sizeof hi);
    snprintf(buf, len, "%s%s..%s",
             k->kind == KIND_POW2 ? "a power of two, " : "", lo, hi);
}

/* How a value of knob k is written, for the environment. */
static const char *syntax_of(const struct knob *k)
{
    switch (k->kind) {
    case KIND_US:
        return "a whole number with an optional unit us, ms, s, min or h; "
               "plain: microseconds";
    case KIND_MS:
        return "a whole number with an optional unit us, ms, s, min or h; "
               "plain: milliseconds";
    case KIND_SIZE:
        return "a whole number of bytes with an optional k, M, G, T or P "
               "suffix, powers of 1024";
    case KIND_COUNT:
    case KIND_POW2:
        return "a whole number";
    case KIND_BOOL:
    case KIND_POLICY:
        return "any case";
    }
    return "";
}

/* What the environment may give knob k, for a message: "1us..1s (a
 * number with an optional unit ...; 0ms: no limit)". */
static void format_expected(const struct knob *k, char *buf, size_t len)
{
    char range[96], zero[96] = "";
    format_range(k, range, sizeof range);
    if (k->zero != NULL) {
        char plain[48];
        format_plain(k, 0, plain, sizeof plain);
        snprintf(zero, sizeof zero, "; %s: %s", plain, k->zero);
    }
    snprintf(buf, len, "%s (%s%s)", range, syntax_of(k), zero);
}

/* What a field of struct defer_config may hold, for defer_configure's
 * message: "microseconds, 1..1000000", "0 or 1". */
static void format_field_range(const struct knob *k, char *buf, size_t len)
{
    static const char *const units[] = {
        [KIND_US] = "microseconds, ", [KIND_MS] = "milliseconds, ",
        [KIND_SIZE] = "bytes, ",      [KIND_COUNT] = "a count, ",
        [KIND_POW2] = "a power of two, ",
    };
    if (k->kind == KIND_BOOL) {
        snprintf(buf, len, "0 or 1");
    } else if (k->kind == KIND_POLICY) {
        snprintf(buf, len, "%s or %s", config_parse_policy_word(0),
                 config_parse_policy_word(1));
    } else {
        snprintf(buf, len, "%s%" PRIu64 "..%" PRIu64 "%s%s", units[k->kind],
                 k->min, k->max, k->zero != NULL ? "; 0: " : "",
                 k->zero != NULL ? k->zero : "");
    }
}

/* Any thread.  The help text of knob i: see config.h. */
bool config_knob_text(size_t i, struct config_knob_text *out)
{
    if (i >= NKNOBS)
        return false;
    const struct knob *k = &knobs[i];
    out->name = k->name;
    format_plain(k, k->def, out->def, sizeof out->def);
    format_range(k, out->range, sizeof out->range);
    format_expected(k, out->expected, sizeof out->expected);
    return true;
}

/* Any value of a field, as the application set it (ints and enums signed). */
static void format_raw(const struct knob *k, uint64_t v, char *buf, size_t len)
{
    if (k->kind == KIND_BOOL || k->kind == KIND_POLICY)
        snprintf(buf, len, "%" PRId32, (int32_t)(uint32_t)v);
    else
        snprintf(buf, len, "%" PRIu64, v);
}

/* Any thread.  One "cudefer: CUDEFER_X=value" line per knob, in table
 * order, each value as the environment would spell it. */
void config_print(const struct defer_config *cfg, FILE *out)
{
    for (size_t i = 0; i < NKNOBS; i++) {
        char shown[96];
        format_value(&knobs[i], field_get(cfg, &knobs[i]), shown, sizeof shown);
        fprintf(out, "cudefer: %s=%s\n", knobs[i].name, shown);
    }
}

/* ---- the environment, checks -------------------------------------------- */

/* Knob k's value v as a poll message names it, by where it came from:
 * "CUDEFER_POLL_US (2ms)" from the environment, "CUDEFER_POLL_MAX_US (the
 * default 1ms)", "poll_max_us (200us, given to defer_configure)". */
static void poll_named(const struct knob *k, uint64_t v, bool from_env,
                       char *buf, size_t len)
{
    char d[48];
    format_duration(v, 1, d, sizeof d);
    if (from_env)
        snprintf(buf, len, "%s (%s)", k->name, d);
    else if (v == k->def)
        snprintf(buf, len, "%s (the default %s)", k->name, d);
    else
        snprintf(buf, len, "%s (%s, given to defer_configure)", k->field, d);
}

/* poll_max_us below poll_us: reported and raised.  poll and poll_max are
 * their knobs; each from_env when its variable set it. */
static void raise_poll_max(struct defer_config *cfg, const struct knob *poll,
                           bool poll_env, const struct knob *poll_max,
                           bool poll_max_env, bool say)
{
    if (cfg->poll_max_us >= cfg->poll_us)
        return;
    if (!say) {
        cfg->poll_max_us = cfg->poll_us;
        return;
    }
    char lo[96], hi[96], value[48];
    poll_named(poll_max, cfg->poll_max_us, poll_max_env, lo, sizeof lo);
    poll_named(poll, cfg->poll_us, poll_env, hi, sizeof hi);
    format_duration(cfg->poll_us, 1, value, sizeof value);
    report("%s is below %s: using %s", lo, hi, value);
    cfg->poll_max_us = cfg->poll_us;
}

/* The most characters of a value or name a line shows (then "..."). */
#define SHOWN_MAX 64

/* text as it may be shown inside quotes on one line, in buf (len at least
 * SHOWN_MAX + 4): each byte that is no printable ASCII, and a quote or a
 * backslash, written as \xNN; at most SHOWN_MAX characters so written
 * (escapes count their four), then "..." if any is left, so that the rest
 * of the line (what the knob takes, the value kept) always fits in
 * report's. */
static void shown_text(const char *text, char *buf, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; text[i] != '\0'; i++) {
        unsigned char c = (unsigned char)text[i];
        bool plain = c >= 0x20 && c <= 0x7e && c != '"' && c != '\\';
        size_t width = plain ? 1 : 4;
        if (n + width > SHOWN_MAX || n + width + 4 > len) {
            n += (size_t)snprintf(buf + n, len - n, "...");
            break;
        }
        if (plain)
            buf[n++] = (char)c;
        else
            n += (size_t)snprintf(buf + n, len - n, "\\x%02x", c);
    }
    buf[n] = '\0';
}

/* Knob k's value text, refused for why: one line naming the variable, the
 * value, what it takes and the value kept (v, in *cfg). */
static void report_refused(const struct knob *k, const char *text,
                           enum config_parse_result why, uint64_t kept)
{
    static const char *const kinds[] = {
        [KIND_US] = "a duration", [KIND_MS] = "a duration",
        [KIND_SIZE] = "a size",   [KIND_COUNT] = "a number",
        [KIND_POW2] = "a number", [KIND_BOOL] = "a switch",
        [KIND_POLICY] = "a policy",
    };
    char problem[64], shown[SHOWN_MAX + 4], expected[256], value[96];
    if (why == CONFIG_PARSE_OUT_OF_RANGE)
        snprintf(problem, sizeof problem, "is out of range");
    else if (why == CONFIG_PARSE_NOT_WHOLE)
        snprintf(problem, sizeof problem, "is not a whole number of "
                 "milliseconds");
    else if (why == CONFIG_PARSE_NOT_POW2)
        snprintf(problem, sizeof problem, "is not a power of two");
    else
        snprintf(problem, sizeof problem, "is not %s", kinds[k->kind]);
    shown_text(text, shown, sizeof shown);
    format_expected(k, expected, sizeof expected);
    format_plain(k, kept, value, sizeof value);
    report("%s=\"%s\" %s: expected %s; using %s%s", k->name, shown, problem,
           expected, kept == k->def ? "the default " : "", value);
}

/* CUDEFER_* names that are no knob of the library's but are read by the
 * rest of cudefer: the Python package's (the library to load, the C++
 * compiler for cudefer.torch), bench's PyTorch shims' trace file; and the
 * test suites' own (CUDEFER_TEST_*). */
static bool known_elsewhere(const char *name, size_t len)
{
    static const char *const names[] = {"CUDEFER_LIB", "CUDEFER_CXX",
                                        "CUDEFER_TRACE_FILE"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0)
            return true;
    return len > 13 && memcmp(name, "CUDEFER_TEST_", 13) == 0;
}

/* Any thread.  Each CUDEFER_* variable of the environment (its name in
 * any case) that names no knob (nor anything else of cudefer's:
 * known_elsewhere) is a setting the user believes applied and does not:
 * said in one line, with the knob it was likely meant to be (the nearest
 * name, at most 3 edits away, or one it begins, in any case). */
static void report_unknown_names(void)
{
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        const char *var = *e, *eq = strchr(var, '=');
        if (eq == NULL || strncasecmp(var, "CUDEFER_", 8) != 0)
            continue;
        size_t len = (size_t)(eq - var);
        if (known_elsewhere(var, len))
            continue;
        /* The name in capitals, as the knobs are spelt, to find the knob
         * meant (a longer one is near none). */
        char upper[64];
        size_t n = len < sizeof upper ? len : sizeof upper - 1;
        for (size_t i = 0; i < n; i++)
            upper[i] = (char)toupper((unsigned char)var[i]);
        upper[n] = '\0';
        bool knob = false;
        const struct knob *near = NULL;
        size_t near_d = 4;
        for (size_t i = 0; i < NKNOBS; i++) {
            const char *name = knobs[i].name;
            if (strlen(name) == len && memcmp(name, var, len) == 0) {
                knob = true;
                break;
            }
            size_t d = config_parse_distance(upper, len, name);
            if (len == n && strncmp(name, upper, len) == 0 && name[len] == '_')
                d = 0; /* CUDEFER_POLL for CUDEFER_POLL_US */
            if (d < near_d) {
                near_d = d;
                near = &knobs[i];
            }
        }
        if (knob)
            continue;
        /* One character more than a line shows, so that shown_text sees a
         * longer name and marks the cut with "...". */
        char shown[SHOWN_MAX + 4];
        char name[SHOWN_MAX + 2];
        snprintf(name, sizeof name, "%.*s",
                 (int)(len < SHOWN_MAX + 1 ? len : SHOWN_MAX + 1), var);
        shown_text(name, shown, sizeof shown);
        if (near != NULL)
            report("%s is not a cudefer setting: ignored (did you mean %s?)",
                   shown, near->name);
        else
            report("%s is not a cudefer setting: ignored (man cudefer lists "
                   "them)", shown);
    }
}

/* Any thread.  Returns the number of invalid values (each reported once,
 * when say); a variable that names no setting is said
 * (report_unknown_names, when say) and not counted. */
static int load_env(struct defer_config *cfg, bool say)
{
    int invalid = 0;
    bool from_env[NKNOBS] = {false};
    for (size_t i = 0; i < NKNOBS; i++) {
        const struct knob *k = &knobs[i];
        const char *text = getenv(k->name);
        if (text == NULL)
            continue;
        /* Read whole, however long: zero-padded, a number; too many
         * digits, out of range.  Without memory, refused as unreadable. */
        size_t need = strlen(text) + 1;
        char *buf = malloc(need);
        const char *value_text =
            buf != NULL ? config_parse_trim(text, buf, need) : NULL;
        if (value_text != NULL && value_text[0] == '\0') {
            free(buf);
            continue; /* set to nothing (or blanks): as if unset */
        }
        uint64_t value;
        enum config_parse_result r =
            value_text != NULL ? parse_knob(k, value_text, &value)
                               : CONFIG_PARSE_NOT_UNDERSTOOD;
        free(buf);
        if (r == CONFIG_PARSE_OK) {
            field_set(cfg, k, value);
            from_env[i] = true;
        } else {
            if (say)
                report_refused(k, text, r, field_get(cfg, k));
            invalid++;
        }
    }
    size_t p = 0, m = 0;
    for (size_t i = 0; i < NKNOBS; i++) {
        if (knobs[i].offset == offsetof(struct defer_config, poll_us))
            p = i;
        if (knobs[i].offset == offsetof(struct defer_config, poll_max_us))
            m = i;
    }
    raise_poll_max(cfg, &knobs[p], from_env[p], &knobs[m], from_env[m],
                   say);
    if (say)
        report_unknown_names();
    return invalid;
}

int config_load_env(struct defer_config *cfg)
{
    return load_env(cfg, true);
}

int config_load_env_quietly(struct defer_config *cfg)
{
    return load_env(cfg, false);
}

bool config_equal(const struct defer_config *a, const struct defer_config *b)
{
    for (size_t i = 0; i < NKNOBS; i++)
        if (field_get(a, &knobs[i]) != field_get(b, &knobs[i]))
            return false;
    return true;
}

/* Any thread (defer_configure).  True if valid; else false, why filled. */
bool config_validate(const struct defer_config *cfg, char *why, size_t len)
{
    for (size_t i = 0; i < NKNOBS; i++) {
        const struct knob *k = &knobs[i];
        uint64_t v = field_get(cfg, k);
        if (!knob_takes(k, v)) {
            char shown[32], range[160];
            format_raw(k, v, shown, sizeof shown);
            format_field_range(k, range, sizeof range);
            snprintf(why, len, "%s is %s (expected %s)", k->field, shown,
                     range);
            return false;
        }
    }
    if (cfg->poll_max_us < cfg->poll_us) {
        /* In the words of the range messages above: the most is that of
         * poll_max_us's knob (in range here), the least poll_us. */
        uint64_t most = 0;
        for (size_t i = 0; i < NKNOBS; i++)
            if (knobs[i].offset == offsetof(struct defer_config, poll_max_us))
                most = knobs[i].max;
        snprintf(why, len,
                 "poll_max_us is %" PRIu32 " with poll_us %" PRIu32
                 " (expected microseconds, at least poll_us: %" PRIu32
                 "..%" PRIu64 ")",
                 cfg->poll_max_us, cfg->poll_us, cfg->poll_us, most);
        return false;
    }
    if (len > 0)
        why[0] = '\0';
    return true;
}
