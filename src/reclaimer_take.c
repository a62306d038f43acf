/* SPDX-License-Identifier: MIT */
/* The reclaimer taking in a pushed entry (reclaimer_take_in): its place in
 * the flushes' order, the CUDEFER_CHECK of its pointers, what it holds
 * (its bytes, pool memory or not, its own device's or not, blocks of the
 * cache or not), then its stream's FIFO.  Reclaimer thread only. */
#include "reclaimer_state.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "cuda.h"
#include "entry.h"
#include "event_pool.h"
#include "pointer_set.h"
#include "release.h"
#include "report.h"
#include "stream_table.h"

/* Learn what a free entry holds: its bytes, whether it is pool memory (all
 * of it, or some: some_pool), whether it is all memory of its own device
 * (held_here: what the auto cap takes out of the device's use), and whether
 * every pointer is a block of the cache (given back, never held).  Pool
 * memory's bytes are never held bytes: cudaFreeAsync costs nothing, so it
 * is released once its work is done, in an entry with other memory too
 * (release_pool_part, reclaimer.c).  A pointer whose device is not known
 * counts as its entry's device's. */
static void size_up(struct entry *e)
{
    e->held_bytes = 0;
    e->pool = e->kind == ENTRY_FREE_DEVICE;
    e->some_pool = false;
    e->held_here = e->kind == ENTRY_FREE_DEVICE;
    e->cache_blocks = false;
    e->interior = false;
    if (e->kind != ENTRY_FREE_DEVICE && e->kind != ENTRY_FREE_HOST)
        return;
    size_t blocks = 0;
    for (size_t i = 0; i < e->nptrs; i++) {
        if (e->kind == ENTRY_FREE_DEVICE && entry_claimed(e, i)) {
            blocks++;
            continue;
        }
        struct cuda_allocation info;
        cuda_allocation_of(e->ptrs[i], e->kind == ENTRY_FREE_DEVICE, &info);
        e->pool &= info.pool;
        e->some_pool |= info.pool;
        e->held_here &= info.device < 0 || info.device == e->device;
        e->held_bytes += info.pool ? 0 : info.bytes;
        e->interior |= info.bytes > 0 && info.start != e->ptrs[i];
    }
    e->cache_blocks = blocks > 0 && blocks == e->nptrs;
    /* pool says what the pointers that are not blocks are: those go back
     * with cudaFreeAsync once the blocks went back to the cache
     * (give_back_blocks), never held.  An entry of blocks only frees
     * nothing, and needs no stream of the reclaimer's. */
    if (e->cache_blocks)
        e->pool = false;
    e->some_pool &= !e->pool;
}

/* CUDEFER_CHECK: drop (and report) the pointers of e that are already
 * pending; false when none is left.  A pointer whose free claimed a block
 * is not checked: a second free of a block is refused at the call, and its
 * address may be an interior pointer's still pending (a block cut there
 * since), which is no second free of it. */
static bool check_pointers(struct entry *e)
{
    size_t kept = 0;
    for (size_t i = 0; i < e->nptrs; i++) {
        if (entry_claimed(e, i) || pointer_set_add(&rs.deferred, e->ptrs[i])) {
            release_move_pointer(e, i, kept++);
            continue;
        }
        report("CUDEFER_CHECK: %p (device %d) was deferred again while its "
               "first release is still pending: the second request is "
               "dropped", e->ptrs[i], e->device);
    }
    e->nptrs = kept;
    return kept > 0 || e->kind == ENTRY_CALL;
}

/* Take in one pushed entry (not a request, not a waiting graph entry): it
 * gets its place in the flushes' order, then waits in its stream's FIFO, or
 * completes at once when it has no event.  CUDEFER_CHECK: its pointers
 * join the pending set first, also when its device failed already, for
 * finishing it takes them out again (reclaimer_finish_entry): one never
 * added would be taken out from under another device's pending free of
 * the same pointer. */
void reclaimer_take_in(struct entry *e)
{
    e->seq = rs.next_seq++;
    rs.tracked++;
    if (rs.cfg.check && e->nptrs > 0 && e->kind != ENTRY_BLOCK &&
        !check_pointers(e)) {
        reclaimer_event_done(e, cudaErrorInvalidValue, now_ns());
        return;
    }
    if (device_error(e->device) != cudaSuccess) {
        reclaimer_event_done(e, device_error(e->device), now_ns());
        return;
    }
    /* Sized under the eager policy too: pool memory is then still freed
     * with cudaFreeAsync, and a trim can say what it released. */
    if (reclaimer_use_device(e->device)) {
        if (rs.held[e->device].cap == 0)
            reclaimer_held_learn_cap(e->device, now_ns());
        size_up(e);
    }
    if (e->ev == NULL && !e->synced) { /* complete on arrival */
        reclaimer_event_done(e, cudaSuccess, now_ns());
        return;
    }
    if (e->ev != NULL && e->label > e->ev->taken)
        e->ev->taken = e->label; /* recorded before it was pushed */
    if (stream_table_append(&rs.streams, e, now_ns())) {
        rs.incomplete++;
        /* Its caller synchronized the stream and now waits: the entries
         * before it are complete, so look at once. */
        if (e->synced)
            stream_table_poll_all_soon(&rs.streams, rs.cfg.poll_max_us);
        return;
    }
    /* Out of memory for a FIFO: wait for this one entry here.  A wait that
     * fails is what a failed query is (reclaimer_poll.c): never completion,
     * so the device fails, said once. */
    report("reclaimer: out of memory; waiting for one entry's event "
           "synchronously");
    cudaError_t err = e->ev == NULL ? cudaSuccess /* synced */
                      : reclaimer_use_device(e->device)
                          ? cuda_event_synchronize(e->ev->event)
                          : device_error(e->device);
    if (err != cudaSuccess) {
        reclaimer_fail_device(e->device, "cudaEventSynchronize", err);
        err = device_error(e->device);
    }
    reclaimer_event_done(e, err, now_ns());
}
