// SPDX-License-Identifier: MIT
// What the probes share: a clock, a launching thread that measures how long
// each of its launches waits (launcher(): started with pthread_create, it
// launches an empty kernel on a stream of its own until stop_flag is set,
// then leaves its slowest launch in max_launch_us and its count in
// nlaunch), and the device's memory in use.
#include <cuda_runtime.h>
#include <pthread.h>
#include <time.h>
#include <atomic>
static double now_us(){ timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3; }
__global__ void tiny(){}
static std::atomic<int> stop_flag; static double max_launch_us; static long nlaunch;
static void* launcher(void*){ cudaStream_t s; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking); double mx=0; long n=0;
  while(!stop_flag.load()){ double t=now_us(); tiny<<<1,1,0,s>>>(); double d=now_us()-t; if(d>mx)mx=d; n++; if(n%256==0) cudaStreamSynchronize(s);}
  cudaStreamSynchronize(s); max_launch_us=mx; nlaunch=n; return 0; }
static size_t used(){ size_t f,t; cudaMemGetInfo(&f,&t); return t-f; }
