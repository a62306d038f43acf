/* SPDX-License-Identifier: MIT */
/* Release policy: which held entries to release, and when (see the header). */
#include "release_policy.h"

#include <stddef.h>

#define NS_PER_US UINT64_C(1000)
#define NS_PER_MS UINT64_C(1000000)

bool release_policy_release_at_once(const struct defer_config *cfg,
                                    const struct entry *e)
{
    return cfg->policy == DEFER_POLICY_EAGER || e->kind == ENTRY_CALL ||
           e->synced ||
           e->cache_blocks || (e->held_bytes == 0 && e->pool);
}

static bool too_old(const struct defer_config *cfg, const struct entry *e,
                    uint64_t now_ns)
{
    return cfg->max_delay_ms != 0 &&
           now_ns - e->completed_ns >= cfg->max_delay_ms * NS_PER_MS;
}

uint64_t release_policy_quiet_at(const struct defer_config *cfg,
                                 const struct policy_view *v)
{
    return v->work_pending ? UINT64_MAX
                           : v->last_activity_ns + cfg->idle_us * NS_PER_US;
}

bool release_policy_quiet(const struct defer_config *cfg,
                          const struct policy_view *v)
{
    return release_policy_quiet_at(cfg, v) <= v->now_ns;
}

enum release_reason release_policy_decide(const struct defer_config *cfg,
                                          const struct held_list *h,
                                          const struct policy_view *view)
{
    if (h->head == NULL)
        return RELEASE_NONE;
    if (view->demand || cfg->policy == DEFER_POLICY_EAGER)
        return RELEASE_DEMAND;
    if (h->bytes > h->cap)
        return RELEASE_CAP;
    if (release_policy_quiet(cfg, view))
        return RELEASE_IDLE;
    if (too_old(cfg, h->head, view->now_ns))
        return RELEASE_AGE;
    return RELEASE_NONE;
}

bool release_policy_continue(const struct defer_config *cfg,
                             const struct held_list *h,
                             enum release_reason reason, uint64_t now_ns)
{
    if (h->head == NULL)
        return false;
    switch (reason) {
    case RELEASE_CAP:
        return h->bytes > h->cap / 2;
    case RELEASE_AGE:
        return too_old(cfg, h->head, now_ns);
    case RELEASE_DEMAND:
    case RELEASE_IDLE:
        return true;
    case RELEASE_NONE:
        break;
    }
    return false;
}

uint64_t release_policy_wait_ns(const struct defer_config *cfg,
                                const struct held_list *h,
                                const struct policy_view *view)
{
    if (h->head == NULL)
        return UINT64_MAX;
    uint64_t wait = UINT64_MAX;
    uint64_t idle_at = release_policy_quiet_at(cfg, view);
    if (idle_at != UINT64_MAX)
        wait = idle_at > view->now_ns ? idle_at - view->now_ns : 0;
    if (cfg->max_delay_ms != 0) {
        uint64_t old_at = h->head->completed_ns + cfg->max_delay_ms * NS_PER_MS;
        uint64_t age_wait = old_at > view->now_ns ? old_at - view->now_ns : 0;
        if (age_wait < wait)
            wait = age_wait;
    }
    return wait;
}

bool release_policy_cap_follows_use(const struct defer_config *cfg)
{
    return cfg->max_pending_bytes == 0;
}

uint64_t release_policy_cap(const struct defer_config *cfg,
                            uint64_t total_bytes, uint64_t free_bytes,
                            uint64_t held_bytes)
{
    if (!release_policy_cap_follows_use(cfg))
        return cfg->max_pending_bytes;
    uint64_t used = total_bytes > free_bytes ? total_bytes - free_bytes : 0;
    uint64_t app = used > held_bytes ? used - held_bytes : 0;
    uint64_t cap = app / RELEASE_POLICY_CAP_SHARE, most = total_bytes / 4;
    if (cap < RELEASE_POLICY_CAP_FLOOR)
        cap = RELEASE_POLICY_CAP_FLOOR;
    return cap < most ? cap : most;
}
