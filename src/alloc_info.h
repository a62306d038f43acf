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
 * zero bytes, not pool) when CUDA knows no allocation there (the driver
 * answers a size of 0: said nowhere, the release says what became of it),
 * the query failed (said) or is not available. */
bool alloc_info_query(const void *ptr, struct alloc_info *info);

/* What CUDA says a pointer is, for a message about it. */
enum alloc_kind {
    ALLOC_UNKNOWN, /* no allocation of CUDA's there: host memory it did not
                      allocate, a freed or made-up address */
    ALLOC_DEVICE,  /* device (or managed) memory */
    ALLOC_HOST,    /* host memory CUDA allocated or registered */
    ALLOC_UNSURE,  /* the query is not available or failed */
};

/* Any thread (a failed release only: it costs a driver call).  What ptr
 * is; for device and host memory, *start is where its allocation starts
 * (ptr itself unless it points inside one). */
enum alloc_kind alloc_info_kind(const void *ptr, const void **start);

#endif
