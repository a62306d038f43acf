/* SPDX-License-Identifier: MIT */
/* Size classes and the fit rule.  The pure functions of the private
 * src/cache_block.h (which this test includes for them alone: no state):
 * every class, the bin a block is filed in and the blocks a request may
 * take.  Then the size of a new block (cache_round) at every rounding
 * CUDEFER_ROUND_DIVISIONS allows the ends of: 16 (the default), 32, 1 and
 * 256 sizes per power of two, the cache started again for each. */
#include <stddef.h>
#include <stdio.h>

#include "cache.h"
#include "cache_block.h"
#include "helpers.h"

/* The sizes the pure tests try: every 512 bytes to 64 KiB (every class
 * there), then steps of about 1/7 (some classes of each power of two) to
 * past 2^41. */
static size_t next_size(size_t n)
{
    return n < 65536 ? n + 512 : n + n / 7 + 511;
}

/* A model of the classes below 2^40: class 0 is 512 bytes, class c > 0
 * the power of two 2^(9 + (c - 1) / 16) plus ((c - 1) % 16 + 1) sixteenths
 * of it. */
static size_t class_bytes(int c)
{
    if (c == 0)
        return 512;
    size_t base = (size_t)1 << (MIN_SHIFT + (c - 1) / STEPS);
    return base + (size_t)((c - 1) % STEPS + 1) * (base / STEPS);
}

/* Each size's class is the smallest at least as large (the model's);
 * above 2^40, the overflow class, the size rounded to 512. */
static void test_classes(void)
{
    int smallest = 1;
    for (size_t n = 1; n <= ((size_t)1 << 40); n = next_size(n)) {
        size_t bytes;
        int c = block_class_of(n, &bytes);
        smallest &= c < OVERFLOW_BIN && bytes == class_bytes(c) &&
                    bytes >= n && (c == 0 || class_bytes(c - 1) < n);
    }
    size_t bytes;
    ok(block_class_of(1, &bytes) == 0 && bytes == 512 &&
           block_class_of(512, &bytes) == 0 && bytes == 512,
       "class 0: up to 512 bytes");
    ok(block_class_of(513, &bytes) == 1 && bytes == 544 &&
           block_class_of(1024, &bytes) == STEPS && bytes == 1024,
       "16 classes a power of two from 512");
    ok(smallest, "a size's class is the smallest at least as large, to 2^40");
    ok(block_class_of(((size_t)1 << 40) + 1, &bytes) == OVERFLOW_BIN &&
           bytes == ((size_t)1 << 40) + 512,
       "above 2^40: the overflow class, to 512 bytes");
}

/* A block is filed in the largest class not above its size, so that every
 * block in a bin above a request's class is large enough. */
static void test_bins(void)
{
    int largest = 1;
    for (size_t n = 512; n < ((size_t)1 << 40); n = next_size(n)) {
        int bin = block_bin_of(n);
        largest &= class_bytes(bin) <= n && n < class_bytes(bin + 1);
    }
    ok(block_bin_of(512) == 0 && block_bin_of(543) == 0 &&
           block_bin_of(544) == 1 && block_bin_of(1023) == STEPS - 1,
       "the bins of a few sizes");
    ok(largest, "a block's bin is the largest class not above its size");
    ok(block_bin_of(((size_t)1 << 40) + 512) == OVERFLOW_BIN,
       "above 2^40: the overflow bin");
}

/* The fit rule: a request takes a block of at least its size and at most
 * 1/8 above a new block's size for it, searched in the bins [lo, hi]:
 * every block it may take lies in them. */
static void test_fit_rule(void)
{
    int covered = 1, bounded = 1;
    for (int shift = 0; shift <= 8; shift += 4)
        for (size_t n = 1; n < ((size_t)1 << 41); n = next_size(n)) {
            struct block_fit f = block_fit_of(n, shift);
            size_t fresh = block_round_up(f.min, shift);
            bounded &= f.min == (n < 512 ? 512 : n) &&
                       f.max == fresh + fresh / 8 && f.lo <= f.hi;
            for (size_t s = f.min; s <= f.max;
                 s += (f.max - f.min) / 16 + 1) {
                int bin = block_bin_of(s);
                covered &= bin >= f.lo && bin <= f.hi;
            }
            covered &= block_bin_of(f.max) <= f.hi &&
                       block_bin_of(f.min) >= f.lo;
        }
    ok(bounded, "from the request's size to 1/8 above a new block's");
    ok(covered, "every size a request may take is in its bins");
    struct block_fit f = block_fit_of(BLOCK_MAX_REQUEST, STEPS_SHIFT);
    ok(f.max > f.min && f.min == BLOCK_MAX_REQUEST,
       "the largest request's bounds do not wrap");
    f = block_fit_of(3700, STEPS_SHIFT);
    ok(f.min == 3700 && f.max == 3712 + 464,
       "3700 bytes: blocks of 3700 to 4176 (a new one would get 3712)");
}

/* New blocks at the rounding divs sizes per power of two the cache was
 * started with: the cases given (bytes, rounded; bytes 0 ends them); any
 * request wastes under 1/divs from 512 x divs bytes on, below that under
 * 1/16 (finer stops at 512-byte steps); above 2^40, to 512 bytes. */
static void test_rounding(unsigned divs, const size_t (*cases)[2])
{
    int good = 1, within = 1;
    for (; cases[0][0] != 0; cases++) {
        size_t r = cache_round(cases[0][0]);
        if (r != cases[0][1]) {
            diag("round(%zu) = %zu; want %zu", cases[0][0], r, cases[0][1]);
            good = 0;
        }
    }
    for (size_t n = 513; n < ((size_t)1 << 41); n = n * 3 / 2 + 7) {
        size_t r = cache_round(n), waste = r - n;
        within &= r >= n && waste * (divs < 16 ? divs : 16) < n &&
                  (n <= (size_t)512 * divs || waste * divs < n);
    }
    char below[48] = "";
    if (divs > 16)
        snprintf(below, sizeof below, " (1/16 below %u bytes)", 512 * divs);
    ok(good && within, "rounding: %u sizes per power of two from 512 bytes, "
       "a request wastes under 1/%u%s; above 2^40 to 512 bytes", divs, divs,
       below);
}

#define MIB ((size_t)1 << 20)
#define TIB ((size_t)1 << 40)
static const size_t round16[][2] = {
    {1, 512}, {512, 512}, {513, 544}, {1000, 1024}, {1025, 1088},
    {MIB, MIB}, {MIB + 1, MIB + 65536}, {TIB - 1, TIB}, {TIB + 1, TIB + 512},
    {0, 0}};
static const size_t round32[][2] = {
    {1, 512}, {513, 544}, {1000, 1024}, {1025, 1088}, {16385, 16896},
    {MIB, MIB}, {MIB + 1, MIB + 32768}, {TIB - 1, TIB}, {TIB + 1, TIB + 512},
    {0, 0}};
static const size_t round1[][2] = {
    {1, 512}, {513, 1024}, {1025, 2048}, {MIB + 1, 2 * MIB},
    {TIB, TIB}, {TIB + 1, TIB + 512}, {0, 0}};
static const size_t round256[][2] = {
    {513, 544}, {1000, 1024}, {65537, 66048}, {MIB + 1, MIB + 4096},
    {TIB + 1, TIB + 512}, {0, 0}};

int main(void)
{
    static const struct {
        unsigned divs;
        const size_t (*cases)[2];
    } runs[] = {{16, round16}, {32, round32}, {1, round1}, {256, round256}};
    plan_lazy();
    test_classes();
    test_bins();
    test_fit_rule();
    fake_reset(1);
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (!cache_init(1, MIB, runs[i].divs))
            bail("cache_init at %u", runs[i].divs);
        test_rounding(runs[i].divs, runs[i].cases);
        cache_destroy();
    }
    return 0;
}
