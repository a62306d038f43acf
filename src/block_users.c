/* The streams a free's blocks were recorded on (block_users.h). */
#include "block_users.h"

#include "block_cache.h"
#include "block_recorded.h"
#include "stream_identity.h"

size_t block_users_of(const struct request_args *a, struct block_user *out)
{
    if (a->kind != ENTRY_FREE_DEVICE || !block_cache_active())
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < a->nptrs; i++) {
        struct block_user mine[BLOCK_MAX_RECORDED];
        size_t k = block_recorded_of(a->ptrs[i], mine);
        for (size_t j = 0; j < k; j++) {
            bool seen = false;
            for (size_t m = 0; out != NULL && m < n && m < 64 && !seen; m++)
                seen = out[m].handle == mine[j].handle &&
                       out[m].device == mine[j].device;
            if (!seen && out != NULL && n < 64)
                out[n] = mine[j];
            n += !seen;
        }
    }
    return n;
}

/* The device current now, asked once. */
static cudaError_t current(struct device_switch *sw, int *device)
{
    if (sw->caller < 0) {
        cudaError_t err = cudaGetDevice(&sw->caller);
        if (err != cudaSuccess) {
            sw->caller = -1;
            return err;
        }
        sw->on = sw->caller;
    }
    *device = sw->on;
    return cudaSuccess;
}

cudaError_t block_users_enter(const struct block_user *u,
                              struct device_switch *sw)
{
    if (!stream_is_special(u->handle) || u->device < 0)
        return cudaSuccess;
    int on;
    cudaError_t err = current(sw, &on);
    if (err != cudaSuccess || on == u->device)
        return err;
    if ((err = cudaSetDevice(u->device)) == cudaSuccess)
        sw->on = u->device;
    return err;
}

void block_users_leave(struct device_switch *sw)
{
    if (sw->caller >= 0 && sw->on != sw->caller)
        cudaSetDevice(sw->caller);
    sw->on = sw->caller;
}

/* The device a special handle of u names: its own, or the caller's. */
static bool device_of(const struct block_user *u, struct device_switch *sw,
                      int *device)
{
    if (u->device >= 0) {
        *device = u->device;
        return true;
    }
    int ignored;
    if (current(sw, &ignored) != cudaSuccess)
        return false;
    *device = sw->caller;
    return true;
}

bool block_users_same(const struct block_user *u, const struct block_user *v,
                      struct device_switch *sw)
{
    if (u->handle != v->handle)
        return false;
    if (!stream_is_special(u->handle))
        return true;
    int du, dv;
    return device_of(u, sw, &du) && device_of(v, sw, &dv) && du == dv;
}
