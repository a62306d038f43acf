/* Block records kept for reuse per device (see the header).  A kept record
 * links to the next through lru_next and holds the depth of the stack it
 * tops in size, so that neither pushing nor popping touches a line of the
 * device's but its lock line. */
#include "block_records.h"

#include <stdlib.h>
#include <string.h>

#include "block_cache.h"

struct cache_block *block_records_new(struct device_cache *c)
{
    struct cache_block *b = c->spare_records;
    if (b == NULL)
        return calloc(1, sizeof *b);
    c->spare_records = b->lru_next;
    memset(b, 0, sizeof *b);
    return b;
}

void block_records_retire(struct device_cache *c, struct cache_block *b)
{
    free(b->recorded);
    size_t depth = block_records_kept(c);
    if (depth >= BLOCK_RECORDS_KEPT) {
        free(b);
        return;
    }
    b->recorded = NULL;
    b->lru_next = c->spare_records;
    b->size = depth + 1;
    c->spare_records = b;
}

size_t block_records_kept(const struct device_cache *c)
{
    return c->spare_records != NULL ? c->spare_records->size : 0;
}

void block_records_free_all(struct device_cache *c)
{
    for (struct cache_block *b = c->spare_records, *next; b != NULL;
         b = next) {
        next = b->lru_next;
        free(b);
    }
    c->spare_records = NULL;
}
