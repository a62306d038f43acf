/* Helpers for the fake-runtime tests (see helpers.h). */
#define _GNU_SOURCE
#include "helpers.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void *device_alloc(size_t bytes)
{
    void *p;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMalloc: %s", cudaGetErrorString(err));
    return p;
}

void *host_alloc(size_t bytes)
{
    void *p;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess)
        bail("cudaMallocHost: %s", cudaGetErrorString(err));
    return p;
}

cudaStream_t stream_new(void)
{
    cudaStream_t s;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess)
        bail("cudaStreamCreate: %s", cudaGetErrorString(err));
    return s;
}

fake_work *work_held(cudaStream_t s, void *p)
{
    fake_work *w = fake_launch_held(s, &p, p != NULL);
    if (w == NULL)
        bail("fake_launch_held on an invalid stream");
    return w;
}

fake_work *work_timed(cudaStream_t s, unsigned us, void *p)
{
    fake_work *w = fake_launch(s, us, &p, p != NULL);
    if (w == NULL)
        bail("fake_launch on an invalid stream");
    return w;
}

void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

bool wait_released(const void *p, unsigned timeout_ms)
{
    for (unsigned waited = 0; fake_is_released(p) != 1; waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

bool wait_flag(const volatile int *flag, unsigned timeout_ms)
{
    for (unsigned waited = 0; !__atomic_load_n(flag, __ATOMIC_ACQUIRE); waited++) {
        if (waited >= timeout_ms)
            return false;
        sleep_ms(1);
    }
    return true;
}

struct defer_stats stats_now(void)
{
    struct defer_stats s;
    defer_stats_get(&s);
    return s;
}

static int saved_stderr = -1;
static FILE *capture;

void stderr_capture_begin(void)
{
    fflush(stderr);
    capture = tmpfile();
    if (capture == NULL)
        sysbail("tmpfile");
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(capture), STDERR_FILENO);
}

const char *stderr_capture_end(void)
{
    static char text[8192];
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    rewind(capture);
    size_t n = fread(text, 1, sizeof text - 1, capture);
    text[n] = '\0';
    fclose(capture);
    if (n > 0)
        diag("stderr: %s", text);
    return text;
}
