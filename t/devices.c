/* SPDX-License-Identifier: MIT */
/* Four devices: each entry's event lives on its stream's device whatever the
 * caller's current device, the caller's device is left alone, and the
 * reclaimer touches only devices the application used. */
#include "helpers.h"

#define NDEV 4
#define PER_DEVICE 50

int main(void)
{
    plan_lazy();
    fake_reset(NDEV);
    cudaStream_t s[NDEV - 1];
    fake_work *gate[NDEV - 1];
    void *p[NDEV - 1][PER_DEVICE];
    /* Devices 0..2 get work; device 3 is never used. */
    for (int d = 0; d < NDEV - 1; d++) {
        cudaSetDevice(d);
        s[d] = stream_new();
        gate[d] = work_held(s[d], NULL);
        for (int i = 0; i < PER_DEVICE; i++) {
            p[d][i] = device_alloc(128);
            work_timed(s[d], 10, p[d][i]);
        }
    }
    int accepted = 0, device_kept = 1;
    for (int i = 0; i < PER_DEVICE; i++)
        for (int d = 0; d < NDEV - 1; d++) {
            int caller = (d + 1) % (NDEV - 1); /* another device is current */
            cudaSetDevice(caller);
            accepted += defer_free(p[d][i], s[d]) == cudaSuccess;
            int now;
            cudaGetDevice(&now);
            device_kept &= now == caller;
        }
    is_int(accepted, (NDEV - 1) * PER_DEVICE,
           "every defer_free accepted while another device is current");
    ok(device_kept, "the caller's current device is unchanged");
    sleep_ms(10);
    is_int(fake_live_allocations(), (NDEV - 1) * PER_DEVICE,
           "nothing released while each device's stream is held");
    fake_complete(gate[1]);
    ok(wait_released(p[1][PER_DEVICE - 1], 10000), "device 1's entries released");
    is_int(fake_live_allocations(), 2 * PER_DEVICE, "devices 0 and 2 still held");
    fake_complete(gate[0]);
    fake_complete(gate[2]);
    is_int(defer_flush(), cudaSuccess, "flush");
    is_int(fake_live_allocations(), 0, "every device's entries released");
    is_int(fake_device_touched(NDEV - 1), 0,
           "the unused device was never touched (no context created)");
    is_int(defer_shutdown(), cudaSuccess, "shutdown");
    is_int(fake_live_events(), 0, "events of every device destroyed");
    is_int(fake_violations(), 0, "oracle: no premature or double release");
    return 0;
}
