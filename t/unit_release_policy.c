/* SPDX-License-Identifier: MIT */
/* The release policy's decisions at their boundaries (src/release_policy.c),
 * called directly: the cap ("more than" it; a batch stops at half), the
 * age (max_delay_ms, 0 = none), quiet time (idle_us after the last
 * arrival, never while work is pending), demand and eager before all, the
 * wait until the answer changes, and the default cap.  A mutation test
 * found the scenario test of the cap blind to "at" against "above". */
#include <string.h>

#include "cudefer.h"
#include "release_policy.h"
#include "tap.h"

#define MS UINT64_C(1000000)
#define US UINT64_C(1000)

static struct defer_config config(void)
{
    struct defer_config c;
    defer_config_defaults(&c);
    c.max_pending_bytes = 1000;
    c.max_delay_ms = 50;
    c.idle_us = 2000;
    return c;
}

/* A held list of one entry that completed at completed_ns, bytes in all
 * (the entry itself need not hold them: the policy reads the list's). */
static struct held_list held(struct entry *e, uint64_t bytes,
                             uint64_t completed_ns)
{
    memset(e, 0, sizeof *e);
    e->completed_ns = completed_ns;
    struct held_list h;
    memset(&h, 0, sizeof h);
    h.head = h.tail = e;
    h.bytes = bytes;
    h.count = 1;
    h.cap = 1000;
    return h;
}

/* Busy (work pending), now 10 ms after the entry completed. */
static struct policy_view busy(void)
{
    return (struct policy_view){.now_ns = 110 * MS, .last_activity_ns =
                                    110 * MS, .work_pending = true};
}

static void test_cap(void)
{
    struct defer_config c = config();
    struct entry e;
    struct policy_view v = busy();
    struct held_list h = held(&e, 1000, 100 * MS);
    is_int(release_policy_decide(&c, &h, &v), RELEASE_NONE,
           "at the cap: held");
    h.bytes = 1001;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_CAP,
           "one byte above: released for the cap");
    ok(release_policy_continue(&c, &h, RELEASE_CAP, v.now_ns),
       "the batch goes on above half the cap");
    h.bytes = 500;
    ok(!release_policy_continue(&c, &h, RELEASE_CAP, v.now_ns),
       "and stops at half");
    h.bytes = 501;
    ok(release_policy_continue(&c, &h, RELEASE_CAP, v.now_ns),
       "one byte above half: goes on");
}

static void test_age(void)
{
    struct defer_config c = config();
    struct entry e;
    struct policy_view v = busy();
    struct held_list h = held(&e, 10, 100 * MS);
    v.now_ns = 150 * MS - 1;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_NONE,
           "1 ns younger than max_delay_ms: held");
    is_int((long)release_policy_wait_ns(&c, &h, &v), 1,
           "and the policy wakes in 1 ns");
    v.now_ns = 150 * MS;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_AGE,
           "max_delay_ms old: released for its age");
    ok(!release_policy_continue(&c, &h, RELEASE_AGE, 120 * MS),
       "an age batch stops at an entry that is young enough");
    c.max_delay_ms = 0;
    v.now_ns = 3600 * 1000 * MS;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_NONE,
           "max_delay_ms 0: never for its age");
    ok(release_policy_wait_ns(&c, &h, &v) == UINT64_MAX,
       "and nothing to wait for while busy");
}

static void test_quiet(void)
{
    struct defer_config c = config();
    struct entry e;
    struct held_list h = held(&e, 10, 100 * MS);
    struct policy_view v = {.now_ns = 102 * MS - 1,
                            .last_activity_ns = 100 * MS};
    is_int(release_policy_decide(&c, &h, &v), RELEASE_NONE,
           "1 ns short of idle_us after the last arrival: held");
    is_int((long)release_policy_wait_ns(&c, &h, &v), 1,
           "and the policy wakes in 1 ns");
    v.now_ns = 102 * MS;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_IDLE,
           "idle_us after it, nothing pending: released, quiet");
    ok(release_policy_continue(&c, &h, RELEASE_IDLE, v.now_ns),
       "a quiet batch takes everything");
    v.work_pending = true;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_NONE,
           "with work pending never quiet");
    ok(release_policy_quiet_at(&c, &v) == UINT64_MAX, "quiet at: never");
}

static void test_first(void)
{
    struct defer_config c = config();
    struct entry e;
    struct policy_view v = busy();
    struct held_list h = held(&e, 10, 100 * MS);
    v.demand = true;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_DEMAND,
           "a flush, trim or shutdown: everything, first");
    v.demand = false;
    c.policy = DEFER_POLICY_EAGER;
    is_int(release_policy_decide(&c, &h, &v), RELEASE_DEMAND,
           "eager: everything, always");
    struct held_list empty;
    memset(&empty, 0, sizeof empty);
    is_int(release_policy_decide(&c, &empty, &v), RELEASE_NONE,
           "nothing held: nothing to release");
    ok(!release_policy_continue(&c, &empty, RELEASE_DEMAND, v.now_ns),
       "nor to go on with");
    ok(release_policy_wait_ns(&c, &empty, &v) == UINT64_MAX,
       "nor to wait for");
}

static void test_default_cap(void)
{
    const uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
    struct defer_config c = config();
    is_int((long)release_policy_cap(&c, 80 * GiB, 10 * GiB, 0), 1000,
           "max_pending_bytes when set");
    ok(!release_policy_cap_follows_use(&c), "and then it is not asked again");
    c.max_pending_bytes = 0;
    ok(release_policy_cap_follows_use(&c), "auto: the cap follows the use");
    ok(release_policy_cap(&c, 80 * GiB, 68 * GiB, 0) == 2 * GiB,
       "auto: a sixth of what the application uses (12 GiB used)");
    ok(release_policy_cap(&c, 80 * GiB, 64 * GiB, 4 * GiB) == 2 * GiB,
       "what cudefer holds is not the application's (16 GiB used, 4 held)");
    ok(release_policy_cap(&c, 80 * GiB, 80 * GiB, 0) ==
           RELEASE_POLICY_CAP_FLOOR &&
           release_policy_cap(&c, 80 * GiB, 79 * GiB, 0) == 512 * MiB,
       "at least the floor (half a GiB) for a small program");
    ok(release_policy_cap(&c, 80 * GiB, 76 * GiB, 0) == 4 * GiB / 6,
       "a working set of 4 GiB sets the cap: above the floor");
    ok(release_policy_cap(&c, 80 * GiB, 80 * GiB, 5 * GiB) ==
           RELEASE_POLICY_CAP_FLOOR,
       "held more than used (pinned memory): the floor");
    ok(release_policy_cap(&c, 96 * GiB, 0, 0) == 16 * GiB,
       "a device used whole: a sixth of it");
    ok(release_policy_cap(&c, 1 * GiB, 0, 0) == 256 * MiB,
       "a device smaller than four floors: a quarter of it");
}

int main(void)
{
    plan_lazy();
    test_cap();
    test_age();
    test_quiet();
    test_first();
    test_default_cap();
    return 0;
}
