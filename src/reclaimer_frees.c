/* SPDX-License-Identifier: MIT */
/* Where the reclaimer gives device memory back: a stream of its own per
 * device, synchronized in slices (Note [Releasing without a drain]).
 * Reclaimer thread only: rs.free_streams is its alone. */
#include "reclaimer_state.h"

#include "cuda.h"
#include "report.h"

/*
 * Note [Releasing without a drain]
 * ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
 * cudaFree waits until the whole device is idle, and other threads' launches
 * and event records wait behind it: each batch the cap forces drains the
 * application's queue, and the GPU then idles while the launching thread
 * refills it.  Measured on an H200 (bench/results/h200-release-sweep.txt):
 * 1 MiB buffers released with cudaFree cost the launch loop W1 1.45x the
 * never-free floor.
 *
 * So device memory from cudaMalloc goes back with cudaFreeAsync on the
 * reclaimer's own stream, where nothing else runs: the entry's work is
 * complete, so the free is ordered after nothing and waits for no other
 * stream.  CUDA unmaps the memory when that stream is synchronized (about
 * 22 us a 1 MiB buffer there, bench/results/h200-probes.txt), without
 * waiting for other streams' work and without holding up launches or event
 * records; only other threads' cudaMalloc and cudaFree wait meanwhile.  The
 * reclaimer synchronizes the stream after every FREE_SYNC_SLICE such frees
 * and at the end of each pass, so the memory is back before a flush or trim
 * returns (sync_frees says what happens when that fails), and no cudaMalloc
 * waits for more than a slice.  W1 then runs at 1.00x the floor; W2 (a host
 * sync every 32 iterations) at 1.19x with slices of 8, 1.25x with 64, 1.29x
 * with one sync a pass.
 *
 * A device without memory pools (cudaDevAttrMemoryPoolsSupported 0) has no
 * cudaFreeAsync: its memory goes back with cudaFree.  A pointer that
 * cudaFreeAsync refuses (memory of another device, say) is freed with
 * cudaFree, which says what is wrong with it if anything is.
 */
#define FREE_SYNC_SLICE 8

cudaStream_t reclaimer_frees_stream(int device)
{
    struct free_stream *f = &rs.free_streams[device];
    if (f->stream != NULL)
        return f->stream;
    cudaError_t err = cuda_stream_create(&f->stream);
    if (err != cudaSuccess) {
        static bool reported; /* once: it is tried again for each entry */
        f->stream = NULL;
        if (!reported)
            cuda_report_failure("reclaimer", "cudaStreamCreateWithFlags", err,
                                "; device memory is freed with cudaFree until "
                                "a stream can be made (reported once)");
        reported = true;
    }
    return f->stream;
}

cudaStream_t reclaimer_frees_stream_of(const struct entry *e)
{
    if (e->kind != ENTRY_FREE_DEVICE)
        return NULL;
    struct free_stream *f = &rs.free_streams[e->device];
    if (!e->pool && f->async == 0)
        f->async = cuda_device_has_pools(e->device) ? 1 : -1;
    return e->pool || f->async > 0 ? reclaimer_frees_stream(e->device) : NULL;
}

/* Blocks until the frees on device's stream ran (never on other streams'
 * work).  A sticky error fails the device, and the requests this pass
 * completes hear of it (end_pass, reclaimer.c): their entries counted
 * released when CUDA took their frees, but the device is gone.  Another
 * error is said once until a sync succeeds, and the frees stay
 * unsynchronized, to be tried again at the next release or pass. */
static void sync_frees(int device)
{
    struct free_stream *f = &rs.free_streams[device];
    cudaError_t err = cuda_stream_synchronize(f->stream);
    if (err == cudaSuccess || cuda_error_is_sticky(err)) {
        f->unsynced = 0;
        f->sync_failure_said = false;
    }
    if (cuda_error_is_sticky(err)) {
        reclaimer_fail_device(device, "cudaStreamSynchronize", err);
        rs.pass_sync_failed = true;
    } else if (err != cudaSuccess && !f->sync_failure_said) {
        cuda_report_failure("release", "cudaStreamSynchronize", err,
                            "; device memory given back comes back when a "
                            "later synchronization succeeds (said once)");
        f->sync_failure_said = true;
    }
}

void reclaimer_frees_queued(int device, unsigned n)
{
    struct free_stream *f = &rs.free_streams[device];
    if (n > 0 && (f->unsynced += n) >= FREE_SYNC_SLICE)
        sync_frees(device);
}

void reclaimer_frees_wait(int device)
{
    if (rs.free_streams[device].stream != NULL)
        sync_frees(device);
}

void reclaimer_frees_sync(void)
{
    for (int d = 0; d < rs.ndevices; d++)
        if (rs.free_streams[d].unsynced > 0)
            sync_frees(d);
}

void reclaimer_frees_destroy(void)
{
    for (int d = 0; d < rs.ndevices; d++) {
        cudaError_t err;
        if (rs.free_streams[d].stream != NULL &&
            device_error(d) == cudaSuccess && reclaimer_use_device(d) &&
            (err = cuda_stream_destroy(rs.free_streams[d].stream)) !=
                cudaSuccess)
            cuda_report_failure("shutdown", "cudaStreamDestroy", err, "");
    }
}
