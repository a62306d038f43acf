/* SPDX-License-Identifier: MIT */
/*
 * Entry slabs: where pooled entries (entry.h, event_pool.h) live.  A thread
 * that needs an entry while its cache and its device's pool have none maps
 * a slab of entries at once (one mmap, its pages populated), takes one and
 * gives the rest to its cache (event_pool.c).  A slab is unmapped when the
 * last of its entries is freed (a pool already full, a failed device,
 * shutdown).
 *
 * Why: entries were calloc'ed one at a time, and glibc grows a thread's
 * arena a page at a time (an mprotect, which takes the process's memory map
 * lock for writing while the other threads fault their pages in).  In W6 on
 * an H100 (64 threads, 10^6 pending callbacks) 30% of the launching
 * threads' CPU samples were in that mprotect, and in W5 one defer_free in
 * 18 took a page fault of a fresh entry.
 *
 * Limit: a slab stays mapped while any of its entries is allocated, so
 * after a burst the idle entries the pools keep (CUDEFER_EVENT_POOL a
 * device, and up to 64 in each thread's cache) may each keep a slab
 * (ENTRY_SLAB_ENTRIES entries, about 54 KiB) mapped (t/entry_slab).
 */
#ifndef CUDEFER_ENTRY_SLAB_H
#define CUDEFER_ENTRY_SLAB_H

#include <stddef.h>

struct entry;

/* Entries a slab holds (to measure another: CPPFLAGS=-DENTRY_SLAB_ENTRIES=N). */
#ifndef ENTRY_SLAB_ENTRIES
#define ENTRY_SLAB_ENTRIES 256
#endif

/* Fewer entries than this are allocated one at a time (calloc, their slab
 * NULL): with a small CUDEFER_EVENT_POOL (0 keeps none idle) a slab would
 * be mapped and unmapped for every few entries, an mmap and an munmap
 * (about 9 us, and the memory map lock taken for writing) where calloc and
 * free take tens of nanoseconds. */
#define ENTRY_SLAB_MIN 16

/* Any thread; blocks in mmap.  Maps a slab of at most max entries (at least
 * one): returns its first entry, the others following it in memory
 * (e[0..*n)), all zeroed but for their slab; NULL (errno set) when the
 * system refused the memory.  Below ENTRY_SLAB_MIN, one entry, calloc'ed. */
struct entry *entry_slab_make(size_t max, size_t *n);

/* Any thread; blocks only to unmap.  Frees e, an entry of
 * entry_slab_make: its slab is unmapped once every one of its entries has
 * been freed (a calloc'ed one is freed). */
void entry_slab_free(struct entry *e);

/* Any thread, never blocks: slabs mapped now (tests, fork). */
size_t entry_slab_count(void);

#endif
