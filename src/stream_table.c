/* SPDX-License-Identifier: MIT */
/* Per-stream FIFOs of pending entries: a chained hash table for lookup and a
 * dense array for the reclaimer's pass over every pending stream. */
#include "stream_table.h"

#include <stdint.h>
#include <stdlib.h>

#define INITIAL_BUCKETS 64

/* The bucket of one of a stream's FIFOs (enum stream_fifo_kind). */
static size_t bucket_of(const struct stream_table *t, int device,
                        unsigned long long stream_id, unsigned kind)
{
    uint64_t h = (stream_id ^ ((uint64_t)(unsigned)device << 56) ^
                  ((uint64_t)kind << 54)) *
                 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (t->nbuckets - 1);
}

enum stream_fifo_kind stream_table_fifo_of(const struct entry *e)
{
    if (e->kind == ENTRY_CALL ||
        (e->kind == ENTRY_MEMBER && e->group != NULL &&
         e->group->kind == ENTRY_CALL))
        return FIFO_CALLBACKS;
    return e->kind == ENTRY_BLOCK ? FIFO_BLOCKS : FIFO_MEMORY;
}

bool stream_table_init(struct stream_table *t)
{
    *t = (struct stream_table){0};
    t->buckets = calloc(INITIAL_BUCKETS, sizeof *t->buckets);
    t->fifos = malloc(INITIAL_BUCKETS * sizeof *t->fifos);
    if (t->buckets == NULL || t->fifos == NULL) {
        stream_table_destroy(t);
        return false;
    }
    t->nbuckets = t->capacity = INITIAL_BUCKETS;
    return true;
}

void stream_table_destroy(struct stream_table *t)
{
    for (size_t i = 0; i < t->count; i++)
        free(t->fifos[i]);
    while (t->spare != NULL) {
        struct stream_fifo *next = t->spare->hash_next;
        free(t->spare);
        t->spare = next;
    }
    free(t->buckets);
    free(t->fifos);
    *t = (struct stream_table){0};
}

/* Double the buckets and the dense array when the table is full. */
static bool grow(struct stream_table *t)
{
    size_t n = t->capacity * 2;
    struct stream_fifo **fifos = realloc(t->fifos, n * sizeof *fifos);
    if (fifos == NULL)
        return false;
    t->fifos = fifos;
    struct stream_fifo **buckets = calloc(n, sizeof *buckets);
    if (buckets == NULL)
        return false;
    free(t->buckets);
    t->buckets = buckets;
    t->nbuckets = t->capacity = n;
    for (size_t i = 0; i < t->count; i++) {
        struct stream_fifo *f = t->fifos[i];
        size_t b = bucket_of(t, f->device, f->stream_id, f->kind);
        f->hash_next = t->buckets[b];
        t->buckets[b] = f;
    }
    return true;
}

static struct stream_fifo *find_or_add(struct stream_table *t, int device,
                                       unsigned long long stream_id,
                                       unsigned kind, uint64_t now_ns)
{
    size_t b = bucket_of(t, device, stream_id, kind);
    for (struct stream_fifo *f = t->buckets[b]; f != NULL; f = f->hash_next)
        if (f->stream_id == stream_id && f->device == device &&
            f->kind == kind)
            return f;
    if (t->count == t->capacity) {
        if (!grow(t))
            return NULL;
        b = bucket_of(t, device, stream_id, kind);
    }
    struct stream_fifo *f = t->spare;
    if (f != NULL)
        t->spare = f->hash_next;
    else if ((f = malloc(sizeof *f)) == NULL)
        return NULL;
    *f = (struct stream_fifo){.stream_id = stream_id, .device = device,
                              .kind = (unsigned char)kind,
                              .hash_next = t->buckets[b], .index = t->count,
                              .head_since_ns = now_ns};
    t->buckets[b] = f;
    t->fifos[t->count++] = f;
    return f;
}

bool stream_table_append(struct stream_table *t, struct entry *e,
                         uint64_t now_ns)
{
    struct stream_fifo *f = find_or_add(t, e->device, e->stream_id,
                                        stream_table_fifo_of(e), now_ns);
    if (f == NULL)
        return false;
    e->fifo_next = NULL;
    if (f->tail != NULL)
        f->tail->fifo_next = e;
    else
        f->head = e;
    f->tail = e;
    return true;
}

/* Unlink an empty FIFO from its bucket and the dense array; keep it spare. */
static void remove_fifo(struct stream_table *t, struct stream_fifo *f)
{
    struct stream_fifo **link =
        &t->buckets[bucket_of(t, f->device, f->stream_id, f->kind)];
    while (*link != f)
        link = &(*link)->hash_next;
    *link = f->hash_next;
    struct stream_fifo *last = t->fifos[--t->count];
    t->fifos[f->index] = last;
    last->index = f->index;
    f->hash_next = t->spare;
    t->spare = f;
}

struct entry *stream_table_pop(struct stream_table *t, struct stream_fifo *fifo,
                               uint64_t now_ns)
{
    struct entry *e = fifo->head;
    fifo->head = e->fifo_next;
    /* A new head: its wait starts now, and it is queried at once (the work
     * before it just completed; it may have too). */
    fifo->head_since_ns = now_ns;
    fifo->due_ns = 0;
    fifo->backoff_us = 0;
    if (fifo->head == NULL) {
        fifo->tail = NULL;
        remove_fifo(t, fifo);
    }
    e->fifo_next = NULL;
    return e;
}

struct entry *stream_table_unlink_next(struct stream_fifo *fifo,
                                       struct entry *prev)
{
    struct entry *e = prev->fifo_next;
    prev->fifo_next = e->fifo_next;
    if (fifo->tail == e)
        fifo->tail = prev;
    e->fifo_next = NULL;
    return e;
}

void stream_table_backoff(struct stream_fifo *fifo, uint64_t now_ns,
                          uint32_t min_us, uint32_t max_us, bool demand)
{
    uint64_t waited_us = now_ns > fifo->head_since_ns
                             ? (now_ns - fifo->head_since_ns) / 1000
                             : 0;
    uint64_t cap = !demand && waited_us / 16 > max_us ? waited_us / 16 : max_us;
    uint64_t wait = fifo->backoff_us == 0 ? min_us : 2 * (uint64_t)fifo->backoff_us;
    if (wait > cap)
        wait = cap;
    if (wait > UINT32_MAX)
        wait = UINT32_MAX;
    fifo->backoff_us = (uint32_t)wait;
    fifo->due_ns = now_ns + wait * 1000;
}

void stream_table_poll_all_soon(struct stream_table *t, uint32_t max_us)
{
    for (size_t i = 0; i < t->count; i++) {
        struct stream_fifo *f = t->fifos[i];
        f->due_ns = 0;
        if (f->backoff_us > max_us)
            f->backoff_us = max_us;
    }
}
