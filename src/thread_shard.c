/* SPDX-License-Identifier: MIT */
/* Thread shards (see the header). */
#include "thread_shard.h"

struct thread_shard thread_shards[THREAD_SHARDS];
_Thread_local struct thread_here thread_here = {.shard = -1,
                                               .special.key_device = -1};
static _Atomic unsigned next_shard;

struct thread_shard *thread_shard_take(void)
{
    thread_here.shard = (int)(atomic_fetch_add_explicit(&next_shard, 1,
                                                        memory_order_relaxed) %
                              THREAD_SHARDS);
    return &thread_shards[thread_here.shard];
}
