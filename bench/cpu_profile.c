/* SPDX-License-Identifier: MIT */
/*
 * cpu_profile.c: a sampling CPU profiler loaded with LD_PRELOAD, for
 * machines without perf (the GPU machines have none).  bench/cpu_profile.py
 * builds it, runs a program under it and names the functions; see there.
 *
 * ITIMER_PROF sends SIGPROF every CPU_PROFILE_US microseconds of the
 * process's CPU time (all threads together), to a thread that is running, so
 * the samples fall where the CPU time goes.  The handler stores the thread's
 * program counter and backtrace (glibc's backtrace(), warmed up in the
 * constructor so that it allocates nothing in the handler) in a fixed array,
 * and whether the thread is the reclaimer (its name); the destructor writes
 * them to CPU_PROFILE_OUT as lines "R|O pc frame frame ...", then the
 * process's executable mappings.  A sample past the array is counted, not
 * stored.  Only the process it was preloaded into is profiled: its
 * programs started later get neither the preload nor the variables, and a
 * fork child writes nothing.  backtrace() is not async-signal-safe; it has
 * held in these programs (C, no unwinder lock taken by a throw).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <unistd.h>
#include <ucontext.h>

#define MAX_SAMPLES 200000
#define MAX_FRAMES  24

struct sample {
    uintptr_t pc;
    int nframes;
    char reclaimer;
    void *frames[MAX_FRAMES];
};

static struct sample *samples;
static atomic_long taken;
static pid_t profiled; /* the process preloaded, not a fork child */
static char out_path[4096];

/* SIGPROF, on whichever thread was running: one sample. */
static void on_prof(int sig, siginfo_t *info, void *uc)
{
    (void)sig, (void)info;
    int saved_errno = errno;
    long i = atomic_fetch_add_explicit(&taken, 1, memory_order_relaxed);
    if (i >= MAX_SAMPLES) {
        errno = saved_errno;
        return;
    }
    struct sample *s = &samples[i];
    s->pc = (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
    char name[16] = {0};
    prctl(PR_GET_NAME, name);
    s->reclaimer = strncmp(name, "cudefer-recl", 12) == 0;
    s->nframes = backtrace(s->frames, MAX_FRAMES);
    errno = saved_errno;
}

__attribute__((constructor)) static void start(void)
{
    const char *out = getenv("CPU_PROFILE_OUT");
    if (out == NULL || strlen(out) >= sizeof out_path)
        return;
    strcpy(out_path, out);
    long us = getenv("CPU_PROFILE_US") ? atol(getenv("CPU_PROFILE_US")) : 250;
    /* Not for the programs this one starts (still one thread here). */
    unsetenv("LD_PRELOAD");
    unsetenv("CPU_PROFILE_OUT");
    samples = calloc(MAX_SAMPLES, sizeof *samples);
    if (samples == NULL || us <= 0) {
        fprintf(stderr, "cpu_profile: no profile (%s)\n",
                samples == NULL ? "out of memory" : "CPU_PROFILE_US <= 0");
        return;
    }
    profiled = getpid();
    void *warm[4];
    backtrace(warm, 4); /* loads the unwinder now, not in the handler */
    struct sigaction sa = {.sa_sigaction = on_prof,
                           .sa_flags = SA_SIGINFO | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{us / 1000000, us % 1000000},
                           {us / 1000000, us % 1000000}};
    if (setitimer(ITIMER_PROF, &it, NULL) != 0)
        perror("cpu_profile: setitimer");
}

__attribute__((destructor)) static void finish(void)
{
    if (samples == NULL || profiled != getpid())
        return;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    sigset_t prof;
    sigemptyset(&prof);
    sigaddset(&prof, SIGPROF);
    pthread_sigmask(SIG_BLOCK, &prof, NULL);
    FILE *f = fopen(out_path, "w");
    if (f == NULL)
        return;
    long n = atomic_load(&taken);
    fprintf(f, "# samples %ld (stored %ld)\n", n,
            n < MAX_SAMPLES ? n : MAX_SAMPLES);
    for (long i = 0; i < n && i < MAX_SAMPLES; i++) {
        fprintf(f, "%c %lx", samples[i].reclaimer ? 'R' : 'O',
                (unsigned long)samples[i].pc);
        for (int k = 0; k < samples[i].nframes; k++)
            fprintf(f, " %lx", (unsigned long)(uintptr_t)samples[i].frames[k]);
        fputc('\n', f);
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (maps != NULL && fgets(line, sizeof line, maps) != NULL)
        fprintf(f, "map %s", line);
    if (maps != NULL)
        fclose(maps);
    fclose(f);
}
