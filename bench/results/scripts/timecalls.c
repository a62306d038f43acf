/* LD_PRELOAD: time some CUDA runtime calls (histograms by power of two from
 * 1 us), launching threads vs the reclaimer, cudaEventRecord on the legacy
 * stream apart: whether the LM's slow frees are the seals' event records.
 * Build: gcc -O2 -shared -fPIC -I$CUDA/include timecalls.c -o timecalls.so -ldl
 * Appends one line per thread class and call at exit to $TIMECALLS_OUT
 * (stderr without it), after a line with the process's command line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
enum { REC0, REC, QUERY, CREATE, CAPTURING, EXCHANGE, LAUNCH, N };
static const char *names[N] = {"EventRecord(legacy)", "EventRecord(other)", "EventQuery", "EventCreateWithFlags", "StreamIsCapturing", "ThreadExchangeCaptureMode", "LaunchKernel"};
enum { B = 8 }; /* <1, <2, <4, <8, <16, <32, <64, >=64 us */
static _Atomic long cnt[2][N][B];
static _Atomic long long slow_ns[2][N]; /* calls of 4 us or more */
static _Thread_local int who = -1;
static int me(void) {
    if (who < 0) { char n[32] = ""; pthread_getname_np(pthread_self(), n, sizeof n); who = strcmp(n, "cudefer-reclaim") == 0; }
    return who;
}
static long long ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
static void note(int k, long long t0) {
    long long d = ns() - t0; int b = 0;
    while (b < B - 1 && d >= (1000LL << b)) b++;
    int w = me();
    cnt[w][k][b]++;
    if (d >= 4000) slow_ns[w][k] += d;
}
#define NEXT(T, name) static __typeof__(T) *real; if (!real) real = (__typeof__(T) *)dlsym(RTLD_NEXT, name)
#define TIMED(k, call) long long t0 = ns(); cudaError_t r = call; note(k, t0); return r
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { NEXT(cudaError_t (cudaEvent_t, cudaStream_t), "cudaEventRecord"); TIMED(s == NULL || s == cudaStreamLegacy ? REC0 : REC, real(e, s)); }
cudaError_t cudaEventQuery(cudaEvent_t e) { NEXT(cudaError_t (cudaEvent_t), "cudaEventQuery"); TIMED(QUERY, real(e)); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) { NEXT(cudaError_t (cudaEvent_t *, unsigned), "cudaEventCreateWithFlags"); TIMED(CREATE, real(e, f)); }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) { NEXT(cudaError_t (cudaStream_t, enum cudaStreamCaptureStatus *), "cudaStreamIsCapturing"); TIMED(CAPTURING, real(s, st)); }
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) { NEXT(cudaError_t (enum cudaStreamCaptureMode *), "cudaThreadExchangeStreamCaptureMode"); TIMED(EXCHANGE, real(m)); }
cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) { NEXT(cudaError_t (const void *, dim3, dim3, void **, size_t, cudaStream_t), "cudaLaunchKernel"); TIMED(LAUNCH, real(f, g, b, a, sh, s)); }
__attribute__((destructor)) static void report(void) {
    long any = 0;
    for (int w = 0; w < 2; w++) for (int k = 0; k < N; k++) for (int b = 0; b < B; b++) any += cnt[w][k][b];
    if (any == 0) return;
    const char *path = getenv("TIMECALLS_OUT");
    FILE *out = path != NULL ? fopen(path, "a") : NULL;
    if (out == NULL) out = stderr;
    char cmd[1024] = ""; FILE *c = fopen("/proc/self/cmdline", "r");
    if (c != NULL) { size_t n = fread(cmd, 1, sizeof cmd - 1, c); fclose(c); for (size_t i = 0; i < n; i++) if (cmd[i] == 0) cmd[i] = ' '; cmd[n] = 0; }
    fprintf(out, "timecalls process: %s\n", cmd);
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < N; k++) {
            long all = 0, slow = 0;
            for (int b = 0; b < B; b++) { all += cnt[w][k][b]; slow += b >= 3 ? cnt[w][k][b] : 0; }
            if (all == 0) continue;
            fprintf(out, "timecalls %s %s: %ld calls, %ld of 4 us or more (%.0f us), hist", w ? "reclaimer" : "others", names[k], all, slow, slow_ns[w][k] / 1e3);
            for (int b = 0; b < B; b++) fprintf(out, " %ld", cnt[w][k][b]);
            fprintf(out, "\n");
        }
    if (out != stderr) fclose(out);
}
