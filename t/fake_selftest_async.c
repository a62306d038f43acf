/* SPDX-License-Identifier: MIT */
/*
 * fake_selftest_async.c — self-test of the fake CUDA runtime: memory freed
 * in stream order.  Pools (cudaMemPoolCreate) and what their trims keep of
 * memory whose cudaFreeAsync has not run yet; cudaMalloc memory given to
 * cudaFreeAsync, in the device's use until its stream is synchronized.
 */
#define _GNU_SOURCE
#include "fake_selftest.h"

/* Pools (cudaMemPoolCreate): used and reserved bytes, reservations in
 * granules (fake_set_pool_granularity), a trim back to what is used. */
void test_pools(void)
{
    struct cudaMemPoolProps props = {
        .allocType = cudaMemAllocationTypePinned,
        .location = {.type = cudaMemLocationTypeDevice, .id = 0}};
    cudaMemPool_t pool;
    void *a = NULL, *b = NULL;
    uint64_t used = 0, reserved = 0;

    diag("pools");
    fake_reset(1);
    is_int(cudaMemPoolCreate(&pool, &props), cudaSuccess, "cudaMemPoolCreate");
    is_int(cudaMallocFromPoolAsync(&a, 3072, pool, 0), cudaSuccess,
           "3 KiB from the pool");
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    ok(used == 3072 && reserved == 3072,
       "used and reserved: exactly that (%llu, %llu)", ULL(used), ULL(reserved));
    fake_set_pool_granularity(2 * MiB);
    is_int(cudaMallocFromPoolAsync(&b, 4096, pool, 0), cudaSuccess,
           "4 KiB more, in 2 MiB granules");
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, 2 * MiB, "reserved: one granule");
    cudaFreeAsync(a, 0);
    cudaFreeAsync(b, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    ok(used == 0 && reserved == 2 * MiB, "freed: none used, the granule kept "
       "(%llu, %llu)", ULL(used), ULL(reserved));
    is_int(cudaMallocFromPoolAsync(&a, 1000, pool, 0), cudaSuccess, "1000 B");
    is_int(cudaMemPoolTrimTo(pool, 0), cudaSuccess, "trim to 0");
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, 2 * MiB, "keeps the granule of what is used");
    cudaFreeAsync(a, 0);
    cudaMemPoolTrimTo(pool, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, 0, "nothing used: nothing kept");
    fake_reset(1);
    is_int(cudaMallocFromPoolAsync(&a, 3072, pool, 0), cudaSuccess, "again");
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, 3072, "fake_reset: exact reservations again");
    cudaFreeAsync(a, 0);

    /* An async allocation is ordered after its stream's earlier work (its
     * memory may be what that work freed): usable on that stream at once,
     * on another only once that work is done; cudaFree waits for it. */
    cudaStream_t s, t;
    cudaStreamCreate(&s);
    cudaStreamCreate(&t);
    fake_work *w = fake_launch_held(s, NULL, 0);
    cudaMallocFromPoolAsync(&a, 4096, pool, s);
    fake_oracle_handout(a, s);
    is_int(fake_violations(), 0, "handed out on its stream: fine");
    fake_oracle_handout(a, t);
    is_int(fake_violations(), 1, "on another while the stream's earlier "
                                 "work runs: a violation");
    fake_oracle_forgive();
    cudaMallocAsync(&b, 4096, s);
    fake_oracle_handout(b, t);
    is_int(fake_violations(), 1, "cudaMallocAsync too");
    fake_oracle_forgive();
    cudaFree(b);
    is_int(fake_violations(), 0, "cudaFree of it: fine (it waits)");
    fake_complete(w);
    fake_oracle_handout(a, t);
    is_int(fake_violations(), 0, "on another once that work is done: fine");
    cudaFreeAsync(a, t);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
}

/* fake_set_free_async_us: a cudaFreeAsync is an item of its own on its
 * stream; the pool memory it gave back stays used and reserved through a
 * trim until the item completed, as does memory freed behind pending work
 * (no duration); a later allocation from the pool on that stream may take
 * it at once. */
void test_pool_frees(void)
{
    struct cudaMemPoolProps props = {
        .allocType = cudaMemAllocationTypePinned,
        .location = {.type = cudaMemLocationTypeDevice, .id = 0}};
    cudaMemPool_t pool;
    cudaStream_t s;
    void *a = NULL, *b = NULL;
    uint64_t used = 0, reserved = 0;

    diag("pool frees");
    fake_reset(1);
    cudaMemPoolCreate(&pool, &props);
    cudaStreamCreate(&s);
    fake_set_free_async_us(20000);
    cudaMallocFromPoolAsync(&a, MiB, pool, s);
    is_int(cudaFreeAsync(a, s), cudaSuccess, "a free that takes 20 ms");
    is_int(cudaStreamQuery(s), cudaErrorNotReady, "runs on its stream");
    cudaMemPoolTrimTo(pool, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    ok(used == MiB && reserved == MiB, "until it ran, the pool keeps the "
       "memory through a trim (%llu, %llu)", ULL(used), ULL(reserved));
    is_int(cudaStreamSynchronize(s), cudaSuccess, "wait for it");
    cudaMemPoolTrimTo(pool, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    ok(used == 0 && reserved == 0, "then a trim gives it back (%llu, %llu)",
       ULL(used), ULL(reserved));

    fake_set_free_async_us(0);
    fake_work *w = fake_launch_held(s, NULL, 0);
    cudaMallocFromPoolAsync(&a, MiB, pool, s);
    cudaFreeAsync(a, s);
    cudaMemPoolTrimTo(pool, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, MiB, "no duration: kept while the work before it runs");
    cudaMallocFromPoolAsync(&b, MiB / 2, pool, s);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    ok(used == MiB && reserved == MiB, "a later allocation on that stream "
       "takes half of it: no more reserved (%llu, %llu)", ULL(used),
       ULL(reserved));
    fake_complete(w);
    cudaMemPoolTrimTo(pool, 0);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    is_hex(reserved, MiB / 2, "the work done, a trim keeps what is lent");
    cudaFreeAsync(b, s);
    cudaStreamDestroy(s);
}

/* cudaMalloc memory given to cudaFreeAsync: released at once as far as the
 * oracle and a second release are concerned, but in the device's use
 * (cudaMemGetInfo) until its stream, or its device, is synchronized or the
 * stream destroyed, as on an H200; and refused on a device without memory
 * pools. */
void test_malloc_free_async(void)
{
    size_t free0 = 0, fr = 0, tot = 0;
    cudaStream_t s;
    void *a;
    int value = -1;

    diag("cudaMalloc memory given to cudaFreeAsync");
    fake_reset(2);
    cudaStreamCreate(&s);
    cudaMemGetInfo(&free0, &tot);
    is_int(cudaDeviceGetAttribute(&value, cudaDevAttrMemoryPoolsSupported, 0),
           cudaSuccess, "cudaDevAttrMemoryPoolsSupported");
    is_int(value, 1, "memory pools by default");

    const char *how[] = {"cudaStreamSynchronize", "cudaDeviceSynchronize",
                         "cudaStreamDestroy"};
    for (int k = 0; k < 3; k++) {
        cudaMalloc(&a, MiB);
        is_int(cudaFreeAsync(a, s), cudaSuccess, "cudaFreeAsync of cudaMalloc "
               "memory (then %s)", how[k]);
        is_int(fake_is_released(a), 1, "released for the oracle");
        cudaMemGetInfo(&fr, &tot);
        is_hex(free0 - fr, MiB, "still in the device's use");
        if (k == 0)
            cudaStreamSynchronize(s);
        else if (k == 1)
            cudaDeviceSynchronize();
        else
            cudaStreamDestroy(s);
        cudaMemGetInfo(&fr, &tot);
        is_hex(free0 - fr, 0, "back after %s", how[k]);
    }

    fake_set_memory_pools(1, 0);
    cudaDeviceGetAttribute(&value, cudaDevAttrMemoryPoolsSupported, 1);
    is_int(value, 0, "fake_set_memory_pools(1, 0): device 1 has none");
    cudaSetDevice(1);
    cudaStreamCreate(&s);
    cudaMalloc(&a, MiB);
    is_int(cudaFreeAsync(a, s), cudaErrorNotSupported,
           "cudaFreeAsync on its streams: cudaErrorNotSupported");
    is_int(fake_is_released(a), 0, "and nothing released");
    is_int(cudaFree(a), cudaSuccess, "cudaFree does it");
    cudaStreamDestroy(s);
    cudaSetDevice(0);
}
