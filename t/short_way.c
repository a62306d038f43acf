/* SPDX-License-Identifier: MIT */
/* defer_pluggable_free's short way (src/submit_pluggable.c, Note [The
 * short way]): a block of the cache freed on the legacy stream by a thread
 * that has the stream's identity cached.  Each scenario warms the identity
 * with a first free, then checks that every outcome is the common path's:
 * a parked block joins the batch with no CUDA call of the calling thread
 * and is reusable on the stream at once; a block freed twice, a pointer
 * inside a block, a block recorded on another stream, memory that is not
 * a block, a size PyTorch says wrongly, CUDEFER_DISABLE; and where it is
 * not taken (a thread's first free, a callback's free) the same outcome. */
#include <pthread.h>
#include <string.h>

#include "helpers.h"

static const size_t KiB = 1024;

/* The lines of text. */
static int lines_of(const char *text)
{
    int n = 0;
    for (; *text != '\0'; text++)
        n += *text == '\n';
    return n;
}

/* This thread's identity of the legacy stream cached: a block allocated
 * and freed there, its batch sealed and released. */
static void warm(void)
{
    void *p = defer_pluggable_alloc(64 * KiB, 0, 0);
    CHECK(p != NULL, "a block");
    defer_pluggable_free(p, 64 * KiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess, "flush");
}

/* The CUDA calls this thread made of the kinds a free could make. */
static unsigned long own_calls(void)
{
    static const enum fake_call kinds[] = {
        FAKE_GET_DEVICE, FAKE_SET_DEVICE, FAKE_STREAM_IS_CAPTURING,
        FAKE_STREAM_GET_ID, FAKE_STREAM_GET_DEVICE, FAKE_EVENT_RECORD,
        FAKE_EVENT_CREATE};
    unsigned long n = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        n += fake_thread_calls(kinds[i]);
    return n;
}

/* A block in use on the legacy stream, freed: parked in the batch with no
 * CUDA call, reusable there at once, released once its work is done. */
static void parked(void)
{
    warm();
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    fake_work *w = work_held(0, p);
    struct defer_stats before = stats_now();
    unsigned long calls = own_calls();
    stderr_capture_begin();
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0', "nothing said (%s)", said);
    CHECK(own_calls() == calls, "no CUDA call (%lu)", own_calls() - calls);
    CHECK(stats_now().deferred == before.deferred + 1, "deferred");
    void *q = NULL;
    CHECK(alloc_checked(&q, 256 * KiB, 0) == cudaSuccess && q == p,
          "reused on the legacy stream at once (%p, %p)", q, p);
    defer_pluggable_free(q, 256 * KiB, 0, 0);
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().pending == 0 && stats_now().rejected == 0,
          "released, nothing refused");
}

/* The same block freed twice: the second refused in one line, counted,
 * the first free unharmed. */
static void freed_twice(void)
{
    warm();
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    fake_work *w = work_held(0, p);
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(lines_of(said) == 1 &&
              has_line(said, "defer_pluggable_free", "freed twice", NULL),
          "one line naming defer_pluggable_free (%s)", said);
    CHECK(strstr(said, "defer_alloc") == NULL,
          "and no call PyTorch never made (%s)", said);
    CHECK(stats_now().rejected == rejected + 1, "counted in rejected");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(stats_now().pending == 0, "the first free released");
}

/* A pointer inside a live block: refused in one line; the block stays
 * live and is freed after. */
static void inside(void)
{
    warm();
    char *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    uint64_t rejected = stats_now().rejected;
    stderr_capture_begin();
    defer_pluggable_free(p + 4096, 4096, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(lines_of(said) == 1 &&
              has_line(said, "defer_pluggable_free", "inside a live block",
                       NULL),
          "one line saying it points inside a block (%s)", said);
    CHECK(strstr(said, "defer_alloc") == NULL,
          "and no call PyTorch never made (%s)", said);
    CHECK(stats_now().rejected == rejected + 1, "counted in rejected");
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess && stats_now().pending == 0,
          "the block freed after");
}

/* A block recorded on a created stream (defer_record_stream): its free on
 * the legacy stream waits for both; not reused before that stream's work
 * is done (the oracle checks every reuse). */
static void recorded(void)
{
    warm();
    cudaStream_t s = stream_new();
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    fake_work *ws = work_held(s, p);
    CHECK(defer_record_stream(p, s) == cudaSuccess, "recorded on s");
    stderr_capture_begin();
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0', "nothing said (%s)", said);
    void *q = NULL;
    CHECK(alloc_checked(&q, 256 * KiB, 0) == cudaSuccess && q != p,
          "not reused while s's work is pending");
    fake_complete(ws);
    defer_pluggable_free(q, 256 * KiB, 0, 0);
    CHECK(defer_flush() == cudaSuccess && stats_now().pending == 0,
          "released once s's work is done");
}

/* Memory that is no block of the cache (cudaMalloc's): deferred as a free
 * of its own, released once the legacy stream's work is done. */
static void not_a_block(void)
{
    warm();
    void *m = device_alloc(128 * KiB);
    fake_work *w = work_held(0, m);
    stderr_capture_begin();
    defer_pluggable_free(m, 128 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(said[0] == '\0', "nothing said (%s)", said);
    sleep_ms(20);
    CHECK(fake_is_released(m) == 0, "kept while its work is pending");
    fake_complete(w);
    CHECK(wait_released(m, 5000), "released once its work is done");
    CHECK(stats_now().rejected == 0, "nothing refused");
}

/* A size PyTorch says larger than the block's: said in one line, freed
 * all the same. */
static void wrong_size(void)
{
    warm();
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    stderr_capture_begin();
    defer_pluggable_free(p, 1024 * KiB, 0, 0);
    const char *said = stderr_capture_end();
    CHECK(lines_of(said) == 1 &&
              has_line(said, "defer_pluggable_free", "freed all the same",
                       NULL),
          "one line saying the size (%s)", said);
    CHECK(defer_flush() == cudaSuccess && stats_now().pending == 0 &&
              stats_now().rejected == 0,
          "freed, nothing refused");
}

/* A thread with no identity of the legacy stream cached takes the common
 * path for its first free and the short way for its second: both parked,
 * neither says anything, both reused at once on the stream. */
struct fresh {
    void *p[2];
    bool reused[2];
    const char *said;
};

static void *free_on_fresh_thread(void *arg)
{
    struct fresh *f = arg;
    stderr_capture_begin();
    for (int i = 0; i < 2; i++) {
        defer_pluggable_free(f->p[i], 256 * KiB, 0, 0);
        void *q = NULL;
        f->reused[i] =
            alloc_checked(&q, 256 * KiB, 0) == cudaSuccess && q == f->p[i];
        f->p[i] = q;
    }
    f->said = stderr_capture_end();
    return NULL;
}

static void fresh_thread(void)
{
    warm();
    struct fresh f = {{NULL, NULL}, {false, false}, NULL};
    fake_work *w[2];
    for (int i = 0; i < 2; i++) {
        f.p[i] = defer_pluggable_alloc(256 * KiB, 0, 0);
        w[i] = work_held(0, f.p[i]);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, free_on_fresh_thread, &f) != 0)
        bail("pthread_create");
    pthread_join(t, NULL);
    CHECK(f.said[0] == '\0', "nothing said (%s)", f.said);
    CHECK(f.reused[0] && f.reused[1],
          "both reused on the legacy stream at once (%d, %d)", f.reused[0],
          f.reused[1]);
    for (int i = 0; i < 2; i++) {
        defer_pluggable_free(f.p[i], 256 * KiB, 0, 0);
        fake_complete(w[i]);
    }
    CHECK(defer_flush() == cudaSuccess && stats_now().pending == 0 &&
              stats_now().rejected == 0,
          "released, nothing refused");
}

/* A callback's free (the reclaimer thread, which joins no batch: the
 * common path, an event of its own) of a block on the legacy stream:
 * released once its stream's work is done, as any. */
static void *callback_block;

static void free_in_callback(void *arg)
{
    (void)arg;
    defer_pluggable_free(callback_block, 256 * KiB, 0, 0);
}

static void in_callback(void)
{
    warm();
    callback_block = defer_pluggable_alloc(256 * KiB, 0, 0);
    fake_work *w = work_held(0, callback_block);
    uint64_t deferred = stats_now().deferred;
    CHECK(defer_call(free_in_callback, NULL, 0) == cudaSuccess,
          "the callback deferred");
    fake_complete(w);
    CHECK(defer_flush() == cudaSuccess, "flush");
    CHECK(defer_flush() == cudaSuccess, "flush its free");
    struct defer_stats st = stats_now();
    CHECK(st.deferred == deferred + 2 && st.pending == 0 && st.rejected == 0,
          "the callback's free deferred and released (deferred +%llu, "
          "pending %llu)", ULL(st.deferred - deferred), ULL(st.pending));
}

/* CUDEFER_DISABLE: the free is released at the call, after the stream's
 * work, as the common path releases it. */
static void disabled(void)
{
    warm();
    void *p = defer_pluggable_alloc(256 * KiB, 0, 0);
    uint64_t sync = stats_now().sync_releases;
    defer_pluggable_free(p, 256 * KiB, 0, 0);
    CHECK(stats_now().sync_releases == sync + 1 &&
              stats_now().pending == 0,
          "released synchronously (%llu)",
          ULL(stats_now().sync_releases - sync));
}

int main(void)
{
    plan_lazy();
    fork_scenario("short way: a parked block, no CUDA call, reused at once",
                  "", 1, 30000, parked);
    fork_scenario("short way: freed twice, refused in one line", "", 1,
                  30000, freed_twice);
    fork_scenario("short way: inside a block, refused in one line", "", 1,
                  30000, inside);
    fork_scenario("short way: recorded on another stream, waits for it", "",
                  1, 30000, recorded);
    fork_scenario("short way: not a block, deferred on its own", "", 1,
                  30000, not_a_block);
    fork_scenario("short way: a wrong size said, freed all the same", "", 1,
                  30000, wrong_size);
    fork_scenario("short way: a thread's first free takes the common path, "
                  "its second the short way, both parked", "", 1, 30000,
                  fresh_thread);
    fork_scenario("short way: not taken by a callback's free", "", 1, 30000,
                  in_callback);
    fork_scenario("short way: CUDEFER_DISABLE releases at the call",
                  "CUDEFER_DISABLE=1", 1, 30000, disabled);
    return 0;
}
