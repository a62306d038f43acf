/*
 * An entry: one deferred release (or callback, or flush request) on its way
 * from a launching thread to the reclaimer.  Made by the launching thread,
 * owned by the reclaimer from the moment it is pushed.
 */
#ifndef CUDEFER_ENTRY_H
#define CUDEFER_ENTRY_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "queue.h"

enum entry_kind {
    ENTRY_FREE_DEVICE, /* cudaFree(ptr) */
    ENTRY_FREE_HOST,   /* cudaFreeHost(ptr) */
    ENTRY_CALL,        /* fn(arg) */
    ENTRY_FLUSH,       /* not work: wake flush->waiter once earlier entries are done */
};

struct flush_request;

struct entry {
    struct queue_node node; /* first: entries are queue nodes */
    struct entry *fifo_next;
    enum entry_kind kind;
    int device;
    unsigned long long stream_id;
    cudaEvent_t event;
    uint64_t seq; /* order of arrival at the reclaimer */
    union {
        void *ptr;
        struct {
            void (*fn)(void *arg);
            void *arg;
        } call;
        struct flush_request *flush;
    } u;
};

static inline struct entry *entry_of_node(struct queue_node *node)
{
    return (struct entry *)node;
}

#endif
