// SPDX-License-Identifier: MIT
// When does cudaFreeAsync of cudaMalloc memory on an idle private stream give
// the memory back, and what does forcing it cost while another stream is busy?
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double now_us(){ timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3; }
__global__ void spin_ns(unsigned long long ns){ unsigned long long s; asm volatile("mov.u64 %0, %%globaltimer;":"=l"(s)); unsigned long long n=s; while(n-s<ns) asm volatile("mov.u64 %0, %%globaltimer;":"=l"(n)); }
static long used_mib(){ size_t f,t; cudaMemGetInfo(&f,&t); return (long)((t-f)>>20); }
int main(){
  cudaFree(0); cudaStream_t s,s2; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2,cudaStreamNonBlocking);
  const int N=500; void* p[N]; const size_t B=1<<20;
  const char* what[]={"nothing (sleep 5 ms)","cudaStreamQuery(s2)","cudaStreamSynchronize(s2)","cudaMalloc 1 MiB","cudaEventRecord+Query on s2","cudaDeviceSynchronize","cudaMemGetInfo x3 after sleep 50 ms","cudaMalloc 2 MiB x1 then sleep","cudaMemPoolTrimTo default pool"};
  for(int m=0;m<9;m++){
    for(int i=0;i<N;i++) cudaMalloc(&p[i],B); cudaDeviceSynchronize();
    long u0=used_mib();
    spin_ns<<<1,1,0,s>>>(300000000ull); // 300 ms busy on another stream
    double t=now_us(); for(int i=0;i<N;i++) cudaFreeAsync(p[i],s2); double tf=now_us()-t;
    long u1=used_mib(); double tc=0; void* q=0; cudaEvent_t ev; cudaEventCreateWithFlags(&ev,cudaEventDisableTiming);
    t=now_us();
    switch(m){ case 0: usleep(5000); break; case 1: cudaStreamQuery(s2); break; case 2: cudaStreamSynchronize(s2); break;
      case 3: cudaMalloc(&q,B); break; case 4: cudaEventRecord(ev,s2); cudaEventQuery(ev); break; case 5: cudaDeviceSynchronize(); break;
      case 6: usleep(50000); used_mib(); used_mib(); break; case 7: cudaMalloc(&q,2*B); usleep(5000); break;
      case 8: { cudaMemPool_t mp; cudaDeviceGetDefaultMemPool(&mp,0); cudaMemPoolTrimTo(mp,0);} break; }
    tc=now_us()-t; long u2=used_mib();
    cudaDeviceSynchronize(); long u3=used_mib(); if(q) cudaFree(q);
    printf("%-38s frees %.2f us/call; released before: %ld MiB, after the call: %ld MiB (call %.0f us), after device sync: %ld MiB\n",
      what[m], tf/N, u0-u1, u0-u2, tc, u0-u3);
    cudaEventDestroy(ev);
  }
  return 0; }
