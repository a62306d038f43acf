/* SPDX-License-Identifier: MIT */
/* The static libcudefer.a keeps its internal names to itself: this program
 * defines its own stats, report and queue_init (names cudefer uses inside)
 * and is linked against the static archive and the real CUDA runtime (no
 * fake).  Before the archive's internal symbols were made local, the link
 * failed with "multiple definition of `stats'".  It runs on any machine:
 * without a GPU, the call that needs one gets CUDA's error. */
#include <stdio.h>
#include <string.h>

#include "cudefer.h"
#include "tap.h"

/* The application's own objects, named as cudefer's internal ones. */
int stats = 42;
int report_calls;

/* The application's report, not cudefer's: never called by the library. */
int report(const char *what);
int report(const char *what)
{
    (void)what;
    return ++report_calls;
}

/* The application's queue_init, of another type than cudefer's. */
long queue_init(long x);
long queue_init(long x)
{
    return x + 1;
}

int main(void)
{
    plan_lazy();
    is_str(defer_version(), PACKAGE_VERSION, "defer_version of the archive");
    struct defer_stats s;
    memset(&s, 0xff, sizeof s);
    defer_stats_get(&s);
    is_int((long long)s.deferred, 0, "the library's own counters");
    is_int(stats, 42, "the program's stats is its own");
    is_int(queue_init(1), 2, "the program's queue_init is its own");

    /* cudefer reports a NULL configuration with its report, not ours. */
    is_int(defer_configure(NULL), cudaErrorInvalidValue,
           "defer_configure(NULL) refused");
    is_int(report_calls, 0, "the library's report is its own");

    /* Touches CUDA: the real runtime answers, with or without a device. */
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0) {
        diag("no CUDA device (%s)", cudaGetErrorName(err));
        void *p = NULL;
        err = defer_alloc(&p, 256, 0);
        ok(err != cudaSuccess && p == NULL,
           "no device: defer_alloc returns an error (%s)",
           cudaGetErrorName(err));
    } else {
        void *p = NULL;
        is_int(defer_alloc(&p, 256, 0), cudaSuccess, "defer_alloc on a GPU");
        is_int(defer_free(p, 0), cudaSuccess, "and defer_free");
    }
    defer_shutdown();
    is_int(report_calls, 0, "still never called by the library");
    return 0;
}
