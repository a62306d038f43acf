/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_reuse.c — self-test of the fake CUDA runtime: released
 * addresses reused as CUDA reuses them (fake_set_address_reuse,
 * FAKE_ADDRESS_REUSE): which address a new allocation takes, when an
 * address freed in stream order may come back, and that the oracle still
 * sees the old allocation's work.
 */
#define _GNU_SOURCE
#include "fake_selftest.h"

#include <stdlib.h>
#include <string.h>

void test_address_reuse(void)
{
    void *a = NULL, *b = NULL, *c = NULL, *h = NULL, *h2 = NULL, *p = NULL;
    cudaStream_t s;

    diag("address reuse");
    const char *env = getenv("FAKE_ADDRESS_REUSE");
    char *saved = env != NULL ? strdup(env) : NULL;
    unsetenv("FAKE_ADDRESS_REUSE");
    fake_reset(1);
    cudaMalloc(&a, 8192);
    cudaFree(a);
    cudaMalloc(&b, 8192);
    ok(b != a, "off after fake_reset: a new address");
    is_int((long long)fake_addresses_reused(), 0, "none reused");
    setenv("FAKE_ADDRESS_REUSE", "1", 1);
    fake_reset(1);
    cudaMalloc(&p, 8192);
    cudaFree(p);
    cudaMalloc(&a, 8192);
    ok(a == p, "FAKE_ADDRESS_REUSE: on at fake_reset");
    cudaFree(a);
    if (saved != NULL)
        setenv("FAKE_ADDRESS_REUSE", saved, 1);
    else
        unsetenv("FAKE_ADDRESS_REUSE");
    free(saved);
    fake_reset(1);
    fake_set_address_reuse(0);
    cudaMalloc(&a, 8192);
    cudaFree(a);
    cudaMalloc(&b, 8192);
    fake_set_address_reuse(1);
    cudaMalloc(&c, 4096);
    ok(c == a, "on: the lowest released address that is large enough");
    is_int((long long)fake_addresses_reused(), 1, "counted");
    is_int(fake_is_released(c), 0, "the address is live again");
    cudaMalloc(&p, 8192);
    ok(p != a && p != b, "too large for what is left: a new address");
    cudaFree(p);
    cudaMallocHost(&h, 4096);
    ok(h != p, "host memory does not take a device address");
    cudaFreeHost(h);
    cudaMallocHost(&h2, 100);
    ok(h2 == h, "but a released host address");
    cudaFreeHost(h2);

    /* A cudaFreeAsync is done once its stream reached it: work before it
     * may still use the memory until then. */
    cudaStreamCreate(&s);
    cudaMallocAsync(&p, 4096, s);
    fake_work *w = fake_launch_held(s, &p, 1);
    cudaFreeAsync(p, s);
    void *q = NULL;
    cudaMalloc(&q, 4096);
    ok(q != p, "not while the work before the async free runs");
    fake_complete(w);
    cudaStreamSynchronize(s);
    void *r = NULL;
    cudaMalloc(&r, 4096);
    ok(r == p, "once it is done (%p, %p)", r, p);
    /* Stream order: pool memory freed on a stream serves that stream's
     * next pool allocation at once, and no other stream before the work
     * freed with it is done. */
    cudaStream_t t;
    cudaStreamCreate(&t);
    void *pa = NULL, *pb = NULL;
    cudaMallocAsync(&pa, 4096, s);
    fake_work *w2 = fake_launch_held(s, &pa, 1);
    cudaFreeAsync(pa, s);
    cudaMallocAsync(&pb, 4096, s);
    ok(pb == pa, "a pool allocation on the freeing stream: the address at "
                 "once");
    fake_oracle_handout(pb, s);
    is_int(fake_violations(), 0, "handed out on that stream: fine");
    fake_oracle_handout(pb, t);
    is_int(fake_violations(), 1, "on another while the work runs: a "
                                 "violation");
    fake_oracle_forgive();
    fake_complete(w2);
    cudaFreeAsync(pb, s);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(t);
    cudaFree(r);
    is_int(cudaFree(r), cudaErrorInvalidValue, "a second free of it: refused");
    is_int(fake_violations(), 1, "and a violation, as before");
    fake_oracle_forgive();
    cudaFree(q);
    cudaFree(c);
    cudaFree(b);
    cudaStreamDestroy(s);
    is_int((long long)fake_live_allocations(), 0, "nothing live");
    fake_reset(1);
}
