/* SPDX-License-Identifier: MIT */
/* The block cache's segment index (src/cache_segments.c, Note [Segment
 * index]): sorted, disjoint ranges; a new segment drops the ranges it
 * overlaps (their memory was cudaFree'd behind cudefer's back and allocated
 * again); cache_segments_holds tells a pointer inside a segment from one
 * outside all.  White-box: the index alone, on a device cache of its own
 * (so this test includes the private src/cache_block.h; no block in the
 * map: holds finds no block), then against a model of the rule (a list,
 * every range checked), with random segments. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_block.h"
#include "helpers.h"

#define MiB ((uintptr_t)1 << 20)
#define AT(n) ((uintptr_t)0x7f0000000000 + (uintptr_t)(n) * MiB)

static bool holds(struct device_cache *c, uintptr_t p)
{
    struct cache_block *b;
    return cache_segments_holds(c, (const void *)p, &b);
}

static bool file(struct device_cache *c, uintptr_t start, uintptr_t size)
{
    return cache_segments_file(c, (const void *)start, size);
}

/* The index stays sorted and disjoint. */
static bool well_formed(const struct segment_index *x)
{
    for (size_t i = 0; i < x->count; i++)
        if (x->ranges[i].start >= x->ranges[i].end ||
            (i > 0 && x->ranges[i - 1].end > x->ranges[i].start))
            return false;
    return true;
}

static void test_rules(void)
{
    struct device_cache c = {0};
    ok(!holds(&c, AT(10)), "an empty index holds nothing");
    ok(file(&c, AT(10), MiB) && file(&c, AT(30), MiB) && file(&c, AT(20), MiB),
       "three segments, filed out of order");
    is_int(c.segments.count, 3, "three ranges");
    ok(holds(&c, AT(10)) && holds(&c, AT(20) + MiB / 2) &&
           holds(&c, AT(30) + MiB - 1),
       "their first, inner and last bytes are inside");
    ok(!holds(&c, AT(10) - 1) && !holds(&c, AT(11)) && !holds(&c, AT(25)) &&
           !holds(&c, AT(31)),
       "the bytes before, between and after are not (ends exclusive)");
    /* One segment over the second half of 20 and the first of 30. */
    ok(file(&c, AT(20) + MiB / 2, 10 * MiB), "a segment over two others");
    is_int(c.segments.count, 2, "drops both: two ranges left");
    ok(!holds(&c, AT(20)) && holds(&c, AT(20) + MiB / 2) &&
           holds(&c, AT(30) + MiB / 2 - 1) && !holds(&c, AT(30) + MiB / 2),
       "20's first half is no longer inside, the new segment is, to its end");
    ok(file(&c, AT(10) + MiB / 4, MiB / 4), "a segment inside 10");
    ok(!holds(&c, AT(10)) && holds(&c, AT(10) + MiB / 4) &&
           !holds(&c, AT(10) + MiB / 2),
       "drops 10: only the new quarter is inside");
    ok(file(&c, AT(10) + MiB / 4, MiB / 4), "the same segment again");
    is_int(c.segments.count, 2, "replaces itself");
    ok(file(&c, AT(5), MiB), "a segment below all");
    ok(file(&c, AT(40), MiB), "and one above all");
    is_int(c.segments.count, 4, "four");
    ok(well_formed(&c.segments), "sorted and disjoint");
    cache_segments_unfile(&c, (const void *)(AT(40) + 1));
    is_int(c.segments.count, 4, "unfiling an address where none starts: nothing");
    cache_segments_unfile(&c, (const void *)AT(5));
    ok(c.segments.count == 3 && !holds(&c, AT(5)), "unfiling 5 drops it");
    cache_segments_index_free(&c);
    ok(c.segments.count == 0 && c.segments.ranges == NULL, "freed");
}

/* The model: a list of ranges; a new one drops every range it overlaps. */
struct model {
    uintptr_t start[4096], end[4096]; /* 256 MiB in 64 KiB steps: at most 4096 disjoint ranges */
    size_t n;
};

static void model_file(struct model *m, uintptr_t start, uintptr_t end)
{
    size_t kept = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->end[i] <= start || m->start[i] >= end) {
            m->start[kept] = m->start[i];
            m->end[kept++] = m->end[i];
        }
    m->n = kept;
    m->start[m->n] = start;
    m->end[m->n++] = end;
}

static bool model_holds(const struct model *m, uintptr_t p)
{
    for (size_t i = 0; i < m->n; i++)
        if (p >= m->start[i] && p < m->end[i])
            return true;
    return false;
}

/* 20,000 random segments (starts on 64 KiB steps over 256 MiB, sizes of
 * 64 KiB to 8 MiB, a fifth unfiled again): after each, the index agrees
 * with the model on 16 random bytes and on the count. */
static void test_against_model(void)
{
    struct device_cache c = {0};
    struct model *m = calloc(1, sizeof *m);
    if (m == NULL)
        bail("out of memory");
    unsigned seed = 12345, disagreements = 0, malformed = 0;
    const uintptr_t step = 64 * 1024, steps = 256 * MiB / step;
    for (int k = 0; k < 20000; k++) {
        if (rand_r(&seed) % 5 == 0 && m->n > 0) {
            size_t i = (size_t)rand_r(&seed) % m->n;
            cache_segments_unfile(&c, (const void *)m->start[i]);
            m->start[i] = m->start[m->n - 1];
            m->end[i] = m->end[--m->n];
        } else {
            uintptr_t start = AT(0) + (uintptr_t)rand_r(&seed) % steps * step;
            uintptr_t size = (1 + (uintptr_t)rand_r(&seed) % 128) * step;
            if (!file(&c, start, size))
                bail("out of memory");
            model_file(m, start, start + size);
        }
        malformed += !well_formed(&c.segments);
        disagreements += c.segments.count != m->n;
        for (int j = 0; j < 16; j++) {
            uintptr_t p = AT(0) + (uintptr_t)rand_r(&seed) % (264 * MiB);
            disagreements += holds(&c, p) != model_holds(m, p);
        }
    }
    is_int(malformed, 0, "the index stayed sorted and disjoint");
    is_int(disagreements, 0, "it agreed with the model every time (%zu ranges "
                             "at the end)", m->n);
    cache_segments_index_free(&c);
    free(m);
}

int main(void)
{
    plan_lazy();
    test_rules();
    test_against_model();
    return 0;
}
