/* SPDX-License-Identifier: MIT */
/* Helpers shared by the fake-runtime tests: allocations, simulated work,
 * waiting with a deadline, capturing what the library prints, and running
 * scenarios in child processes (checks, the environment, fork and wait). */
#ifndef CUDEFER_TEST_HELPERS_H
#define CUDEFER_TEST_HELPERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "cudefer.h"
#include "fake_cuda.h"
#include "tap.h"

/* cudaMalloc / cudaMallocHost / cudaStreamCreate, or bail. */
void *device_alloc(size_t bytes);
void *host_alloc(size_t bytes);
cudaStream_t stream_new(void);

/* defer_alloc(p, bytes, s), then, when it succeeded with a block, the
 * oracle's check that its bytes are free of other streams' pending work
 * (fake_oracle_handout_range: a premature reuse is a violation, which
 * fails the test at exit).  Returns what defer_alloc returned.  Any thread, as
 * defer_alloc; blocks where defer_alloc does.  Use it in place of
 * defer_alloc wherever a test reuses memory. */
cudaError_t alloc_checked(void **p, size_t bytes, cudaStream_t s);

/* Simulated work on s that uses p: held until fake_complete, or timed. */
fake_work *work_held(cudaStream_t s, void *p);
fake_work *work_timed(cudaStream_t s, unsigned us, void *p);

void sleep_ms(unsigned ms);

/* Poll until fake_is_released(p) == 1, at most timeout_ms; true if so. */
bool wait_released(const void *p, unsigned timeout_ms);

/* How many of the n allocations at p are released (fake_is_released). */
int count_released(void *const *p, int n);

/* Poll until *flag becomes nonzero, at most timeout_ms; true if so. */
bool wait_flag(const volatile int *flag, unsigned timeout_ms);

/* defer_flush on a thread of its own (*t, to join): *done (0 before)
 * becomes 1 when it returned cudaSuccess, -1 when it returned an error;
 * read it with wait_flag or __atomic_load_n.  Bails if no thread could be
 * made. */
void flush_in_thread(pthread_t *t, int *done);

struct defer_stats stats_now(void);

/* Wait (timeout_ms at most) until two snapshots of the statistics 5 ms
 * apart agree on what the reclaimer counts (held, held_bytes, released,
 * failed and the releases by reason): the reclaimer publishes them at the
 * end of a pass, so a condition on fake_is_released may hold halfway
 * through one.  True when settled. */
bool wait_stats_settled(unsigned timeout_ms);

/* Capture what is written to stderr between begin and end; end returns it
 * (static buffer, NUL-terminated) and echoes it as TAP diagnostics. */
void stderr_capture_begin(void);
const char *stderr_capture_end(void);

/* A line of text containing a and b (b may be NULL) and not starting with
 * unless (may be NULL); true if there is one. */
bool has_line(const char *text, const char *a, const char *b,
              const char *unless);

/* ---- scenarios run in child processes (policy, lifecycle) ---------------- */

/* A check in a process that must not print TAP results of its own, since
 * its parent numbers them: in a scenario child (or a worker it forks) only.
 * A failure is explained with diag ("line N: check failed: ...") and
 * counted in failed_checks, which the child resets at its start and turns
 * into its exit status; check returns cond. */
extern int failed_checks;
bool check(bool cond, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define CHECK(cond, ...) check((cond), __LINE__, __VA_ARGS__)

/* A counter (uint64_t and the like) as unsigned long long, for %llu.
 * Anyone. */
#define ULL(x) ((unsigned long long)(x))

/* Now on the monotonic clock, in milliseconds: for measuring intervals and
 * deadlines only.  Anyone. */
double now_ms(void);

/* fork() with stdout and stderr flushed first, so that the child does not
 * write again what the parent had buffered; bails if fork fails.  Returns
 * 0 in the child, its pid in the parent.  For starting a scenario child or
 * a worker; the parent waits for it with wait_child. */
pid_t fork_flushed(void);

/* End a forked child now, with exit status failures (at most 100), stdout
 * and stderr flushed, without running exit handlers.  In a child started
 * with fork_flushed only. */
_Noreturn void child_end(int failures);

/* End a scenario child: CHECK that the fake's oracle saw no violation (a
 * failure names a line of helpers.c), then child_end(failed_checks).  In a
 * scenario child only, once its scenario is over. */
_Noreturn void scenario_child_end(void);

/* Unset every CUDEFER_* variable (in any case), then set those of env
 * ("CUDEFER_X=1 CUDEFER_Y=2"; NULL or "" sets none); bails on a word with
 * no '='.  Only where cudefer has not read its configuration yet: in a
 * scenario child before its first cudefer call, between fork and exec, or
 * in a test that calls the configuration parser itself. */
void set_cudefer_env(const char *env);

/* Wait for the child pid at most timeout_ms, polling every 2 ms: true, with
 * *status from waitpid, if it ended; false if not, after killing it with
 * SIGKILL and reaping it (*status is then that of the kill).  Only in the
 * process that forked pid. */
bool wait_child(pid_t pid, double timeout_ms, int *status);

/* Run fn in a child process: the CUDEFER_* environment env
 * (set_cudefer_env), a fresh fake of ndevices, failed_checks reset; then
 * scenario_child_end (fn's CHECKs and the oracle).  One TAP result, "title
 * [env]" ("defaults" for an empty env): ok when the child ended within
 * timeout_ms with no failed check (a diagnostic says so on a hang).  In the
 * parent before its first cudefer call (a forked child's calls are
 * refused). */
void fork_scenario(const char *title, const char *env, int ndevices,
                   unsigned timeout_ms, void (*fn)(void));

/* From a fake call hook (fake_set_return_hook): when the calling thread is
 * cudefer's reclaimer and *state is armed, sets *state to held and waits
 * there until another thread changes it; returns whether it held.  On any
 * other thread, or not armed, returns false at once.  A test holds the
 * reclaimer inside one of its calls this way: arm, wait for held, act,
 * then store the next state to let it go. */
bool hold_reclaimer_in_call(_Atomic int *state, int armed, int held);

/* Anyone.  Read fd into buf (cap bytes, NUL-terminated, the rest dropped)
 * until end of file or until now_ms() passes deadline_ms; returns the
 * length kept. */
size_t read_until(int fd, double deadline_ms, char *buf, size_t cap);

/* Poll until fake_live_user_objects() <= n, at most timeout_ms; whether it
 * got there. */
bool wait_user_objects(size_t n, unsigned timeout_ms);

/* A callback (defer_call) that does nothing but add 1 to noop_counted_calls,
 * atomically.  Anyone. */
extern int noop_counted_calls;
void noop_counted(void *arg);

/* Begin a capture of s in the global mode / end it and return its graph;
 * each bails on an error. */
void begin_capture(cudaStream_t s);
cudaGraph_t end_capture(cudaStream_t s);

/* Work on s that uses p (fake_launch, 200 us): in a capture, it joins the
 * graph.  Bails on an invalid stream. */
void captured_work(cudaStream_t s, void *p);

/* A capture test's end, in the process that ran it: no user object, graph
 * or allocation left, the stats agreeing once flushed, no oracle
 * violation (6 TAP results). */
void captures_all_gone(void);

/* Whether stream captures (and its capture is not invalidated). */
bool capture_intact(cudaStream_t stream);

/* A capture of another thread's, in the global mode, on stream, held open
 * until release becomes 1 (30 s at most); begun becomes 1 once it began,
 * -1 if it could not; intact: whether it was intact then and ended well.
 * hold_capture(&c) is that thread's function (pthread_create). */
struct held_capture {
    cudaStream_t stream;
    int begun, release, intact;
};
void *hold_capture(void *arg);

#endif
