/* SPDX-License-Identifier: MIT */
/*
 * faults_reclaimer.c — fault injection into the reclaimer's loop:
 * cudaEventQuery (once, persistently, and the sticky error that fails a
 * device) and the reclaimer's cudaSetDevice.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faults.h"

/* ---- reclaimer: cudaEventQuery -------------------------------------------- */

/* Two devices.  Device 0 has entries pending and entries held when its
 * event query fails; device 1 is used afterwards.  Once: device 1 carries
 * on.  Persistently: device 1 fails too, when its entry is polled. */
void s_query_fails(const struct scenario *sc)
{
    /* Entries of device 0: a buffer and pinned memory pending behind held
     * work, a callback after them, HELD buffers completed and held.  Its
     * pointers: those, and one refused later. */
    enum { HELD = 5, DEV0 = HELD + 3, NPTRS = HELD + 3 };
    const cudaError_t bad = sc->err;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *p1 = device_alloc(4096);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    cudaStream_t sa = stream_new(), sb = stream_new();
    void *dev0[NPTRS];
    int ran = 0;
    dev0[0] = device_alloc(512);
    fake_work *w = work_held(sa, dev0[0]);
    dev0[1] = host_alloc(512);
    work_timed(sa, 0, dev0[1]);
    CHECK(defer_free(dev0[0], sa) == cudaSuccess, "defer_free (pending)");
    CHECK(defer_free_host(dev0[1], sa) == cudaSuccess, "defer_free_host "
          "(pending)");
    CHECK(defer_call(mark, &ran, sa) == cudaSuccess, "defer_call (pending)");
    for (int i = 0; i < HELD; i++) {
        dev0[2 + i] = busy_buffer(sb, 1024, 0);
        CHECK(defer_free(dev0[2 + i], sb) == cudaSuccess, "defer_free (held)");
    }
    void *late = dev0[NPTRS - 1] = device_alloc(64);
    WAIT_UNTIL(stats_now().held == HELD, 10000);
    CHECK(stats_now().held == HELD, "%d entries held (%llu)", HELD,
          ULL(stats_now().held));

    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, bad, 0, sc->count);
    WAIT_UNTIL(stats_now().failed == DEV0, 10000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t flush_err = defer_flush();
    cudaError_t late_err = defer_free(late, sb);
    const char *msg = capture_end();
    struct defer_stats st = stats_now();
    CHECK(st.failed == DEV0 && st.released == 0 && st.pending == 0 &&
              st.held == 0,
          "device 0's pending and held entries abandoned: failed %llu (want "
          "%d) released %llu pending %llu held %llu", ULL(st.failed), DEV0,
          ULL(st.released), ULL(st.pending), ULL(st.held));
    CHECK(failed_at_once == DEV0, "abandoned when the query failed, before "
          "any flush (failed %llu)", ULL(failed_at_once));
    CHECK(flush_err == bad, "defer_flush returns %s (%s)", EN(bad),
          EN(flush_err));
    CHECK(late_err == bad, "a later defer_free on device 0 returns %s (%s)",
          EN(bad), EN(late_err));
    CHECK(st.rejected == 1, "and is counted in rejected (%llu)",
          ULL(st.rejected));
    int lines = lines_with(msg, "cudaEventQuery failed", EN(bad), NULL);
    CHECK(lines == 1 && lines_with(msg, "device 0", "cudaEventQuery failed",
                                   EN(bad)) == 1,
          "one line names device 0, cudaEventQuery and %s (%d lines)",
          EN(bad), lines);
    CHECK(lines_with(msg, "defer_free", EN(bad), NULL) == 1,
          "the refused defer_free names the error");
    CHECK(count_released(dev0, NPTRS) == 0 && !flag(&ran),
          "nothing of device 0 released (%d), no callback run",
          count_released(dev0, NPTRS));

    /* Device 1. */
    work_timed(s1, 1000, p1);
    stderr_capture_begin();
    cudaError_t e1 = defer_free(p1, s1);
    cudaError_t flush1 = defer_flush();
    msg = capture_end();
    CHECK(e1 == cudaSuccess, "device 1 still accepts entries (%s)", EN(e1));
    CHECK(flush1 == bad, "defer_flush still returns device 0's error (%s)",
          EN(flush1));
    if (sc->count == ONCE) {
        CHECK(fake_is_released(p1) == 1, "device 1's entry is released");
        CHECK(lines_with(msg, "cudaEventQuery failed", NULL, NULL) == 0,
              "no other failure reported");
    } else {
        CHECK(fake_is_released(p1) == 0, "device 1's entry is abandoned too");
        CHECK(lines_with(msg, "device 1", "cudaEventQuery failed", EN(bad)) == 1,
              "in one line naming device 1");
        CHECK(stats_now().failed == DEV0 + 1, "failed %llu, want %d",
              ULL(stats_now().failed), DEV0 + 1);
    }

    /* The work completes: what was abandoned stays unreleased. */
    fake_fail_clear();
    fake_complete(w);
    sleep_ms(20);
    CHECK(defer_flush() == bad, "the error is sticky");
    CHECK(count_released(dev0, NPTRS) == 0 && !flag(&ran),
          "device 0's entries are never released (%d)",
          count_released(dev0, NPTRS));
    CHECK_STATS();
}

/* A sticky error: after a fault every query fails; many entries on many
 * streams, all abandoned in one message; every call after it returns it. */
void s_sticky(const struct scenario *sc)
{
    enum { STREAMS = 5, PER = 8, HELD = 10, N = STREAMS * PER + 3 + HELD };
    const cudaError_t bad = sc->err;
    void *all[N];
    int n = 0;
    fake_work *gates[STREAMS];
    cudaStream_t s[STREAMS];
    for (int k = 0; k < STREAMS; k++) {
        s[k] = stream_new();
        gates[k] = work_held(s[k], NULL);
        for (int i = 0; i < PER; i++) {
            all[n] = busy_buffer(s[k], 128, 0);
            CHECK(defer_free(all[n], s[k]) == cudaSuccess, "defer_free");
            n++;
        }
    }
    void *three[3];
    for (int i = 0; i < 3; i++)
        three[i] = all[n++] = busy_buffer(s[0], 128, 0);
    CHECK(defer_free_n(three, 3, s[0]) == cudaSuccess, "defer_free_n");
    cudaStream_t sh = stream_new();
    for (int i = 0; i < HELD; i++) {
        all[n] = busy_buffer(sh, 128, 0);
        CHECK(defer_free(all[n], sh) == cudaSuccess, "defer_free (held)");
        n++;
    }
    const uint64_t entries = STREAMS * PER + 1 + HELD;
    WAIT_UNTIL(stats_now().held == HELD, 10000);
    CHECK(stats_now().held == HELD, "%d entries held (%llu)", HELD,
          ULL(stats_now().held));

    stderr_capture_begin();
    fake_fail(FAKE_EVENT_QUERY, bad, 0, ALWAYS);
    WAIT_UNTIL(stats_now().failed == entries, 10000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t f1 = defer_flush(), f2 = defer_flush();
    size_t bytes = 99;
    cudaError_t t = defer_trim(&bytes);
    void *q = device_alloc(64), *h = host_alloc(64);
    int ran = 0;
    cudaError_t e[4] = {defer_free(q, s[1]), defer_free_host(h, s[2]),
                        defer_free_n(&q, 1, sh), defer_call(mark, &ran, s[3])};
    const char *msg = capture_end();
    struct defer_stats st = stats_now();
    CHECK(st.failed == entries && st.pending == 0 && st.released == 0 &&
              st.held == 0, "all %llu entries abandoned: failed %llu pending "
          "%llu released %llu held %llu", ULL(entries), ULL(st.failed),
          ULL(st.pending), ULL(st.released), ULL(st.held));
    CHECK(failed_at_once == entries, "abandoned at once, before any flush "
          "(failed %llu)", ULL(failed_at_once));
    CHECK(lines_with(msg, "cudaEventQuery failed", EN(bad), NULL) == 1,
          "one line for them all (%d)",
          lines_with(msg, "cudaEventQuery failed", EN(bad), NULL));
    CHECK(f1 == bad && f2 == bad, "every flush returns %s (%s, %s)", EN(bad),
          EN(f1), EN(f2));
    CHECK(t == bad && bytes == 0, "defer_trim returns it too (%s, %zu bytes)",
          EN(t), bytes);
    for (int i = 0; i < 4; i++)
        CHECK(e[i] == bad, "defer call #%d after the fault: %s, want %s", i,
              EN(e[i]), EN(bad));
    CHECK(st.rejected == 4, "rejected %llu, want 4", ULL(st.rejected));
    CHECK(fake_is_released(q) == 0 && fake_is_released(h) == 0 && !flag(&ran),
          "the refused pointers stay the caller's");
    CHECK(count_released(all, n) == 0, "nothing released (%d)",
          count_released(all, n));
    fake_fail_clear();
    for (int k = 0; k < STREAMS; k++)
        fake_complete(gates[k]);
    sleep_ms(20);
    CHECK(defer_flush() == bad, "still failed after the work completes");
    CHECK(count_released(all, n) == 0, "and still nothing released (%d)",
          count_released(all, n));
    CHECK_STATS();
}

/* ---- reclaimer: cudaSetDevice --------------------------------------------- */

/* Two devices.  The reclaimer works on device 1 first, then fails to switch
 * to device 0: device 0 fails; device 1 carries on (no switch needed, even
 * while every cudaSetDevice fails). */
void s_reclaimer_set_device(const struct scenario *sc)
{
    const cudaError_t bad = sc->err;
    CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    cudaStream_t s1 = stream_new();
    void *a1 = busy_buffer(s1, 64, 0), *b1 = device_alloc(64);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(defer_free(a1, s1) == cudaSuccess, "defer_free on device 1");
    CHECK(defer_flush() == cudaSuccess && fake_is_released(a1) == 1,
          "released (the reclaimer is on device 1)");
    cudaStream_t s0 = stream_new();
    void *p0 = device_alloc(64), *h0 = host_alloc(64), *q0 = device_alloc(64);
    fake_work *w0 = work_held(s0, p0);
    work_timed(s0, 0, h0);
    int ran = 0;

    stderr_capture_begin();
    fake_fail(FAKE_SET_DEVICE, bad, 0, sc->count);
    /* The first entry is accepted (device 0 cannot fail before the
     * reclaimer has an entry for it); the next ones are accepted, or, once
     * the reclaimer has failed the device, refused with its error. */
    cudaError_t e[3] = {defer_free(p0, s0), defer_free_host(h0, s0),
                        defer_call(mark, &ran, s0)};
    uint64_t accepted = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(e[i] == cudaSuccess || (i > 0 && e[i] == bad), "defer call #%d "
              "on device 0: %s", i, EN(e[i]));
        accepted += e[i] == cudaSuccess;
    }
    WAIT_UNTIL(stats_now().failed == accepted, 10000);
    uint64_t failed_at_once = stats_now().failed;
    cudaError_t f0 = defer_flush();
    cudaError_t eq = defer_free(q0, s0);
    work_timed(s1, 1000, b1);
    cudaError_t eb = defer_free(b1, s1);
    cudaError_t f1 = defer_flush();
    const char *msg = capture_end();
    fake_fail_clear();
    struct defer_stats st = stats_now();
    CHECK(st.failed == accepted && failed_at_once == accepted,
          "device 0's %llu entries abandoned at once (failed %llu, before the "
          "flush %llu)", ULL(accepted), ULL(st.failed), ULL(failed_at_once));
    CHECK(fake_is_released(p0) == 0 && fake_is_released(h0) == 0 && !flag(&ran),
          "not released, no callback run");
    CHECK(lines_with(msg, "device 0", "cudaSetDevice failed", EN(bad)) == 1 &&
              lines_with(msg, "cudaSetDevice", NULL, NULL) == 1,
          "one line names device 0, cudaSetDevice and %s", EN(bad));
    CHECK(f0 == bad, "defer_flush returns %s (%s)", EN(bad), EN(f0));
    CHECK(eq == bad && fake_is_released(q0) == 0, "a later defer_free on "
          "device 0 returns it (%s), the caller keeps the pointer", EN(eq));
    CHECK(st.rejected == 3 - accepted + 1, "rejected %llu, want %llu",
          ULL(st.rejected), ULL(3 - accepted + 1));
    CHECK(eb == cudaSuccess, "device 1 still accepts entries (%s)", EN(eb));
    CHECK(fake_is_released(b1) == 1, "and releases them");
    CHECK(f1 == bad, "the next flush still returns %s (%s)", EN(bad), EN(f1));
    CHECK(st.released == 2, "released %llu, want 2", ULL(st.released));
    fake_complete(w0);
    CHECK_STATS();
}
