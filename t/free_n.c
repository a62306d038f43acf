/* SPDX-License-Identifier: MIT */
/* defer_free_n: one event for several pointers, NULL ones skipped, the
 * array copied at the call; a NULL array, n == 0 and a pointer named more
 * than once (which would be released twice) handled at the call.  (Moved
 * out of t/policy, which is about when completed memory is released.) */
#include <stdint.h>
#include <string.h>

#include "helpers.h"

static void test_one_event(cudaStream_t s)
{
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = device_alloc(1024);
    fake_work *w = fake_launch_held(s, p, 4);
    void *ptrs[5] = {p[0], p[1], NULL, p[2], p[3]};
    unsigned long records = fake_calls(FAKE_EVENT_RECORD);
    is_int(defer_free_n(ptrs, 5, s), cudaSuccess, "defer_free_n of 5 (one NULL)");
    memset(ptrs, 0, sizeof ptrs); /* the caller may reuse the array */
    is_int(fake_calls(FAKE_EVENT_RECORD) - records, 1, "one event");
    is_int(stats_now().deferred, 1, "one entry");
    sleep_ms(20);
    is_int(count_released(p, 4), 0,
           "nothing released before the work completes");
    fake_complete(w);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(count_released(p, 4), 4, "all released after");
}

static void test_null_and_empty(cudaStream_t s)
{
    void *ptrs[5] = {NULL};
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    cudaError_t err = defer_free_n(NULL, 3, s);
    stderr_capture_end();
    is_int(err, cudaErrorInvalidValue, "defer_free_n(NULL, 3)");
    is_int(stats_now().rejected - rejected, 1, "counted as rejected");
    is_int(defer_free_n(ptrs, 0, s), cudaSuccess, "n == 0: cudaSuccess");
    is_int(defer_free_n(NULL, 0, s), cudaSuccess, "NULL, n == 0: cudaSuccess");
    uint64_t deferred = stats_now().deferred;
    is_int(defer_free_n(ptrs, 5, s), cudaSuccess, "all NULL: cudaSuccess");
    is_int(stats_now().deferred, deferred, "all NULL: nothing deferred");
}

/* A pointer named twice, in a short list and a long (sorted) one: refused,
 * said (plain memory was released twice before). */
static void test_named_twice(cudaStream_t s)
{
    void *many[41] = {NULL};
    for (int i = 0; i < 40; i++)
        many[i] = device_alloc(4096);
    /* The long list's lowest address, which sorts first: a repeat there is
     * the sorted list's first pair. */
    int lowest = 0;
    for (int i = 1; i < 40; i++)
        if ((uintptr_t)many[i] < (uintptr_t)many[lowest])
            lowest = i;
    const struct {
        size_t n;
        int twice;
    } cases[] = {{3, 0}, {41, 17}, {41, lowest}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = cases[c].n;
        void *keep = many[n - 1];
        many[n - 1] = many[cases[c].twice];
        uint64_t rejected = stats_now().rejected,
                 deferred = stats_now().deferred;
        stderr_capture_begin();
        cudaError_t err = defer_free_n(many, n, s);
        ok(strstr(stderr_capture_end(), "named more than once") != NULL,
           "%zu pointers, one twice (%s): said", n,
           c == 2 ? "the lowest address" : "another");
        ok(err == cudaErrorInvalidValue &&
               stats_now().rejected - rejected == 1 &&
               stats_now().deferred == deferred,
           "refused (%s), counted, nothing deferred", cudaGetErrorName(err));
        many[n - 1] = keep;
    }
    ok(defer_free_n(many, 40, s) == cudaSuccess &&
           defer_flush() == cudaSuccess && count_released(many, 40) == 40,
       "40 distinct ones: each released once");
}

/* Pool memory (cudaMallocAsync's) beside cudaMalloc memory in one
 * defer_free_n: released as defer_free releases it, once its work is done,
 * while the policy holds the rest, and its bytes are no held bytes (work
 * pending on another stream all along: no idle-time release; no age
 * limit).  Its address handed out again and deferred is no second free
 * (CUDEFER_CHECK).  A pool pointer whose release fails (one inside its
 * allocation) fails its entry, once, the rest released all the same. */
static void scenario_pool_memory_not_held(void)
{
    fake_set_address_reuse(1);
    cudaStream_t s = stream_new(), busy = stream_new();
    void *other = device_alloc(256);
    fake_work *keep = work_held(busy, other);
    CHECK(defer_free(other, busy) == cudaSuccess, "work pending elsewhere");
    void *q = NULL, *p = device_alloc(4096);
    CHECK(cudaMallocAsync(&q, 4096, s) == cudaSuccess, "pool memory");
    void *both[2] = {p, q};
    fake_work *w = fake_launch_held(s, both, 2);
    CHECK(defer_free_n(both, 2, s) == cudaSuccess,
          "defer_free_n of cudaMalloc and pool memory");
    CHECK(fake_is_released(q) == 0, "nothing released before its work");
    fake_complete(w);
    CHECK(wait_released(q, 10000),
          "the pool memory is released once its work is done");
    CHECK(wait_stats_settled(2000), "the counters settle");
    struct defer_stats st = stats_now();
    CHECK(fake_is_released(p) == 0 && st.held == 1 && st.held_bytes == 4096,
          "the cudaMalloc memory is held, its bytes alone (held %llu, "
          "%llu bytes)", ULL(st.held), ULL(st.held_bytes));
    void *again = NULL;
    CHECK(cudaMallocAsync(&again, 4096, s) == cudaSuccess && again == q,
          "the pool memory's address handed out again");
    stderr_capture_begin();
    CHECK(defer_free(again, s) == cudaSuccess, "and deferred");
    void *p2 = device_alloc(4096), *q2 = NULL;
    CHECK(cudaMallocAsync(&q2, 4096, s) == cudaSuccess, "more pool memory");
    void *inside[2] = {p2, (char *)q2 + 512};
    CHECK(defer_free_n(inside, 2, s) == cudaSuccess,
          "defer_free_n of cudaMalloc memory and a pointer inside pool "
          "memory");
    fake_complete(keep);
    CHECK(defer_flush() == cudaSuccess, "flush");
    const char *msg = stderr_capture_end();
    CHECK(strstr(msg, "CUDEFER_CHECK") == NULL,
          "the address deferred again is no second free");
    CHECK(has_line(msg, "defer_free_n", "inside the allocation", NULL),
          "the pointer inside pool memory is said");
    CHECK(fake_is_released(p) == 1 && fake_is_released(again) == 1 &&
              fake_is_released(p2) == 1 && fake_is_released(other) == 1,
          "the rest released");
    CHECK(cudaFreeAsync(q2, s) == cudaSuccess, "the caller's pool memory");
    st = stats_now();
    CHECK(st.deferred == 4 && st.released == 3 && st.failed == 1 &&
              st.pending == 0,
          "four entries: three released, the one with a pointer inside pool "
          "memory failed (deferred %llu released %llu failed %llu)",
          ULL(st.deferred), ULL(st.released), ULL(st.failed));
}

int main(void)
{
    plan_lazy();
    fork_scenario("pool memory in defer_free_n is released once its work is "
                  "done, never held", "CUDEFER_CHECK=1 CUDEFER_MAX_DELAY_MS=0",
                  1, 30000, scenario_pool_memory_not_held);
    fake_reset(1);
    cudaStream_t s = stream_new();
    test_one_event(s);
    test_null_and_empty(s);
    test_named_twice(s);
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_violations(), 0, "oracle: nothing released twice or early");
    return 0;
}
