# SPDX-License-Identifier: MIT
"""bench/stall_stacks.py PROGRAM [ARGS...]: run PROGRAM; when one of its
threads (not the main thread) sleeps in futex on a heap address for 15 ms or
more, stop the process (SIGSTOP) and print every thread's backtrace
(cuda-gdb, or gdb where there is no cuda-gdb), then kill it.  At most one
capture.  Linux only (/proc).  For questions such as where a defer_free
that stalls in W4 waits."""
import os
import shutil
import signal
import subprocess
import sys
import time

from thread_states import PERIOD_S, threads_of

FUTEX = '202'  # x86-64
STALL_S = 0.015


def heap_futex(syscall):
    """(futex, address) when the thread sleeps in futex on a heap address
    (0x5...: the program's heap, not a thread's stack), else None."""
    if len(syscall) > 1 and syscall[0] == FUTEX and \
            syscall[1].startswith('0x5'):
        return syscall[0], syscall[1]
    return None


def wait_for_stall(proc):
    """Stop proc at the first stall; True if one came before it ended."""
    since = {}  # tid -> (key, since)
    while proc.poll() is None:
        now = time.monotonic()
        for tid, _, syscall, _ in threads_of(proc.pid):
            key = heap_futex(syscall) if tid != proc.pid else None
            if key is None:
                since.pop(tid, None)
            elif since.get(tid, (None,))[0] != key:
                since[tid] = (key, now)
            elif now - since[tid][1] >= STALL_S:
                os.kill(proc.pid, signal.SIGSTOP)
                print('stalled thread', tid, 'futex', key[1], 'for',
                      round((now - since[tid][1]) * 1000, 1), 'ms',
                      flush=True)
                return True
        time.sleep(PERIOD_S)
    return False


def main(cmd):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    caught = wait_for_stall(proc)
    if caught:
        gdb = 'cuda-gdb' if shutil.which('cuda-gdb') else 'gdb'
        out = subprocess.run([gdb, '-batch', '-p', str(proc.pid),
                              '-ex', 'info threads',
                              '-ex', 'thread apply all bt 14'],
                             capture_output=True, text=True, timeout=240)
        print(out.stdout[-60000:])
        print(out.stderr[-3000:])
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    print('caught' if caught else 'no stall seen')


if __name__ == '__main__':
    main(sys.argv[1:])
