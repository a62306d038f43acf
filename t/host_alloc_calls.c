/* SPDX-License-Identifier: MIT */
/* Out of host memory on the calling thread, in the calls that can refuse:
 * each defer call below is made again and again, each time with the next
 * of its malloc, calloc and realloc calls failing, in a fresh child
 * process (the sweep, t/host_alloc_sweep.h).  (defer_call, a flush and
 * defer_free_streams make none on the calling thread once the first call
 * has stocked its pools.)  Whatever fails, the call either refuses (an
 * error, a line on stderr saying why, the pointer still the caller's, and
 * the same call unarmed then succeeds) or accepts; shutdown then releases
 * every pointer, returns cudaSuccess, and leaves nothing the armed call
 * allocated behind; the oracle sees nothing released early.  Memory that
 * cudefer needs after it accepted a call: t/host_alloc_filing.c.
 *
 * Skipped under ASan and TSan (the allocator is replaced). */
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "cudefer.h"
#include "fake_cuda.h"
#include "helpers.h"
#include "host_alloc_sweep.h"
#include "tap.h"

#ifndef UNDER_SANITIZER
/* Capture stderr and fail the n-th allocation from here on this thread. */
static void arm(long n)
{
    stderr_capture_begin();
    seen = 0;
    fail_at = n;
    armed = true;
}

/* Stop failing; returns what was said on stderr meanwhile. */
static const char *disarm(void)
{
    armed = false;
    *reached = seen > fail_at;
    return stderr_capture_end();
}

/* Checks the armed call's outcome: a refusal is said and leaves the
 * pointer with the caller; then the call is made again unarmed. */
static void refused_well(cudaError_t err, const char *said, const void *p)
{
    CHECK(strstr(said, "cudefer: ") != NULL,
          "refused (%s) and said why (stderr: \"%s\")",
          cudaGetErrorName(err), said);
    CHECK(p == NULL || !fake_is_released(p), "the pointer is still the "
          "caller's");
}

static cudaError_t first_free(long n, void **mine, int *nmine)
{
    void *p = device_alloc(1 << 20);
    mine[(*nmine)++] = p;
    arm(n);
    cudaError_t err = defer_free(p, s);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, p);
        CHECK(defer_free(p, s) == cudaSuccess, "the next defer_free");
    }
    return err;
}

static cudaError_t first_alloc(long n, void **mine, int *nmine)
{
    void *q = NULL;
    arm(n);
    cudaError_t err = defer_alloc(&q, 3 << 20, s);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, NULL);
        CHECK(q == NULL, "no block given (%p)", q);
        CHECK(defer_alloc(&q, 3 << 20, s) == cudaSuccess,
              "the next defer_alloc");
    }
    mine[(*nmine)++] = q;
    CHECK(q == NULL || defer_free(q, s) == cudaSuccess, "its free");
    return err;
}

/* defer_free_n of three blocks of defer_alloc's: their claims. */
static cudaError_t free_n_blocks(long n, void **mine, int *nmine)
{
    void *q[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        CHECK(defer_alloc(&q[i], (size_t)(i + 1) << 20, s) == cudaSuccess,
              "block %d", i);
        mine[(*nmine)++] = q[i];
    }
    arm(n);
    cudaError_t err = defer_free_n(q, 3, s2);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, NULL);
        CHECK(defer_free_n(q, 3, s2) == cudaSuccess, "the next defer_free_n");
    }
    return err;
}

/* defer_free_n of 40 pointers, one NULL: a copy, and a sorted copy. */
static cudaError_t free_n(long n, void **mine, int *nmine)
{
    void *p[41];
    for (int i = 0; i < 40; i++)
        mine[(*nmine)++] = p[i] = device_alloc(4096);
    p[40] = NULL;
    void *w = device_alloc(4096);
    mine[(*nmine)++] = w;
    CHECK(defer_free(w, s) == cudaSuccess, "warm-up");
    arm(n);
    cudaError_t err = defer_free_n(p, 41, s);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, p[0]);
        CHECK(defer_free_n(p, 41, s) == cudaSuccess, "the next defer_free_n");
    }
    return err;
}

/* A block also used on a second stream. */
static cudaError_t record_stream(long n, void **mine, int *nmine)
{
    void *q = NULL;
    CHECK(defer_alloc(&q, 1 << 20, s) == cudaSuccess, "a block");
    mine[(*nmine)++] = q;
    arm(n);
    cudaError_t err = defer_record_stream(q, s2);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, NULL);
        CHECK(defer_record_stream(q, s2) == cudaSuccess,
              "the next defer_record_stream");
    }
    CHECK(defer_free(q, s) == cudaSuccess, "its free");
    return err;
}

/* A block freed on the legacy stream: a claim in its free batch. */
static cudaError_t batched_free(long n, void **mine, int *nmine)
{
    void *q = NULL;
    CHECK(defer_alloc(&q, 1 << 20, NULL) == cudaSuccess, "a block");
    mine[(*nmine)++] = q;
    arm(n);
    cudaError_t err = defer_free(q, NULL);
    const char *said = disarm();
    if (err != cudaSuccess) {
        refused_well(err, said, q);
        CHECK(defer_free(q, NULL) == cudaSuccess, "the next defer_free");
    }
    return err;
}

/* A free on a capturing stream: tied to the graph.  Where the graph
 * refuses the user object (retain_fails: cudaGraphRetainUserObject fails),
 * the call is refused whatever else fails, and once the object's
 * destructor ran nothing the call allocated is left. */
static cudaError_t captured_free_in(long n, void **mine, int *nmine,
                                    bool retain_fails)
{
    void *p = device_alloc(1 << 20);
    void *w = device_alloc(4096);
    mine[(*nmine)++] = p;
    mine[(*nmine)++] = w;
    CHECK(defer_free(w, s) == cudaSuccess, "warm-up");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) ==
              cudaSuccess, "capture");
    if (retain_fails)
        fake_graph_fail(FAKE_GRAPH_RETAIN_USER_OBJECT,
                        cudaErrorMemoryAllocation, 0, 1);
    arm(n);
    cudaError_t err = defer_free(p, s);
    const char *said = disarm();
    fake_fail_clear();
    if (retain_fails) {
        CHECK(err != cudaSuccess, "refused");
        CHECK(wait_user_objects(0, 2000), "the user object is gone");
        track_lock();
        size_t left = tracked_count;
        track_unlock();
        CHECK(left == 0, "%zu allocations of the refused call left", left);
    }
    if (err != cudaSuccess) {
        refused_well(err, said, p);
        CHECK(defer_free(p, s) == cudaSuccess, "the next defer_free");
    }
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "capture's end");
    cudaGraphDestroy(g);
    CHECK(wait_released(p, 5000), "released once the graph is gone");
    return err;
}

static cudaError_t captured_free(long n, void **mine, int *nmine)
{
    return captured_free_in(n, mine, nmine, false);
}

static cudaError_t captured_free_retain_fails(long n, void **mine,
                                              int *nmine)
{
    return captured_free_in(n, mine, nmine, true);
}

/* PyTorch's first allocation and its free (the pluggable entry points:
 * a refusal is NULL, said). */
static cudaError_t pluggable(long n, void **mine, int *nmine)
{
    arm(n);
    void *q = defer_pluggable_alloc(1 << 20, 0, s);
    const char *said = disarm();
    cudaError_t err = q != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
    if (q == NULL) {
        refused_well(err, said, NULL);
        q = defer_pluggable_alloc(1 << 20, 0, s);
        CHECK(q != NULL, "the next defer_pluggable_alloc");
    }
    mine[(*nmine)++] = q;
    if (q != NULL)
        defer_pluggable_free(q, 1 << 20, 0, s);
    return err;
}

int main(void)
{
    plan_lazy();
    set_cudefer_env("CUDEFER_IDLE_US=1000");
    reached = mmap(NULL, sizeof *reached, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (reached == MAP_FAILED)
        bail("mmap");
    static const struct sweep sweeps[] = {
        {"the first defer_free (the reclaimer's start)", first_free},
        {"the first defer_alloc", first_alloc},
        {"defer_free_n of three blocks", free_n_blocks},
        {"defer_free_n of 41 pointers, one NULL", free_n},
        {"defer_record_stream", record_stream},
        {"a block's defer_free on the legacy stream", batched_free},
        {"a defer_free on a capturing stream", captured_free},
        {"a defer_free on a capturing stream whose graph refuses the user "
         "object", captured_free_retain_fails},
        {"the first defer_pluggable_alloc", pluggable},
    };
    for (size_t i = 0; i < sizeof sweeps / sizeof *sweeps; i++)
        sweep(&sweeps[i]);
    return 0;
}
#else
int main(void)
{
    skip_all("the allocator is replaced here, which a sanitizer's clashes "
             "with");
    return 0;
}
#endif
