"""bench/stall_stacks.py PROGRAM [ARGS...]: run PROGRAM; when one of its
threads (not the main thread) sleeps in futex on a heap address for 15 ms or
more, stop the process (SIGSTOP) and print every thread's backtrace
(cuda-gdb, or gdb where there is no cuda-gdb), then kill it.  At most one
capture.  Linux only (/proc); how bench/results/2026-11-26-h100-w4-stall-
stacks.txt found where W4's stalled defer_free waited."""
import os
import shutil
import signal
import subprocess
import sys
import time
cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
pid = p.pid
since = {}
caught = False
while p.poll() is None and not caught:
    now = time.monotonic()
    try:
        tids = os.listdir('/proc/%d/task' % pid)
    except OSError:
        break
    for tid in tids:
        if int(tid) == pid:
            continue
        try:
            sc = open('/proc/%d/task/%s/syscall' % (pid, tid)).read().split()
        except OSError:
            continue
        key = (sc[0], sc[1]) if len(sc) > 1 and sc[0] == '202' and sc[1].startswith('0x5') else None
        if key is None:
            since.pop(tid, None)
            continue
        if since.get(tid, (None,))[0] != key:
            since[tid] = (key, now)
        elif now - since[tid][1] >= 0.015:
            os.kill(pid, signal.SIGSTOP)
            print('stalled thread', tid, 'futex', key[1], 'for', round((now - since[tid][1]) * 1000, 1), 'ms', flush=True)
            caught = True
            break
    time.sleep(0.0005)
if caught:
    gdb = 'cuda-gdb' if shutil.which('cuda-gdb') else 'gdb'
    out = subprocess.run([gdb, '-batch', '-p', str(pid), '-ex', 'info threads', '-ex', 'thread apply all bt 14'],
                         capture_output=True, text=True, timeout=240)
    print(out.stdout[-60000:])
    print(out.stderr[-3000:])
    os.kill(pid, signal.SIGKILL)
p.wait()
print('caught' if caught else 'no stall seen')
