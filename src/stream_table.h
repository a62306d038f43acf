/*
 * Stream table: one FIFO of pending entries per (device, stream), owned by
 * the reclaimer thread alone (no locks).  Events recorded on one stream
 * complete in order, so only the oldest entry of each FIFO needs polling.
 * A FIFO exists only while it holds entries.
 */
#ifndef CUDEFER_STREAM_TABLE_H
#define CUDEFER_STREAM_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include "entry.h"

struct stream_fifo {
    unsigned long long stream_id;
    int device;
    struct entry *head, *tail;
    struct stream_fifo *hash_next;
    size_t index; /* position in stream_table.fifos */
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

/* Reclaimer only.  Appends e to the FIFO of (e->device, e->stream_id),
 * creating it if needed.  Returns false when out of memory (e not added). */
bool stream_table_append(struct stream_table *t, struct entry *e);

/* Reclaimer only.  Removes and returns the head of fifo; when that empties
 * it, the FIFO leaves the table (the caller's fifo pointer goes stale and the
 * last FIFO moves into its index). */
struct entry *stream_table_pop(struct stream_table *t, struct stream_fifo *fifo);

#endif
