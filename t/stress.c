/* SPDX-License-Identifier: MIT */
/* A seeded stress test: many threads defer on many streams of several
 * devices (their own streams, created and destroyed as they go, their
 * per-thread streams, the legacy streams, short-lived threads' streams),
 * behind work of random durations, a random mix of defer_free (device and
 * pool memory, sometimes on a stream that only waits for the work through an
 * event), defer_free_host, defer_free_n, defer_call, defer_flush and
 * defer_trim, with quiet moments, under a release configuration drawn from
 * the seed; and defer_alloc's blocks (stress_alloc.c): allocated on every
 * kind of stream of every device, used on one or two streams, freed every
 * way (on other streams and devices too, beside other memory), kept live
 * across operations, freed behind held work, and wrong inputs.  The fake
 * runtime's oracle checks every release (never while work that uses the
 * memory is pending, never twice) and every hand-out of a block (never while
 * another stream's work may use it); this program checks that each flush
 * released everything its thread deferred before it, that each trim
 * released every entry whose work had completed, that every callback ran
 * exactly once, in stream order, never early, that each hand-out lies in a
 * live device allocation of the stream's device and overlaps no block owned
 * by someone else (blocks may be cut from larger ones), that each wrong
 * input got its expected result, and at the end that only the blocks the
 * test still owns are left and the counters agree.
 *
 *   t/stress [--entries N] [--seed S] [--threads T] [--devices D]
 *            [--streams K]
 *
 * (--double-free-every-path is still accepted, for the replay commands of
 * earlier runs: a block is now freed twice after every way of freeing it
 * by default, t/alloc_stress_found.c saying why.)
 *
 * make check runs it with the defaults (100 000 entries, a new seed each
 * run); make stress with 1 000 000.  The seed is printed first; it fixes
 * the configuration and each thread's sequence of operations (not how the
 * threads interleave), so a failure is replayed with the command it prints.
 * A hang (no progress for a minute) bails out with that command too.
 *
 * This file: the options, the configuration drawn from the seed, failures,
 * the watchdog and main; a thread's operations and their checks are in
 * stress_worker.c and stress_alloc.c (stress.h: what they share).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stress.h"

/* ---- options and the run's identity --------------------------------------- */

struct stress_options opt = {0, DEFAULT_ENTRIES, DEFAULT_THREADS,
                             DEFAULT_DEVICES, DEFAULT_STREAMS};

static char replay[256]; /* the command that replays this run */

static void make_replay(void)
{
    /* FAKE_ADDRESS_REUSE forces reuse on every seed: the replay too. */
    int n = snprintf(replay, sizeof replay, "%st/stress --seed %" PRIu64
                     " --entries %lu",
                     getenv("FAKE_ADDRESS_REUSE") != NULL
                         ? "FAKE_ADDRESS_REUSE=1 "
                         : "",
                     opt.seed, opt.entries);
    if (opt.threads != DEFAULT_THREADS)
        n += snprintf(replay + n, sizeof replay - (size_t)n, " --threads %d",
                      opt.threads);
    if (opt.devices != DEFAULT_DEVICES)
        n += snprintf(replay + n, sizeof replay - (size_t)n, " --devices %d",
                      opt.devices);
    if (opt.streams != DEFAULT_STREAMS)
        snprintf(replay + n, sizeof replay - (size_t)n, " --streams %d",
                 opt.streams);
}

static void usage(void)
{
    fprintf(stderr, "usage: t/stress [--entries N] [--seed S] [--threads T "
                    "(1..%d)] [--devices D (1..%d)] [--streams K (1..%d)]\n",
            MAX_THREADS, FAKE_MAX_DEVICES, MAX_STREAMS);
    exit(2);
}

static uint64_t number(const char *text, uint64_t min, uint64_t max)
{
    char *end;
    errno = 0;
    if (text == NULL || text[0] < '0' || text[0] > '9')
        usage();
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        usage();
    return v;
}

/* ---- the release configuration, drawn from the seed ------------------------ */

static char config_env[512];
struct stress_config cfg;

static void choose_config(void)
{
    struct rng r = rng_for(opt.seed, UINT64_C(0xc0f16));
    bool eager = rng_percent(&r, 25);
    /* 64k .. 4M, so that cap releases happen; sometimes the default. */
    uint64_t max_pending = rng_percent(&r, 15) ? 0 : (UINT64_C(64) << 10)
                                                      << rng_below(&r, 7);
    unsigned idle_us = rng_percent(&r, 20) ? 0 : rng_below(&r, 5001);
    unsigned max_delay_ms = rng_percent(&r, 20) ? 0 : 1 + rng_below(&r, 20);
    unsigned poll_us = 1 + rng_below(&r, 100);
    unsigned poll_max_us = poll_us * (1 + rng_below(&r, 20));
    static const unsigned pools[] = {0, 1, 64, 4096};
    unsigned event_pool = pools[rng_below(&r, 4)];
    bool check = rng_percent(&r, 30);
    /* Frequent trims and flushes release most entries on demand; rare ones
     * leave them to the policy (cap, idle time, age). */
    cfg.trim_per_100k = rng_percent(&r, 20) ? 0 : 10 + rng_below(&r, 391);
    cfg.flush_per_100k = 5 + rng_below(&r, 96);
    cfg.idle_us = idle_us;
    cfg.poll_max_us = poll_max_us;
    /* Block splitting: off sometimes, else from 512 B (most requests may be
     * cut) to 4 MiB (only the held-work blocks may). */
    unsigned split_min = rng_percent(&r, 20) ? 0 : 512u << rng_below(&r, 14);
    cfg.split_min = split_min;
    /* Free batches on the legacy stream: sometimes an event per free, else
     * 2 to 64 blocks per event (drawn last: earlier seeds keep the rest). */
    unsigned free_batch = rng_percent(&r, 20) ? 1 : 2u << rng_below(&r, 6);
    /* Half the seeds: released addresses come back as CUDA's do, so what
     * cudefer remembers of a released pointer meets a new allocation. */
    cfg.reuse = rng_percent(&r, 50) || getenv("FAKE_ADDRESS_REUSE") != NULL;
    /* New blocks' rounding: half the seeds the default, else a power of two
     * (coarse: one block serves many sizes) or 256 sizes per power of two
     * (sizes between the bins' classes); drawn after the rest. */
    unsigned round_divisions = rng_percent(&r, 50)   ? 16
                               : rng_percent(&r, 50) ? 1
                                                     : 256;
    cfg.round_divisions = round_divisions;
    snprintf(config_env, sizeof config_env,
             "CUDEFER_POLICY=%s CUDEFER_MAX_PENDING=%" PRIu64
             " CUDEFER_IDLE_US=%u CUDEFER_MAX_DELAY_MS=%u CUDEFER_POLL_US=%u "
             "CUDEFER_POLL_MAX_US=%u CUDEFER_EVENT_POOL=%u CUDEFER_CHECK=%d "
             "CUDEFER_SPLIT_MIN=%u CUDEFER_FREE_BATCH=%u "
             "CUDEFER_ROUND_DIVISIONS=%u",
             eager ? "eager" : "batched", max_pending, idle_us, max_delay_ms,
             poll_us, poll_max_us, event_pool, check, split_min, free_batch,
             round_divisions);
}

/* ---- failures: counted, the first few explained ---------------------------- */

/* Bail out, saying how to replay the run. */
_Noreturn void stress_die(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag("FAILED with seed %" PRIu64 ": replay with %s", opt.seed, replay);
    bail("%s", msg);
}

static _Atomic unsigned long failures[NFAILURES];
static _Atomic int diags_left = MAX_DIAGS;

/* Count a failure; explain the first few (see stress.h). */
void stress_fail(enum failure f, const char *fmt, ...)
{
    static _Atomic unsigned long total;
    atomic_fetch_add(&failures[f], 1);
    if (atomic_fetch_add(&total, 1) + 1 == MAX_FAILURES)
        stress_die("%d failures: stopped (the first are above)", MAX_FAILURES);
    if (atomic_fetch_sub(&diags_left, 1) <= 0)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    diag("FAILURE: %s", msg);
}


/* ---- the threads' shared state --------------------------------------------- */

struct worker *workers;
_Atomic unsigned long calls_run, nested_deferred;
_Atomic int lull;
_Atomic int phase_done;
const char *_Atomic phase = "start";

/* ---- the watchdog ---------------------------------------------------------- */

static unsigned long progress_now(void)
{
    unsigned long n = 0;
    for (int i = 0; i < opt.threads; i++)
        n += atomic_load_explicit(&workers[i].progress, memory_order_relaxed);
    return n;
}

static void *watchdog_main(void *unused)
{
    (void)unused;
    /* About 200 times what a run takes on 2 cores: only a broken run (one
     * that crawls, e.g. on 50 ms timeouts) gets there. */
    int64_t deadline = mono_ns() + (int64_t)(120 + opt.entries / 2000) * 1000000000;
    unsigned long last = progress_now();
    const char *last_phase = atomic_load(&phase);
    int still = 0;
    while (!atomic_load(&phase_done)) {
        sleep_ns(100000000);
        if (mono_ns() > deadline)
            stress_die("still running after %lu s (phase \"%s\"): far too slow",
                       120 + opt.entries / 2000, atomic_load(&phase));
        unsigned long now = progress_now();
        const char *ph = atomic_load(&phase);
        if (now != last || ph != last_phase) {
            last = now;
            last_phase = ph;
            still = 0;
            continue;
        }
        if (++still < STALL_S * 10)
            continue;
        struct defer_stats st = stats_now();
        diag("no progress for %d s in phase \"%s\": a hang? deferred %llu "
             "released %llu pending %llu held %llu failed %llu", STALL_S, ph,
             ULL(st.deferred), ULL(st.released), ULL(st.pending),
             ULL(st.held), ULL(st.failed));
        for (int i = 0; i < opt.threads; i++)
            diag("thread %d: %lu of %lu entries, %lu items since its last flush",
                 i, workers[i].deferred, workers[i].quota, workers[i].nitems);
        stress_die("no progress for %d s: a hang", STALL_S);
    }
    return NULL;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    bool seeded = false;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--double-free-every-path") == 0)
            i--; /* the default now; takes no value */
        else if (strcmp(a, "--entries") == 0)
            opt.entries = (unsigned long)number(v, 1, UINT64_C(1) << 40);
        else if (strcmp(a, "--seed") == 0)
            opt.seed = number(v, 0, UINT64_MAX), seeded = true;
        else if (strcmp(a, "--threads") == 0)
            opt.threads = (int)number(v, 1, MAX_THREADS);
        else if (strcmp(a, "--devices") == 0)
            opt.devices = (int)number(v, 1, FAKE_MAX_DEVICES);
        else if (strcmp(a, "--streams") == 0)
            opt.streams = (int)number(v, 1, MAX_STREAMS);
        else
            usage();
    }
    if (!seeded)
        opt.seed = (uint32_t)mix64((uint64_t)time(NULL) ^
                                   ((uint64_t)getpid() << 32) ^
                                   (uint64_t)mono_ns());
    make_replay();
    diag("seed %" PRIu64 " (replay: %s)", opt.seed, replay);
    choose_config();
    set_weights();
    diag("addresses %s", cfg.reuse ? "reused (fake_set_address_reuse)"
                                   : "never reused");
    diag("%lu entries, %d threads, %d devices, %d streams per thread; %u trims "
         "and %u flushes per 100 000 operations; %s", opt.entries, opt.threads,
         opt.devices, opt.streams, cfg.trim_per_100k, cfg.flush_per_100k,
         config_env);
    set_cudefer_env(config_env);
    diag("expected on stderr: one \"defer_flush called from a defer_call "
         "callback: refused\"; for the wrong inputs, \"already free or being "
         "freed (freed twice?): refused\", \"is no live block\", \"cudaStreamPerThread "
         "names a different stream\" and \"cudaFree failed ... is not "
         "released\"");
    plan(23);

    fake_reset(opt.devices);
    fake_set_address_reuse(cfg.reuse);
    alloc_init();
    workers = calloc((size_t)opt.threads, sizeof *workers);
    if (workers == NULL)
        stress_die("out of memory");
    for (int i = 0; i < opt.threads; i++) {
        workers[i].index = i;
        workers[i].rng = rng_for(opt.seed, (uint64_t)i);
        workers[i].quota = opt.entries / (unsigned long)opt.threads +
                           ((unsigned long)i < opt.entries % (unsigned long)opt.threads);
    }
    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, watchdog_main, NULL) != 0)
        stress_die("pthread_create");

    double t0 = now_ms();
    atomic_store(&phase, "threads");
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0)
            stress_die("pthread_create");
    for (int i = 0; i < opt.threads; i++)
        pthread_join(workers[i].thread, NULL);
    double t_threads = now_ms() - t0;

    atomic_store(&phase, "final defer_flush");
    cudaError_t flush_err = defer_flush();
    size_t trimmed = 0;
    cudaError_t trim_err = defer_trim(&trimmed);
    double t_flush = now_ms() - t0;

    unsigned long made = 0, flushes = 0, trims = 0, flush_checked = 0,
                  trim_checked = 0, trim_exempt = 0, calls = 0,
                  ops[NOPS] = {0};
    unsigned long handouts = 0, pluggable = 0, held_frees = 0, wrong[NWRONG] = {0};
    unsigned long kept = 0;
    uint64_t kept_min = 0, kept_max = 0; /* the bytes cached for them */
    /* The allocations holding them: blocks may be cut from one allocation,
     * which the cache holds whole. */
    void **kept_allocs = calloc((size_t)opt.threads * MAX_KEPT + 1,
                                sizeof *kept_allocs);
    size_t nkept_allocs = 0;
    uint64_t kept_alloc_bytes = 0;
    if (kept_allocs == NULL)
        stress_die("out of memory");
    for (int i = 0; i < opt.threads; i++) {
        struct worker *w = &workers[i];
        handouts += w->handouts;
        pluggable += w->pluggable;
        held_frees += w->held_frees;
        for (int k = 0; k < NWRONG; k++)
            wrong[k] += w->wrong[k];
        for (int k = 0; k < w->nkept; k++) {
            uint64_t b = w->kept[k].bytes < 512 ? 512 : w->kept[k].bytes;
            kept++;
            kept_min += b;
            /* Rounded (under 1/16 whatever finer, under 1/N coarser),
             * then taken up to 1/8 larger. */
            uint64_t n = cfg.round_divisions < 16 ? cfg.round_divisions : 16;
            uint64_t rounded = b + b / n + 512;
            kept_max += rounded + rounded / 8;
            void *base = NULL;
            size_t size = 0;
            fake_allocation_of(w->kept[k].p, &base, &size);
            size_t j = 0;
            while (j < nkept_allocs && kept_allocs[j] != base)
                j++;
            if (j == nkept_allocs) {
                kept_allocs[nkept_allocs++] = base;
                kept_alloc_bytes += size;
            }
        }
        made += w->deferred;
        flushes += w->flushes;
        trims += w->trims;
        flush_checked += w->flush_checked;
        trim_checked += w->trim_checked;
        trim_exempt += w->trim_exempt;
        calls += w->calls;
        for (int k = 0; k < NOPS; k++)
            ops[k] += w->ops[k];
    }
    unsigned long nested = atomic_load(&nested_deferred);

    is_int(failures[F_REFUSED], 0, "every defer call accepted (%lu entries "
           "from %d threads, %lu from callbacks)", made, opt.threads, nested);
    is_int(failures[F_CUDA], 0, "the test's own CUDA calls succeeded");
    is_int(failures[F_FLUSH_ERROR], 0, "every defer_flush and defer_trim "
           "returned cudaSuccess (%lu flushes, %lu trims)", flushes, trims);
    is_int(failures[F_FLUSH_LEFT], 0, "each flush released everything its "
           "thread deferred before it (%lu entries checked)", flush_checked);
    is_int(failures[F_TRIM_LEFT], 0, "each trim released every entry whose "
           "work had completed (%lu entries checked; %lu callbacks left out "
           "while a later record of their event, or of an earlier "
           "callback's of their stream, was pending)", trim_checked,
           trim_exempt);
    ok(failures[F_CALL_TWICE] == 0 && atomic_load(&calls_run) == calls,
       "every callback ran exactly once (%lu deferred, %lu runs, %lu twice)",
       calls, atomic_load(&calls_run), failures[F_CALL_TWICE]);
    is_int(failures[F_CALL_EARLY], 0, "no callback ran before its work "
           "completed");
    is_int(failures[F_CALL_ORDER], 0, "the callbacks of each stream ran in "
           "order");
    is_int(failures[F_IN_CALLBACK], 0, "in a callback, defer_free is "
           "accepted and defer_flush refused");
    is_int(failures[F_HANDOUT], 0, "every hand-out lay inside a live device "
           "allocation of its stream's device and overlapped no block owned "
           "by someone else (%lu hand-outs, %lu by defer_pluggable_alloc)",
           handouts, pluggable);
    is_int(failures[F_REUSE], 0, "a block freed behind held work went to no "
           "other stream, and its own stream got a block freed there (%lu "
           "times)", held_frees);
    unsigned long refused = atomic_load(&wrong_refused),
                  failing = atomic_load(&wrong_failing);
    char wrongs[256];
    int wn = 0;
    for (int k = 0; k < NWRONG; k++)
        wn += snprintf(wrongs + wn, sizeof wrongs - (size_t)wn, "%s%s %lu",
                       k ? ", " : "", wrong_names[k], wrong[k]);
    is_int(failures[F_WRONG], 0, "every wrong input got its expected result "
           "(%s)", wrongs);
    is_int(failures[F_DEVICE], 0, "the pluggable entry points left the "
           "current device as it was");
    ok(flush_err == cudaSuccess && trim_err == cudaSuccess,
       "the final defer_flush (%s) and defer_trim (%s)",
       cudaGetErrorName(flush_err), cudaGetErrorName(trim_err));
    is_int(fake_live_allocations(), nkept_allocs, "after the final flush and "
           "trim, only the %zu allocations holding the %lu blocks the test "
           "kept are live", nkept_allocs, kept);
    struct defer_stats st = stats_now();
    ok(st.deferred == made + nested && st.released + st.failed == st.deferred &&
           st.pending == 0 && st.failed == failing && st.rejected == refused,
       "statistics agree: deferred %llu (want %lu), released %llu, pending "
       "%llu, failed %llu (want %lu), rejected %llu (want %lu)",
       ULL(st.deferred), made + nested, ULL(st.released), ULL(st.pending),
       ULL(st.failed), failing, ULL(st.rejected), refused);
    /* After the trim the cache holds the allocations of the kept blocks,
     * whole (the rest of one a kept block was cut from stays free in it). */
    uint64_t kept_live = st.cache_bytes - st.cache_free_bytes;
    ok(st.reused + st.cache_mallocs == handouts &&
           st.reused_same_stream <= st.reused &&
           st.cache_bytes == kept_alloc_bytes &&
           st.cache_free_bytes <= st.cache_bytes && kept_live >= kept_min &&
           kept_live <= kept_max,
       "block statistics agree: reused %llu + cache_mallocs %llu = %lu "
       "hand-outs, reused_same_stream %llu <= reused; after the trim "
       "cache_bytes %llu = %llu (the kept blocks' allocations), of which "
       "not free %llu - %llu in [%llu, %llu] (the kept blocks)",
       ULL(st.reused), ULL(st.cache_mallocs), handouts,
       ULL(st.reused_same_stream), ULL(st.cache_bytes),
       ULL(kept_alloc_bytes), ULL(st.cache_bytes), ULL(st.cache_free_bytes),
       ULL(kept_min), ULL(kept_max));
    is_int(fake_invalid_releases(), failing, "the releases that failed are "
           "those of the host pointers given to defer_free");
    char last[256];
    if (cfg.reuse)
        diag("%zu allocations took a released address", fake_addresses_reused());
    ok(fake_violations() == 0, "oracle: no premature or double release "
       "(%ld violations; the last: %s)", fake_violations(),
       fake_last_violation(last, sizeof last));

    atomic_store(&phase, "defer_shutdown");
    is_int(defer_shutdown(), cudaSuccess, "defer_shutdown");
    is_int(fake_live_events(), 0, "no CUDA event left after shutdown");
    size_t live_after = fake_live_allocations();
    for (int d = 0; d < opt.devices; d++) { /* the kept blocks' work */
        cudaSetDevice(d);
        cudaDeviceSynchronize();
    }
    /* A block cut from a larger one is no allocation of its own: the
     * application cannot cudaFree it (include/cudefer.h); the test knows
     * the allocations from the fake. */
    unsigned long freed = 0;
    for (size_t j = 0; j < nkept_allocs; j++)
        freed += cudaFree(kept_allocs[j]) == cudaSuccess;
    ok(live_after == nkept_allocs && freed == nkept_allocs &&
           fake_live_allocations() == 0,
       "after shutdown the %zu allocations of the %lu kept blocks are still "
       "the test's (%zu live); cudaFree released %lu of them; %zu "
       "allocations left", nkept_allocs, kept, live_after, freed,
       fake_live_allocations());
    free(kept_allocs);
    is_int(fake_violations(), 0, "oracle: still no violation after shutdown");
    atomic_store(&phase_done, 1);
    pthread_join(watchdog, NULL);

    double t_end = now_ms() - t0;
    diag("%.0f ms: threads %.0f, final flush %.0f, shutdown %.0f; %.0f "
         "entries/s", t_end, t_threads, t_flush - t_threads, t_end - t_flush,
         (double)(made + nested) / (t_threads / 1000.0));
    char buf[512];
    int n = 0;
    for (int k = 0; k < NOPS; k++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s %lu",
                      k ? ", " : "", op_names[k], ops[k]);
    diag("operations: %s", buf);
    diag("blocks: %lu hand-outs (%lu by defer_pluggable_alloc), %llu reused "
         "(%llu on their own stream before their work was done), %llu "
         "cudaMalloc, %llu released; %lu freed behind held work; %lu kept to "
         "the end; the final trim released %zu bytes", handouts, pluggable,
         ULL(st.reused), ULL(st.reused_same_stream), ULL(st.cache_mallocs),
         ULL(st.cache_releases), held_frees, kept, trimmed);
    diag("releases: idle %llu, cap %llu, age %llu, demand %llu; %llu batches "
         "(largest %llu), %llu event queries, %llu wake-ups, %llu events "
         "created, latency p50 %llu us max %llu us, %llu sync releases",
         ULL(st.idle_releases), ULL(st.cap_releases), ULL(st.age_releases),
         ULL(st.demand_releases), ULL(st.batches), ULL(st.largest_batch),
         ULL(st.event_queries), ULL(st.wakeups), ULL(st.events_created),
         ULL(st.latency_p50_us), ULL(st.latency_max_us),
         ULL(st.sync_releases));
    if (tap_failures() > 0 || fake_violations() != 0)
        diag("FAILED with seed %" PRIu64 ": replay with %s", opt.seed, replay);
    else
        diag("seed %" PRIu64 " passed", opt.seed);

    for (int i = 0; i < opt.threads; i++) {
        struct worker *w = &workers[i];
        while (w->free_calls != NULL) {
            struct call *c = w->free_calls;
            w->free_calls = c->next_free;
            free(c);
        }
        while (w->orders != NULL) {
            struct order *o = w->orders;
            w->orders = o->next;
            free(o);
        }
    }
    free(workers);
    return 0;
}
