/* SPDX-License-Identifier: MIT */
/* defer_peer_access: another device's kernels and copies may use the
 * blocks defer_alloc makes on a device only once that device's pool of
 * cudefer's lets them (cudaMemPoolSetAccess; peer access does not reach a
 * pool's memory).  The call grants it to the peer named, only to it, and
 * makes the pool where none was made yet; a device without pools (its
 * blocks are cudaMalloc's, which peer access covers) and a device's own
 * access need nothing; a device that does not exist is refused, counted. */
#include "helpers.h"

#define MiB ((size_t)1 << 20)

static void scenario_grant(void)
{
    CHECK(defer_peer_access(0, 1) == cudaSuccess,
          "device 1 is let into device 0's pool");
    CHECK(fake_mem_pool_access(0, 1) && !fake_mem_pool_access(0, 2) &&
          !fake_mem_pool_access(1, 0),
          "device 0's pool lets device 1 in (%d), not device 2 (%d); "
          "device 1's pool is not opened (%d)", fake_mem_pool_access(0, 1),
          fake_mem_pool_access(0, 2), fake_mem_pool_access(1, 0));
    cudaStream_t s = stream_new();
    void *b = NULL;
    CHECK(alloc_checked(&b, MiB, s) == cudaSuccess, "1 MiB on device 0 "
          "after the grant");
    CHECK(defer_free(b, s) == cudaSuccess, "freed");
    CHECK(defer_peer_access(0, 0) == cudaSuccess, "a device's own access: "
          "nothing to do");
    struct defer_stats before = stats_now();
    CHECK(defer_peer_access(0, 3) == cudaErrorInvalidDevice &&
          defer_peer_access(-1, 1) == cudaErrorInvalidDevice,
          "a device that does not exist is refused");
    CHECK(stats_now().rejected == before.rejected + 2,
          "both refusals counted in rejected");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
    cudaStreamDestroy(s);
}

static void scenario_no_pools(void)
{
    fake_set_memory_pools(1, 0);
    CHECK(defer_peer_access(1, 0) == cudaSuccess,
          "a device without pools: nothing to grant");
    CHECK(!fake_mem_pool_access(1, 0), "no pool was opened");
    CHECK(defer_shutdown() == cudaSuccess, "shutdown");
}

int main(void)
{
    plan_lazy();
    fork_scenario("defer_peer_access opens a pool to the peer named", "", 3,
                  20000, scenario_grant);
    fork_scenario("defer_peer_access on a device without pools", "", 2,
                  20000, scenario_no_pools);
    return 0;
}
