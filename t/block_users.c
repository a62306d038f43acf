/* SPDX-License-Identifier: MIT */
/* The streams recorded on a block of the cache (src/cache_users.c), on its
 * own (no reclaimer), through src/cache.h: a record counts once, a claimed
 * or freed block takes none, at most BLOCK_MAX_USERS, a free on another
 * stream waits for them all, the legacy streams of two devices are two
 * users though they share an id, and a block its stream takes back has no
 * stream recorded. */
#include <stdint.h>
#include <string.h>

#include "block_test.h"
#include "cache.h"
#include "helpers.h"

/* Stream x as recorded with id on device 0 (struct block_user). */
static const struct block_user *user(cudaStream_t x, unsigned long long id)
{
    static struct block_user u;
    u = (struct block_user){x, id, 0};
    return &u;
}

static void test_recorded(void)
{
    size_t size;
    ok(add_block(0, ADDR(7), 2048, false), "a block");
    cudaStream_t x = (cudaStream_t)(uintptr_t)0x1234;
    is_int(cache_users_add(ADDR(7), user(x, 9)), cudaSuccess,
           "recorded on stream 9");
    is_int(cache_users_add(ADDR(7), user(x, 9)), cudaSuccess,
           "recording it twice is once");
    struct block_free_plan plan;
    cache_claim_plan(ADDR(7), 0, 9, &plan);
    is_int(plan.path, BLOCK_STREAM_ORDERED,
           "freed on the recorded stream itself: stream-ordered");
    /* A plan claims the block (FREEING): until the free gives it back
     * (refused after all), no other free or record takes it. */
    struct block_free_plan again;
    cache_claim_plan(ADDR(7), 0, 9, &again);
    is_int(again.path, BLOCK_NOT_LIVE, "planned: a second free is refused");
    is_int(claim(ADDR(7)), BLOCK_NOT_LIVE,
           "so is a claim by another free path");
    stderr_capture_begin();
    is_int(cache_users_add(ADDR(7), user(x, 10)), cudaErrorInvalidValue,
           "and a record");
    stderr_capture_end();
    cache_claim_undo(&(struct block_claim){plan.block, plan.handout});
    cache_claim_plan(ADDR(7), 0, 4, &plan);
    struct block_user waits[BLOCK_MAX_USERS];
    ok(plan.path == BLOCK_AFTER_STREAMS && plan.nstreams == 2 &&
           cache_users_of_block(ADDR(7), waits) == 1 && waits[0].handle == x,
       "given back, then freed on another stream: waits for both");
    is_int(cache_users_of_block(ADDR(7), NULL), 1,
           "a claimed block's recorded streams are still its free's");
    cache_claim_undo(&(struct block_claim){plan.block, plan.handout});
    is_int(claim(ADDR(99)), BLOCK_NOT_OURS,
           "claiming an unknown pointer: not ours");
    int all = 1;
    for (unsigned long long id = 100; id < 100 + BLOCK_MAX_USERS - 1; id++)
        all &= cache_users_add(ADDR(7), user(x, id)) == cudaSuccess;
    ok(all, "up to 63 streams recorded");
    stderr_capture_begin();
    is_int(cache_users_add(ADDR(7), user(x, 5000)), cudaErrorNotSupported,
           "a 64th is refused (not InvalidValue: the PyTorch hook takes "
           "that for memory that is not cudefer's, and carries on)");
    ok(strstr(stderr_capture_end(), "63 streams") != NULL, "saying why");
    ok(give_back(ADDR(7)), "freed, its work done: adopted");
    ok(cache_take(0, 4, 2048, &size) == ADDR(7) &&
           view(cache_test_find(ADDR(7))).nusers == 0,
       "handed out again with no stream recorded");
    stderr_capture_begin();
    is_int(cache_users_add(ADDR(98), user(x, 9)), cudaErrorInvalidValue,
           "recording an unknown pointer is refused");
    stderr_capture_end();
}

/* The legacy streams of two devices may share an id: a user is told
 * apart by device too (as the free's device switch is: cache_users_enter). */
static void test_recorded_devices(void)
{
    ok(add_block(0, ADDR(500), 2048, false), "a block");
    struct block_user on0 = {0, 9, 0}, on1 = {0, 9, 1};
    ok(cache_users_add(ADDR(500), &on0) == cudaSuccess &&
           cache_users_add(ADDR(500), &on1) == cudaSuccess,
       "stream 0 recorded with device 0, then with device 1 (one id)");
    struct block_user got[BLOCK_MAX_USERS];
    ok(cache_users_of_block(ADDR(500), got) == 2 && got[1].device == 1,
       "two users");
    struct block_free_plan plan;
    cache_claim_plan(ADDR(500), 0, 9, &plan);
    ok(plan.path == BLOCK_AFTER_STREAMS && plan.nstreams == 2,
       "freed on device 0's stream 9: waits for device 1's too");
    cache_claim_undo(&(struct block_claim){plan.block, plan.handout});
    ok(give_back(ADDR(500)), "given back");
}

/* A block recorded on the stream it is freed on parks PENDING on that
 * stream with its record; the request on that stream that takes it back
 * owns it with no stream recorded, so that its new owner's free on another
 * stream is stream-ordered, not a wait for the old owner's stream. */
static void test_reuse_forgets_users(void)
{
    size_t size;
    cudaStream_t x = (cudaStream_t)(uintptr_t)0x5678;
    ok(add_block(0, ADDR(600), 2048, false), "a block");
    is_int(cache_users_add(ADDR(600), user(x, 21)), cudaSuccess,
           "recorded on stream 21");
    struct block_free_plan plan;
    ok(park_free(ADDR(600), 0, 21, &plan),
       "freed on stream 21 itself: parked PENDING there");
    ok(cache_take(0, 21, 2048, &size) == ADDR(600),
       "taken back at once by a request on stream 21");
    is_int(view(cache_test_find(ADDR(600))).nusers, 0,
           "its new owner has no stream recorded");
    cache_claim_plan(ADDR(600), 0, 22, &plan);
    ok(plan.path == BLOCK_STREAM_ORDERED && plan.nstreams == 1,
       "freed on stream 22: stream-ordered, waiting for no other stream "
       "(path %d, %zu streams)", (int)plan.path, plan.nstreams);
    cache_claim_undo(&(struct block_claim){plan.block, plan.handout});
    ok(give_back(ADDR(600)), "given back");
}

int main(void)
{
    plan_lazy();
    fake_reset(2);
    ok(cache_init(2, (size_t)1 << 20, 16), "init for two devices");
    test_recorded();
    test_recorded_devices();
    test_reuse_forgets_users();
    cache_destroy();
    return 0;
}
