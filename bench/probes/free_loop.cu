// SPDX-License-Identifier: MIT
// Probe: W1's loop (cudaMalloc 1 MiB, 50 us kernel, release) with the memory never freed, freed
// with cudaFree, or freed with cudaFreeAsync on the same or another stream; and
// whether frees completing on a stream hold up another thread's launches.
#include <stdio.h>
#include <unistd.h>

#include "probe.h"

__global__ void spin_ns(unsigned long long ns){ unsigned long long s; asm volatile("mov.u64 %0, %%globaltimer;":"=l"(s)); unsigned long long n=s; while(n-s<ns) asm volatile("mov.u64 %0, %%globaltimer;":"=l"(n)); }
enum { NEVER, SYNCFREE, ASYNCFREE, ASYNCFREE_OTHER };
static const char* nm[]={"never-free","inline-cudaFree","cudaFreeAsync same stream","cudaFreeAsync other stream after event"};
static void* kept[6000];
int main(){
  cudaFree(0); cudaStream_t s,s2; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2,cudaStreamNonBlocking);
  const int IT=5000; const size_t B=1<<20; cudaEvent_t ev; cudaEventCreateWithFlags(&ev,cudaEventDisableTiming);
  for(int rep=0;rep<3;rep++) for(int m=0;m<4;m++){
    for(int w=0;w<32;w++){ void*p; cudaMalloc(&p,B); spin_ns<<<1,1,0,s>>>(50000); cudaFreeAsync(p,s);} cudaDeviceSynchronize();
    size_t u0=used(), peak=0; double first=0;
    double t=now_us();
    for(int i=0;i<IT;i++){ void*p; cudaMalloc(&p,B); spin_ns<<<1,1,0,s>>>(50000);
      if(m==NEVER) kept[i]=p; else if(m==SYNCFREE) cudaFree(p);
      else if(m==ASYNCFREE){ double a=now_us(); cudaFreeAsync(p,s); if(i==0) first=now_us()-a; }
      else { cudaEventRecord(ev,s); cudaStreamWaitEvent(s2,ev,0); cudaFreeAsync(p,s2); }
      if(i%250==0){ size_t u=used()-u0; if(u>peak)peak=u; } }
    cudaDeviceSynchronize(); double d=now_us()-t; size_t u=used()-u0; if(u>peak)peak=u;
    if(m==NEVER) for(int i=0;i<IT;i++) cudaFree(kept[i]);
    printf("rep %d %-40s done %.1f ms  peak +%zu MiB  first call %.1f us\n",rep,nm[m],d/1e3,peak>>20,first);
  }
  // E2: launcher latency while frees complete on a stream
  void* p[1000]; for(int i=0;i<1000;i++) cudaMalloc(&p[i],B); cudaDeviceSynchronize();
  stop_flag=0; pthread_t th; pthread_create(&th,0,launcher,0); usleep(10000);
  spin_ns<<<1,1,0,s>>>(20000000); for(int i=0;i<1000;i++){ cudaFreeAsync(p[i],s); spin_ns<<<1,1,0,s>>>(20000);} cudaStreamSynchronize(s);
  usleep(5000); stop_flag=1; pthread_join(th,0);
  printf("E2 launcher while 1000 async frees of cudaMalloc memory complete: max launch %.1f us, %ld launches\n",max_launch_us,nlaunch);
  stop_flag=0; pthread_create(&th,0,launcher,0); usleep(10000);
  spin_ns<<<1,1,0,s>>>(20000000); for(int i=0;i<1000;i++){ spin_ns<<<1,1,0,s>>>(20000);} cudaStreamSynchronize(s);
  usleep(5000); stop_flag=1; pthread_join(th,0);
  printf("E3 same without frees: max launch %.1f us, %ld launches\n",max_launch_us,nlaunch);
  return 0; }
