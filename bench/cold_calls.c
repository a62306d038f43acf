/* SPDX-License-Identifier: MIT */
/*
 * cold-calls: what cudefer's PyTorch entry points cost the launching thread
 * when its caches are cold, as they are between two allocator calls of a
 * training step (PyTorch's own work runs in between), measured on the FAKE
 * CUDA runtime (t/fake), beside the pluggable-floor pair of
 * bench/torch_shims.c:
 *
 *     bench/cold-calls [--evict KIB] [--cycles N] [--seal-when-full] TRACE
 *
 * TRACE is an allocation trace of bench/torch_shims.c (cudefer-trace; the
 * H100 traces are in bench/results/h100-traces.tar.gz).  Every
 * allocation (but those the trace says were refused) and free of it is
 * replayed on the legacy stream, as PyTorch
 * makes them, --cycles times (default 3; the first warms up and is not
 * counted), by each of three rows in turn:
 *   cudefer        defer_pluggable_alloc / defer_pluggable_free
 *   floor          shim_floor_alloc / shim_floor_free (exact-size lists)
 *   cudaGetDevice  the fake's cudaGetDevice alone, once a call: the part of
 *                  cudefer's cost that is the fake's (a real cudaGetDevice
 *                  reads thread-local state; the fake's takes its lock)
 * Before each call the thread writes --evict KiB of its own (default 2048,
 * an L2 cache; 0: warm caches), so that the call finds little of its data
 * in the caches, and only the call is timed.  No kernel runs: every block
 * is free by the next request, which is not what a GPU a step behind gives
 * (bench/replay-trace measures that policy); this measures the work of the
 * calls.  On an H100, in LM training with every call timed (--time-calls;
 * about 1050 allocations and 1040 frees a step), cudefer's calls took
 * about 0.71/0.92 us each and the floor's 0.24/0.19.
 *
 * --seal-when-full: cudefer's free batches are sealed only when full, not
 * also once their oldest free is 1 ms old.  Under valgrind, which runs the
 * calls ~50x slower, the age seals most batches after a few frees and its
 * count depends on the host's speed; full-only, a run's cost is the same
 * from run to run (bench/callgrind_calls.py), so two builds compare.
 *
 * Prints one line per row (microseconds per allocation and per free, means
 * over the counted cycles), then one JSON object with the same numbers.
 * Bad arguments or an unreadable trace: a message, exit status 2.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdint.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cudefer.h"

void *shim_floor_alloc(size_t size, int device, cudaStream_t stream);
void shim_floor_free(void *ptr, size_t size, int device, cudaStream_t stream);
/* src/free_batch.h, in the fake build's library */
void free_batch_set_age_ns(uint64_t age_ns);

enum row { ROW_CUDEFER, ROW_FLOOR, ROW_GET_DEVICE, NROWS };
static const char *const row_names[NROWS] = {"cudefer", "floor",
                                             "cudaGetDevice"};

struct op {
    size_t size;
    unsigned long long id; /* the trace's pointer */
    bool alloc;
};

static volatile unsigned char *junk;
static size_t junk_bytes;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Write a line of every 64 bytes of junk: the caches now hold it. */
static void evict(void)
{
    for (size_t i = 0; i < junk_bytes; i += 64)
        junk[i]++;
}

static _Noreturn void usage(const char *why)
{
    fprintf(stderr, "cold-calls: %s\nusage: bench/cold-calls [--evict KIB] "
                    "[--cycles N] [--seal-when-full] TRACE\n", why);
    exit(2);
}

/* The whole of s as a number in [lo, hi], or usage. */
static unsigned long number(const char *s, unsigned long lo, unsigned long hi,
                            const char *what)
{
    char *end;
    errno = 0;
    unsigned long v = s != NULL ? strtoul(s, &end, 10) : 0;
    if (s == NULL || !isdigit((unsigned char)s[0]) || *end != '\0' ||
        errno != 0 || v < lo || v > hi) {
        char why[128];
        snprintf(why, sizeof why, "%s wants a number from %lu to %lu, not "
                 "\"%s\"", what, lo, hi, s != NULL ? s : "");
        usage(why);
    }
    return v;
}

/* The trace's allocations and frees, in order (other lines skipped). */
static struct op *read_trace(const char *path, size_t *n)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "cold-calls: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    size_t cap = 1024;
    struct op *ops = malloc(cap * sizeof *ops);
    char line[256];
    unsigned long long stream;
    *n = 0;
    while (ops != NULL && fgets(line, sizeof line, f) != NULL) {
        struct op o = {0};
        if (line[0] == 'a' &&
            sscanf(line, "a %zu %llu %llx", &o.size, &stream, &o.id) == 3) {
            if (o.id == 0 && o.size > 0)
                continue; /* refused (out of memory) when recorded */
            o.alloc = true;
        }
        else if (line[0] != 'f' ||
                 sscanf(line, "f %llx %llu", &o.id, &stream) != 2)
            continue;
        if (*n == cap)
            ops = realloc(ops, (cap *= 2) * sizeof *ops);
        if (ops != NULL)
            ops[(*n)++] = o;
    }
    fclose(f);
    if (ops == NULL || *n == 0) {
        fprintf(stderr, "cold-calls: %s: %s\n", path,
                ops == NULL ? "out of memory" : "no allocation in it");
        exit(2);
    }
    return ops;
}

/* Live blocks by the trace's pointer (one live block a pointer: the trace
 * records a free before the call and an allocation after it). */
struct live {
    unsigned long long id;
    void *ptr;
    size_t size;
};

static double us[NROWS][2]; /* [row][0: alloc, 1: free] */
static unsigned long calls[NROWS][2];

static void *alloc_by(enum row r, size_t size)
{
    int dev;
    switch (r) {
    case ROW_CUDEFER: return defer_pluggable_alloc(size, 0, 0);
    case ROW_FLOOR: return shim_floor_alloc(size, 0, 0);
    default: cudaGetDevice(&dev); return NULL;
    }
}

static void free_by(enum row r, void *p, size_t size)
{
    int dev;
    switch (r) {
    case ROW_CUDEFER: defer_pluggable_free(p, size, 0, 0); break;
    case ROW_FLOOR: shim_floor_free(p, size, 0, 0); break;
    default: cudaGetDevice(&dev); break;
    }
}

/* One cycle of the trace by row r; timed when counted. */
static void cycle(enum row r, const struct op *ops, size_t n,
                  struct live *live, bool counted)
{
    size_t nlive = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = nlive;
        if (!ops[i].alloc) {
            while (j > 0 && live[j - 1].id != ops[i].id)
                j--;
            if (j == 0)
                continue; /* freed before the trace began */
            j--;
        }
        evict();
        double t0 = now_s();
        if (ops[i].alloc)
            live[nlive] = (struct live){ops[i].id, alloc_by(r, ops[i].size),
                                        ops[i].size};
        else
            free_by(r, live[j].ptr, live[j].size);
        double t = now_s() - t0;
        if (counted) {
            us[r][!ops[i].alloc] += t * 1e6;
            calls[r][!ops[i].alloc]++;
        }
        if (ops[i].alloc)
            nlive++;
        else
            live[j] = live[--nlive];
    }
    while (nlive > 0) {
        nlive--;
        free_by(r, live[nlive].ptr, live[nlive].size);
    }
}

int main(int argc, char **argv)
{
    unsigned long evict_kib = 2048, cycles = 3;
    const char *path = NULL;
    bool when_full = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--evict") == 0)
            evict_kib = number(argv[++i], 0, 1 << 20, "--evict");
        else if (strcmp(argv[i], "--cycles") == 0)
            cycles = number(argv[++i], 2, 1000, "--cycles");
        else if (strcmp(argv[i], "--seal-when-full") == 0)
            when_full = true;
        else if (argv[i][0] == '-')
            usage("unknown option");
        else if (path != NULL)
            usage("one trace only");
        else
            path = argv[i];
    }
    if (path == NULL)
        usage("no trace given");
    size_t n;
    struct op *ops = read_trace(path, &n);
    struct live *live = malloc(n * sizeof *live);
    junk_bytes = evict_kib << 10;
    junk = calloc(junk_bytes > 0 ? junk_bytes : 1, 1);
    if (live == NULL || junk == NULL) {
        fprintf(stderr, "cold-calls: out of memory\n");
        return 2;
    }
    if (when_full)
        free_batch_set_age_ns(UINT64_MAX);
    for (unsigned long c = 0; c < cycles; c++)
        for (int r = 0; r < NROWS; r++)
            cycle((enum row)r, ops, n, live, c > 0);
    printf("cold-calls: %s, %lu KiB evicted before each call, %lu cycles "
           "counted (fake CUDA runtime%s)\n", path, evict_kib, cycles - 1,
           when_full ? ", free batches sealed when full" : "");
    for (int r = 0; r < NROWS; r++)
        printf("%-14s alloc %6.3f us  free %6.3f us  (%lu + %lu calls)\n",
               row_names[r], us[r][0] / (double)calls[r][0],
               us[r][1] / (double)calls[r][1], calls[r][0], calls[r][1]);
    printf("{\"trace\": \"");
    for (const char *c = path; *c != '\0'; c++)
        printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
    printf("\", \"evict_kib\": %lu, \"cycles\": %lu, \"seal_when_full\": %s",
           evict_kib, cycles - 1, when_full ? "true" : "false");
    for (int r = 0; r < NROWS; r++)
        for (int k = 0; k < 2; k++) /* null: no such call was counted */
            if (calls[r][k] > 0)
                printf(", \"%s_%s_us\": %.4f", row_names[r],
                       k ? "free" : "alloc", us[r][k] / (double)calls[r][k]);
            else
                printf(", \"%s_%s_us\": null", row_names[r],
                       k ? "free" : "alloc");
    printf("}\n");
    defer_shutdown();
    return 0;
}
