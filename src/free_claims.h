/* A free's claims on the block cache's blocks, on the launching thread
 * (see free_claims.c).  Every function: a launching thread inside a defer
 * call (between lifecycle_enter and lifecycle_leave); none blocks on the
 * GPU. */
#ifndef CUDEFER_FREE_CLAIMS_H
#define CUDEFER_FREE_CLAIMS_H

#include <stdbool.h>

#include <cuda_runtime_api.h>

#include "request_args.h"

/* Refusals (reported, counted in rejected; cudaErrorInvalidValue): ptr is
 * a block already free or being freed; ptr lies inside the cache's memory
 * but starts no block (an interior pointer, or a block freed twice after
 * it merged). */
cudaError_t free_claims_refuse_freed(const struct request_args *a,
                                     const void *ptr);
cudaError_t free_claims_refuse_inside(const struct request_args *a,
                                      const void *ptr);

/* The blocks a's free claimed are the caller's again (a refused free). */
void free_claims_unclaim(const struct request_args *a);

/* Claim every block among a's pointers before anything is recorded:
 * cudaSuccess (*claimed: any pointer was a block), or a refusal above with
 * nothing claimed. */
cudaError_t free_claims_claim(const struct request_args *a, bool *claimed);

/* *a = *given with room for its claims (one: a single pointer's); false
 * when out of memory.  free_claims_free gives the room back. */
bool free_claims_make(const struct request_args *given,
                      struct request_args *a, struct block_claim *one);
void free_claims_free(struct request_args *a, struct block_claim *one);

#endif
