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

cudaError_t block_users_enter(const struct block_user *u,
                              struct cuda_switch *sw, const char **call)
{
    if (!stream_is_special(u->handle) || u->device < 0)
        return cudaSuccess;
    return cuda_switch_device(sw, u->device, call);
}

/* The device a special handle of u names: its own, or the caller's. */
static bool device_of(const struct block_user *u, struct cuda_switch *sw,
                      int *device)
{
    if (u->device >= 0) {
        *device = u->device;
        return true;
    }
    return cuda_switch_caller_device(sw, device) == cudaSuccess;
}

bool block_users_same(const struct block_user *u, const struct block_user *v,
                      struct cuda_switch *sw)
{
    if (u->handle != v->handle)
        return false;
    if (!stream_is_special(u->handle))
        return true;
    int du, dv;
    return device_of(u, sw, &du) && device_of(v, sw, &dv) && du == dv;
}
