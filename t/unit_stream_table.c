/* SPDX-License-Identifier: MIT */
/* The stream table (src/stream_table.c), called directly: each stream has
 * three FIFOs (callbacks, blocks of the cache, other memory) kept apart
 * and in order; a new head's poll schedule starts over; a FIFO leaves the
 * table when its last entry is popped and the dense array stays packed,
 * the FIFO readable until the next append; an entry completed out of turn
 * unlinks from the middle or the tail (a trim's pass, reclaimer_poll.c);
 * the table grows past its first 64 FIFOs; a head's poll schedule backs
 * off and a request makes every head due. */
#include <string.h>

#include "entry.h"
#include "stream_table.h"
#include "tap.h"

static struct entry entry(enum entry_kind kind, int device,
                          unsigned long long stream_id)
{
    struct entry e;
    memset(&e, 0, sizeof e);
    e.kind = kind;
    e.device = device;
    e.stream_id = stream_id;
    return e;
}

/* The FIFO of (device, stream_id, kind), or NULL. */
static struct stream_fifo *fifo_of(struct stream_table *t, int device,
                                   unsigned long long stream_id,
                                   enum stream_fifo_kind kind)
{
    for (size_t i = 0; i < t->count; i++)
        if (t->fifos[i]->device == device &&
            t->fifos[i]->stream_id == stream_id && t->fifos[i]->kind == kind)
            return t->fifos[i];
    return NULL;
}

/* Whether every FIFO's index is its place in the dense array. */
static bool packed(const struct stream_table *t)
{
    for (size_t i = 0; i < t->count; i++)
        if (t->fifos[i]->index != i)
            return false;
    return true;
}

static void test_kinds_and_order(void)
{
    struct stream_table t;
    ok(stream_table_init(&t), "init");
    struct entry call = entry(ENTRY_CALL, 0, 7), block = entry(ENTRY_BLOCK, 0, 7),
                 m1 = entry(ENTRY_FREE_DEVICE, 0, 7),
                 m2 = entry(ENTRY_FREE_HOST, 0, 7),
                 other_device = entry(ENTRY_FREE_DEVICE, 1, 7);
    struct entry payload = entry(ENTRY_CALL, 0, 9),
                 member = entry(ENTRY_MEMBER, 0, 7);
    member.group = &payload;
    is_int(stream_table_fifo_of(&call), FIFO_CALLBACKS, "a callback: callbacks");
    is_int(stream_table_fifo_of(&member), FIFO_CALLBACKS,
           "a part of a defer_call_streams: callbacks");
    is_int(stream_table_fifo_of(&block), FIFO_BLOCKS, "a block: blocks");
    is_int(stream_table_fifo_of(&m2), FIFO_MEMORY, "a host free: memory");
    struct entry *all[] = {&m1, &call, &block, &m2, &other_device, &member};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ok(stream_table_append(&t, all[i], 100), "append %zu", i);
    is_int((long)t.count, 4, "stream 7 has three FIFOs, device 1's its own");
    struct stream_fifo *mem = fifo_of(&t, 0, 7, FIFO_MEMORY),
                       *calls = fifo_of(&t, 0, 7, FIFO_CALLBACKS);
    ok(mem != NULL && mem->head == &m1 && mem->tail == &m2,
       "memory: m1 then m2");
    ok(calls != NULL && calls->head == &call && calls->tail == &member,
       "callbacks in the order taken in");
    stream_table_backoff(mem, 150, 50, 1000, false);
    stream_table_backoff(mem, 160, 50, 1000, false);
    ok(stream_table_pop(&t, mem, 200) == &m1 && mem->head == &m2,
       "pop takes the head");
    ok(mem->due_ns == 0 && mem->backoff_us == 0 && mem->head_since_ns == 200,
       "the new head is due at once, its wait starting over, since the pop");
    struct stream_fifo *left = mem;
    ok(stream_table_pop(&t, mem, 300) == &m2, "pop the last");
    is_int((long)t.count, 3, "the emptied FIFO left the table");
    ok(fifo_of(&t, 0, 7, FIFO_MEMORY) == NULL && packed(&t),
       "and the dense array stays packed");
    ok(left->head == NULL && left->device == 0 && left->stream_id == 7 &&
           left->kind == FIFO_MEMORY,
       "the FIFO that left stays readable until the next append "
       "(reclaimer_poll_streams reads its device after the pop)");
    struct entry m3 = entry(ENTRY_FREE_DEVICE, 0, 7);
    ok(stream_table_append(&t, &m3, 400), "a FIFO comes back");
    mem = fifo_of(&t, 0, 7, FIFO_MEMORY);
    ok(mem != NULL && mem->head == &m3 && mem->head_since_ns == 400,
       "new, headed by m3, since its arrival");
    stream_table_destroy(&t);
}

static void test_unlink_next(void)
{
    struct stream_table t;
    ok(stream_table_init(&t), "init");
    struct entry e[4];
    for (int i = 0; i < 4; i++) {
        e[i] = entry(ENTRY_FREE_DEVICE, 0, 3);
        stream_table_append(&t, &e[i], 10);
    }
    struct stream_fifo *f = fifo_of(&t, 0, 3, FIFO_MEMORY);
    f->due_ns = 99;
    f->backoff_us = 8;
    ok(stream_table_unlink_next(f, &e[0]) == &e[1], "unlinks the one after");
    ok(f->head == &e[0] && e[0].fifo_next == &e[2] && e[1].fifo_next == NULL,
       "from the middle: e0 -> e2, e1 detached");
    ok(f->due_ns == 99 && f->backoff_us == 8,
       "the head's schedule is untouched");
    ok(stream_table_unlink_next(f, &e[2]) == &e[3] && f->tail == &e[2],
       "from the end: the tail moves back");
    struct entry late = entry(ENTRY_FREE_DEVICE, 0, 3);
    ok(stream_table_append(&t, &late, 20) && e[2].fifo_next == &late &&
           f->tail == &late,
       "an append after that goes behind the new tail");
    ok(stream_table_pop(&t, f, 30) == &e[0] &&
           stream_table_pop(&t, f, 30) == &e[2] &&
           stream_table_pop(&t, f, 30) == &late && t.count == 0,
       "what is left pops in order, and the FIFO leaves");
    stream_table_destroy(&t);
}

static void test_grow(void)
{
    struct stream_table t;
    ok(stream_table_init(&t), "init");
    enum { N = 300 };
    static struct entry e[N];
    bool all = true;
    for (int i = 0; i < N; i++) {
        e[i] = entry(ENTRY_FREE_DEVICE, i % 3, (unsigned long long)i * 1000);
        all &= stream_table_append(&t, &e[i], 0);
    }
    ok(all && t.count == N, "300 streams, 300 FIFOs (count %zu)", t.count);
    bool found = true;
    for (int i = 0; i < N; i++) {
        struct entry again = entry(ENTRY_FREE_DEVICE, i % 3,
                                   (unsigned long long)i * 1000);
        stream_table_append(&t, &again, 0);
        struct stream_fifo *f = fifo_of(&t, i % 3, (unsigned long long)i * 1000,
                                        FIFO_MEMORY);
        found &= f != NULL && f->head == &e[i] && f->tail == &again;
        stream_table_pop(&t, f, 0);
        found &= f->head == &again;
        stream_table_pop(&t, f, 0);
    }
    ok(found && t.count == 0,
       "after growing, each stream's entries still find their FIFO");
    stream_table_destroy(&t);
}

static void test_schedule(void)
{
    struct stream_table t;
    ok(stream_table_init(&t), "init");
    struct entry e = entry(ENTRY_FREE_DEVICE, 0, 1);
    stream_table_append(&t, &e, 0);
    struct stream_fifo *f = t.fifos[0];
    ok(stream_table_due(f, 0), "a new head is due at once");
    uint64_t us = 1000;
    stream_table_backoff(f, 1 * us, 50, 1000, false);
    ok(!stream_table_due(f, 50 * us) && stream_table_due(f, 51 * us),
       "first wait: poll_us (50 us)");
    stream_table_backoff(f, 51 * us, 50, 1000, false);
    is_int(f->backoff_us, 100, "then it doubles");
    for (int i = 0; i < 10; i++)
        stream_table_backoff(f, 60 * us, 50, 1000, false);
    is_int(f->backoff_us, 1000, "up to poll_max_us");
    stream_table_backoff(f, 32000 * us, 50, 1000, false);
    is_int(f->backoff_us, 2000, "or 1/16 of the head's wait (32 ms: 2 ms)");
    stream_table_backoff(f, 32000 * us, 50, 1000, true);
    is_int(f->backoff_us, 1000, "but poll_max_us while someone waits");
    f->backoff_us = 5000;
    stream_table_poll_all_soon(&t, 1000);
    ok(f->due_ns == 0 && f->backoff_us == 1000,
       "a request makes every head due, its wait capped");
    stream_table_destroy(&t);
}

int main(void)
{
    plan_lazy();
    test_kinds_and_order();
    test_unlink_next();
    test_grow();
    test_schedule();
    return 0;
}
