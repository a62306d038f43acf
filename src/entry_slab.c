/* SPDX-License-Identifier: MIT */
/* Entries mapped a slab at a time: see entry_slab.h. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_POPULATE */
#include "entry_slab.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "entry.h"

struct entry_slab {
    _Atomic size_t live; /* entries not yet freed */
    size_t bytes;        /* mapped */
};

/* To measure the effect of populating: CPPFLAGS=-DENTRY_SLAB_POPULATE=0. */
#ifndef ENTRY_SLAB_POPULATE
#define ENTRY_SLAB_POPULATE MAP_POPULATE
#endif

static _Atomic size_t slabs_mapped;

/* The first entry sits at the first multiple of its alignment past the
 * header. */
static size_t entries_offset(void)
{
    size_t align = _Alignof(struct entry);
    return (sizeof(struct entry_slab) + align - 1) / align * align;
}

struct entry *entry_slab_make(size_t max, size_t *n)
{
    if (max < ENTRY_SLAB_MIN) {
        struct entry *e = calloc(1, sizeof *e); /* its slab NULL */
        *n = 1;
        return e;
    }
    size_t count = max < ENTRY_SLAB_ENTRIES ? max : ENTRY_SLAB_ENTRIES;
    size_t bytes = entries_offset() + count * sizeof(struct entry);
    /* Populated: one call faults every page in, where touching them one by
     * one would take the memory map lock once a page. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | ENTRY_SLAB_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    struct entry_slab *slab = p;
    slab->bytes = bytes;
    atomic_init(&slab->live, count);
    struct entry *e = (struct entry *)((char *)p + entries_offset());
    for (size_t i = 0; i < count; i++)
        e[i].slab = slab;
    atomic_fetch_add_explicit(&slabs_mapped, 1, memory_order_relaxed);
    *n = count;
    return e;
}

void entry_slab_free(struct entry *e)
{
    struct entry_slab *slab = e->slab;
    if (slab == NULL) {
        free(e);
        return;
    }
    /* acq_rel: the last one's unmapping comes after every other entry's
     * last use. */
    if (atomic_fetch_sub_explicit(&slab->live, 1, memory_order_acq_rel) != 1)
        return;
    atomic_fetch_sub_explicit(&slabs_mapped, 1, memory_order_relaxed);
    munmap(slab, slab->bytes);
}

size_t entry_slab_count(void)
{
    return atomic_load_explicit(&slabs_mapped, memory_order_relaxed);
}
