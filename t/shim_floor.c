/* bench/torch_shims.c's pluggable-floor pair (a bound row of the training
 * benchmark) on the fake runtime: a block freed on a stream comes back to
 * the next request of exactly its size on that stream, at once (stream
 * order: the oracle accepts it while the block's work is pending), and to
 * no other size or stream; a request no list serves is a new allocation. */
#include "helpers.h"

void *shim_floor_alloc(size_t size, int device, cudaStream_t stream);
void shim_floor_free(void *ptr, size_t size, int device, cudaStream_t stream);

int main(void)
{
    plan_lazy();
    fake_reset(1);
    cudaStream_t s = stream_new(), t = stream_new();

    void *a = shim_floor_alloc(1 << 20, 0, s);
    ok(a != NULL, "a first request is served (cudaMalloc)");
    fake_work *w = work_held(s, a);
    shim_floor_free(a, 1 << 20, 0, s);
    void *b = shim_floor_alloc(1 << 20, 0, s);
    ok(b == a, "the same size on the same stream gets the freed block back");
    fake_oracle_handout(b, s);
    is_int(fake_violations(), 0, "while its work is pending (stream order)");
    shim_floor_free(b, 1 << 20, 0, s);

    void *c = shim_floor_alloc(1 << 20, 0, t);
    ok(c != NULL && c != a, "another stream does not get it");
    void *d = shim_floor_alloc((1 << 20) + 512, 0, s);
    ok(d != NULL && d != a, "another size does not get it");
    void *e = shim_floor_alloc(1 << 20, 0, s);
    ok(e == a, "it is still there for its own size and stream");

    fake_complete(w);
    is_int(fake_violations(), 0, "oracle: nothing reused early");
    return 0;
}
