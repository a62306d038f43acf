/*
 * Block pool: where the block cache gets new blocks.  One stream-ordered
 * memory pool of cudefer's own per device (cudaMemPoolCreate; its release
 * threshold is the maximum, so memory stays with the pool), created on the
 * first miss.  A pool makes memory fungible: free blocks of one size handed
 * back to it (cudaFreeAsync, no device drain) serve requests of any other
 * size, which the cache's size classes alone cannot do.  Where no pool can
 * be made, blocks come from cudaMalloc (reported once).
 */
#ifndef CUDEFER_BLOCK_POOL_H
#define CUDEFER_BLOCK_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <cuda_runtime_api.h>

/* Start-up (the lifecycle lock held): room for ndevices; false when out of
 * memory.  Shutdown: destroy the pools (memory still allocated from one is
 * released by CUDA once freed).  Fork child: forget them. */
bool block_pool_init(int ndevices);
void block_pool_destroy_all(void);
void block_pool_fork_child(void);

/* Any thread.  bytes of new memory on device for use on stream (stream's
 * device is device): from the pool, ordered on stream (*pooled true), or
 * from cudaMalloc.  Returns the CUDA error; an error that is not sticky
 * (out of memory, a bad argument) leaves the runtime's last error clear. */
cudaError_t block_pool_malloc(int device, size_t bytes, cudaStream_t stream,
                              void **ptr, bool *pooled);

/* Any thread, while the library is running.  Whether bytes exceed all of
 * device's memory, so that no allocation of them can succeed (the first
 * call asks cudaGetDeviceProperties, once per device); false when that is
 * not known.  Never blocks on the GPU. */
bool block_pool_beyond_device(int device, size_t bytes);

/* Any thread: whether device has a pool (it was used for blocks). */
bool block_pool_exists(int device);

/* Any thread.  Hands a block of bytes from device's pool back to it,
 * ordered on stream (cudaFreeAsync: its memory serves the next request on
 * stream at once, any stream once stream reached the free).  Returns
 * cudaFreeAsync's error (the block is then lost to the pool). */
cudaError_t block_pool_free(int device, void *ptr, size_t bytes,
                            cudaStream_t stream);
/* The same with cudaFree (which drains the device), for a caller that has
 * no stream to order the free on. */
cudaError_t block_pool_free_sync(int device, void *ptr, size_t bytes);

/* Any thread, while the library is running (the pools exist).  bytes taken
 * from device's pool are no block of the cache any more, though not handed
 * back through block_pool_free (a block that could not be filed, a record
 * dropped because its memory was freed behind cudefer's back): the pool
 * stops counting them as lent. */
void block_pool_forget(int device, size_t bytes);

/* Any thread.  The memory device's pool holds but no block uses: what it
 * has reserved from CUDA less the blocks taken from it and not handed
 * back.  A request of at most this many bytes is likely served without the
 * pool growing (fragmentation aside).  0 without a pool or when the pool
 * cannot say; never blocks on the GPU. */
size_t block_pool_slack(int device);

/* Reclaimer (device current), after pool blocks were handed back on
 * stream: releases the pool's unused memory to CUDA once that stream
 * reached the frees.  Returns the bytes by which the pool's reserve
 * shrank (0 without a pool). */
size_t block_pool_trim(int device, cudaStream_t stream);

#endif
