# SPDX-License-Identifier: MIT
"""The memory fraction parts of t/gpu/torch_full.py:
PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction (read at the
allocator's start: torch_full.py run again in a process of its own),
set_per_process_memory_fraction's cap (beyond it, inside a MemPool and
at a fraction of 0) and an OOM observer; what each process saw goes into
its results, and the check_ functions compare the two (check is
compare()'s, one PASS/FAIL line each)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_FULL = os.path.join(HERE, "torch_full.py")
GiB = 1 << 30

ENV_FRACTION = "per_process_memory_fraction:0.5"


def probe_env_fraction(mode, lib):
    """The process env_fraction starts: prints, as JSON, the fraction read
    and whether 60 % of the device fits."""
    import torch
    if mode == "cudefer":
        import cudefer.torch
        cudefer.torch.enable(lib)
    res = {"fraction": torch.cuda.get_per_process_memory_fraction()
           if hasattr(torch.cuda, "get_per_process_memory_fraction") else None}
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        big = torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")
        res["big"] = "allocated"
        del big
    except torch.OutOfMemoryError:
        res["big"] = "OutOfMemoryError"
    print(json.dumps(res))


def env_fraction(mode, lib):
    """What probe_env_fraction saw under PYTORCH_CUDA_ALLOC_CONF=ENV_FRACTION
    (read when the allocator starts: a process of its own), or why it
    failed."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=ENV_FRACTION)
    cmd = [sys.executable, TORCH_FULL, "--run", mode,
           "--probe", "env-fraction"]
    if lib:
        cmd += ["--lib", lib]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    found = [line for line in proc.stdout.splitlines()
             if line.startswith("{")]
    if proc.returncode != 0 or not found:
        return "exit status %d: %s" % (proc.returncode,
                                       proc.stdout.strip()[-300:])
    return json.loads(found[-1])


def memory_fraction(torch, dev, mode, lib, res):
    """The fraction read from PYTORCH_CUDA_ALLOC_CONF, then the cap of
    set_per_process_memory_fraction with an OOM observer attached (left
    attached), into res; the fraction is 1.0 again when it returns."""
    # PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction.
    res["env_fraction"] = env_fraction(mode, lib)

    # set_per_process_memory_fraction and an OOM observer.
    seen = []
    try:
        torch._C._cuda_attach_out_of_memory_observer(
            lambda device, alloc, total, free: seen.append(alloc))
    except Exception as e:  # noqa: BLE001
        res["observer_error"] = "%s: %s" % (type(e).__name__, e)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = torch.cuda.memory_reserved() + GiB
    torch.cuda.set_per_process_memory_fraction(cap / total)
    res["fraction_read"] = torch.cuda.get_per_process_memory_fraction() \
        if hasattr(torch.cuda, "get_per_process_memory_fraction") else None
    try:
        big = torch.empty(2 * GiB, dtype=torch.uint8, device=dev)
        res["fraction_big"] = "allocated"
        del big
    except torch.OutOfMemoryError as e:
        res["fraction_big"] = "OutOfMemoryError"
        res["fraction_message"] = str(e).splitlines()[0][:200]
        # What accelerate's find_executable_batch_size (and HF Trainer's
        # auto_find_batch_size) takes for an out of memory to retry.
        res["oom_retryable"] = (len(e.args) == 1 and
                                "CUDA out of memory." in e.args[0])
    try:
        small = torch.empty(GiB // 4, dtype=torch.uint8, device=dev)
        res["fraction_small"] = "allocated"
        del small
    except torch.OutOfMemoryError:
        res["fraction_small"] = "OutOfMemoryError"
    # The cap holds inside a MemPool (a private pool) too.
    pool = torch.cuda.MemPool()
    try:
        with torch.cuda.use_mem_pool(pool):
            big = torch.empty(2 * GiB, dtype=torch.uint8, device=dev)
        res["fraction_pool"] = "allocated"
        del big
    except torch.OutOfMemoryError:
        res["fraction_pool"] = "OutOfMemoryError"
    del pool
    # A fraction of 0 allows no new memory (PyTorch's cache emptied first).
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.0)
    try:
        zero = torch.empty(GiB, dtype=torch.uint8, device=dev)
        res["fraction_zero"] = "allocated"
        del zero
    except torch.OutOfMemoryError:
        res["fraction_zero"] = "OutOfMemoryError"
    torch.cuda.set_per_process_memory_fraction(1.0)
    res["observer_calls"] = len(seen)


def check_fraction_caps(native, mine, check):
    """set_per_process_memory_fraction's cap: beyond it, in a MemPool, 0."""
    check("set_per_process_memory_fraction: beyond the cap raises "
          "OutOfMemoryError, below it fits",
          mine["fraction_big"] == native["fraction_big"] == "OutOfMemoryError"
          and mine["fraction_small"] == native["fraction_small"] == "allocated",
          "native %s/%s, cudefer %s/%s (%s)" % (
              native["fraction_big"], native["fraction_small"],
              mine["fraction_big"], mine["fraction_small"],
              mine.get("fraction_message", "")))
    check("set_per_process_memory_fraction: beyond the cap in a MemPool "
          "raises OutOfMemoryError",
          mine.get("fraction_pool") == native.get("fraction_pool")
          == "OutOfMemoryError",
          "native %s, cudefer %s" % (native.get("fraction_pool"),
                                     mine.get("fraction_pool")))
    check("set_per_process_memory_fraction(0): allocating raises "
          "OutOfMemoryError",
          mine.get("fraction_zero") == native.get("fraction_zero")
          == "OutOfMemoryError",
          "native %s, cudefer %s" % (native.get("fraction_zero"),
                                     mine.get("fraction_zero")))


def check_fraction_env_and_oom(native, mine, check):
    """PYTORCH_CUDA_ALLOC_CONF's fraction, the OutOfMemoryError's message
    and the OOM observer."""

    def env_capped(r):
        return (isinstance(r, dict) and r.get("big") == "OutOfMemoryError"
                and (r.get("fraction") is None
                     or abs(r["fraction"] - 0.5) < 1e-6))
    check("PYTORCH_CUDA_ALLOC_CONF=%s caps from the start" % ENV_FRACTION,
          env_capped(native.get("env_fraction"))
          and env_capped(mine.get("env_fraction")),
          "native %s, cudefer %s" % (native.get("env_fraction"),
                                     mine.get("env_fraction")))
    check("the OutOfMemoryError's message opens with 'CUDA out of memory.'",
          mine.get("oom_retryable") is native.get("oom_retryable") is True,
          "native %s, cudefer %s (%s)" % (native.get("oom_retryable"),
                                          mine.get("oom_retryable"),
                                          mine.get("fraction_message", "")))
    check("OOM observer called as under PyTorch's allocator",
          mine.get("observer_calls") == native.get("observer_calls")
          and mine.get("observer_calls", 0) > 0,
          "native %s, cudefer %s %s" % (native.get("observer_calls"),
                                        mine.get("observer_calls"),
                                        mine.get("observer_error", "")))
