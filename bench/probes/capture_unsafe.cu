// SPDX-License-Identifier: MIT
// Probe: which of the calls a block cache's miss makes invalidate a graph
// capture that another thread holds in cudaStreamCaptureModeGlobal.
// For each call: thread A begins a Global capture on a stream of its own
// and waits; thread B, in its own capture mode (Global, the default, or
// Relaxed where the line says so), makes the call; then A launches a
// kernel into its capture and ends it.  Printed per call: the call's own
// result, and whether A's capture survived (its end's result).
#include <stdio.h>
#include <string.h>

#include "probe.h"

static std::atomic<int> phase; // 0 A capturing, 1 B done, 2 A done
static cudaStream_t cap;

typedef cudaError_t (*call_fn)(void);

static cudaMemPool_t pool;
static void *block;

static cudaMemPool_t spare; // made by the probe of cudaMemPoolCreate
static cudaError_t make_pool(cudaMemPool_t *to)
{
  cudaMemPoolProps p; memset(&p, 0, sizeof p);
  p.allocType = cudaMemAllocationTypePinned;
  p.location.type = cudaMemLocationTypeDevice; p.location.id = 0;
  return cudaMemPoolCreate(to, &p);
}
static cudaError_t pool_create(void) { return make_pool(&spare); }
static cudaError_t pool_set(void)
{
  unsigned long long v = ~0ULL;
  return cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &v);
}
static cudaError_t pool_get(void)
{
  unsigned long long v = 0;
  return cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v);
}
static cudaStream_t own; // B's, created and synchronised outside the captures
static cudaEvent_t ev;
static cudaError_t pool_alloc(void)
{
  return cudaMallocFromPoolAsync(&block, 1 << 20, pool, own);
}
static cudaError_t pool_free(void) { return cudaFreeAsync(block, own); }
static cudaError_t pool_access(void)
{
  cudaMemAccessDesc d; memset(&d, 0, sizeof d);
  d.location.type = cudaMemLocationTypeDevice; d.location.id = 0;
  d.flags = cudaMemAccessFlagsProtReadWrite;
  return cudaMemPoolSetAccess(pool, &d, 1);
}
static cudaError_t record_own(void) { return cudaEventRecord(ev, own); }
static cudaError_t record_legacy(void) { return cudaEventRecord(ev, 0); }
static cudaError_t stream_create(void)
{
  cudaStream_t s; cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamDestroy(s);
  return e;
}
static cudaError_t event_create(void)
{
  cudaEvent_t x; cudaError_t e = cudaEventCreateWithFlags(&x, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventDestroy(x);
  return e;
}
static cudaError_t pool_trim(void) { return cudaMemPoolTrimTo(pool, 0); }
static cudaError_t pool_destroy(void) { return cudaMemPoolDestroy(pool); }
static cudaError_t props(void)
{
  cudaDeviceProp p; return cudaGetDeviceProperties(&p, 0);
}
static cudaError_t mem_info(void) { size_t f, t; return cudaMemGetInfo(&f, &t); }
static cudaError_t malloc_(void) { return cudaMalloc(&block, 1 << 20); }
static cudaError_t free_(void) { return cudaFree(block); }

struct probe_call { const char *name; call_fn fn; bool relaxed; };
static const struct probe_call calls[] = {
  {"cudaMemPoolCreate", pool_create, false},
  {"cudaMemPoolSetAttribute(ReleaseThreshold)", pool_set, false},
  {"cudaMemPoolGetAttribute(ReservedMemCurrent)", pool_get, false},
  {"cudaMemPoolSetAccess", pool_access, false},
  {"cudaMallocFromPoolAsync (B's own stream)", pool_alloc, false},
  {"cudaFreeAsync (B's own stream)", pool_free, false},
  {"cudaMallocFromPoolAsync (B relaxed)", pool_alloc, true},
  {"cudaFreeAsync (B relaxed)", pool_free, true},
  {"cudaEventRecord (B's own stream)", record_own, false},
  {"cudaEventRecord (legacy stream)", record_legacy, false},
  {"cudaStreamCreate + Destroy", stream_create, false},
  {"cudaEventCreate + Destroy", event_create, false},
  {"cudaMemPoolTrimTo", pool_trim, false},
  {"cudaMemPoolDestroy", pool_destroy, false},
  {"cudaGetDeviceProperties", props, false},
  {"cudaMemGetInfo", mem_info, false},
  {"cudaMalloc", malloc_, false},
  {"cudaFree", free_, false},
  {"cudaMalloc (B relaxed)", malloc_, true},
  {"cudaFree (B relaxed)", free_, true},
};

static const struct probe_call *now_call;
static cudaError_t now_result;

static void *other(void *)
{
  while (phase.load() != 0) {}
  cudaStreamCaptureMode m = now_call->relaxed ? cudaStreamCaptureModeRelaxed
                                              : cudaStreamCaptureModeGlobal;
  cudaThreadExchangeStreamCaptureMode(&m);
  now_result = now_call->fn();
  cudaThreadExchangeStreamCaptureMode(&m);
  phase.store(1);
  return 0;
}

int main()
{
  cudaFree(0);
  cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (make_pool(&pool) != cudaSuccess) { printf("no memory pool\n"); return 1; }
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    now_call = &calls[i];
    phase.store(-1);
    pthread_t th; pthread_create(&th, 0, other, 0);
    cudaError_t begin = cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
    phase.store(0);
    while (phase.load() != 1) {}
    pthread_join(th, 0);
    tiny<<<1, 1, 0, cap>>>();
    cudaError_t launch = cudaGetLastError();
    cudaGraph_t g = NULL;
    cudaError_t end = cudaStreamEndCapture(cap, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError(); // clear a sticky-free launch error, if any
    printf("%-46s call %-28s capture %s (begin %s, launch %s, end %s)\n",
           now_call->name, cudaGetErrorName(now_result),
           begin == cudaSuccess && launch == cudaSuccess && end == cudaSuccess
               ? "kept" : "INVALIDATED",
           cudaGetErrorName(begin), cudaGetErrorName(launch),
           cudaGetErrorName(end));
    cudaStreamSynchronize(cap);
    cudaStreamSynchronize(own);
    cudaGetLastError();
  }
  return 0;
}
