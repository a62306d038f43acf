/* SPDX-License-Identifier: MIT */
/* A block's users (cache.h says which file holds what): the streams that
 * defer_record_stream recorded on a live block, which its free waits for,
 * and how a user's special handle (the legacy or per-thread stream) names
 * its device.  The list is read and written under the block's device
 * lock; it lives as long as the block's struct (cache_forget frees it). */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache_block.h"
#include "cuda.h"
#include "report.h"
#include "request_args.h"
#include "stream_identity.h"

/* ---- a block's users ---------------------------------------------------- */

cudaError_t cache_users_add(void *ptr, const struct block_user *user)
{
    struct device_cache *c;
    struct cache_block *b = cache_find_locked(ptr, &c);
    if (b == NULL) {
        /* A caller may carry on after this, as PyTorch's own allocator
         * does for memory it does not own: the message is then the
         * user's only sign. */
        report("defer_record_stream: %p is not the start of a block of "
               "cudefer's (memory from elsewhere, or a pointer inside a "
               "block): nothing recorded", ptr);
        return cudaErrorInvalidValue;
    }
    cudaError_t err = cudaSuccess;
    bool known = false;
    /* Ids told apart by device too: the legacy streams of two devices
     * may share one. */
    for (uint32_t i = 0; i < b->nusers && !known; i++)
        known = b->users[i].id == user->id &&
                b->users[i].device == user->device;
    if (b->state != BLOCK_LIVE) {
        err = cudaErrorInvalidValue;
    } else if (known) {
        /* once is enough */
    } else if (b->nusers == BLOCK_MAX_USERS) {
        /* Not cudaErrorInvalidValue, which says ptr is no block of
         * cudefer's: a caller may take that for memory it need not
         * protect, and this block is cudefer's. */
        err = cudaErrorNotSupported;
    } else {
        /* An array of the largest size at once: a block rarely has any. */
        if (b->users == NULL)
            b->users = malloc(BLOCK_MAX_USERS * sizeof *b->users);
        if (b->users == NULL)
            err = cudaErrorMemoryAllocation;
        else
            b->users[b->nusers++] = *user;
    }
    pthread_mutex_unlock(&c->lock);
    if (err != cudaSuccess)
        report("defer_record_stream: %p %s: nothing recorded", ptr,
               err == cudaErrorNotSupported
                   ? "is already recorded on 63 streams (the most)"
               : err == cudaErrorMemoryAllocation
                   ? "needs its list of streams: out of host memory"
                   : "is no live block of cudefer's (already freed?)");
    return err;
}

size_t cache_users_of_block(const void *ptr, struct block_user *out)
{
    struct device_cache *c;
    struct cache_block *b = cache_find_locked(ptr, &c);
    if (b == NULL)
        return 0;
    size_t n = b->state == BLOCK_LIVE || b->state == BLOCK_FREEING
                   ? b->nusers
                   : 0;
    if (out != NULL && n > 0)
        memcpy(out, b->users, n * sizeof *out);
    pthread_mutex_unlock(&c->lock);
    return n;
}

size_t cache_users_of_free(const struct request_args *a, struct block_user *out)
{
    if (a->kind != ENTRY_FREE_DEVICE || !cache_active())
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < a->nptrs; i++) {
        struct block_user mine[BLOCK_MAX_USERS];
        size_t k = cache_users_of_block(a->ptrs[i], mine);
        for (size_t j = 0; j < k; j++) {
            bool seen = false;
            for (size_t m = 0; out != NULL && m < n && m < 64 && !seen; m++)
                seen = out[m].handle == mine[j].handle &&
                       out[m].device == mine[j].device;
            if (!seen && out != NULL && n < 64)
                out[n] = mine[j];
            n += !seen;
        }
    }
    return n;
}

/* A block recorded on device 1's legacy stream and freed while device 0 is
 * current must wait for device 1's legacy stream: a user's special handle
 * is used with the device it named current. */
cudaError_t cache_users_enter(const struct block_user *u,
                              struct cuda_switch *sw, const char **call)
{
    if (!stream_is_special(u->handle) || u->device < 0)
        return cudaSuccess;
    return cuda_switch_device(sw, u->device, call);
}

/* The device a special handle of u names: its own, or the caller's. */
static bool user_device(const struct block_user *u, struct cuda_switch *sw,
                        int *device)
{
    if (u->device >= 0) {
        *device = u->device;
        return true;
    }
    return cuda_switch_caller_device(sw, device) == cudaSuccess;
}

bool cache_users_same(const struct block_user *u, const struct block_user *v,
                      struct cuda_switch *sw)
{
    if (u->handle != v->handle)
        return false;
    if (!stream_is_special(u->handle))
        return true;
    int du, dv;
    return user_device(u, sw, &du) && user_device(v, sw, &dv) && du == dv;
}
