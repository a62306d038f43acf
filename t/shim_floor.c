/* SPDX-License-Identifier: MIT */
/* bench/torch_shims.c's pluggable-floor pair (a bound row of the training
 * benchmark) on the fake runtime: a block freed on a stream comes back to
 * the next request of exactly its size on that stream, at once (stream
 * order: the oracle accepts it while the block's work is pending), and to
 * no other size or stream; a request no list serves is a new allocation.
 * Then the timed shims (--time-calls): they call the pair they were given
 * and count each call and its time. */
#include <stdint.h>
#include <stdlib.h>

#include "helpers.h"

void *shim_floor_alloc(size_t size, int device, cudaStream_t stream);
void shim_floor_free(void *ptr, size_t size, int device, cudaStream_t stream);
int shim_timed_use(const char *allocator);
void *shim_timed_alloc(size_t size, int device, cudaStream_t stream);
void shim_timed_free(void *ptr, size_t size, int device, cudaStream_t stream);
void shim_timed_read(uint64_t out[4]);
int shim_timed_buckets(void);
void shim_timed_hist(uint64_t *out);

/* Calls counted in the histogram of kind (0 allocations, 1 frees) of a
 * shim_timed_hist read. */
static uint64_t hist_calls(const uint64_t *h, int kind)
{
    uint64_t n = 0;
    for (uint64_t b = 0; b < h[0]; b++)
        n += h[4 + (uint64_t)kind * h[0] + b];
    return n;
}

/* The timed shims around cudefer's pair: calls counted, time summed, the
 * sums zeroed by a read, and the blocks cudefer's (reused on the stream). */
static void test_timed(cudaStream_t s)
{
    uint64_t n[4];

    is_int(shim_timed_use("no-such-allocator"), -1, "an unknown pair: -1");
    is_int(shim_timed_use("cudefer"), 0, "cudefer's pair chosen");
    shim_timed_read(n);
    void *a = shim_timed_alloc(1 << 20, 0, s);
    ok(a != NULL, "a timed cudefer allocation");
    fake_oracle_handout_range(a, 1 << 20, s);
    shim_timed_free(a, 1 << 20, 0, s);
    void *b = shim_timed_alloc(1 << 20, 0, s);
    ok(b == a, "the freed block comes back on its stream (cudefer's cache)");
    shim_timed_free(b, 1 << 20, 0, s);
    shim_timed_read(n);
    ok(n[0] == 2 && n[2] == 2, "2 allocations and 2 frees counted (%llu, %llu)",
       (unsigned long long)n[0], (unsigned long long)n[2]);
    ok(n[1] > 0 && n[3] > 0, "their time summed (%llu ns, %llu ns)",
       (unsigned long long)n[1], (unsigned long long)n[3]);
    int nb = shim_timed_buckets();
    uint64_t *h = calloc(4 + 2 * (size_t)nb, sizeof *h);
    if (h == NULL)
        bail("calloc");
    shim_timed_hist(h);
    ok(h[0] == (uint64_t)nb && nb > 64 && h[1] == 4096,
       "the histogram's shape: %d buckets, 64 ns wide below 4096 ns", nb);
    ok(hist_calls(h, 0) == 2 && hist_calls(h, 1) == 2,
       "each call in one bucket of its kind's histogram");
    ok(h[2] <= n[1] && h[3] <= n[3], "the tail's ns within the sums");
    shim_timed_hist(h);
    ok(hist_calls(h, 0) == 0 && hist_calls(h, 1) == 0 && h[2] == 0 &&
       h[3] == 0, "a read zeroes the histograms");
    free(h);
    shim_timed_read(n);
    ok(n[0] == 0 && n[1] == 0 && n[2] == 0 && n[3] == 0,
       "a read zeroes the sums");
}

int main(void)
{
    plan_lazy();
    fake_reset(1);
    cudaStream_t s = stream_new(), t = stream_new();

    void *a = shim_floor_alloc(1 << 20, 0, s);
    ok(a != NULL, "a first request is served (cudaMalloc)");
    fake_work *w = work_held(s, a);
    shim_floor_free(a, 1 << 20, 0, s);
    void *b = shim_floor_alloc(1 << 20, 0, s);
    ok(b == a, "the same size on the same stream gets the freed block back");
    fake_oracle_handout(b, s);
    is_int(fake_violations(), 0, "while its work is pending (stream order)");
    shim_floor_free(b, 1 << 20, 0, s);

    void *c = shim_floor_alloc(1 << 20, 0, t);
    ok(c != NULL && c != a, "another stream does not get it");
    void *d = shim_floor_alloc((1 << 20) + 512, 0, s);
    ok(d != NULL && d != a, "another size does not get it");
    void *e = shim_floor_alloc(1 << 20, 0, s);
    ok(e == a, "it is still there for its own size and stream");

    fake_complete(w);
    test_timed(s);
    is_int(fake_violations(), 0, "oracle: nothing reused early");
    return 0;
}
