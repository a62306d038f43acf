/* SPDX-License-Identifier: MIT */
/* Addresses reused, as CUDA reuses them: the fake hands a released
 * allocation's address to the next allocation that fits
 * (fake_set_address_reuse), so that whatever cudefer remembers of a pointer
 * after releasing it (a pending entry, a block record, a merged piece)
 * meets a new allocation at the same address.  Scenarios: plain device and
 * host memory released and allocated again, then deferred again; a block
 * of the cache trimmed and its address taken by the application; pool
 * addresses taken by blocks of other sizes; and a seeded mix of all of
 * them.  Every defer call must be accepted, nothing reported, and the
 * oracle sees no release or hand-out while work still uses the memory. */
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define MIB ((size_t)1 << 20)

/* defer_free(p, s) of memory whose work is held, then released only once
 * that work is done (the oracle fails a release while it runs). */
static void free_after_work(void *p, cudaStream_t s, bool host,
                            const char *what)
{
    fake_work *w = work_held(s, p);
    cudaError_t err = host ? defer_free_host(p, s) : defer_free(p, s);
    is_int(err, cudaSuccess, "%s: deferred", what);
    sleep_ms(5); /* the reclaimer polls meanwhile */
    is_int(fake_is_released(p), 0, "%s: not released while its work runs",
           what);
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "%s: flushed", what);
    is_int(fake_is_released(p), 1, "%s: released", what);
}

static void test_plain(cudaStream_t s, cudaStream_t s2)
{
    void *p = device_alloc(MIB);
    free_after_work(p, s, false, "device memory");
    void *q = device_alloc(MIB);
    ok(q == p, "cudaMalloc gives the released address again");
    free_after_work(q, s2, false, "the same address on another stream");
    void *h = host_alloc(4096);
    free_after_work(h, s, true, "host memory");
    void *h2 = host_alloc(4096);
    ok(h2 == h, "cudaMallocHost gives it again");
    free_after_work(h2, s2, true, "the same host address");
}

/* A block of the cache trimmed back to the device: the application's
 * next cudaMalloc gets its address; cudefer must take that as plain memory
 * (released after its own work), not as its block, and never hand it out. */
static void test_trimmed_block(cudaStream_t s, cudaStream_t s2)
{
    void *b = NULL;
    is_int(alloc_checked(&b, MIB, s), cudaSuccess, "a block");
    defer_free(b, s);
    defer_flush();
    size_t trimmed = 0;
    defer_trim(&trimmed);
    ok(trimmed >= MIB, "trimmed (%zu bytes)", trimmed);
    void *q = device_alloc(MIB);
    ok(q == b, "the application's cudaMalloc gets the block's address");
    fake_work *w = work_held(s2, q);
    is_int(defer_free(q, s2), cudaSuccess, "deferred as plain memory");
    void *c = NULL;
    is_int(alloc_checked(&c, MIB, s), cudaSuccess,
           "a request meanwhile (the oracle checks it is not that memory)");
    ok(c != q, "not that memory");
    fake_complete(w);
    defer_free(c, s);
    is_int(defer_flush(), cudaSuccess, "flushed");
    is_int(fake_is_released(q), 1, "the plain memory is released");
}

/* Pool addresses taken by blocks of other sizes: after a trim the pool
 * gives a 2 MiB block's address to a 1 MiB block, and so on. */
static void test_pool_sizes(cudaStream_t s, cudaStream_t s2)
{
    size_t sizes[] = {2 * MIB, MIB, 3 * MIB, 512 << 10, MIB};
    void *first = NULL;
    int same = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *a = NULL, *b = NULL;
        alloc_checked(&a, sizes[i], s);
        alloc_checked(&b, sizes[i] / 2, s2);
        if (i == 0)
            first = a;
        same += a == first && i > 0;
        fake_work *w = work_held(s, a);
        defer_free(a, s);
        defer_free(b, s2);
        fake_complete(w);
        defer_flush();
        defer_trim(NULL);
    }
    ok(same > 0, "blocks of other sizes took the first block's address "
                 "(%d times)", same);
}

/* A seeded mix: plain memory and blocks, on three streams, work held and
 * completed in random order, trims and flushes now and then. */
static void test_mix(cudaStream_t *streams, unsigned seed0)
{
    unsigned seed = seed0;
    enum { SLOTS = 24 };
    struct {
        void *p;
        fake_work *w;
    } held[SLOTS] = {{0}};
    enum { STEPS = 3000 };
    static void *seen[STEPS];
    unsigned refused = 0, nseen = 0, again = 0;
    for (int i = 0; i < STEPS; i++) {
        unsigned r = (unsigned)rand_r(&seed);
        cudaStream_t s = streams[r % 3];
        size_t bytes = (size_t)(1 + (r >> 4) % 64) << 14; /* 16 KiB .. 1 MiB */
        int slot = (int)((r >> 12) % SLOTS);
        if (held[slot].w != NULL) {
            fake_complete(held[slot].w);
            held[slot].w = NULL;
        }
        void *p = NULL;
        if ((r >> 20) % 2 == 0) {
            p = device_alloc(bytes);
            for (unsigned k = 0; k < nseen; k++)
                if (seen[k] == p) {
                    again++;
                    break;
                }
            seen[nseen++] = p;
        } else if (alloc_checked(&p, bytes, s) != cudaSuccess)
            p = NULL;
        if (p == NULL)
            continue;
        held[slot].w = work_held(s, p);
        refused += defer_free(p, s) != cudaSuccess;
        if ((r >> 24) % 64 == 0) {
            defer_trim(NULL);
        } else if ((r >> 24) % 64 == 1) {
            /* A flush waits for everything deferred before it. */
            for (int k = 0; k < SLOTS; k++)
                if (held[k].w != NULL) {
                    fake_complete(held[k].w);
                    held[k].w = NULL;
                }
            defer_flush();
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (held[i].w != NULL)
            fake_complete(held[i].w);
    is_int(refused, 0, "mix (seed %u): every defer_free accepted", seed0);
    ok(again > 0, "mix: %u of %u cudaMalloc took an address used before",
       again, nseen);
    is_int(defer_flush(), cudaSuccess, "mix: flushed");
}

int main(void)
{
    plan_lazy();
    /* No age limit or idle release: each release happens where the test
     * asks for it (a flush, a trim) or under the policy's cap. */
    set_cudefer_env("CUDEFER_MAX_DELAY_MS=0 CUDEFER_IDLE_US=10s");
    fake_reset(1);
    fake_set_address_reuse(1);
    cudaStream_t streams[3] = {stream_new(), stream_new(), stream_new()};
    stderr_capture_begin();
    test_plain(streams[0], streams[1]);
    test_trimmed_block(streams[0], streams[1]);
    test_pool_sizes(streams[1], streams[2]);
    for (unsigned seed = 1; seed <= 3; seed++)
        test_mix(streams, seed);
    const char *said = stderr_capture_end();
    ok(said[0] == '\0', "nothing reported%s%s", said[0] ? ": " : "", said);
    defer_trim(NULL);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_allocations(), 0, "every allocation released");
    is_int(fake_violations(), 0, "oracle: nothing released or reused early");
    return 0;
}
