/* Configuration: one table of knobs (variable, field, kind, default, range,
 * what is expected) drives the defaults, the CUDEFER_* environment, the
 * checks of defer_configure and the verbose print.  Each value is parsed in
 * full (the whole string, within bounds) or reported and ignored. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "report.h"

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

struct knob {
    const char *name;     /* the environment variable */
    const char *field;    /* the field of struct defer_config */
    size_t offset, size;  /* of that field: 4 or 8 bytes */
    enum kind kind;
    uint64_t def, min, max;
    const char *expected; /* "invalid value ... (expected <this>)" */
    const char *zero;     /* what 0 means when printed, or NULL */
};

/* Every field is 32 or 64 bits wide: see field_get. */
_Static_assert(sizeof(enum defer_policy) == sizeof(uint32_t), "policy width");
_Static_assert(sizeof(int) == sizeof(uint32_t), "int width");

#define KNOB(var, field, kind, def, min, max, expected, zero)                \
    {"CUDEFER_" #var, #field, offsetof(struct defer_config, field),            \
     sizeof(((struct defer_config *)0)->field), kind, def, min, max, expected, \
     zero}

static const char *const policy_names[] = {
    [DEFER_POLICY_BATCHED] = "batched",
    [DEFER_POLICY_EAGER] = "eager",
};
#define NPOLICIES (sizeof policy_names / sizeof *policy_names)

static const struct knob knobs[] = {
    KNOB(POLL_US, poll_us, KIND_US, 50, 1, 1000000,
         "microseconds, 1..1000000", NULL),
    KNOB(POLL_MAX_US, poll_max_us, KIND_US, 1000, 1, 1000000,
         "microseconds, 1..1000000", NULL),
    KNOB(IDLE_US, idle_us, KIND_US, 2000, 0, 10000000,
         "microseconds, 0..10000000", NULL),
    KNOB(MAX_PENDING, max_pending_bytes, KIND_SIZE, 0, 0, UINT64_C(1) << 50,
         "bytes with an optional k/M/G/T suffix, e.g. 4G; 0 for auto",
         "auto (a quarter of device memory)"),
    KNOB(MAX_DELAY_MS, max_delay_ms, KIND_MS, 1000, 0, 3600000,
         "milliseconds, 0..3600000", "0 (no limit)"),
    KNOB(POLICY, policy, KIND_POLICY, DEFER_POLICY_BATCHED, 0, NPOLICIES - 1,
         "batched or eager", NULL),
    KNOB(EVENT_POOL, event_pool_max, KIND_COUNT, 4096, 0, 1048576,
         "a count, 0..1048576", NULL),
    KNOB(DISABLE, disable, KIND_BOOL, 0, 0, 1, "0 or 1", NULL),
    KNOB(VERBOSE, verbose, KIND_BOOL, 0, 0, 1, "0 or 1", NULL),
    KNOB(STATS, print_stats, KIND_BOOL, 0, 0, 1, "0 or 1", NULL),
    KNOB(CHECK, check, KIND_BOOL, 0, 0, 1, "0 or 1", NULL),
    KNOB(CACHE_KEEP_MS, cache_keep_ms, KIND_MS, 10000, 0, 3600000,
         "milliseconds, 0..3600000", "0 (kept until defer_trim)"),
    KNOB(SPLIT_MIN, split_min_bytes, KIND_SIZE, UINT64_C(1) << 20, 0,
         UINT64_C(1) << 50,
         "bytes with an optional k/M/G/T suffix, e.g. 1M; 0 for never",
         NULL),
    KNOB(FREE_BATCH, free_batch, KIND_COUNT, 32, 1, 4096,
         "a count, 1..4096", NULL),
    KNOB(ROUND_DIVISIONS, round_divisions, KIND_POW2, 16, 1, 256,
         "a power of two, 1..256", NULL),
    KNOB(DRIVER_CALLS, driver_calls, KIND_BOOL, 1, 0, 1, "0 or 1", NULL),
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

/* Where the fields of cudefer 0.1.0's struct defer_config end (check was
 * its last): the plain 0.1.0 symbols read and write no further, and a
 * smaller size is refused.  (0.1.0's sizeof is larger: cache_keep_ms went
 * into its tail padding, which is why the end of the fields is used.)  A new
 * knob goes at the end of struct defer_config, at or past the sizeof of the
 * last release's struct (add an explicit padding field if need be): the
 * size a caller passes must never cover a field lying in its padding. */
#define CONFIG_END_0_1_0 \
    (offsetof(struct defer_config, check) + sizeof(((struct defer_config *)0)->check))

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

/* *full = the defaults, then the value of every knob of the caller's cfg
 * (size bytes, at least 0.1.0's fields) whose field fits in size bytes. */
static void config_from_caller(struct defer_config *full,
                               const struct defer_config *cfg, size_t size)
{
    config_defaults(full);
    for (size_t i = 0; i < NKNOBS; i++) {
        if (knob_fits(&knobs[i], size))
            field_set(full, &knobs[i], field_get(cfg, &knobs[i]));
    }
}

/* ---- parsers ------------------------------------------------------------ */

/* The leading digits of text into *value, *end just after them.  False when
 * text does not start with a digit (strtoull would skip blanks and take a
 * sign) or the number overflows. */
static bool parse_digits(const char *text, uint64_t *value, const char **end)
{
    if (text[0] < '0' || text[0] > '9')
        return false;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(text, &e, 10);
    if (errno != 0)
        return false;
    *value = v;
    *end = e;
    return true;
}

/* value * scale into *out when it is within [min, max] (no overflow). */
static bool scale_within(uint64_t value, uint64_t scale, uint64_t min,
                         uint64_t max, uint64_t *out)
{
    if (value > max / scale)
        return false;
    value *= scale;
    if (value < min)
        return false;
    *out = value;
    return true;
}

static const struct {
    const char *suffix;
    uint64_t us;
} time_units[] = {{"us", 1}, {"ms", 1000}, {"s", 1000000}};

/* A duration counted in units of base_us microseconds: digits, then an
 * optional time unit no finer than the base. */
static bool parse_duration(const char *text, uint64_t base_us, uint64_t min,
                           uint64_t max, uint64_t *out)
{
    uint64_t value;
    const char *end;
    if (!parse_digits(text, &value, &end))
        return false;
    uint64_t scale = 1;
    if (*end != '\0') {
        size_t i = 0, n = sizeof time_units / sizeof *time_units;
        while (i < n && strcmp(end, time_units[i].suffix) != 0)
            i++;
        if (i == n || time_units[i].us < base_us)
            return false;
        scale = time_units[i].us / base_us;
    }
    return scale_within(value, scale, min, max, out);
}

/* Any thread.  True with microseconds in *out: see config.h. */
bool config_parse_duration_us(const char *text, uint64_t min_us,
                              uint64_t max_us, uint64_t *out)
{
    return parse_duration(text, 1, min_us, max_us, out);
}

/* Any thread.  True with milliseconds in *out ("us" refused). */
bool config_parse_duration_ms(const char *text, uint64_t min_ms,
                              uint64_t max_ms, uint64_t *out)
{
    return parse_duration(text, 1000, min_ms, max_ms, out);
}

/* The multiple of a size suffix into *scale: an optional k/K, M, G or T,
 * then an optional "B", or "iB" after a multiple.  False if not one. */
static bool size_scale(const char *suffix, uint64_t *scale)
{
    static const char letters[] = "kKMGT";
    static const unsigned shifts[] = {10, 10, 20, 30, 40};
    const char *hit = suffix[0] != '\0' ? strchr(letters, suffix[0]) : NULL;
    *scale = 1;
    if (hit != NULL) {
        *scale = UINT64_C(1) << shifts[hit - letters];
        suffix++;
        if (strcmp(suffix, "iB") == 0)
            return true;
    }
    return suffix[0] == '\0' || strcmp(suffix, "B") == 0;
}

/* Any thread.  True with bytes in [0, max] in *out; overflow refused. */
bool config_parse_size(const char *text, uint64_t max, uint64_t *out)
{
    uint64_t value, scale;
    const char *end;
    if (!parse_digits(text, &value, &end) || !size_scale(end, &scale))
        return false;
    return scale_within(value, scale, 0, max, out);
}

/* A plain number within [min, max]. */
static bool parse_count(const char *text, uint64_t min, uint64_t max,
                        uint64_t *out)
{
    uint64_t value;
    const char *end;
    if (!parse_digits(text, &value, &end) || *end != '\0')
        return false;
    return scale_within(value, 1, min, max, out);
}

/* Any thread.  True with the boolean in *out. */
bool config_parse_bool(const char *text, bool *out)
{
    static const char *const words[][2] = {
        {"0", "1"}, {"no", "yes"}, {"false", "true"}, {"off", "on"},
    };
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        for (int v = 0; v < 2; v++) {
            if (strcasecmp(text, words[i][v]) == 0) {
                *out = v;
                return true;
            }
        }
    }
    return false;
}

/* Any thread.  True with the policy named (any case) in *out. */
bool config_parse_policy(const char *text, enum defer_policy *out)
{
    for (size_t i = 0; i < NPOLICIES; i++) {
        if (strcasecmp(text, policy_names[i]) == 0) {
            *out = (enum defer_policy)i;
            return true;
        }
    }
    return false;
}

/* Whether v is a value knob k takes: within its range, and a power of two
 * where it must be. */
static bool knob_takes(const struct knob *k, uint64_t v)
{
    return v >= k->min && v <= k->max &&
           (k->kind != KIND_POW2 || (v & (v - 1)) == 0);
}

/* text as a value of knob k, within its range, into *out. */
static bool parse_knob(const struct knob *k, const char *text, uint64_t *out)
{
    bool b;
    enum defer_policy p;
    switch (k->kind) {
    case KIND_US:
        return config_parse_duration_us(text, k->min, k->max, out);
    case KIND_MS:
        return config_parse_duration_ms(text, k->min, k->max, out);
    case KIND_SIZE:
        return config_parse_size(text, k->max, out) && *out >= k->min;
    case KIND_COUNT:
        return parse_count(text, k->min, k->max, out);
    case KIND_POW2:
        return parse_count(text, k->min, k->max, out) && knob_takes(k, *out);
    case KIND_BOOL:
        if (!config_parse_bool(text, &b))
            return false;
        *out = b;
        return true;
    case KIND_POLICY:
        if (!config_parse_policy(text, &p))
            return false;
        *out = (uint64_t)p;
        return true;
    }
    return false;
}

/* ---- printing ----------------------------------------------------------- */

/* bytes with the largest binary multiple that divides them: "64M". */
static void format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char letters[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t unit = UINT64_C(1) << (10 * (4 - i));
        if (bytes != 0 && bytes % unit == 0) {
            snprintf(buf, len, "%" PRIu64 "%c", bytes / unit, letters[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, bytes);
}

/* A valid value of knob k as the environment would spell it. */
static void format_value(const struct knob *k, uint64_t v, char *buf,
                         size_t len)
{
    if (v == 0 && k->zero != NULL) {
        snprintf(buf, len, "%s", k->zero);
    } else if (k->kind == KIND_US) {
        snprintf(buf, len, "%" PRIu64 "us", v);
    } else if (k->kind == KIND_MS) {
        snprintf(buf, len, "%" PRIu64 "ms", v);
    } else if (k->kind == KIND_SIZE) {
        format_size(v, buf, len);
    } else if (k->kind == KIND_POLICY && v < NPOLICIES) {
        snprintf(buf, len, "%s", policy_names[v]);
    } else {
        snprintf(buf, len, "%" PRIu64, v);
    }
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
        char shown[64];
        format_value(&knobs[i], field_get(cfg, &knobs[i]), shown, sizeof shown);
        fprintf(out, "cudefer: %s=%s\n", knobs[i].name, shown);
    }
}

/* ---- the environment, checks -------------------------------------------- */

/* poll_max_us below poll_us: reported and raised. */
static void raise_poll_max(struct defer_config *cfg)
{
    if (cfg->poll_max_us >= cfg->poll_us)
        return;
    report("CUDEFER_POLL_MAX_US (%" PRIu32 "us) is below CUDEFER_POLL_US "
           "(%" PRIu32 "us): using %" PRIu32 "us",
           cfg->poll_max_us, cfg->poll_us, cfg->poll_us);
    cfg->poll_max_us = cfg->poll_us;
}

/* Any thread.  Returns the number of invalid values (each reported once). */
int config_load_env(struct defer_config *cfg)
{
    int invalid = 0;
    for (size_t i = 0; i < NKNOBS; i++) {
        const struct knob *k = &knobs[i];
        const char *text = getenv(k->name);
        uint64_t value;
        if (text == NULL)
            continue;
        if (parse_knob(k, text, &value)) {
            field_set(cfg, k, value);
        } else {
            report("invalid value for %s: \"%s\" (expected %s)", k->name, text,
                   k->expected);
            invalid++;
        }
    }
    raise_poll_max(cfg);
    return invalid;
}

/* Any thread (defer_configure).  True if valid; else false, why filled. */
bool config_validate(const struct defer_config *cfg, char *why, size_t len)
{
    for (size_t i = 0; i < NKNOBS; i++) {
        const struct knob *k = &knobs[i];
        uint64_t v = field_get(cfg, k);
        if (!knob_takes(k, v)) {
            char shown[32];
            format_raw(k, v, shown, sizeof shown);
            snprintf(why, len, "%s is %s (expected %s)", k->field, shown,
                     k->expected);
            return false;
        }
    }
    if (cfg->poll_max_us < cfg->poll_us) {
        snprintf(why, len, "poll_max_us (%" PRIu32 ") is below poll_us (%"
                 PRIu32 ")", cfg->poll_max_us, cfg->poll_us);
        return false;
    }
    if (len > 0)
        why[0] = '\0';
    return true;
}

/* ---- defer_configure and start-up --------------------------------------- */

static struct {
    pthread_mutex_t lock;
    bool configured;              /* defer_configure stored app */
    bool started;                 /* in_force settled: too late to configure */
    bool shut_down;               /* defer_shutdown came first: never starts */
    struct defer_config app;      /* from defer_configure */
    struct defer_config in_force; /* app or defaults, then the environment */
} state = {.lock = PTHREAD_MUTEX_INITIALIZER};

void config_fork_child(void)
{
    pthread_mutex_init(&state.lock, NULL);
}

/* Take state.lock (a fork child gets it unlocked: config_fork_child). */
static void state_lock(void)
{
    pthread_mutex_lock(&state.lock);
}

/* state.lock held.  The first start: settle in_force, once. */
static void settle_locked(void)
{
    if (state.configured)
        state.in_force = state.app;
    else
        config_defaults(&state.in_force);
    config_load_env(&state.in_force);
    if (state.in_force.verbose)
        config_print(&state.in_force, stderr);
    state.started = true;
}

/* The reclaimer's start-up, any number of times.  Returns nothing: the
 * configuration in force is copied into *out. */
void config_at_start(struct defer_config *out)
{
    state_lock();
    if (!state.started)
        settle_locked();
    *out = state.in_force;
    pthread_mutex_unlock(&state.lock);
}

/* defer_shutdown before any start: from now on defer_configure is refused
 * (the reclaimer will never start to use it). */
void config_refuse_from_now(void)
{
    state_lock();
    state.shut_down = true;
    pthread_mutex_unlock(&state.lock);
}

/* Public, any thread, before the first defer call; never blocks on the GPU.
 * *cfg is size bytes (the knobs that do not fit take their defaults).
 * Returns cudaSuccess, or the first that applies: cudaErrorInvalidValue for
 * NULL or a size below 0.1.0's fields, cudaErrorNotPermitted once started or
 * after defer_shutdown, cudaErrorInvalidValue when out of range; each
 * reported. */
cudaError_t defer_configure_sized(const struct defer_config *cfg, size_t size)
{
    if (cfg == NULL) {
        report("defer_configure: cfg is NULL: ignored");
        return cudaErrorInvalidValue;
    }
    if (size < CONFIG_END_0_1_0) {
        report("defer_configure: size %zu is smaller than any struct "
               "defer_config (%zu bytes in cudefer 0.1.0): ignored",
               size, (size_t)CONFIG_END_0_1_0);
        return cudaErrorInvalidValue;
    }
    struct defer_config full;
    config_from_caller(&full, cfg, size);
    char why[256];
    bool valid = config_validate(&full, why, sizeof why);
    state_lock();
    bool started = state.started, shut_down = state.shut_down;
    if (!started && !shut_down && valid) {
        state.app = full;
        state.configured = true;
    }
    pthread_mutex_unlock(&state.lock);
    if (started) {
        report("defer_configure called after the first defer call: ignored");
        return cudaErrorNotPermitted;
    }
    if (shut_down) {
        report("defer_configure called after defer_shutdown: ignored");
        return cudaErrorNotPermitted;
    }
    if (!valid) {
        report("defer_configure: %s", why);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

/* Public, any thread: cudefer 0.1.0's symbol (programs built against it,
 * callers that bypass the header's macro).  Reads 0.1.0's fields only; the
 * later knobs take their defaults.  Returns as defer_configure_sized. */
cudaError_t (defer_configure)(const struct defer_config *cfg)
{
    return defer_configure_sized(cfg, CONFIG_END_0_1_0);
}
