/* SPDX-License-Identifier: MIT */
/* Stream identity, with a small cache per thread (see the header). */
#include "stream_identity.h"

#include <stdint.h>

#include "cuda.h"
#include "thread_shard.h"

/* A 4-way set-associative cache of 16 sets: a thread that round-robins 16
 * streams (W6) or alternates a few streams and stream 0 (PyTorch) finds
 * them all, at a few compares a look-up. */
#define SETS 16
#define WAYS 4
#define NO_DEVICE (-1) /* the key of a created stream: any current device */

struct slot {
    cudaStream_t handle;
    int key_device; /* special handles: the current device; else NO_DEVICE */
    int device;
    unsigned long long id;
    bool valid;
};

static _Thread_local struct {
    _Alignas(64) struct slot set[SETS][WAYS]; /* a set: two cache lines */
    unsigned char next[SETS]; /* the way replaced next (round robin) */
} cache;

/* The set of (handle, key_device): the top bits of a multiplicative hash
 * (handles are aligned pointers or small constants). */
static unsigned set_of(cudaStream_t handle, int key_device)
{
    uint64_t h = ((uint64_t)(uintptr_t)handle ^
                  ((uint64_t)(unsigned)key_device << 40)) *
                 UINT64_C(0x9e3779b97f4a7c15);
    return (unsigned)(h >> 60) & (SETS - 1);
}

static struct slot *find(cudaStream_t handle, int key_device)
{
    struct slot *set = cache.set[set_of(handle, key_device)];
    for (int w = 0; w < WAYS; w++)
        if (set[w].valid && set[w].handle == handle &&
            set[w].key_device == key_device)
            return &set[w];
    return NULL;
}

/* The special handle found last (thread_shard.h: struct thread_here): a
 * copy of a slot that is in the cache with those values, so that a hit on
 * it answers as find would.  Set where stream_identity_cached_special
 * finds a slot; dropped where that slot is overwritten or forgotten. */
static struct thread_special *last_special(void)
{
    return &thread_here.special;
}

static void store(cudaStream_t handle, int key_device, int device,
                  unsigned long long id)
{
    unsigned s = set_of(handle, key_device);
    struct slot *slot = find(handle, key_device);
    if (slot == NULL) {
        slot = &cache.set[s][cache.next[s]];
        cache.next[s] = (unsigned char)((cache.next[s] + 1) % WAYS);
    }
    struct thread_special *last = last_special();
    if (last->key_device == slot->key_device &&
        last->handle == (void *)slot->handle)
        last->key_device = -1;
    *slot = (struct slot){.handle = handle, .key_device = key_device,
                          .device = device, .id = id, .valid = true};
}

cudaError_t stream_identity_lookup(cudaStream_t stream, bool exact,
                                   int *device, unsigned long long *id,
                                   bool *cached, const char **failed)
{
    return stream_identity_lookup_on(stream, exact, -1, device, id, cached,
                                     failed);
}

cudaError_t stream_identity_lookup_on(cudaStream_t stream, bool exact,
                                      int current, int *device,
                                      unsigned long long *id, bool *cached,
                                      const char **failed)
{
    *cached = false;
    int key_device = NO_DEVICE;
    cudaError_t err;
    if (stream_is_special(stream) && current >= 0) {
        key_device = current;
    } else if (stream_is_special(stream) &&
               (err = cuda_get_device(&key_device)) != cudaSuccess) {
        *failed = "cudaGetDevice";
        return err;
    }
    struct slot *slot = find(stream, key_device);
    bool have_id = false;
    /* A special handle cannot name another stream later: only a created
     * stream's handle can come back for a new stream. */
    if (slot != NULL && exact && key_device == NO_DEVICE) {
        if ((err = cuda_stream_get_id(stream, id)) != cudaSuccess) {
            *failed = "cudaStreamGetId";
            return err;
        }
        have_id = true;
        if (*id != slot->id)
            slot = NULL; /* stale: the handle names another stream now */
    }
    if (slot != NULL) {
        *device = slot->device;
        *id = slot->id;
        *cached = true;
        return cudaSuccess;
    }
    if ((err = cuda_stream_get_device(stream, device)) != cudaSuccess) {
        *failed = "cudaStreamGetDevice";
        return err;
    }
    if (!have_id && (err = cuda_stream_get_id(stream, id)) != cudaSuccess) {
        *failed = "cudaStreamGetId";
        return err;
    }
    store(stream, key_device, *device, *id);
    return cudaSuccess;
}

bool stream_identity_cached_special(cudaStream_t stream, int current,
                                    int *device, unsigned long long *id)
{
    struct thread_special *last = last_special();
    /* current >= 0 (the callers know it): never the key of none. */
    if (current < 0 || last->key_device != current ||
        last->handle != (void *)stream) {
        struct slot *slot = find(stream, current);
        if (slot == NULL)
            return false;
        *last = (struct thread_special){.handle = stream,
                                        .key_device = current,
                                        .device = slot->device,
                                        .id = slot->id};
    }
    *device = last->device;
    *id = last->id;
    return true;
}

void stream_identity_forget(cudaStream_t stream)
{
    if (last_special()->handle == (void *)stream)
        last_special()->key_device = -1;
    for (int s = 0; s < SETS; s++)
        for (int w = 0; w < WAYS; w++)
            if (cache.set[s][w].handle == stream)
                cache.set[s][w].valid = false;
}
