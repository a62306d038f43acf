/* SPDX-License-Identifier: MIT */
/* bench/torch_shims.c's cudefer-trace pair on the fake runtime: every call
 * of shim_traced_alloc, shim_traced_free and shim_trace_mark becomes one
 * line of the trace file (the format in torch_shims.c's header comment), in
 * call order, through a buffer written out when full (built here with a
 * buffer of TRACE_BUFFER_BYTES = 1 KiB, so that a few steps fill it many
 * times), and the blocks are cudefer's (checked by the oracle).  The file
 * is CUDEFER_TRACE_FILE = argv[1] (default t/trace_record.out);
 * t/replay_trace.sh replays what it writes with bench/replay-trace: a
 * training loop's shape (gradients kept until the next step's
 * zero_grad frees them), its last step ended by a mark, as
 * bench/torch_train.py marks it, then the teardown's frees. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

/* The shims (bench/torch_shims.c, built into this test). */
void *shim_traced_alloc(size_t size, int device, cudaStream_t stream);
void shim_traced_free(void *ptr, size_t size, int device, cudaStream_t stream);
void shim_trace_mark(long step);
void shim_trace_flush(void);

#define STEPS 4
#define LAYERS 12
#define MAX_LINES 1024
#define LINE_MAX_CHARS 96

/* The lines the calls should have written, in order. */
static char expected[MAX_LINES][LINE_MAX_CHARS];
static unsigned nexpected;

/* Note the line a call should write (printf-like). */
static void expect(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void expect(const char *fmt, ...)
{
    if (nexpected == MAX_LINES)
        bail("more than %d lines expected", MAX_LINES);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expected[nexpected++], LINE_MAX_CHARS, fmt, ap);
    va_end(ap);
}

/* A block of size bytes on stream through the traced shim, used by a
 * simulated kernel; bails when refused. */
static void *traced_alloc(size_t size, cudaStream_t stream)
{
    void *p = shim_traced_alloc(size, 0, stream);
    if (p == NULL)
        bail("shim_traced_alloc of %zu bytes refused", size);
    fake_oracle_handout_range(p, size, stream);
    expect("a %zu %" PRIuPTR " %#" PRIxPTR, size, (uintptr_t)stream,
           (uintptr_t)p);
    work_timed(stream, 20, p);
    return p;
}

static void traced_free(void *p, size_t size, cudaStream_t stream)
{
    shim_traced_free(p, size, 0, stream);
    expect("f %#" PRIxPTR " %" PRIuPTR, (uintptr_t)p, (uintptr_t)stream);
}

/* Read path's lines and compare them with the expected ones (the first
 * line, a comment, apart). */
static void check_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        sysbail("fopen %s", path);
    char line[LINE_MAX_CHARS + 2];
    ok(fgets(line, sizeof line, f) != NULL && line[0] == '#',
       "the trace begins with a comment: %s", line);
    unsigned n = 0, mismatches = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (n >= nexpected || strcmp(line, expected[n]) != 0) {
            if (mismatches++ == 0)
                diag("line %u: \"%s\", expected \"%s\"", n + 2, line,
                     n < nexpected ? expected[n] : "(nothing)");
        }
        n++;
    }
    fclose(f);
    is_int(n, nexpected, "as many lines as calls (%u)", nexpected);
    is_int(mismatches, 0, "every line as the call made it, in order");
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "t/trace_record.out";
    plan_lazy();
    fake_reset(1);
    if (setenv("CUDEFER_TRACE_FILE", path, 1) != 0)
        sysbail("setenv");
    cudaStream_t s = stream_new();
    void *grads[LAYERS] = {0};
    for (int step = 0; step < STEPS; step++) {
        shim_trace_mark(step);
        expect("m %d", step);
        for (int i = 0; i < LAYERS; i++) /* zero_grad(set_to_none) */
            if (grads[i] != NULL)
                traced_free(grads[i], 4096u << (i % 4), s);
        void *acts[LAYERS];
        for (int i = 0; i < LAYERS; i++) {
            acts[i] = traced_alloc(65536u * (1 + i % 3), s);
            traced_free(traced_alloc(8192, 0), 8192, 0); /* a workspace */
        }
        for (int i = LAYERS - 1; i >= 0; i--) {
            grads[i] = traced_alloc(4096u << (i % 4), s);
            traced_free(acts[i], 65536u * (1 + i % 3), s);
        }
    }
    shim_trace_mark(STEPS); /* the end of the last step */
    expect("m %d", STEPS);
    shim_trace_flush();
    check_file(path);
    for (int i = 0; i < LAYERS; i++)
        shim_traced_free(grads[i], 4096u << (i % 4), 0, s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
