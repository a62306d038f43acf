/* malloc_sites.so: an LD_PRELOAD interposer that counts malloc, calloc and
 * realloc by call site (return address, relative to its object), written at
 * exit to $MC_OUT.<pid>.  Used for bench/results/2026-11-27-fake-malloc-sites.txt:
 *   gcc -O2 -shared -fPIC -o malloc_sites.so malloc_sites.c -ldl
 * Counts of two runs that differ only in their steady-state cycles, taken
 * one from the other, leave what the steady state allocates; addr2line -f -i
 * names each site. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
enum { N = 4096 };
static _Atomic uintptr_t site[N];
static _Atomic unsigned long cnt[N];
static _Thread_local int inside;
static void note(void *ra, int kind)
{
    uintptr_t a = ((uintptr_t)ra << 2) | (uintptr_t)kind;
    size_t h = (a >> 2) * 0x9E3779B97F4A7C15ull >> 52;
    for (size_t i = 0; i < N; i++) {
        size_t j = (h + i) % N;
        uintptr_t cur = atomic_load(&site[j]);
        if (cur == 0) {
            uintptr_t z = 0;
            if (!atomic_compare_exchange_strong(&site[j], &z, a) && z != a)
                continue;
            cur = a;
        }
        if (cur == a) { atomic_fetch_add(&cnt[j], 1); return; }
    }
}
void *malloc(size_t n) { void *p = __libc_malloc(n); if (!inside) { inside = 1; note(__builtin_return_address(0), 0); inside = 0; } return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); if (!inside) { inside = 1; note(__builtin_return_address(0), 1); inside = 0; } return p; }
void *realloc(void *q, size_t n) { void *p = __libc_realloc(q, n); if (!inside) { inside = 1; note(__builtin_return_address(0), 2); inside = 0; } return p; }
__attribute__((destructor)) static void dump(void)
{
    inside = 1;
    const char *f = getenv("MC_OUT");
    char fn[512]; if (f) snprintf(fn, sizeof fn, "%s.%d", f, (int)getpid()); FILE *o = f ? fopen(fn, "w") : stderr;
    for (size_t j = 0; j < N; j++) {
        uintptr_t a = site[j];
        if (!a) continue;
        void *ra = (void *)(a >> 2);
        Dl_info d; uintptr_t off = (uintptr_t)ra;
        const char *obj = "?";
        if (dladdr(ra, &d)) { off -= (uintptr_t)d.dli_fbase; obj = d.dli_fname; }
        fprintf(o, "%lu %c %s 0x%lx\n", cnt[j], "mcr"[a & 3], obj, (unsigned long)off);
    }
    if (f) fclose(o);
}
