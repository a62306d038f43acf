/*
 * Allocation facts the release policy needs: how many bytes an entry holds
 * and whether it came from a stream-ordered memory pool.  Asked of the
 * driver (cuPointerGetAttributes, found through the runtime so cudefer needs
 * no link to libcuda: driver_calls.h), on the reclaimer thread only: it
 * stays off the launching thread's path.
 */
#ifndef CUDEFER_ALLOC_INFO_H
#define CUDEFER_ALLOC_INFO_H

#include <stdbool.h>
#include <stddef.h>

struct alloc_info {
    size_t bytes; /* size of the allocation containing ptr; 0 if unknown */
    bool pool;    /* from cudaMallocAsync / cudaMallocFromPoolAsync */
};

/* Reclaimer only.  Facts about the allocation that contains ptr; false (and
 * zero bytes, not pool) when the driver does not know ptr or the query is
 * not available. */
bool alloc_info_query(const void *ptr, struct alloc_info *info);

#endif
