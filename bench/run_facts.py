# SPDX-License-Identifier: MIT
"""bench/run_facts.py: the facts of a bench/run.py run that every record
carries: date, command, commit, NVIDIA driver, device, CUDA and PyTorch
versions.  The parent never initializes CUDA itself: a C program or
nvidia-smi is asked.  Python standard library only."""
import os
import re
import subprocess

from run_process import child_env, last_json_list, last_json_object, progress, run_child
from run_workloads import Strategy

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.path.dirname(HERE)

# Keys of every record that describe the run, not one result.
RUN_FACTS = ('date', 'command', 'commit', 'driver_version', 'cuda', 'cuda_runtime',
             'cuda_driver', 'cudefer_version', 'torch_version')


def git_commit():
    """HEAD of the source tree (-dirty with uncommitted changes), or the
    commit make dist wrote into the tarball, or 'unknown'."""
    try:
        head = subprocess.run(['git', '-C', SRCDIR, 'rev-parse', 'HEAD'],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True, timeout=30)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(['git', '-C', SRCDIR, 'diff', '--quiet', 'HEAD'],
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, timeout=30)
            return head.stdout.strip() + ('-dirty' if dirty.returncode else '')
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open(os.path.join(HERE, 'source-commit')) as f:
            return f.read().strip() or 'unknown'
    except OSError:
        return 'unknown'


def parse_driver_version(text):
    """The driver's version (e.g. 580.95.05) in the text of
    /proc/driver/nvidia/version, or None.  Its first line is either
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." or
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  ...":
    the version is the first dotted number after "Kernel Module", not the
    word after it."""
    m = re.search(r'Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)', text)
    return m.group(1) if m else None


def nvidia_smi_gpus():
    """[(name, driver version)] of every GPU as nvidia-smi lists them (it
    does not initialize CUDA in this process); [] when nvidia-smi is missing
    or fails.  Blocks until nvidia-smi ends (at most 60 s)."""
    try:
        r = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version',
                            '--format=csv,noheader'], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    rows = []
    for line in r.stdout.splitlines():
        name, _, version = line.rpartition(',')
        if name.strip() and version.strip():
            rows.append((name.strip(), version.strip()))
    return rows


def driver_version(proc_file='/proc/driver/nvidia/version'):
    """The NVIDIA kernel driver's version (e.g. 580.95.05), from proc_file
    or else nvidia-smi; None when neither says."""
    try:
        with open(proc_file) as f:
            version = parse_driver_version(f.read())
        if version:
            return version
    except OSError:
        pass
    rows = nvidia_smi_gpus()
    return rows[0][1] if rows else None


def device_info_without_programs(torch_found):
    """Device facts for a run with no C program to ask (training only, no
    make bench): device and GPU count from nvidia-smi, the CUDA version
    PyTorch was built with; {} for what is unknown."""
    info = {}
    rows = nvidia_smi_gpus()
    if rows:
        info['device'], info['gpus'] = rows[0][0], len(rows)
    if torch_found and torch_found[2]:
        info['cuda'] = 'PyTorch built with CUDA %s' % torch_found[2]
    return info


def device_info(bindir):
    """Device and versions from `bench-launch-loop --info` (the parent never
    initializes CUDA itself); {} when that fails (said on stderr)."""
    status, out, err, _ = run_child([os.path.join(bindir, 'bench-launch-loop'),
                                     '--info'], child_env(Strategy('', '')), 60)
    info = last_json_object(out) if status == 0 else None
    if not info:
        progress('run.py: device info failed (%s): %s' % (
            'timed out' if status is None else 'exit status %s' % status,
            err.strip()[-300:]))
        return {}
    info.pop('info', None)
    rt, drv = info.get('cuda_runtime', 0), info.get('cuda_driver', 0)
    info['cuda'] = 'runtime %d.%d, driver %d.%d' % (rt // 1000, rt % 1000 // 10,
                                                     drv // 1000, drv % 1000 // 10)
    return info


def torch_check(python):
    """(torch version, GPU count, CUDA version torch was built with or None)
    when python can import torch, else None."""
    status, out, err, _ = run_child(
        [python, '-c', 'import json, torch; print(json.dumps([torch.__version__, '
                       'torch.cuda.device_count(), getattr(getattr(torch, '
                       '"version", None), "cuda", None)]))'], dict(os.environ), 300)
    found = last_json_list(out) if status == 0 else None
    if not found or len(found) != 3 or not isinstance(found[1], int):
        return None
    return found[0], found[1], found[2]
