# SPDX-License-Identifier: MIT
"""bench/test_train_measure.py: tests of bench/train_measure.py (what a
training run measures beside its time), without a GPU: the host's load
from /proc/stat, and the NVML sampler over a fake pynvml.  Run through
bench/test_run.py, which takes these test_ functions into its TAP."""
import os
import shutil
import tempfile
import time

import train_measure

__all__ = ['test_host_load', 'test_sampler_window_clock',
           'test_call_percentiles']


def test_host_load():
    """train_measure.py's record of the machine's load."""
    tmp = tempfile.mkdtemp()
    try:
        stat = os.path.join(tmp, 'stat')
        with open(stat, 'w') as f:
            f.write('cpu  100 0 50 800 10 5 5 30 0 0\ncpu0 1 2 3\n')
        before = train_measure.host_cpu_sample(stat)
        assert before == (160, 30, 1000), before
        with open(stat, 'w') as f:
            f.write('cpu  300 0 100 1300 10 5 5 80 0 0\n')
        after = train_measure.host_cpu_sample(stat)
        load = train_measure.host_load(before, after, 4)
        # 800 ticks passed: 250 busy, 50 stolen, on 4 CPUs.
        assert abs(load['host_busy_cpus'] - 1.25) < 1e-9, load
        assert abs(load['host_steal_pct'] - 6.25) < 1e-9, load
        assert train_measure.host_load(after, after, 4) == {}
        assert train_measure.host_load(None, after, 4) == {}
        assert train_measure.host_cpu_sample(os.path.join(tmp, 'none')) is None
        with open(stat, 'w') as f:
            f.write('intr 1 2 3\n')
        assert train_measure.host_cpu_sample(stat) is None
        with open(stat, 'w') as f:
            f.write('cpu  7 x\n')
        assert train_measure.host_cpu_sample(stat) is None
    finally:
        shutil.rmtree(tmp)


FAKE_PYNVML = """
import itertools
class NVMLError(Exception):
    pass
NVML_CLOCK_SM = 1
class _Mem:
    used = 0
_mhz = itertools.cycle([1980, 1755, 1980])
def nvmlInit(): pass
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetMemoryInfo(h):
    _Mem.used += 1 << 20
    return _Mem
def nvmlDeviceGetComputeRunningProcesses(h): return []
def nvmlDeviceGetClockInfo(h, which):
    assert which == NVML_CLOCK_SM
    return next(_mhz)
def nvmlDeviceGetCurrentClocksEventReasons(h): return 0x4 | 0x40
"""


def test_sampler_window_clock():
    """train_measure.Sampler: the SM clock and clock-event reasons over the
    samples inside the timed window, none when no sample falls inside."""
    tmp = tempfile.mkdtemp()
    saved = os.environ.get('PYTHONPATH')
    try:
        with open(os.path.join(tmp, 'pynvml.py'), 'w') as f:
            f.write(FAKE_PYNVML)
        os.environ['PYTHONPATH'] = tmp
        s = train_measure.Sampler(0, 0.001)
        t0 = time.time()
        time.sleep(0.05)
        out = s.finish([t0, time.time()])  # a list, as torch_train.py passes
        clock = out['window_clock']
        assert clock['samples'] >= 3, out
        assert (clock['sm_mhz_min'], clock['sm_mhz_max']) == (1755, 1980), clock
        assert clock['sm_mhz_median'] in (1755, 1980), clock
        assert clock['reasons'] == ['sw-power-cap', 'hw-thermal'], clock
        assert out['peak_bytes'] > 0 and out['source'] == 'nvml-device-delta', out
        s = train_measure.Sampler(0, 0.001)
        out = s.finish((1.0, 2.0))  # long before: no sample inside
        assert 'window_clock' not in out and out['samples'] >= 1, out
        s = train_measure.Sampler(0, 0.001)
        assert 'window_clock' not in s.finish(), out
    finally:
        if saved is None:
            os.environ.pop('PYTHONPATH', None)
        else:
            os.environ['PYTHONPATH'] = saved
        shutil.rmtree(tmp)


def test_call_percentiles():
    """torch_train.py --time-calls: a percentile from the timed shims'
    histogram (bench/torch_shims.c: 64 ns buckets below 4096 ns, then one
    per power of two) is its bucket's upper bound."""
    counts = [0] * (64 + 19)
    counts[5] = 90    # 320-383 ns
    counts[64] = 9    # 4096-8191 ns
    counts[66] = 1    # 16384-32767 ns
    p = train_measure.CallTimer.percentile_ns
    assert p(counts, 4096, 0.5) == 384, p(counts, 4096, 0.5)
    assert p(counts, 4096, 0.90) == 384, p(counts, 4096, 0.90)
    assert p(counts, 4096, 0.95) == 8192, p(counts, 4096, 0.95)
    assert p(counts, 4096, 0.999) == 32768, p(counts, 4096, 0.999)
    assert p([0] * 83, 4096, 0.5) is None

