/* Stream identity, with a one-stream cache per thread (see the header). */
#include "stream_identity.h"

/* The last created stream this thread asked about.  A stream handle can be
 * destroyed and its value reused; then recording on it fails (another
 * device) and the caller forgets this and asks again, or an entry joins the
 * old stream's FIFO, which only delays it: every entry waits for its own
 * event. */
static _Thread_local struct {
    cudaStream_t handle;
    int device;
    unsigned long long id;
    bool valid;
} last_stream;

cudaError_t stream_identity_lookup(cudaStream_t stream, int *device,
                                   unsigned long long *id, bool *cached,
                                   const char **failed)
{
    bool special = stream_is_special(stream);
    *cached = !special && last_stream.valid && last_stream.handle == stream;
    if (*cached) {
        *device = last_stream.device;
        *id = last_stream.id;
        return cudaSuccess;
    }
    cudaError_t err = cudaStreamGetDevice(stream, device);
    if (err != cudaSuccess) {
        *failed = "cudaStreamGetDevice";
        return err;
    }
    if ((err = cudaStreamGetId(stream, id)) != cudaSuccess) {
        *failed = "cudaStreamGetId";
        return err;
    }
    if (!special)
        last_stream.handle = stream, last_stream.device = *device,
        last_stream.id = *id, last_stream.valid = true;
    return cudaSuccess;
}

void stream_identity_forget(void)
{
    last_stream.valid = false;
}
