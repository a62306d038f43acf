/* SPDX-License-Identifier: MIT */
/* The block cache's address map (cache.h says which file holds what;
 * cache_block.h declares these): from the start address of every block to
 * the block, a hash of chained blocks sharded by address, a mutex per
 * shard. */
#include "cache_block.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define SHARDS 64

/* One cache line each (a free's look-up reads one line of the map
 * besides its bucket and the block). */
struct shard {
    _Alignas(64) pthread_mutex_t lock;
    struct cache_block **buckets;
    size_t nbuckets, count;
};

static struct shard shards[SHARDS] = {
#define S {.lock = PTHREAD_MUTEX_INITIALIZER}
    S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S,
    S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S,
    S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S, S,
#undef S
};

/* Blocks start at 512-byte boundaries at least: the low bits say nothing. */
static uint64_t hash_of(const void *ptr)
{
    uint64_t h = (uint64_t)(uintptr_t)ptr >> 9;
    h ^= h >> 29;
    h *= UINT64_C(0xbf58476d1ce4e5b9);
    return h ^ (h >> 32);
}

static struct shard *shard_of(uint64_t h)
{
    return &shards[h % SHARDS];
}

/* Shard lock held.  Doubles the buckets; false when out of memory. */
static bool grow(struct shard *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : 64;
    struct cache_block **b = calloc(n, sizeof *b);
    if (b == NULL)
        return false;
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (struct cache_block *x = s->buckets[i], *next; x != NULL; x = next) {
            next = x->map_next;
            size_t j = (hash_of(x->ptr) / SHARDS) % n;
            x->map_next = b[j];
            b[j] = x;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return true;
}

static struct cache_block **slot_of(struct shard *s, uint64_t h,
                                    const void *ptr)
{
    struct cache_block **link = &s->buckets[(h / SHARDS) % s->nbuckets];
    while (*link != NULL && (*link)->ptr != ptr)
        link = &(*link)->map_next;
    return link;
}

struct cache_block *cache_map_find(const void *ptr)
{
    int device;
    return cache_map_find_device(ptr, &device);
}

/* cache_map_find_device and cache_map_find_device_held: held, where not
 * NULL, runs with the shard's lock held, after the block was found. */
static inline struct cache_block *find_device(const void *ptr, int *device,
                                              void (*held)(void))
{
    uint64_t h = hash_of(ptr);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    struct cache_block *b = s->nbuckets ? *slot_of(s, h, ptr) : NULL;
    if (held != NULL)
        held();
    if (b != NULL)
        *device = b->device;
    pthread_mutex_unlock(&s->lock);
    return b;
}

struct cache_block *cache_map_find_device(const void *ptr, int *device)
{
    return find_device(ptr, device, NULL);
}

struct cache_block *cache_map_find_device_held(const void *ptr, int *device,
                                               void (*held)(void))
{
    return find_device(ptr, device, held);
}

struct cache_block *cache_map_find_held(const void *ptr)
{
    uint64_t h = hash_of(ptr);
    struct shard *s = shard_of(h);
    return s->nbuckets ? *slot_of(s, h, ptr) : NULL;
}

bool cache_map_insert(struct cache_block *b, struct cache_block **stale)
{
    uint64_t h = hash_of(b->ptr);
    struct shard *s = shard_of(h);
    *stale = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->count >= s->nbuckets && !grow(s) && s->nbuckets == 0) {
        pthread_mutex_unlock(&s->lock);
        return false;
    }
    struct cache_block **link = slot_of(s, h, b->ptr);
    if (*link != NULL && (*link)->device != b->device) {
        pthread_mutex_unlock(&s->lock);
        return false;
    }
    if (*link != NULL) {
        *stale = *link;
        b->map_next = (*link)->map_next;
        s->count--;
    } else {
        b->map_next = NULL;
    }
    *link = b;
    s->count++;
    pthread_mutex_unlock(&s->lock);
    return true;
}

void cache_map_remove(struct cache_block *b)
{
    uint64_t h = hash_of(b->ptr);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    struct cache_block **link = s->nbuckets ? slot_of(s, h, b->ptr) : NULL;
    if (link != NULL && *link == b) {
        *link = b->map_next;
        s->count--;
    }
    pthread_mutex_unlock(&s->lock);
}

void cache_map_clear(void (*dispose)(struct cache_block *b))
{
    for (int i = 0; i < SHARDS; i++) {
        /* Emptied under the shard's lock, disposed of after: a look-up
         * not admitted (cache_block.h) finds each block whole or none. */
        struct shard *s = &shards[i];
        pthread_mutex_lock(&s->lock);
        struct cache_block **buckets = s->buckets;
        size_t n = s->nbuckets;
        s->buckets = NULL;
        s->nbuckets = s->count = 0;
        pthread_mutex_unlock(&s->lock);
        for (size_t j = 0; j < n; j++)
            for (struct cache_block *x = buckets[j], *next; x; x = next) {
                next = x->map_next;
                dispose(x);
            }
        free(buckets);
    }
}

void cache_map_reset(void)
{
    for (int i = 0; i < SHARDS; i++) {
        pthread_mutex_init(&shards[i].lock, NULL);
        free(shards[i].buckets);
        shards[i].buckets = NULL;
        shards[i].nbuckets = shards[i].count = 0;
    }
}
