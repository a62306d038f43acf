/* SPDX-License-Identifier: MIT */
/*
 * Stream table: FIFOs of pending entries, owned by the reclaimer thread
 * alone (no locks).  Events recorded on one stream complete in order, so
 * only the oldest entry of each FIFO needs polling.  A FIFO exists only
 * while it holds entries.
 *
 * A stream has three FIFOs: its callbacks (defer_call, and the parts of a
 * defer_call_streams on it), its blocks of the cache (ENTRY_BLOCK) and its
 * other memory.  Callbacks of a stream run in the order deferred
 * (include/cudefer.h), so they wait for each other; memory entries have no
 * order to keep, and other memory must not wait for callbacks or blocks:
 * those may share an event (stream_lane.h) and then complete only once the
 * newest record of that event does, later than their own work, while
 * defer_trim releases every other free whose own work is done (t/stress
 * found a block sharing a pending event at the head of a stream's one
 * memory FIFO holding back plain frees whose work was done).
 *
 * Each FIFO also keeps its poll schedule: a head that
 * stays incomplete is queried less and less often, so entries waiting
 * behind long work cost a few queries each, not one per reclaimer pass.
 */
#ifndef CUDEFER_STREAM_TABLE_H
#define CUDEFER_STREAM_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "entry.h"

enum stream_fifo_kind { FIFO_MEMORY, FIFO_CALLBACKS, FIFO_BLOCKS };

struct stream_fifo {
    unsigned long long stream_id;
    int device;
    unsigned char kind; /* enum stream_fifo_kind: whose FIFO of the stream */
    struct entry *head, *tail;
    struct stream_fifo *hash_next;
    size_t index; /* position in stream_table.fifos */
    /* The poll schedule of the head (monotonic ns; see stream_table_due,
     * stream_table_backoff). */
    uint64_t head_since_ns; /* when the head became the head */
    uint64_t due_ns;        /* not queried before this (0: at once) */
    uint32_t backoff_us;    /* the last wait after an incomplete query */
};

struct stream_table {
    struct stream_fifo **buckets;
    size_t nbuckets;
    struct stream_fifo **fifos; /* the non-empty FIFOs, densely packed */
    size_t count, capacity;
    struct stream_fifo *spare; /* emptied FIFOs kept for reuse */
};

/* Reclaimer only.  Returns false when out of memory. */
bool stream_table_init(struct stream_table *t);
void stream_table_destroy(struct stream_table *t);

/* Reclaimer only.  Which of its stream's FIFOs e waits in: the callbacks'
 * (a callback, or a part of a defer_call_streams), the blocks' (a block of
 * the cache freed on its stream, or a free batch), or the memory's. */
enum stream_fifo_kind stream_table_fifo_of(const struct entry *e);

/* Reclaimer only.  Appends e to its FIFO of (e->device, e->stream_id) (see
 * stream_table_fifo_of), creating it if needed (its head then is e,
 * due at once, since now_ns).
 * Returns false when out of memory (e not added). */
bool stream_table_append(struct stream_table *t, struct entry *e,
                         uint64_t now_ns);

/* Reclaimer only.  Removes and returns the head of fifo; the next entry
 * becomes the head, due at once, since now_ns.  When that empties it, the
 * FIFO leaves the table (the last FIFO moves into its index) and is kept
 * spare: the caller's fifo pointer still reads as before (its device,
 * stream and kind) until the next stream_table_append or
 * stream_table_destroy (reclaimer_poll_streams reads its device after). */
struct entry *stream_table_pop(struct stream_table *t, struct stream_fifo *fifo,
                               uint64_t now_ns);

/* Reclaimer only.  Removes and returns the entry after prev in fifo (prev
 * any entry of it but its tail): an entry that completed out of turn
 * (see trim_behind_head in reclaimer.c).  The head, its poll schedule and
 * the FIFO's place in the table stay. */
struct entry *stream_table_unlink_next(struct stream_fifo *fifo,
                                       struct entry *prev);

/* Reclaimer only.  Whether fifo's head should be queried at now_ns. */
static inline bool stream_table_due(const struct stream_fifo *fifo,
                                    uint64_t now_ns)
{
    return now_ns >= fifo->due_ns;
}

/* Reclaimer only.  fifo's head was queried at now_ns and is incomplete:
 * wait longer before the next query.  The wait doubles from min_us up to
 * the larger of max_us and 1/16 of how long the head has waited (only
 * max_us while someone waits, demand: a flush or trim), so a stream held
 * back for T costs about 20 + 16 ln(T / 16 max_us) queries, and a head is
 * seen complete at most 1/16 of its wait late (max_us at first). */
void stream_table_backoff(struct stream_fifo *fifo, uint64_t now_ns,
                          uint32_t min_us, uint32_t max_us, bool demand);

/* Reclaimer only.  Every head is due at once, its wait capped at max_us (a
 * flush or trim waits: completions must be seen soon). */
void stream_table_poll_all_soon(struct stream_table *t, uint32_t max_us);

#endif
