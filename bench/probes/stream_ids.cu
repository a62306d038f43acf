// SPDX-License-Identifier: MIT
// Probe: two facts the stream identity and the device switch rest on.
// 1. Are cudaStreamGetId values unique across the process's devices, and
//    are they reused after a stream is destroyed?  Streams are created on
//    each device in turn (and destroyed and created again); every id is
//    printed with its device, and any id seen twice is named.
// 2. A thread with no current context: what cudaGetDevice answers, whether
//    it or a call on another device's stream makes a context current, and
//    whether cuCtxSetCurrent(NULL) gives the thread back its 'no context'.
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <map>

static const char *ctx_name(void)
{
  CUcontext c = 0; CUresult r = cuCtxGetCurrent(&c);
  if (r != CUDA_SUCCESS) return "error";
  if (!c) return "none";
  static char b[64]; CUdevice d = -1; cuCtxGetDevice(&d);
  snprintf(b, sizeof b, "device %d's", (int)d); return b;
}

static cudaStream_t s1; // a stream of device 1, made by main

static void *no_context(void *)
{
  printf("thread start: current context %s\n", ctx_name());
  int dev = -7; cudaError_t e = cudaGetDevice(&dev);
  printf("cudaGetDevice -> %d (%s); current context %s\n", dev, cudaGetErrorName(e), ctx_name());
  cudaEvent_t ev; e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  printf("cudaEventCreate -> %s; current context %s\n", cudaGetErrorName(e), ctx_name());
  CUresult r = cuCtxSetCurrent(NULL);
  printf("cuCtxSetCurrent(NULL) -> %d; current context %s\n", (int)r, ctx_name());
  e = cudaSetDevice(1);
  printf("cudaSetDevice(1) -> %s; current context %s\n", cudaGetErrorName(e), ctx_name());
  e = cudaEventRecord(ev, s1);
  printf("cudaEventRecord(event of device 0, stream of device 1) -> %s\n", cudaGetErrorName(e));
  cudaGetLastError();
  r = cuCtxSetCurrent(NULL);
  printf("cuCtxSetCurrent(NULL) -> %d; current context %s\n", (int)r, ctx_name());
  dev = -7; e = cudaGetDevice(&dev);
  printf("cudaGetDevice -> %d (%s); current context %s\n", dev, cudaGetErrorName(e), ctx_name());
  return 0;
}

int main(void)
{
  int n = 0; cudaGetDeviceCount(&n);
  printf("devices %d\n", n);
  std::map<unsigned long long, int> seen; int dup = 0, total = 0;
  auto note = [&](unsigned long long id, int dev, const char *what) {
    total++;
    auto it = seen.find(id);
    if (it != seen.end()) { dup++; printf("id %llu seen again: %s on device %d, first on device %d\n", id, what, dev, it->second); }
    else seen[id] = dev;
  };
  for (int round = 0; round < 3; round++) {
    cudaStream_t st[8];
    for (int i = 0; i < 8; i++) {
      int dev = i % n; cudaSetDevice(dev);
      cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking);
      unsigned long long id = 0; cudaStreamGetId(st[i], &id);
      printf("round %d device %d stream id %llu\n", round, dev, id);
      note(id, dev, "created");
    }
    for (int i = 0; i < 8; i++) { cudaSetDevice(i % n); cudaStreamDestroy(st[i]); }
  }
  for (int dev = 0; dev < n; dev++) {
    cudaSetDevice(dev);
    unsigned long long a = 0, b = 0;
    cudaStreamGetId(cudaStreamLegacy, &a); cudaStreamGetId(cudaStreamPerThread, &b);
    printf("device %d legacy stream id %llu, per-thread %llu\n", dev, a, b);
  }
  printf("ids %d, seen twice %d\n", total, dup);
  if (n > 1) {
    cudaSetDevice(1); cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaSetDevice(0);
    pthread_t t; pthread_create(&t, 0, no_context, 0); pthread_join(t, 0);
  }
  return 0;
}
