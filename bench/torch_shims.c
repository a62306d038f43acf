/* SPDX-License-Identifier: MIT */
/*
 * torch_shims.c: the allocators cudefer is compared with, as PyTorch
 * pluggable allocators (torch.cuda.memory.CUDAPluggableAllocator loads a
 * shared object and two functions of these signatures).  bench/torch_train.py
 * compiles this file at first use (cc -shared -fPIC against the CUDA runtime
 * and libcudefer) and picks a pair by name:
 *
 *   pluggable-async  shim_async_alloc  / shim_async_free   cudaMallocAsync, cudaFreeAsync
 *   malloc-defer     shim_malloc_alloc / shim_defer_free   cudaMalloc, defer_free
 *   malloc-free      shim_malloc_alloc / shim_cudafree     cudaMalloc, cudaFree
 *   pluggable-floor  shim_floor_alloc  / shim_floor_free   exact-size free lists
 *   (--time-calls)   shim_timed_alloc  / shim_timed_free   any pair above, or
 *                                                          cudefer's, timed
 *   cudefer-trace    shim_traced_alloc / shim_traced_free  cudefer, traced
 *
 * cudefer-trace is cudefer's defer_pluggable_alloc/free that also records
 * every call, for bench/replay-trace to replay on the fake CUDA runtime
 * (cudefer's block cache measured without a GPU).  The trace is text, one
 * line a call, appended to a buffer in memory (a lock, a snprintf) and
 * written to the file named by CUDEFER_TRACE_FILE when the buffer fills
 * (TRACE_BUFFER_BYTES), when shim_trace_flush is called and at exit:
 *
 *   a SIZE STREAM PTR   an allocation: SIZE bytes (decimal) asked for on
 *                       STREAM, which got PTR (PTR 0: refused, as out of
 *                       memory)
 *   f PTR STREAM        PTR freed on STREAM (the allocation's stream)
 *   m STEP              training step STEP begins (shim_trace_mark)
 *   # ...               a comment (the first line says what the file is)
 *
 * STREAM is the cudaStream_t handle as a decimal number (0: the legacy
 * stream, PyTorch's default); PTR is hexadecimal with 0x.  Lines are in the
 * order the calls took the buffer's lock.  The device is not recorded (one
 * process, one device: bench/torch_train.py gives each --ddp rank its own
 * file).  Calls after the exit's flush are not recorded.
 *
 * cudefer itself needs no shim: libcudefer exports defer_pluggable_alloc
 * and defer_pluggable_free.  None of these hears Tensor.record_stream
 * (PyTorch forwards it to a pluggable allocator only through a C++ hook),
 * so on a program that relies on record_stream they may reuse memory early.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>

#include "cudefer.h"

/* Make device current on the calling thread; *previous gets the device that
 * was (so that the caller can restore it).  Returns the CUDA error. */
static cudaError_t enter_device(int device, int *previous)
{
    cudaError_t err = cudaGetDevice(previous);
    if (err != cudaSuccess || *previous == device)
        return err;
    return cudaSetDevice(device);
}

/* Restore the device enter_device found. */
static void leave_device(int device, int previous)
{
    if (previous != device)
        (void)cudaSetDevice(previous);
}

/* Report a failed CUDA call of a shim on stderr (PyTorch sees only NULL). */
static void report_error(const char *what, cudaError_t err, size_t size)
{
    fprintf(stderr, "torch_shims: %s(%zu bytes): %s\n", what, size,
            cudaGetErrorString(err));
}

/* cudaMallocAsync on stream, on device.  Called by PyTorch on any thread;
 * never blocks on the GPU.  Returns NULL when out of memory (PyTorch then
 * raises its out-of-memory error) or on error (reported). */
void *shim_async_alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = NULL;
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaMallocAsync(&ptr, size, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess) {
        if (err != cudaErrorMemoryAllocation)
            report_error("cudaMallocAsync", err, size);
        (void)cudaGetLastError();
        return NULL;
    }
    return ptr;
}

/* cudaFreeAsync on the allocation's stream (the stream PyTorch passes). */
void shim_async_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaFreeAsync(ptr, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("cudaFreeAsync", err, size);
}

/* cudaMalloc on device (stream unused).  Blocks as cudaMalloc does.
 * Returns NULL when out of memory or on error (reported). */
void *shim_malloc_alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = NULL;
    int previous;
    (void)stream;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaMalloc(&ptr, size);
        leave_device(device, previous);
    }
    if (err != cudaSuccess) {
        if (err != cudaErrorMemoryAllocation)
            report_error("cudaMalloc", err, size);
        (void)cudaGetLastError();
        return NULL;
    }
    return ptr;
}

/* defer_free on the allocation's stream: released by cudefer's reclaimer.
 * Never blocks on the GPU. */
void shim_defer_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = defer_free(ptr, stream);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("defer_free", err, size);
}

/* cudaFree: waits for the whole device. */
void shim_cudafree(void *ptr, size_t size, int device, cudaStream_t stream)
{
    int previous;
    (void)stream;
    cudaError_t err = enter_device(device, &previous);
    if (err == cudaSuccess) {
        err = cudaFree(ptr);
        leave_device(device, previous);
    }
    if (err != cudaSuccess)
        report_error("cudaFree", err, size);
}

/* ---- pluggable-floor: the least any pluggable allocator can cost ---------- */

/* A bound row, not an allocator to use: a block freed on stream S goes on a
 * free list of its exact (device, stream, size) and the next request of that
 * size on S takes it back at once (safe by stream order, as cudefer's
 * same-stream reuse); a request no list can serve is a cudaMalloc; nothing
 * is ever released, nothing waits for another stream, and record_stream is
 * not honoured.  So on a one-stream training step it does the least any
 * pluggable allocator must (a lock and a table look-up a call) and measures
 * what PyTorch's pluggable path itself costs against its own allocator.
 * Its memory is the sum over sizes of each size's most live blocks. */

#define FLOOR_SLOTS 65536 /* (device, stream, size) keys; a power of two */

struct floor_block {
    void *ptr;
    struct floor_block *next;
};

struct floor_slot {
    int used, device;
    cudaStream_t stream;
    size_t size;
    struct floor_block *free; /* this key's freed blocks, newest first */
};

static pthread_mutex_t floor_lock = PTHREAD_MUTEX_INITIALIZER;
static struct floor_slot floor_slots[FLOOR_SLOTS];
static struct floor_block *floor_spare; /* list nodes to reuse */

/* The slot of (device, stream, size), made if absent (NULL: table full).
 * Under floor_lock. */
static struct floor_slot *floor_slot(int device, cudaStream_t stream,
                                     size_t size)
{
    uint64_t h = (uint64_t)size * UINT64_C(0x9e3779b97f4a7c15) ^
                 (uint64_t)(uintptr_t)stream * UINT64_C(0xff51afd7ed558ccd) ^
                 (uint64_t)device;
    for (size_t i = 0; i < FLOOR_SLOTS; i++) {
        struct floor_slot *s = &floor_slots[(h + i) & (FLOOR_SLOTS - 1)];
        if (!s->used) {
            s->used = 1;
            s->device = device;
            s->stream = stream;
            s->size = size;
            return s;
        }
        if (s->device == device && s->stream == stream && s->size == size)
            return s;
    }
    return NULL;
}

/* A freed block of exactly size from stream, else cudaMalloc on device.
 * Called by PyTorch on any thread.  Returns NULL when out of memory. */
void *shim_floor_alloc(size_t size, int device, cudaStream_t stream)
{
    struct floor_slot *s;
    struct floor_block *b = NULL;

    pthread_mutex_lock(&floor_lock);
    s = floor_slot(device, stream, size);
    if (s != NULL && (b = s->free) != NULL) {
        s->free = b->next;
        b->next = floor_spare;
        floor_spare = b;
    }
    pthread_mutex_unlock(&floor_lock);
    if (b != NULL)
        return b->ptr;
    return shim_malloc_alloc(size, device, stream);
}

/* Put ptr on its (device, stream, size) list; on failure (no memory for a
 * list node, table full) the block is leaked, reported. */
void shim_floor_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    struct floor_slot *s;
    struct floor_block *b;

    pthread_mutex_lock(&floor_lock);
    s = floor_slot(device, stream, size);
    b = floor_spare;
    if (b != NULL)
        floor_spare = b->next;
    else
        b = malloc(sizeof *b);
    if (s != NULL && b != NULL) {
        b->ptr = ptr;
        b->next = s->free;
        s->free = b;
    }
    pthread_mutex_unlock(&floor_lock);
    if (s == NULL || b == NULL) {
        free(b);
        fprintf(stderr, "torch_shims: pluggable-floor leaks %p (%zu bytes): "
                "%s\n", ptr, size, s == NULL ? "table full" : "out of memory");
    }
}

/* ---- cudefer-trace: cudefer, every call recorded ------------------------ */

/* The trace buffer's size: written out when a line may not fit
 * (t/trace_record builds this file with a small one, to write it out
 * often). */
#ifndef TRACE_BUFFER_BYTES
#define TRACE_BUFFER_BYTES ((size_t)8 << 20)
#endif
/* The longest line: "a" and three 20-digit numbers, or "0x" and 16 digits. */
#define TRACE_LINE_MAX 80

/* The trace, under trace_lock. */
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static enum { TRACE_UNSTARTED, TRACE_ON, TRACE_OFF } trace_state;
static char *trace_buffer;
static size_t trace_used;
static FILE *trace_file;
static const char *trace_path;

/* Write the buffer to the trace file (opened, truncated, at the first
 * write).  Under trace_lock; blocks on the file.  On failure, reports and
 * stops tracing. */
static void trace_write_locked(void)
{
    if (trace_state != TRACE_ON || trace_used == 0)
        return;
    if (trace_file == NULL) {
        trace_file = fopen(trace_path, "w");
        if (trace_file == NULL ||
            fputs("# cudefer allocation trace (bench/torch_shims.c): "
                  "a SIZE STREAM PTR | f PTR STREAM | m STEP\n",
                  trace_file) == EOF) {
            perror(trace_path);
            trace_state = TRACE_OFF;
            return;
        }
    }
    if (fwrite(trace_buffer, 1, trace_used, trace_file) != trace_used ||
        fflush(trace_file) != 0) {
        perror(trace_path);
        trace_state = TRACE_OFF;
    }
    trace_used = 0;
}

/* At exit: write what is left, close the file, record nothing more. */
static void trace_at_exit(void)
{
    pthread_mutex_lock(&trace_lock);
    trace_write_locked();
    if (trace_file != NULL)
        fclose(trace_file);
    trace_file = NULL;
    trace_state = TRACE_OFF;
    pthread_mutex_unlock(&trace_lock);
}

/* Start tracing at the first call: the buffer, the file's name, the exit
 * handler.  Under trace_lock.  Without CUDEFER_TRACE_FILE, reports once and
 * traces nothing (the allocations go on). */
static void trace_start_locked(void)
{
    trace_path = getenv("CUDEFER_TRACE_FILE");
    trace_buffer = malloc(TRACE_BUFFER_BYTES);
    if (trace_path == NULL || trace_path[0] == '\0' || trace_buffer == NULL ||
        atexit(trace_at_exit) != 0) {
        fprintf(stderr, "torch_shims: %s: no trace is recorded\n",
                trace_buffer == NULL ? "out of memory"
                : trace_path == NULL || trace_path[0] == '\0'
                    ? "CUDEFER_TRACE_FILE is not set"
                    : "atexit failed");
        trace_state = TRACE_OFF;
        return;
    }
    trace_state = TRACE_ON;
}

/* Append one line to the trace: format (a literal of this file) with the
 * numbers x, y, z (those it does not name are ignored, as printf ignores
 * excess arguments).  Any thread; blocks on the lock, and
 * on the file only when the buffer is full. */
static void trace_line(const char *format, uint64_t x, uint64_t y,
                       uint64_t z)
{
    pthread_mutex_lock(&trace_lock);
    if (trace_state == TRACE_UNSTARTED)
        trace_start_locked();
    if (trace_state == TRACE_ON) {
        if (TRACE_BUFFER_BYTES - trace_used < TRACE_LINE_MAX)
            trace_write_locked();
        trace_used += (size_t)snprintf(trace_buffer + trace_used,
                                       TRACE_BUFFER_BYTES - trace_used,
                                       format, x, y, z);
    }
    pthread_mutex_unlock(&trace_lock);
}

/* defer_pluggable_alloc, recorded ("a SIZE STREAM PTR").  Called by
 * PyTorch on any thread; never blocks on the GPU.  Returns the block, NULL
 * when out of memory or on error (as defer_pluggable_alloc). */
void *shim_traced_alloc(size_t size, int device, cudaStream_t stream)
{
    void *ptr = defer_pluggable_alloc(size, device, stream);
    trace_line("a %" PRIu64 " %" PRIu64 " %#" PRIx64 "\n", (uint64_t)size,
               (uint64_t)(uintptr_t)stream, (uint64_t)(uintptr_t)ptr);
    return ptr;
}

/* defer_pluggable_free, recorded ("f PTR STREAM"); recorded first, so that
 * the line precedes any allocation that gets ptr again.  Called by PyTorch
 * on any thread; never blocks on the GPU. */
void shim_traced_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    trace_line("f %#" PRIx64 " %" PRIu64 "\n", (uint64_t)(uintptr_t)ptr,
               (uint64_t)(uintptr_t)stream, 0);
    defer_pluggable_free(ptr, size, device, stream);
}

/* Record that training step step begins ("m STEP"): bench/torch_train.py
 * calls it through ctypes at each step's start.  Any thread. */
void shim_trace_mark(long step)
{
    trace_line("m %" PRIu64 "\n", (uint64_t)(step < 0 ? 0 : step), 0, 0);
}

/* Write the buffered lines to the trace file now (bench/torch_train.py
 * calls it when training is over, so that a process killed later keeps its
 * trace).  Any thread; blocks on the file. */
void shim_trace_flush(void)
{
    pthread_mutex_lock(&trace_lock);
    trace_write_locked();
    pthread_mutex_unlock(&trace_lock);
}

/* ---- timed: any pair above, or cudefer's, with its calls timed ----------- */

/* bench/torch_train.py --time-calls installs shim_timed_alloc/free and names
 * the pair they call (shim_timed_use); each call is timed with the
 * monotonic clock (two clock_gettime calls, about 40 ns, added to every
 * call) and summed per kind, so that the allocator's own time a step is
 * measured in real training next to ms/step. */

typedef void *(*alloc_fn)(size_t, int, cudaStream_t);
typedef void (*free_fn)(void *, size_t, int, cudaStream_t);

static const struct {
    const char *name;
    alloc_fn alloc;
    free_fn free;
} timed_pairs[] = {
    {"cudefer", defer_pluggable_alloc, defer_pluggable_free},
    {"pluggable-async", shim_async_alloc, shim_async_free},
    {"pluggable-floor", shim_floor_alloc, shim_floor_free},
    {"malloc-defer", shim_malloc_alloc, shim_defer_free},
    {"malloc-free", shim_malloc_alloc, shim_cudafree},
};

static alloc_fn timed_alloc;
static free_fn timed_free;
static _Atomic uint64_t timed_calls[2], timed_ns[2]; /* [0] alloc, [1] free */

/* Each call's duration, in a histogram per kind: buckets of 64 ns below
 * TIMED_TAIL_NS, then one per power of two (up to 2^30 ns, the last open):
 * whether a mean comes from the typical call or from a few slow ones (a
 * lock waited for, a page fault, an event recorded).  The ns of the calls
 * of TIMED_TAIL_NS or more are also summed apart. */
#define TIMED_TAIL_NS 4096
#define TIMED_BUCKETS (TIMED_TAIL_NS / 64 + 19)
static _Atomic uint64_t timed_hist[2][TIMED_BUCKETS], timed_tail_ns[2];

static void timed_count(int kind, uint64_t ns)
{
    size_t b;
    if (ns < TIMED_TAIL_NS) {
        b = ns / 64;
    } else {
        b = TIMED_TAIL_NS / 64 + (size_t)(63 - __builtin_clzll(ns)) - 12;
        if (b >= TIMED_BUCKETS)
            b = TIMED_BUCKETS - 1;
        atomic_fetch_add(&timed_tail_ns[kind], ns);
    }
    atomic_fetch_add(&timed_ns[kind], ns);
    atomic_fetch_add(&timed_calls[kind], 1);
    atomic_fetch_add(&timed_hist[kind][b], 1);
}

/* Choose the pair the timed shims call, by the allocator's name in
 * bench/torch_train.py ("cudefer", "pluggable-async", ...).  Before the
 * first call.  Returns 0, or -1 for an unknown name. */
int shim_timed_use(const char *allocator)
{
    for (size_t i = 0; i < sizeof timed_pairs / sizeof *timed_pairs; i++)
        if (strcmp(timed_pairs[i].name, allocator) == 0) {
            timed_alloc = timed_pairs[i].alloc;
            timed_free = timed_pairs[i].free;
            return 0;
        }
    return -1;
}

static uint64_t timed_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The chosen pair's allocation, timed.  Any thread. */
void *shim_timed_alloc(size_t size, int device, cudaStream_t stream)
{
    uint64_t t0 = timed_now_ns();
    void *ptr = timed_alloc(size, device, stream);
    timed_count(0, timed_now_ns() - t0);
    return ptr;
}

/* The chosen pair's free, timed.  Any thread. */
void shim_timed_free(void *ptr, size_t size, int device, cudaStream_t stream)
{
    uint64_t t0 = timed_now_ns();
    timed_free(ptr, size, device, stream);
    timed_count(1, timed_now_ns() - t0);
}

/* The sums since the last read: out[0] allocations, out[1] their ns,
 * out[2] frees, out[3] their ns; then zero them (bench/torch_train.py reads
 * at the timed window's start and end, through ctypes).  Any thread. */
void shim_timed_read(uint64_t out[4])
{
    out[0] = atomic_exchange(&timed_calls[0], 0);
    out[1] = atomic_exchange(&timed_ns[0], 0);
    out[2] = atomic_exchange(&timed_calls[1], 0);
    out[3] = atomic_exchange(&timed_ns[1], 0);
}

/* The histograms since the last read, then zeroed: out[0] the bucket
 * count, out[1] the ns below which buckets are 64 ns wide, out[2] and
 * out[3] the tail ns of allocations and frees (calls of out[1] ns or
 * more), then the allocations' buckets and the frees'.  out has room for
 * 4 + 2 * shim_timed_buckets() values.  Any thread. */
int shim_timed_buckets(void)
{
    return TIMED_BUCKETS;
}

void shim_timed_hist(uint64_t *out)
{
    out[0] = TIMED_BUCKETS;
    out[1] = TIMED_TAIL_NS;
    out[2] = atomic_exchange(&timed_tail_ns[0], 0);
    out[3] = atomic_exchange(&timed_tail_ns[1], 0);
    for (int k = 0; k < 2; k++)
        for (size_t b = 0; b < TIMED_BUCKETS; b++)
            out[4 + k * TIMED_BUCKETS + b] =
                atomic_exchange(&timed_hist[k][b], 0);
}
