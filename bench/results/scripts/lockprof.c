/* LD_PRELOAD: counts contended pthread_mutex_lock calls (trylock failed) by
 * caller address and thread; prints the top sites at exit (dladdr: object + offset). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define SLOTS 4096
static _Atomic(uintptr_t) site[SLOTS];
static _Atomic unsigned long hits[SLOTS], waitns[SLOTS];
static int (*real_lock)(pthread_mutex_t *);
static uint64_t now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
int pthread_mutex_lock(pthread_mutex_t *m)
{
    if (!real_lock) real_lock = dlsym(RTLD_NEXT, "pthread_mutex_lock");
    if (pthread_mutex_trylock(m) == 0) return 0;
    uintptr_t ra = (uintptr_t)__builtin_return_address(0);
    uint64_t t0 = now();
    int rc = real_lock(m);
    uint64_t d = now() - t0;
    unsigned h = (unsigned)((ra >> 2) * 2654435761u) % SLOTS;
    for (unsigned i = 0; i < SLOTS; i++, h = (h + 1) % SLOTS) {
        uintptr_t z = 0;
        if (atomic_load(&site[h]) == ra || atomic_compare_exchange_strong(&site[h], &z, ra) || site[h] == ra) {
            atomic_fetch_add(&hits[h], 1); atomic_fetch_add(&waitns[h], d); break;
        }
    }
    return rc;
}
__attribute__((destructor)) static void report(void)
{
    for (unsigned i = 0; i < SLOTS; i++) {
        if (!site[i] || hits[i] < 5) continue;
        Dl_info di; const char *obj = "?", *sym = "?"; uintptr_t off = 0;
        if (dladdr((void *)site[i], &di)) { obj = di.dli_fname; sym = di.dli_sname ? di.dli_sname : "?"; off = site[i] - (uintptr_t)di.dli_fbase; }
        fprintf(stderr, "lockprof: %lu contended, %.1f us waited, at %s+0x%lx (%s)\n", hits[i], waitns[i] / 1e3, obj, (unsigned long)off, sym);
    }
}
