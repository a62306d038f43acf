/* Diagnostics on stderr, one whole line per message (one fprintf call, so
 * lines of concurrent threads do not interleave). */
#include "report.h"

#include <stdarg.h>
#include <stdio.h>

void report(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudefer: %s\n", line);
}

void report_cuda(const char *what, const char *call, cudaError_t err,
                 const char *detail)
{
    /* The runtime is unloading: the process is exiting, every call fails
     * alike, and the failures are counted; a line each says nothing. */
    if (err == cudaErrorCudartUnloading)
        return;
    report("%s: %s failed: %s (%s)%s", what, call, cudaGetErrorString(err),
           cudaGetErrorName(err), detail);
}

bool report_cuda_error_is_sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorTensorMemoryLeak:
        return true;
    default:
        return false;
    }
}
