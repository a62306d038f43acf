/* Diagnostics: every message cudefer prints goes to stderr as one line that
 * starts with "cudefer: ". */
#ifndef CUDEFER_REPORT_H
#define CUDEFER_REPORT_H

#include <stdbool.h>
#include <cuda_runtime_api.h>

/* Any thread.  Prints "cudefer: <message>\n" on stderr. */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Any thread.  Prints "cudefer: <what>: <call> failed: <error string>
 * (<error name>)<detail>"; detail may be "".  Prints nothing for
 * cudaErrorCudartUnloading (the process is exiting). */
void report_cuda(const char *what, const char *call, cudaError_t err,
                 const char *detail);

/* Any thread.  True for the errors that leave the device's context unusable
 * (a kernel fault): every later call on it fails the same way. */
bool report_cuda_error_is_sticky(cudaError_t err);

#endif
