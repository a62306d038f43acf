/* Block records kept for reuse per device (see the header).  A kept record
 * links to the next through lru_next and holds the depth of the stack it
 * tops in size, so that neither pushing nor popping touches a line of the
 * device's but its lock line. */
#include "block_records.h"

#include <stdlib.h>
#include <string.h>

#include "block_cache.h"

/* b zeroed but for its device and its recorded array, which stay: b is
 * this device's for good, and so is the array. */
static void reset(struct cache_block *b)
{
    struct block_user *recorded = b->recorded;
    char *at = (char *)b;
    size_t dev = offsetof(struct cache_block, device);
    size_t after = dev + sizeof b->device;
    memset(at, 0, dev);
    memset(at + after, 0, sizeof *b - after);
    b->recorded = recorded;
}

struct cache_block *block_records_new(struct device_cache *c)
{
    struct cache_block *b = c->spare_records;
    if (b == NULL)
        return calloc(1, sizeof *b);
    c->spare_records = b->lru_next;
    reset(b);
    return b;
}

void block_records_retire(struct device_cache *c, struct cache_block *b)
{
    b->state = BLOCK_RETIRED;
    b->handout = 0;
    b->nrecorded = 0;
    size_t depth = block_records_kept(c);
    if (depth >= BLOCK_RECORDS_KEPT) {
        b->lru_next = atomic_load_explicit(&c->surplus_records,
                                           memory_order_relaxed);
        atomic_store_explicit(&c->surplus_records, b, memory_order_relaxed);
        return;
    }
    b->lru_next = c->spare_records;
    b->size = depth + 1;
    c->spare_records = b;
}

size_t block_records_kept(const struct device_cache *c)
{
    return c->spare_records != NULL ? c->spare_records->size : 0;
}

static size_t free_list(struct cache_block *b)
{
    size_t n = 0;
    for (struct cache_block *next; b != NULL; b = next, n++) {
        next = b->lru_next;
        free(b->recorded);
        free(b);
    }
    return n;
}

size_t block_records_collect(struct device_cache *c)
{
    if (atomic_load_explicit(&c->surplus_records, memory_order_relaxed) ==
        NULL)
        return 0;
    cache_lock(c);
    struct cache_block *list = atomic_exchange_explicit(
        &c->surplus_records, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&c->lock);
    return free_list(list);
}

void block_records_free_all(struct device_cache *c)
{
    free_list(c->spare_records);
    c->spare_records = NULL;
    free_list(atomic_exchange_explicit(&c->surplus_records, NULL,
                                       memory_order_relaxed));
}
