/* SPDX-License-Identifier: MIT */
/*
 * replay-trace: replay an allocation trace recorded from PyTorch training
 * (bench/torch_shims.c's shim_traced_alloc/free; its header comment gives
 * the format) on the FAKE CUDA runtime (t/fake), to measure cudefer's block
 * cache policy without a GPU:
 *
 *     bench/replay-trace [--from STEP] [--cycles N] [--lag-ops N]
 *                        [--kernel-us N] [--pool-granularity BYTES]
 *                        [--legacy-stream] [--pluggable] TRACE
 *
 * Every allocation of the trace becomes a defer_alloc of its size on one
 * fake stream (a created one, or the legacy stream with --legacy-stream),
 * followed by a simulated kernel on that stream using the block; every free
 * becomes a defer_free of that block on that stream.  --pluggable: through
 * PyTorch's entry points instead, as python/cudefer/torch_allocator.cpp
 * calls them (defer_pluggable_alloc_status of the size on device 0,
 * defer_pluggable_free of the block with its size and device 0); with
 * --legacy-stream, what a PyTorch model on its default stream makes
 * cudefer do (the path to measure for its launching-thread cost: run under
 * callgrind, docs in bench/README.md).  The trace's streams
 * are not told apart (a trace with several says so).  The simulated GPU
 * runs behind the CPU by one step (as many kernels as the window's steps
 * make on average) or by --lag-ops kernels: the CPU waits once that many are
 * queued (t/replay.h), and kernels take twice the CPU's time per request
 * (measured on the first pass) or --kernel-us.  cudefer's pool reserves
 * memory in granules of --pool-granularity bytes (default 2 MiB, as a
 * real pool maps memory; 1: exactly what it lends at most, which makes the
 * H100 LM trace miss 255 requests a step where the H100 missed none).
 *
 * The steps: the trace's "m STEP" lines cut it into steps; the last one
 * ends the last step (what follows it, the teardown, is not replayed).
 * Everything before the --from'th step (0-based; default: half the
 * recorded steps, which warm up) is replayed once; then the steps from
 * there to the last (the window) are replayed --cycles times (default 3).
 * The first cycle warms cudefer's cache; each step of the later ones is
 * measured.  A window does not close on itself: it frees blocks made
 * before it (the previous step's gradients, say) and leaves blocks live at
 * its end.  From the second cycle on, each such free frees the block the
 * previous cycle left live of the same size (the k-th free of a size pairs
 * with the k-th block of that size left live; a free with no partner is
 * skipped, and a block left live with none is freed when its allocation
 * comes round again), so that a steady trace repeats with the same live
 * bytes.
 *
 * Printed per measured step (stdout): the requests, the misses (new blocks
 * from the pool: cudefer's cache_mallocs), the blocks handed back to the
 * pool (cache_releases), the pool's reserved bytes at the step's end
 * (ReservedMemCurrent of fake_mem_pool) against the step's live peak (the
 * most bytes the trace held live during it), and how many kernels the GPU
 * had not run; then one JSON object with the totals (last line).  The
 * fake's oracle checks every hand-out and free; violations make the exit
 * status 1.  Bad arguments or a malformed trace: a message naming the
 * problem and the line, exit status 2.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay.h"

#define MIB 1048576.0
#define NO_ID UINT32_MAX
/* The simulated kernels' length on the first pass, before replay_pace
 * measures the CPU (us; as t/alloc_steady's). */
#define FIRST_KERNEL_US 50
/* Distinct stream handles the trace's summary tells apart. */
#define MAX_STREAMS 64

/* OP_DROPPED: a free of a pointer that is not live, left out. */
enum op_kind { OP_ALLOC, OP_FREE, OP_MARK, OP_DROPPED };

/* One line of the trace that the replay acts on. */
struct op {
    enum op_kind kind;
    uint32_t id;   /* alloc: its number; free: the alloc it frees */
    uint32_t pair; /* a window's free of a block made before the window:
                      the block left live at the window's end that it
                      frees from the second cycle on (NO_ID: none) */
    uint64_t key;  /* a mark: its step; an alloc or a free: the trace's
                      pointer, until pair_window sorts them by size */
    size_t size;   /* alloc: bytes */
    long line;
};

/* The trace, read. */
struct trace {
    const char *path;
    struct op *ops;
    size_t nops, cap;
    uint32_t nallocs;
    size_t *size_of;      /* per alloc id */
    size_t *marks;        /* op index of each "m" line */
    size_t nmarks;
    uint64_t streams[MAX_STREAMS];
    unsigned nstreams;
    unsigned long failed_allocs, unknown_frees, lines;
};

struct options {
    const char *path;
    long from;        /* -1: half the steps */
    unsigned cycles;
    unsigned lag_ops; /* 0: one step */
    unsigned kernel_us; /* 0: paced */
    unsigned long pool_granularity;
    int legacy_stream;
    int pluggable;
};

/* Print "replay-trace: ..." on stderr and exit 2 (bad input).  Anyone. */
static _Noreturn void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("replay-trace: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* Append an op to the trace (grows it; dies when out of memory). */
static struct op *push_op(struct trace *t)
{
    if (t->nops == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        t->ops = realloc(t->ops, t->cap * sizeof *t->ops);
        if (t->ops == NULL)
            die("out of memory reading %s", t->path);
    }
    struct op *o = &t->ops[t->nops++];
    *o = (struct op){.id = NO_ID, .pair = NO_ID};
    return o;
}

/* Remember a stream handle the trace uses (up to MAX_STREAMS). */
static void note_stream(struct trace *t, uint64_t stream)
{
    for (unsigned i = 0; i < t->nstreams; i++)
        if (t->streams[i] == stream)
            return;
    if (t->nstreams < MAX_STREAMS)
        t->streams[t->nstreams++] = stream;
}

/* Parse one unsigned number of line (base 10 or, with 0x, 16); dies
 * naming the field when it is not one. */
static uint64_t number(const struct trace *t, char **cursor, const char *field)
{
    char *end;
    errno = 0;
    while (**cursor == ' ' || **cursor == '\t')
        (*cursor)++;
    if (**cursor == '-' || **cursor == '\0')
        die("%s:%lu: no %s", t->path, t->lines, field);
    uint64_t v = strtoull(*cursor, &end, 0);
    if (errno != 0 || end == *cursor ||
        (*end != ' ' && *end != '\t' && *end != '\0'))
        die("%s:%lu: %s is not a number", t->path, t->lines, field);
    *cursor = end;
    return v;
}

/* Read path's lines into ops ("a SIZE STREAM PTR", "f PTR STREAM",
 * "m STEP"; '#' comments and blank lines skipped).  Dies on anything else. */
static void read_lines(struct trace *t)
{
    FILE *f = fopen(t->path, "r");
    if (f == NULL)
        die("cannot open %s: %s", t->path, strerror(errno));
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
        t->lines++;
        char *newline = strchr(line, '\n');
        if (newline == NULL && !feof(f))
            die("%s:%lu: line too long", t->path, t->lines);
        if (newline != NULL)
            *newline = '\0';
        char *c = line + 1;
        if (line[0] == '#' || line[0] == '\0')
            continue;
        if (line[0] == 'a' && line[1] == ' ') {
            size_t size = number(t, &c, "SIZE");
            uint64_t stream = number(t, &c, "STREAM");
            uint64_t ptr = number(t, &c, "PTR");
            note_stream(t, stream);
            if (ptr == 0) { /* the allocation failed: nothing to replay */
                t->failed_allocs++;
                continue;
            }
            if (size == 0)
                die("%s:%lu: an allocation of 0 bytes", t->path, t->lines);
            struct op *o = push_op(t);
            o->kind = OP_ALLOC;
            o->size = size;
            o->key = ptr;
        } else if (line[0] == 'f' && line[1] == ' ') {
            uint64_t ptr = number(t, &c, "PTR");
            note_stream(t, number(t, &c, "STREAM"));
            struct op *o = push_op(t);
            o->kind = OP_FREE;
            o->key = ptr;
        } else if (line[0] == 'm' && line[1] == ' ') {
            struct op *o = push_op(t);
            o->kind = OP_MARK;
            o->key = number(t, &c, "STEP");
        } else {
            die("%s:%lu: not a trace line (a, f, m or #): %.40s", t->path,
                t->lines, line);
        }
        t->ops[t->nops - 1].line = (long)t->lines;
    }
    if (ferror(f))
        die("reading %s: %s", t->path, strerror(errno));
    fclose(f);
}

/* For sorting ops by key (pointer or size), then by position. */
static int by_key_then_position(const void *a, const void *b)
{
    const struct op *x = *(const struct op *const *)a;
    const struct op *y = *(const struct op *const *)b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Number the allocs and give each free the alloc it frees (the latest
 * earlier alloc of its pointer not yet freed).  Dies when a pointer is
 * handed out twice without a free between; drops a free of a pointer that
 * is not live (made before the trace began), counting it. */
static void match_frees(struct trace *t)
{
    struct op **sorted = malloc((t->nops + 1) * sizeof *sorted);
    t->size_of = malloc((t->nops + 1) * sizeof *t->size_of);
    if (sorted == NULL || t->size_of == NULL)
        die("out of memory matching %s", t->path);
    size_t n = 0;
    for (size_t i = 0; i < t->nops; i++) {
        struct op *o = &t->ops[i];
        if (o->kind == OP_ALLOC) {
            t->size_of[t->nallocs] = o->size;
            o->id = t->nallocs++;
        }
        if (o->kind != OP_MARK)
            sorted[n++] = o;
    }
    qsort(sorted, n, sizeof *sorted, by_key_then_position);
    for (size_t i = 0; i < n; i++) {
        struct op *o = sorted[i], *prev = i ? sorted[i - 1] : NULL;
        int open = prev != NULL && prev->key == o->key &&
                   prev->kind == OP_ALLOC;
        if (o->kind == OP_ALLOC && open) {
            long line = o->line, before = prev->line;
            uint64_t key = o->key;
            free(sorted); /* LeakSanitizer: nothing left behind by die */
            die("%s:%ld: %#" PRIx64 " handed out again (line %ld) without a "
                "free", t->path, line, key, before);
        }
        if (o->kind == OP_FREE) {
            if (open) {
                o->id = prev->id;
            } else {
                t->unknown_frees++;
                o->kind = OP_DROPPED;
            }
        }
    }
    free(sorted);
    /* Drop the unknown frees, then find the step marks. */
    size_t kept = 0;
    for (size_t i = 0; i < t->nops; i++)
        if (t->ops[i].kind != OP_DROPPED)
            t->ops[kept++] = t->ops[i];
    t->nops = kept;
    t->marks = malloc((t->nops + 1) * sizeof *t->marks);
    if (t->marks == NULL)
        die("out of memory");
    for (size_t i = 0; i < t->nops; i++)
        if (t->ops[i].kind == OP_MARK)
            t->marks[t->nmarks++] = i;
}

/* Pair the window's frees of blocks made before it with the blocks the
 * window leaves live, by size (the top comment says why).  The window is
 * ops [start, end); its first alloc id is first_id.  Returns the frees
 * paired (*carried_in gets all such frees). */
static size_t pair_window(struct trace *t, size_t start, size_t end,
                          uint32_t first_id, size_t *carried_in)
{
    unsigned char *freed = calloc(t->nallocs + 1, 1);
    struct op **in = malloc((t->nops + 1) * sizeof *in);
    struct op **out = malloc((t->nops + 1) * sizeof *out);
    if (freed == NULL || in == NULL || out == NULL)
        die("out of memory");
    size_t nin = 0, nout = 0, paired = 0;
    for (size_t i = start; i < end; i++) {
        struct op *o = &t->ops[i];
        if (o->kind != OP_FREE)
            continue;
        freed[o->id] = 1;
        if (o->id < first_id) {
            o->key = t->size_of[o->id];
            in[nin++] = o;
        }
    }
    for (size_t i = start; i < end; i++)
        if (t->ops[i].kind == OP_ALLOC && !freed[t->ops[i].id]) {
            t->ops[i].key = t->ops[i].size;
            out[nout++] = &t->ops[i];
        }
    qsort(in, nin, sizeof *in, by_key_then_position);
    qsort(out, nout, sizeof *out, by_key_then_position);
    for (size_t i = 0, j = 0; i < nin && j < nout;) {
        if (in[i]->key < out[j]->key) {
            i++;
        } else if (in[i]->key > out[j]->key) {
            j++;
        } else {
            in[i++]->pair = out[j++]->id;
            paired++;
        }
    }
    *carried_in = nin;
    free(freed);
    free(in);
    free(out);
    return paired;
}

/* What the measured steps came to. */
struct totals {
    unsigned long steps, requests;
    uint64_t misses, releases, misses_max, releases_max;
    uint64_t reserved_end, reserved_max;
    size_t live_peak;
    unsigned long long behind;
};

/* A replay of the trace in progress. */
struct player {
    struct replay r;
    const struct trace *t;
    uint32_t first_id; /* the window's first alloc id */
    void **block;      /* per alloc id: its live block, NULL if none */
    unsigned *made_in; /* per alloc id: the cycle that made its live block */
    unsigned long implicit_frees, skipped_frees;
    /* the step in progress */
    int step_open;
    unsigned cycle;
    unsigned long step_in_cycle, requests;
    uint64_t trace_step;
    struct defer_stats since;
    struct totals sum;
};

/* Close the step in progress: print and add it up when its cycle is
 * measured (every cycle but the first).  Never blocks on the GPU. */
static void end_step(struct player *pl)
{
    if (!pl->step_open)
        return;
    pl->step_open = 0;
    struct replay_cache_counts c = replay_cache_since(&pl->since);
    if (pl->cycle == 0)
        return;
    uint64_t reserved = replay_pool_reserved();
    unsigned behind = replay_kernels_behind(&pl->r);
    size_t peak = pl->r.live_peak;
    printf("step %u.%lu (trace step %" PRIu64 "): %lu requests, %" PRIu64
           " misses, %" PRIu64 " hand-backs; pool reserved %.1f MiB, live "
           "peak %.1f MiB (%.3fx); GPU %u kernels behind\n",
           pl->cycle, pl->step_in_cycle, pl->trace_step, pl->requests,
           c.misses, c.releases, reserved / MIB, peak / MIB,
           peak ? (double)reserved / (double)peak : 0.0, behind);
    struct totals *s = &pl->sum;
    s->steps++;
    s->requests += pl->requests;
    s->misses += c.misses;
    s->releases += c.releases;
    if (c.misses > s->misses_max)
        s->misses_max = c.misses;
    if (c.releases > s->releases_max)
        s->releases_max = c.releases;
    s->reserved_end = reserved;
    if (reserved > s->reserved_max)
        s->reserved_max = reserved;
    if (peak > s->live_peak)
        s->live_peak = peak;
    s->behind += behind;
}

/* Open a step (the trace's step number trace_step). */
static void begin_step(struct player *pl, uint64_t trace_step)
{
    end_step(pl);
    pl->step_open = 1;
    pl->step_in_cycle++;
    pl->trace_step = trace_step;
    pl->requests = 0;
    pl->r.live_peak = pl->r.live;
}

/* The trace's alloc id: its block, then a kernel using it. */
static void play_alloc(struct player *pl, uint32_t id)
{
    size_t size = pl->t->size_of[id];
    if (pl->block[id] != NULL) { /* left live by the last cycle, unpaired */
        replay_give(&pl->r, pl->block[id], size);
        pl->implicit_frees++;
    }
    void *p = replay_take(&pl->r, size);
    pl->block[id] = p;
    pl->made_in[id] = pl->cycle;
    pl->requests++;
    replay_kernel(&pl->r, &p, 1);
}

/* The trace's free o: of its block, or from the second cycle on, when o
 * frees a block made before the window, of the block its pair left live in
 * the previous cycle. */
static void play_free(struct player *pl, const struct op *o)
{
    uint32_t id = o->id;
    int carried_in = id < pl->first_id && pl->cycle > 0;
    if (carried_in)
        id = o->pair;
    if (id == NO_ID || pl->block[id] == NULL ||
        (carried_in && pl->made_in[id] + 1 != pl->cycle)) {
        pl->skipped_frees++;
        return;
    }
    replay_give(&pl->r, pl->block[id], pl->t->size_of[id]);
    pl->block[id] = NULL;
}

/* Replay ops [from, to) as cycle. */
static void play(struct player *pl, size_t from, size_t to, unsigned cycle)
{
    if (cycle != pl->cycle) {
        end_step(pl);
        pl->cycle = cycle;
        pl->step_in_cycle = 0;
    }
    for (size_t i = from; i < to; i++) {
        const struct op *o = &pl->t->ops[i];
        if (o->kind == OP_ALLOC)
            play_alloc(pl, o->id);
        else if (o->kind == OP_FREE)
            play_free(pl, o);
        else
            begin_step(pl, o->key);
    }
}

/* Parse a positive number option (dies naming it otherwise). */
static unsigned long positive(const char *name, const char *value)
{
    char *end;
    errno = 0;
    unsigned long v = value ? strtoul(value, &end, 10) : 0;
    if (value == NULL || errno != 0 || *end != '\0' || v == 0 ||
        value[0] == '-' || v > UINT32_MAX / 2)
        die("%s needs a positive number (got %s)", name,
            value ? value : "nothing");
    return v;
}

static struct options parse_options(int argc, char **argv)
{
    struct options o = {.from = -1, .cycles = 3,
                        .pool_granularity = 2ul << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--from") == 0) {
            o.from = strcmp(v ? v : "", "0") == 0 ? 0
                                                  : (long)positive(a, v);
            i++;
        } else if (strcmp(a, "--cycles") == 0) {
            o.cycles = (unsigned)positive(a, v);
            i++;
        } else if (strcmp(a, "--lag-ops") == 0) {
            o.lag_ops = (unsigned)positive(a, v);
            i++;
        } else if (strcmp(a, "--kernel-us") == 0) {
            o.kernel_us = (unsigned)positive(a, v);
            i++;
        } else if (strcmp(a, "--pool-granularity") == 0) {
            o.pool_granularity = positive(a, v);
            i++;
        } else if (strcmp(a, "--legacy-stream") == 0) {
            o.legacy_stream = 1;
        } else if (strcmp(a, "--pluggable") == 0) {
            o.pluggable = 1;
        } else if (a[0] == '-' || o.path != NULL) {
            die("usage: replay-trace [--from STEP] [--cycles N] "
                "[--lag-ops N] [--kernel-us N] [--pool-granularity BYTES] "
                "[--legacy-stream] [--pluggable] TRACE (%s?)", a);
        } else {
            o.path = a;
        }
    }
    if (o.path == NULL)
        die("no trace file given (usage: replay-trace [options] TRACE)");
    if (o.cycles < 2)
        die("--cycles must be at least 2 (the first one warms up)");
    return o;
}

/* The totals and the run's facts as one JSON object on stdout. */
static void print_json(const struct player *pl, const struct options *o,
                       size_t from, double requests_per_step,
                       size_t carried_in, size_t paired, long violations)
{
    const struct trace *t = pl->t;
    const struct totals *s = &pl->sum;
    double steps = s->steps ? (double)s->steps : 1.0;
    printf("{\"trace\": \"%s\", \"trace_lines\": %lu, \"trace_steps\": %zu, "
           "\"from_step\": %zu, \"cycles\": %u, \"steps_measured\": %lu, "
           "\"streams_in_trace\": %u, \"stream\": \"%s\", "
           "\"entry_points\": \"%s\", "
           "\"requests_per_step\": %.1f, \"lag_ops\": %u, \"kernel_us\": %u, "
           "\"pool_granularity\": %lu, "
           "\"gpu_steps_behind\": %.3f, "
           "\"misses_per_step\": %.2f, \"misses_max\": %" PRIu64 ", "
           "\"releases_per_step\": %.2f, \"releases_max\": %" PRIu64 ", "
           "\"reserved_mib\": %.3f, \"reserved_max_mib\": %.3f, "
           "\"live_peak_mib\": %.3f, \"reserved_over_live_peak\": %.4f, "
           "\"carried_in_frees\": %zu, \"paired_frees\": %zu, "
           "\"implicit_frees\": %lu, \"skipped_frees\": %lu, "
           "\"unknown_frees\": %lu, \"failed_allocs\": %lu, "
           "\"oracle_violations\": %ld}\n",
           t->path, t->lines, t->nmarks - 1, from, o->cycles, s->steps,
           t->nstreams, o->legacy_stream ? "legacy" : "created",
           o->pluggable ? "pluggable" : "defer_alloc",
           requests_per_step, pl->r.depth, pl->r.kernel_us,
           o->pool_granularity, (double)s->behind / steps / requests_per_step,
           (double)s->misses / steps, s->misses_max,
           (double)s->releases / steps, s->releases_max,
           s->reserved_end / MIB, s->reserved_max / MIB, s->live_peak / MIB,
           s->live_peak ? (double)s->reserved_end / (double)s->live_peak : 0.0,
           carried_in, paired, pl->implicit_frees, pl->skipped_frees,
           t->unknown_frees, t->failed_allocs, violations);
}

int main(int argc, char **argv)
{
    struct options o = parse_options(argc, argv);
    struct trace t = {.path = o.path};
    read_lines(&t);
    match_frees(&t);
    if (t.nmarks < 2)
        die("%s has %zu step marks (\"m STEP\" lines): at least two are "
            "needed, the last one ending the last step", t.path, t.nmarks);
    size_t steps = t.nmarks - 1;
    size_t from = o.from < 0 ? steps / 2 : (size_t)o.from;
    if (from >= steps)
        die("--from %zu: %s has %zu steps", from, t.path, steps);
    size_t start = t.marks[from], end = t.marks[steps];
    uint32_t first_id = 0, window_allocs = 0;
    for (size_t i = 0; i < end; i++) {
        first_id += i < start && t.ops[i].kind == OP_ALLOC;
        window_allocs += i >= start && t.ops[i].kind == OP_ALLOC;
    }
    size_t carried_in = 0;
    size_t paired = pair_window(&t, start, end, first_id, &carried_in);
    double requests_per_step = (double)window_allocs / (double)(steps - from);
    if (requests_per_step < 1)
        die("%s: no allocations in its steps from %zu on", t.path, from);
    if (t.nstreams > 1)
        fprintf(stderr, "replay-trace: %s uses %u streams; all are replayed "
                "on one\n", t.path, t.nstreams);

    fake_reset(1);
    fake_set_pool_granularity(o.pool_granularity);
    struct player pl = {.t = &t, .first_id = first_id};
    pl.block = calloc(t.nallocs + 1, sizeof *pl.block);
    pl.made_in = calloc(t.nallocs + 1, sizeof *pl.made_in);
    if (pl.block == NULL || pl.made_in == NULL)
        die("out of memory");
    unsigned depth = o.lag_ops ? o.lag_ops
                               : (unsigned)(requests_per_step + 0.5);
    replay_init(&pl.r, o.legacy_stream ? 0 : stream_new(), depth,
                o.kernel_us ? o.kernel_us : FIRST_KERNEL_US);
    pl.r.pluggable = o.pluggable;
    pl.since = stats_now();

    double t0 = now_ms();
    play(&pl, 0, end, 0);
    if (o.kernel_us == 0)
        replay_pace(&pl.r, now_ms() - t0 - pl.r.waited_ms, pl.r.launched);
    for (unsigned c = 1; c < o.cycles; c++)
        play(&pl, start, end, c);
    end_step(&pl);

    for (uint32_t id = 0; id < t.nallocs; id++)
        if (pl.block[id] != NULL)
            replay_give(&pl.r, pl.block[id], t.size_of[id]);
    replay_finish(&pl.r);
    if (defer_shutdown() != cudaSuccess)
        bail("defer_shutdown failed");
    long violations = fake_violations();
    /* defer_pluggable_free cannot say a refusal but in its count. */
    uint64_t rejected = stats_now().rejected;
    if (rejected != 0)
        fprintf(stderr, "replay-trace: %" PRIu64 " calls refused\n",
                rejected);
    print_json(&pl, &o, from, requests_per_step, carried_in, paired,
               violations);
    fflush(stdout);
    free(pl.block);
    free(pl.made_in);
    free(t.ops);
    free(t.size_of);
    free(t.marks);
    return violations != 0 || rejected != 0;
}
