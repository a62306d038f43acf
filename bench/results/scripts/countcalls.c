/* LD_PRELOAD: count some CUDA runtime calls, launching threads vs the reclaimer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
enum { Q, C, X, R, I, N };
static const char *names[N] = {"EventQuery", "EventCreateWithFlags", "ThreadExchangeCaptureMode", "EventRecord", "StreamIsCapturing"};
static _Atomic long cnt[2][N];
static _Thread_local int who = -1;
static int me(void) {
    if (who < 0) { char n[32] = ""; pthread_getname_np(pthread_self(), n, sizeof n); who = strcmp(n, "cudefer-reclaim") == 0; }
    return who;
}
#define NEXT(T, name) static __typeof__(T) *real; if (!real) real = (__typeof__(T) *)dlsym(RTLD_NEXT, name)
cudaError_t cudaEventQuery(cudaEvent_t e) { NEXT(cudaError_t (cudaEvent_t), "cudaEventQuery"); cnt[me()][Q]++; return real(e); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) { NEXT(cudaError_t (cudaEvent_t *, unsigned), "cudaEventCreateWithFlags"); cnt[me()][C]++; return real(e, f); }
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) { NEXT(cudaError_t (enum cudaStreamCaptureMode *), "cudaThreadExchangeStreamCaptureMode"); cnt[me()][X]++; return real(m); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { NEXT(cudaError_t (cudaEvent_t, cudaStream_t), "cudaEventRecord"); cnt[me()][R]++; return real(e, s); }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) { NEXT(cudaError_t (cudaStream_t, enum cudaStreamCaptureStatus *), "cudaStreamIsCapturing"); cnt[me()][I]++; return real(s, st); }
__attribute__((destructor)) static void report(void) {
    for (int w = 0; w < 2; w++) {
        fprintf(stderr, "countcalls %s:", w ? "reclaimer" : "others");
        for (int k = 0; k < N; k++) fprintf(stderr, " %s=%ld", names[k], cnt[w][k]);
        fprintf(stderr, "\n");
    }
}
