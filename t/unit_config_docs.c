/* SPDX-License-Identifier: MIT */
/* The documentation's tables against the knobs: for every CUDEFER_*
 * variable, README.md's row and cudefer(7)'s entry state the default and
 * the range config.c works with (config_knob_text), and the documented
 * default, least and most are what the environment takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit_config.h"

/* $srcdir/path (srcdir: "." unless the harness says), whole, in a static
 * buffer; bails if it cannot be read. */
static const char *doc_file(const char *path, char *buf, size_t cap)
{
    const char *dir = getenv("srcdir");
    char name[512];
    snprintf(name, sizeof name, "%s/%s", dir != NULL ? dir : ".", path);
    FILE *f = fopen(name, "r");
    if (f == NULL)
        sysbail("open %s", name);
    size_t n = fread(buf, 1, cap - 1, f);
    if (n == cap - 1)
        bail("%s is larger than %zu bytes", name, cap - 1);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Cell i (0: the variable) of README.md's row for var, trimmed, into cell;
 * false if there is no such row. */
static bool readme_cell(const char *readme, const char *var, int i,
                        char *cell, size_t len)
{
    char head[80];
    snprintf(head, sizeof head, "\n| `%s` |", var);
    const char *row = strstr(readme, head);
    if (row == NULL)
        return false;
    row += 2; /* past "\n|" */
    for (int c = 0; c < i; c++) {
        const char *bar = strpbrk(row, "|\n");
        if (bar == NULL || *bar != '|')
            return false;
        row = bar + 1;
    }
    const char *end = strpbrk(row, "|\n");
    if (end == NULL || *end != '|')
        return false;
    while (*row == ' ')
        row++;
    size_t n = (size_t)(end - row);
    while (n > 0 && row[n - 1] == ' ')
        n--;
    snprintf(cell, len, "%.*s", (int)n, row);
    return true;
}

/* The first `quoted` text of cell into out; false if none. */
static bool first_code(const char *cell, char *out, size_t len)
{
    const char *a = strchr(cell, '`');
    const char *b = a != NULL ? strchr(a + 1, '`') : NULL;
    if (b == NULL)
        return false;
    snprintf(out, len, "%.*s", (int)(b - a - 1), a + 1);
    return true;
}

/* cudefer(7)'s entry for var: from ".B var" to the next paragraph. */
static bool man_entry(const char *man, const char *var, char *out, size_t len)
{
    char head[80];
    snprintf(head, sizeof head, ".TP\n.B %s\n", var);
    const char *at = strstr(man, head);
    if (at == NULL)
        return false;
    at += strlen(head);
    const char *end = at + strlen(at);
    static const char *const stops[] = {"\n.TP\n", "\n.PP\n", "\n.SH "};
    for (size_t i = 0; i < sizeof stops / sizeof *stops; i++) {
        const char *e = strstr(at, stops[i]);
        if (e != NULL && e < end)
            end = e;
    }
    snprintf(out, len, "%.*s", (int)(end - at), at);
    return true;
}

/* var=value alone (but for the other of CUDEFER_POLL_US and
 * CUDEFER_POLL_MAX_US at its least or most, so that the latter is not
 * raised to the former): accepted quietly with the field in *got, or
 * refused. */
static bool env_takes(const char *var, const char *value, uint64_t *got,
                      const char **said)
{
    struct defer_config cfg;
    config_defaults(&cfg);
    set_cudefer_env("");
    if (strcmp(var, "CUDEFER_POLL_MAX_US") == 0)
        setenv("CUDEFER_POLL_US", "1", 1);
    if (strcmp(var, "CUDEFER_POLL_US") == 0)
        setenv("CUDEFER_POLL_MAX_US", "1000000", 1);
    setenv(var, value, 1);
    stderr_capture_begin();
    int invalid = config_load_env(&cfg);
    *said = stderr_capture_end();
    set_cudefer_env("");
    *got = field_of(&cfg, var);
    return invalid == 0 && (*said)[0] == '\0';
}

/* var=value is refused as out of range, in the one line a refusal is. */
static void refused_out_of_range(const char *var, const char *value)
{
    uint64_t got;
    const char *said;
    char want[600];
    refusal(want, sizeof want, var, value, "is out of range");
    ok(!env_takes(var, value, &got, &said) && strcmp(said, want) == 0,
       "%s=%s, one step outside, is refused in one line", var, value);
}

/* For every knob: README.md's row and cudefer(7)'s entry say the default
 * and the range config.c works with (config_knob_text), and the bounds the
 * README documents are taken, one step outside them (a plain number is in
 * the knob's own unit) refused, the default documented is the default. */
static void test_documented_bounds(void)
{
    static char readme_buf[1 << 20], man_buf[1 << 18];
    const char *readme = doc_file("README.md", readme_buf, sizeof readme_buf);
    const char *man = doc_file("man/cudefer.7", man_buf, sizeof man_buf);
    struct config_knob_text t;
    size_t n = 0;
    for (size_t i = 0; config_knob_text(i, &t); i++, n++) {
        char cell[2048], def[128], range[128], entry[4096];
        bool row = readme_cell(readme, t.name, 2, cell, sizeof cell) &&
                   first_code(cell, def, sizeof def) &&
                   readme_cell(readme, t.name, 3, cell, sizeof cell) &&
                   first_code(cell, range, sizeof range);
        if (!ok(row, "README.md has a row for %s, its default and range "
                     "quoted", t.name))
            continue;
        is_str(def, t.def, "README.md: %s's default", t.name);
        is_str(range, t.range, "README.md: %s's range", t.name);
        char want[200];
        snprintf(want, sizeof want, "Default %s;", t.def);
        ok(man_entry(man, t.name, entry, sizeof entry) &&
               strstr(entry, want) != NULL && strstr(entry, t.range) != NULL,
           "cudefer(7): %s's entry says \"%s\" and \"%s\"", t.name, want,
           t.range);

        /* The documented default is the default. */
        struct defer_config d;
        config_defaults(&d);
        uint64_t got, lo, hi;
        const char *said;
        ok(env_takes(t.name, def, &got, &said) && got == field_of(&d, t.name),
           "%s=%s (the documented default) is the default", t.name, def);

        const char *dots = strstr(range, "..");
        if (dots != NULL) {
            const char *from = range;
            if (strncmp(from, "a power of two, ", 16) == 0)
                from += 16;
            char lo_text[64], hi_text[64];
            snprintf(lo_text, sizeof lo_text, "%.*s", (int)(dots - from),
                     from);
            snprintf(hi_text, sizeof hi_text, "%s", dots + 2);
            ok(env_takes(t.name, lo_text, &lo, &said),
               "%s=%s (the documented least) is taken", t.name, lo_text);
            ok(env_takes(t.name, hi_text, &hi, &said) && hi > lo,
               "%s=%s (the documented most) is taken", t.name, hi_text);
            char step[32];
            if (lo > 0) {
                snprintf(step, sizeof step, "%llu",
                         (unsigned long long)lo - 1);
                refused_out_of_range(t.name, step);
            }
            snprintf(step, sizeof step, "%llu", (unsigned long long)hi + 1);
            refused_out_of_range(t.name, step);
            continue;
        }
        /* Words: "a, b" (a policy: the values in order) or pairs "x/y"
         * (a switch: x is 0, y is 1). */
        char words[128];
        snprintf(words, sizeof words, "%s", range);
        uint64_t next = 0;
        for (char *w = strtok(words, ", /"); w != NULL;
             w = strtok(NULL, ", /")) {
            uint64_t want_value = strchr(range, '/') != NULL ? next % 2 : next;
            ok(env_takes(t.name, w, &got, &said) && got == want_value,
               "%s=%s (documented) is %llu", t.name, w,
               (unsigned long long)want_value);
            next++;
        }
        ok(next >= 2, "%s: %llu words documented", t.name,
           (unsigned long long)next);
        ok(!env_takes(t.name, "2", &got, &said) && said[0] != '\0',
           "%s=2, outside the words, is refused", t.name);
    }
    is_int((long long)n, (long long)NVARS, "config_knob_text: every knob");
    size_t rows = 0;
    for (const char *r = strstr(readme, "\n| `CUDEFER_"); r != NULL;
         r = strstr(r + 1, "\n| `CUDEFER_"))
        rows++;
    is_int((long long)rows, (long long)n,
           "README.md's table has a row per knob and no other");
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("");
    test_documented_bounds();
    return 0;
}
