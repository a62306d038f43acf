# SPDX-License-Identifier: MIT
"""bench/thread_states.py PROGRAM [ARGS...]: run a bench program (its last
stdout line a JSON object) and sample every thread's state about every 0.5
ms (/proc/PID/task/*/stat, syscall, comm); print the program's result and
the 25 longest stretches a thread stayed in one state (the same syscall and
first argument, or running) for 5 ms or more.  Linux only.  Also the
sampling bench/stall_stacks.py uses (threads_of)."""
import json
import os
import subprocess
import sys
import time

PERIOD_S = 0.0005


def threads_of(pid):
    """One look at every thread of pid: a list of (tid, state letter,
    /proc syscall fields, comm); threads gone meanwhile are left out, and
    the list is empty once pid is gone."""
    try:
        tids = os.listdir('/proc/%d/task' % pid)
    except OSError:
        return []
    seen = []
    for tid in tids:
        base = '/proc/%d/task/%s/' % (pid, tid)
        try:
            with open(base + 'stat') as f:
                stat = f.read()
            with open(base + 'syscall') as f:
                syscall = f.read().split()
            with open(base + 'comm') as f:
                comm = f.read().strip()
        except OSError:
            continue
        seen.append((int(tid), stat[stat.rindex(')') + 2], syscall, comm))
    return seen


def state_key(state, syscall):
    """What counts as staying in one state: running at one user PC, or
    sleeping in one syscall on one first argument."""
    if syscall and syscall[0] == 'running':
        return ('R', state, syscall[-1] if len(syscall) > 1 else '')
    return ('S', state, syscall[0] if syscall else '?',
            syscall[1] if len(syscall) > 1 else '')


def main(cmd):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    since = {}  # tid -> (key, since, comm)
    stretches = []  # (at ms, length ms, tid, comm, key)
    t0 = time.monotonic()
    while proc.poll() is None:
        now = time.monotonic()
        for tid, state, syscall, comm in threads_of(proc.pid):
            key = state_key(state, syscall)
            old = since.get(tid)
            if old is not None and old[0] == key:
                continue
            if old is not None and now - old[1] >= 0.005:
                stretches.append((round((old[1] - t0) * 1000, 1),
                                  round((now - old[1]) * 1000, 1), tid,
                                  old[2], old[0]))
            since[tid] = (key, now, comm)
        time.sleep(PERIOD_S)
    out = proc.stdout.read().strip().splitlines()
    r = json.loads(out[-1]) if out else {}
    print('result', *(r.get(k) for k in ('done_ms', 'iter_max_us',
                                         'iter_max_index', 'iter_max_call_us',
                                         'events_created')))
    for s in sorted(stretches, key=lambda x: -x[1])[:25]:
        print('  at %8.1f ms: %7.1f ms  tid %s %-16s %s' % s)


if __name__ == '__main__':
    main(sys.argv[1:])
