// SPDX-License-Identifier: MIT
// Probe: what releasing cudaMalloc memory costs, and whether cudaFreeAsync
// accepts it without draining the device.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "probe.h"

__global__ void spin(long long ns){ long long s=clock64(); long long cyc = ns*2; while(clock64()-s<cyc){} }
int main(){
  const int N=1000; const size_t B=1<<20; void* p[N];
  cudaFree(0); cudaStream_t s; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking);
  // A: cudaFree of 1 MiB on an idle device, batch of N
  for(int i=0;i<N;i++) cudaMalloc(&p[i],B);
  cudaDeviceSynchronize(); double t=now_us(); for(int i=0;i<N;i++) cudaFree(p[i]); double a=(now_us()-t)/N;
  printf("A cudaFree 1MiB idle, batch of %d: %.2f us/call\n",N,a);
  // A2: same, another thread launching tiny kernels meanwhile
  for(int i=0;i<N;i++) cudaMalloc(&p[i],B); cudaDeviceSynchronize();
  pthread_t th; stop_flag=0; pthread_create(&th,0,launcher,0); usleep(20000);
  t=now_us(); for(int i=0;i<N;i++) cudaFree(p[i]); double a2=(now_us()-t)/N; usleep(2000); stop_flag=1; pthread_join(th,0);
  printf("A2 cudaFree batch with a launcher: %.2f us/call; launcher max launch %.1f us, %ld launches\n",a2,max_launch_us,nlaunch);
  // A3: launcher alone, for comparison
  stop_flag=0; pthread_create(&th,0,launcher,0); usleep(50000); stop_flag=1; pthread_join(th,0);
  printf("A3 launcher alone 50 ms: max launch %.1f us, %ld launches\n",max_launch_us,nlaunch);
  // B: cudaFreeAsync on cudaMalloc memory behind a busy stream
  for(int i=0;i<N;i++) cudaMalloc(&p[i],B); cudaDeviceSynchronize(); size_t u0=used();
  spin<<<1,1,0,s>>>(200000000LL); // ~200 ms (clock ~2 GHz guess)
  t=now_us(); cudaError_t e=cudaFreeAsync(p[0],s); double b1=now_us()-t;
  printf("B cudaFreeAsync(cudaMalloc ptr) behind busy stream: %s, %.1f us\n",cudaGetErrorString(e),b1);
  if(e==cudaSuccess){ t=now_us(); for(int i=1;i<N;i++) cudaFreeAsync(p[i],s); double b2=(now_us()-t)/(N-1);
    size_t u1=used(); printf("B2 %d more: %.2f us/call; used dropped by %.0f MiB before the kernel ended\n",N-1,b2,(double)((long)u0-(long)u1)/(1<<20));
    // does it block another thread's launches?
    cudaStreamSynchronize(s);
    for(int i=0;i<N;i++) cudaMalloc(&p[i],B); cudaDeviceSynchronize(); u0=used();
    spin<<<1,1,0,s>>>(200000000LL);
    stop_flag=0; pthread_create(&th,0,launcher,0); usleep(20000);
    t=now_us(); for(int i=0;i<N;i++) cudaFreeAsync(p[i],s); double b3=(now_us()-t)/N; usleep(2000); stop_flag=1; pthread_join(th,0);
    printf("B3 cudaFreeAsync batch behind busy stream with a launcher: %.2f us/call; launcher max %.1f us, %ld launches\n",b3,max_launch_us,nlaunch);
    t=now_us(); cudaStreamSynchronize(s); printf("B4 stream sync after: %.0f us; used dropped by %.0f MiB\n", now_us()-t,(double)((long)u0-(long)used())/(1<<20));
  } else cudaGetLastError();
  // C: cudaFree behind a busy other stream: how long does it wait
  void* q; cudaMalloc(&q,B); cudaDeviceSynchronize(); spin<<<1,1,0,s>>>(100000000LL);
  t=now_us(); cudaFree(q); printf("C cudaFree behind a 100 ms kernel on another stream: %.0f us\n",now_us()-t);
  // D: a batch of cudaFree where the launcher keeps the device busy (queue depth)
  return 0; }
