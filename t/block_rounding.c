/* The size of a new block (cache_round) at every rounding
 * CUDEFER_ROUND_DIVISIONS allows the ends of: 16 (the default), 32, 1 and
 * 256 sizes per power of two, the cache started again for each. */
#include <stddef.h>
#include <stdio.h>

#include "cache.h"
#include "helpers.h"

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
    fake_reset(1);
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (!cache_init(1, MIB, runs[i].divs))
            bail("cache_init at %u", runs[i].divs);
        test_rounding(runs[i].divs, runs[i].cases);
        cache_destroy();
    }
    return 0;
}
