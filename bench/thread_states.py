"""bench/thread_states.py PROGRAM [ARGS...]: run a bench program (its last
stdout line a JSON object) and sample every thread's state about every 0.5
ms (/proc/PID/task/*/stat, syscall, comm); print the program's result and
the 25 longest stretches a thread stayed in one state (the same syscall and
first argument, or running) for 5 ms or more.  Linux only."""
import json
import os
import subprocess
import sys
import time
cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
pid = p.pid
state = {}   # tid -> (key, since)
long = []
t0 = time.monotonic()
while p.poll() is None:
    now = time.monotonic()
    try:
        tids = os.listdir('/proc/%d/task' % pid)
    except OSError:
        break
    for tid in tids:
        base = '/proc/%d/task/%s/' % (pid, tid)
        try:
            st = open(base + 'stat').read()
            sc = open(base + 'syscall').read().split()
            comm = open(base + 'comm').read().strip()
        except OSError:
            continue
        s = st[st.rindex(')') + 2]
        if sc and sc[0] == 'running':
            key = ('R', s, sc[-1] if len(sc) > 1 else '')   # user PC
        else:
            key = ('S', s, sc[0] if sc else '?', sc[1] if len(sc) > 1 else '')
        old = state.get(tid)
        if old is None or old[0] != key:
            if old is not None and now - old[1] >= 0.005:
                long.append((round((old[1] - t0) * 1000, 1), round((now - old[1]) * 1000, 1), tid, old[2], old[0]))
            state[tid] = (key, now, comm)
    time.sleep(0.0005)
out = p.stdout.read().strip().splitlines()
r = json.loads(out[-1]) if out else {}
print('result', r.get('done_ms'), r.get('iter_max_us'), r.get('iter_max_index'), r.get('iter_max_call_us'), r.get('events_created'))
for l in sorted(long, key=lambda x: -x[1])[:25]:
    print('  at %8.1f ms: %7.1f ms  tid %s %-16s %s' % l)
