/* SPDX-License-Identifier: MIT */
/* The header's limit of defer_record_stream: a recorded stream must exist
 * until the block is freed.  Destroyed before the free, the free is
 * refused (cudaErrorInvalidResourceHandle), said as a recorded stream gone,
 * not as a stream the caller gave, counted once; the caller keeps the
 * block, which no free takes while the handle names no stream.  A new
 * stream given that handle is waited for instead (the destroyed one's work
 * is not). */
#include <string.h>

#include "helpers.h"

static void destroyed_then_freed(bool pluggable, bool disabled)
{
    const char *how = pluggable ? "defer_pluggable_free" : "defer_free";
    cudaStream_t s = stream_new(), side = stream_new();
    void *p = NULL;
    CHECK(alloc_checked(&p, 4096, s) == cudaSuccess, "a block on s");
    CHECK(defer_record_stream(p, side) == cudaSuccess, "recorded on side");
    cudaStreamDestroy(side);
    struct defer_stats before = stats_now();
    stderr_capture_begin();
    cudaError_t err = cudaSuccess;
    if (pluggable)
        defer_pluggable_free(p, 4096, 0, s);
    else
        err = defer_free(p, s);
    const char *said = stderr_capture_end();
    CHECK(err == (pluggable ? cudaSuccess : cudaErrorInvalidResourceHandle),
          "%s: refused (%s)", how, cudaGetErrorName(err));
    CHECK(has_line(said, how, "a stream its block was recorded on "
                   "(defer_record_stream) is not a live stream", NULL) &&
              strstr(said, "a stream given") == NULL &&
              strchr(said, '\n') == strrchr(said, '\n'),
          "%s: said in one line, of the recorded stream (%s)", how, said);
    CHECK(!pluggable || strstr(said, "stays allocated") != NULL,
          "%s: the line says the block stays allocated", how);
    CHECK(stats_now().rejected == before.rejected + 1 &&
              stats_now().deferred == before.deferred,
          "%s: counted once in rejected, nothing deferred", how);
    /* The caller keeps the block: live, it may be recorded again. */
    cudaStream_t other = stream_new();
    CHECK(defer_record_stream(p, other) == cudaSuccess,
          "%s: still a live block of the caller's", how);
    if (disabled) /* a free would wait for the held work below */
        return;
    /* A new stream given the handle: the free waits for it. */
    cudaStream_t reused = fake_stream_create_reusing(side);
    fake_work *w = work_held(reused, p);
    CHECK(defer_free(p, s) == cudaSuccess, "%s: freed once the handle "
          "names a stream again", how);
    void *q = NULL;
    CHECK(alloc_checked(&q, 4096, other) == cudaSuccess && q != p,
          "%s: not handed out while the new stream's work runs", how);
    fake_complete(w);
    CHECK(defer_free(q, other) == cudaSuccess && defer_flush() == cudaSuccess,
          "%s: flushed", how);
    cudaStreamDestroy(reused);
    cudaStreamDestroy(other);
    cudaStreamDestroy(s);
}

static void plain(void) { destroyed_then_freed(false, false); }
static void pluggable(void) { destroyed_then_freed(true, false); }
static void plain_disabled(void) { destroyed_then_freed(false, true); }
static void pluggable_disabled(void) { destroyed_then_freed(true, true); }

int main(void)
{
    plan_lazy();
    fork_scenario("a recorded stream destroyed before the free: refused, "
                  "said of that stream", "", 1, 20000, plain);
    fork_scenario("... through defer_pluggable_free", "", 1, 20000,
                  pluggable);
    fork_scenario("a recorded stream destroyed before the free: refused, "
                  "said of that stream", "CUDEFER_DISABLE=1", 1, 20000,
                  plain_disabled);
    fork_scenario("... through defer_pluggable_free", "CUDEFER_DISABLE=1", 1,
                  20000, pluggable_disabled);
    return 0;
}
