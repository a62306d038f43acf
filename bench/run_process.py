# SPDX-License-Identifier: MIT
"""bench/run_process.py: one run of bench/run.py in a fresh process: its
environment, the time limit (the whole process group is killed), its JSON
answer, and what of its stderr is shown.  Python standard library only."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

def last_json_object(text):
    """The last line of text that is a JSON object, as a dict, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith('{'):
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


def last_json_list(text):
    """The last line of text, parsed as a JSON list, or None."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    try:
        obj = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return obj if isinstance(obj, list) else None


def parse_cpus(text):
    """The CPU numbers of a list in taskset's form ("2-5,8") as a sorted
    list.  Raises ValueError saying what is wrong."""
    cpus = set()
    for part in text.split(','):
        lo, dash, hi = part.strip().partition('-')
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ValueError("'%s' is not a CPU number or range (e.g. 2-5,8)"
                             % part) from None
        if first < 0 or last < first:
            raise ValueError("'%s' is not a range of CPU numbers" % part)
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def run_child(cmd, env, timeout, cpus=None):
    """Run cmd in its own process group; kill the group after timeout s.
    cpus: CPU numbers the child (its threads and children too) may run on,
    or None for this process's own.  Returns (exit status or None when
    timed out, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True, universal_newlines=True,
                                errors='replace', preexec_fn=pin)
    except OSError as e:
        return -1, '', 'cannot start %s: %s\n' % (cmd[0], e), 0.0
    try:
        out, err = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        status = None
    return status, out, err, time.monotonic() - t0


# Not the library's settings but where the cudefer Python package finds the
# library: kept.
HELPER_ENV = ('CUDEFER_LIB',)


def library_setting(name):
    """Whether an environment variable is one of the library's settings
    (read once per process by cudefer), not a helper's."""
    return name.startswith('CUDEFER_') and name not in HELPER_ENV


def child_env(strategy):
    """The environment of a child: none of the library's CUDEFER_* settings
    but the variant's own (a setting is read once per process; the default
    row must see the defaults); the helpers' variables are kept."""
    env = {k: v for k, v in os.environ.items() if not library_setting(k)}
    env.update(strategy.env)
    return env


def progress(msg):
    sys.stderr.write(msg + '\n')
    sys.stderr.flush()


def echo_stderr(err, failed, cmd, env):
    """What a child said that matters: its notes and cudefer's messages, or
    on failure its last lines and the command to repeat it."""
    lines = [l for l in err.splitlines() if l.strip()]
    if failed:
        shown = lines[-15:]
        shown.append('command: ' + ' '.join(
            ['%s=%s' % (k, shlex.quote(v)) for k, v in env.items()] +
            [shlex.quote(c) for c in cmd]))
    else:
        shown = [l for l in lines if 'note:' in l or l.startswith('cudefer')]
    for line in shown:
        progress('    ' + line)
