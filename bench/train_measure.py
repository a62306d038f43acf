# SPDX-License-Identifier: MIT
"""bench/train_measure.py: what a training run of bench/torch_train.py
measures beside its time: the peak device memory (an NVML sampler in a
process of its own), the machine's load over the timed steps
(/proc/stat), and the allocator calls' own time (--time-calls).  Python standard library only (the sampler process imports
pynvml)."""
import json
import os
import subprocess
import sys

# The NVML sampler, run as `python3 -c SAMPLER nvml_index pid period_s`.
# It prints "ready" once it has read the device's memory before the trainer
# makes its CUDA context, then samples until its stdin closes and prints
# one JSON line.  A process of its own: the trainer's GIL stays free.
# Beside the memory it reads the SM clock and NVML's clock-event reasons
# (why the clock is below its maximum: power cap, thermal, ...); the trainer
# writes "window T0 T1" (time.time()) on stdin before closing it, and those
# are summarised over the samples taken inside the window: whether a
# repetition ran slower because the GPU's clock did.
SAMPLER = r"""
import json, sys, threading, time
try:
    import pynvml
except ImportError as e:
    print("ready", flush=True); sys.stdin.read()
    print(json.dumps({"error": "pynvml: %s" % e})); sys.exit(0)
index, pid, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(index)
baseline = pynvml.nvmlDeviceGetMemoryInfo(h).used
stop = threading.Event()
said = []
def wait_for_eof():
    said.append(sys.stdin.read())
    stop.set()
threading.Thread(target=wait_for_eof, daemon=True).start()
# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*).
REASONS = {0x1: "idle", 0x2: "app-clocks", 0x4: "sw-power-cap",
           0x8: "hw-slowdown", 0x10: "sync-boost", 0x20: "sw-thermal",
           0x40: "hw-thermal", 0x80: "hw-power-brake", 0x100: "display"}
reasons_of = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
    getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
clocks = []  # (time, SM MHz, reason bits)
print("ready", flush=True)
peak_proc = peak_dev = samples = 0
seen = False
while True:
    last = stop.is_set()
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    except pynvml.NVMLError:
        procs = []
    for p in procs:
        if p.pid == pid and p.usedGpuMemory is not None:
            seen = True
            peak_proc = max(peak_proc, p.usedGpuMemory)
    peak_dev = max(peak_dev, pynvml.nvmlDeviceGetMemoryInfo(h).used - baseline)
    try:
        clocks.append((time.time(),
                       pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                       reasons_of(h) if reasons_of else 0))
    except pynvml.NVMLError:
        pass
    samples += 1
    if last:
        break
    time.sleep(period)
out = {"peak_bytes": peak_proc if seen else peak_dev,
       "source": "nvml-process" if seen else "nvml-device-delta",
       "samples": samples, "nvml_index": index}
words = (said[0] if said else "").split()
if len(words) == 3 and words[0] == "window":
    t0, t1 = float(words[1]), float(words[2])
    inside = [c for c in clocks if t0 <= c[0] <= t1]
    if inside:
        mhz = sorted(c[1] for c in inside)
        bits = 0
        for c in inside:
            bits |= c[2]
        out["window_clock"] = {
            "samples": len(inside), "sm_mhz_min": mhz[0],
            "sm_mhz_median": mhz[len(mhz) // 2], "sm_mhz_max": mhz[-1],
            "reasons": [n for b, n in sorted(REASONS.items()) if bits & b]}
print(json.dumps(out))
"""


# ---- memory sampling ---------------------------------------------------------

class Sampler:
    """The NVML sampler process of one device (see SAMPLER)."""

    def __init__(self, nvml_index, period_s):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SAMPLER, str(nvml_index), str(os.getpid()),
             str(period_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        self.proc.stdout.readline()  # "ready": the baseline is taken

    def finish(self, window=None):
        """Stop sampling; the sampler's JSON result as a dict.  window:
        (t0, t1) in time.time()'s seconds, the timed steps, over which the
        result's window_clock summarises the SM clock."""
        said = "window %r %r\n" % tuple(window) if window else ""
        out, _ = self.proc.communicate(said, timeout=60)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": "sampler printed %r" % out[-200:]}


# ---- the host's load ----------------------------------------------------------

def host_cpu_sample(path="/proc/stat"):
    """The machine's CPU time so far, in clock ticks summed over its CPUs:
    (busy, steal, total) from the first line of /proc/stat; None when it
    cannot be read (not Linux, a sandbox without it)."""
    # cpu  user nice system idle iowait irq softirq steal [guest ...]
    try:
        with open(path) as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        t = [int(v) for v in fields[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    t += [0] * (8 - len(t))
    busy = t[0] + t[1] + t[2] + t[5] + t[6]
    return busy, t[7], sum(t)


def host_load(before, after, ncpus):
    """The host's load between two host_cpu_samples: {'host_busy_cpus': CPUs
    busy on average (this process's threads among them), 'host_steal_pct':
    the share of the CPUs' time the hypervisor gave to others}; {} when a
    sample is missing or no tick passed.  A repetition whose launching
    thread was slowed by the machine, not by the allocator, shows here."""
    if before is None or after is None or after[2] <= before[2]:
        return {}
    total = after[2] - before[2]
    return {"host_busy_cpus": ncpus * (after[0] - before[0]) / total,
            "host_steal_pct": 100.0 * (after[1] - before[1]) / total}


class CallTimer:
    """--time-calls: the timed shims' sums (bench/torch_shims.c,
    shim_timed_read), zeroed by each read."""

    def __init__(self, path):
        import ctypes
        self.ctypes = ctypes
        self.shims = ctypes.CDLL(path)
        self.shims.shim_timed_read.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self.shims.shim_timed_hist.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self.nbuckets = self.shims.shim_timed_buckets()

    def read(self):
        """The sums and the histograms since the last read (then zeroed)."""
        out = (self.ctypes.c_uint64 * 4)()
        self.shims.shim_timed_read(out)
        hist = (self.ctypes.c_uint64 * (4 + 2 * self.nbuckets))()
        self.shims.shim_timed_hist(hist)
        return list(out), list(hist)

    @staticmethod
    def percentile_ns(counts, fine_below, q):
        """The upper bound, ns, of the bucket holding the q-th quantile of
        the calls counted (bench/torch_shims.c's buckets: 64 ns wide below
        fine_below, then a power of two each)."""
        total = sum(counts)
        if total == 0:
            return None
        seen, fine = 0, fine_below // 64
        for b, n in enumerate(counts):
            seen += n
            if seen >= q * total:
                return (b + 1) * 64 if b < fine else 2 * fine_below << (b - fine)
        return None

    def per_step(self, steps):
        """Since the last read: calls and microseconds a step, mean ns a
        call, for allocations and frees; the 50th, 90th and 99th
        percentiles of a call (ns, a bucket's upper bound), and the calls
        of fine_below ns or more (tail_ns: 4096) a step and their
        microseconds: what of the mean is the typical call and what a few
        slow ones."""
        (n_alloc, ns_alloc, n_free, ns_free), hist = self.read()
        mean = lambda ns, n: ns / n if n else None
        result = {"alloc_calls_per_step": n_alloc / steps,
                  "alloc_us_per_step": ns_alloc / 1000.0 / steps,
                  "alloc_ns_mean": mean(ns_alloc, n_alloc),
                  "free_calls_per_step": n_free / steps,
                  "free_us_per_step": ns_free / 1000.0 / steps,
                  "free_ns_mean": mean(ns_free, n_free)}
        nb, fine_below = hist[0], hist[1]
        result["tail_ns"] = fine_below
        for k, kind in enumerate(("alloc", "free")):
            counts = hist[4 + k * nb:4 + (k + 1) * nb]
            for q in (50, 90, 99):
                result["%s_ns_p%d" % (kind, q)] = \
                    self.percentile_ns(counts, fine_below, q / 100.0)
            result["%s_tail_calls_per_step" % kind] = \
                sum(counts[fine_below // 64:]) / steps
            result["%s_tail_us_per_step" % kind] = hist[2 + k] / 1000.0 / steps
        return result
