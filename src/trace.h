/* SPDX-License-Identifier: MIT */
/*
 * Trace: NVTX ranges, so Nsight Systems shows when cudefer releases memory
 * (a range per release batch, named for its reason, and one per release).
 * Without NVTX (configure --disable-nvtx, or no nvtx3 headers) they compile
 * to nothing.  With NVTX but no tool attached they cost a few nanoseconds.
 * Reclaimer thread only.
 */
#ifndef CUDEFER_TRACE_H
#define CUDEFER_TRACE_H

#ifdef CUDEFER_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>

/* The cudefer domain, made on first use (one thread: the reclaimer). */
static inline nvtxDomainHandle_t trace_domain(void)
{
    static nvtxDomainHandle_t domain;
    if (domain == NULL)
        domain = nvtxDomainCreateA("cudefer");
    return domain;
}

static inline void trace_push(const char *name)
{
    nvtxEventAttributes_t attr = {0};
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = name;
    nvtxDomainRangePushEx(trace_domain(), &attr);
}

static inline void trace_pop(void)
{
    nvtxDomainRangePop(trace_domain());
}
#else
static inline void trace_push(const char *name)
{
    (void)name;
}

static inline void trace_pop(void)
{
}
#endif

#endif
