/* Helpers shared by the fake-runtime tests: allocations, simulated work,
 * waiting with a deadline, and capturing what the library prints. */
#ifndef CUDEFER_TEST_HELPERS_H
#define CUDEFER_TEST_HELPERS_H

#include <stdbool.h>
#include <stddef.h>

#include "cudefer.h"
#include "fake_cuda.h"
#include "tap.h"

/* cudaMalloc / cudaMallocHost / cudaStreamCreate, or bail. */
void *device_alloc(size_t bytes);
void *host_alloc(size_t bytes);
cudaStream_t stream_new(void);

/* Simulated work on s that uses p: held until fake_complete, or timed. */
fake_work *work_held(cudaStream_t s, void *p);
fake_work *work_timed(cudaStream_t s, unsigned us, void *p);

void sleep_ms(unsigned ms);

/* Poll until fake_is_released(p) == 1, at most timeout_ms; true if so. */
bool wait_released(const void *p, unsigned timeout_ms);

/* Poll until *flag becomes nonzero, at most timeout_ms; true if so. */
bool wait_flag(const volatile int *flag, unsigned timeout_ms);

struct defer_stats stats_now(void);

/* Capture what is written to stderr between begin and end; end returns it
 * (static buffer, NUL-terminated) and echoes it as TAP diagnostics. */
void stderr_capture_begin(void);
const char *stderr_capture_end(void);

#endif
