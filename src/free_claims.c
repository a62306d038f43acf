/* A free's claims on the block cache's blocks (block_cache.h), on the
 * launching thread: room for them, claiming every block among a free's
 * pointers before anything is recorded, giving them back when the free is
 * refused, and the refusals of a pointer that is no live block's start. */
#include "free_claims.h"

#include <stdlib.h>

#include "report.h"
#include "stats.h"

/* A block of the cache freed a second time (or by two threads at once):
 * ptr was already being freed, or free. */
cudaError_t free_claims_refuse_freed(const struct request_args *a,
                                     const void *ptr)
{
    stats_add(&stats.rejected, 1);
    report("%s: %p is a block of defer_alloc's that is already free or being "
           "freed (freed twice?): refused; nothing was deferred", a->what,
           ptr);
    return cudaErrorInvalidValue;
}

/* A pointer that starts no block of the cache but lies in its memory
 * (block_cache.h, BLOCK_INSIDE): refused at the call, where its release
 * would only fail later.  Either inside a live block (an interior pointer)
 * or inside free memory: a block freed twice, its first free's work done
 * and the block merged with a free neighbour since. */
cudaError_t free_claims_refuse_inside(const struct request_args *a,
                                      const void *ptr)
{
    stats_add(&stats.rejected, 1);
    if (block_cache_inside_live(ptr))
        report("%s: %p points inside a live block of defer_alloc's, not at "
               "its start (an interior pointer): refused; nothing was "
               "deferred", a->what, ptr);
    else
        report("%s: %p points inside memory of defer_alloc's that is free or "
               "being freed, where no block starts (freed twice, after its "
               "first free's work was done and the block merged with a free "
               "neighbour?): refused; nothing was deferred", a->what, ptr);
    return cudaErrorInvalidValue;
}

/* Any free path, once the free is refused after its blocks were claimed:
 * the blocks a's free claimed are the caller's again. */
void free_claims_unclaim(const struct request_args *a)
{
    for (size_t i = 0; a->claims != NULL && i < a->nptrs; i++) {
        block_cache_unclaim(&a->claims[i]);
        a->claims[i] = (struct block_claim){NULL, 0};
    }
}

/* The free paths but the single stream-ordered one (whose plan claims its
 * block, block_cache_plan_free): claim every block of the cache among a's
 * pointers (FREEING) before anything is recorded, so that a block freed
 * twice, by any paths, is refused at the second free.  cudaSuccess (*claimed
 * says whether any pointer was a block), or cudaErrorInvalidValue (reported,
 * counted; nothing claimed) when one is already being freed or free, or
 * starts no block inside the cache's memory. */
cudaError_t free_claims_claim(const struct request_args *a, bool *claimed)
{
    *claimed = false;
    if (a->kind != ENTRY_FREE_DEVICE || a->claims == NULL)
        return cudaSuccess;
    for (size_t i = 0; i < a->nptrs; i++) {
        enum block_free_path path = block_cache_claim(a->ptrs[i],
                                                      &a->claims[i]);
        if (path == BLOCK_NOT_LIVE || path == BLOCK_INSIDE) {
            free_claims_unclaim(a);
            *claimed = false;
            return path == BLOCK_INSIDE
                       ? free_claims_refuse_inside(a, a->ptrs[i])
                       : free_claims_refuse_freed(a, a->ptrs[i]);
        }
        *claimed |= path != BLOCK_NOT_OURS;
    }
    return cudaSuccess;
}

/* The launching thread, in a defer call: *a is given with room for the
 * claims of its frees (block_cache.h): one (*one) for a single pointer,
 * an array for several; none when a is no free of device memory or the
 * block cache is not in use (no pointer can be a block).  False when out
 * of memory. */
bool free_claims_make(const struct request_args *given,
                      struct request_args *a, struct block_claim *one)
{
    *a = *given;
    a->claims = NULL;
    if (given->kind != ENTRY_FREE_DEVICE || !block_cache_active())
        return true;
    *one = (struct block_claim){NULL, 0};
    a->claims = given->nptrs == 1 ? one
                                  : calloc(given->nptrs, sizeof *a->claims);
    return a->claims != NULL;
}

/* The claims room of free_claims_make, once the call is over (an entry
 * copied the claims it carries). */
void free_claims_free(struct request_args *a, struct block_claim *one)
{
    if (a->claims != one)
        free(a->claims);
    a->claims = NULL;
}
