#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train one real model under one CUDA allocator, once, and print the result.

    python3 bench/torch_train.py --model {cnn,lm} \
        --allocator {native,native-async,pluggable-async,cudefer,malloc-defer,malloc-free,cudefer-trace,
                     pluggable-floor} \
        [--steps N] [--warmup W] [--seed S] [--ddp] [--lib PATH] [--side-stream] \
        [--trace FILE] [--time-calls]

One (model, allocator, repetition) per process: an allocator cannot be
changed once PyTorch has allocated CUDA memory, and each run must start from
a fresh device.  The last line of stdout is one JSON object (bench/run.py
reads it; t/gpu/gpu_torch.sh compares them); everything else goes to stderr.

Models, built here with random weights (nothing is downloaded):
  cnn  torchvision's ResNet-50, batch 64 at 224x224, 1000 classes
  lm   a GPT-like decoder from torch.nn: 12 layers, d 768, 12 heads,
       sequence 1024, batch 8, vocabulary 32768 (about 110 M parameters)
Both train with AdamW under bf16 autocast on random data drawn each step
from a generator seeded by (seed, rank, step), with deterministic kernels
(cudnn.deterministic, torch.use_deterministic_algorithms,
CUBLAS_WORKSPACE_CONFIG=:4096:8), so that every allocator must give the same
losses bit for bit.  Losses stay on the GPU until the end (no per-step
synchronisation: the CPU runs ahead of the GPU as real training does).

Allocators:
  native           PyTorch's caching allocator
  native-async     PyTorch's cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF)
  cudefer          libcudefer's defer_pluggable_alloc/free through
                   the cudefer package's cudefer.torch (PyTorch's whole
                   allocator interface, record_stream wired)
  pluggable-async  cudaMallocAsync/cudaFreeAsync     } pluggable shims of
  malloc-defer     cudaMalloc/defer_free             } bench/torch_shims.c,
  malloc-free      cudaMalloc/cudaFree               } compiled at first use
  pluggable-floor  exact-size free lists per stream, } (a bound row: the
                   nothing released, record_stream  } least a pluggable
                   ignored                          } allocator can cost)
  cudefer-trace    cudefer through a shim (no record_stream hook), every
                   allocation and free recorded to --trace FILE or
                   $CUDEFER_TRACE_FILE with a mark at each step's start and
                   one after the last (--ddp: FILE.rankN), for
                   bench/replay-trace to replay on the fake runtime

ms_per_step: wall time of the steps after the warm-up, with one
torch.cuda.synchronize before and one after the timed window.  peak_mib:
the most device memory NVML saw this process use (sampled about every
millisecond by a helper process; per process when NVML can name our pid,
else the device's used memory above what it was before we started; which
one is in peak_source), the largest over the ranks under --ddp.
host_busy_cpus, host_steal_pct: the whole machine's load over the timed
window, from /proc/stat (absent where it cannot be read): the CPUs busy on
average, this process's included, and the share of CPU time the hypervisor
gave to others.  A repetition slowed by the machine shows there.
gpu_step_ms: min/median/max of the GPU's time between consecutive timed
steps' ends (CUDA events), the GPU's time per step where it never idles;
steps_gpu_ms, steps_cpu_ms: each step's, in order, on the GPU and on the
launching thread; steps_probe_us: a fixed loop of the interpreter's timed
before each step, slower when the host's CPU is (a noisy neighbour).
window_clock: the SM clock NVML read during the timed steps (min, median,
max MHz) and the clock-event reasons it gave (power cap, thermal, ...):
whether a slow repetition had a slow GPU clock.

--side-stream: each step also draws a tensor on the main stream, has a side
stream read it in a long computation, protects it with record_stream (as
PyTorch's documentation says), frees it at once on the main stream and asks
for tensors of the same size there, which it fills.  An allocator that
ignores record_stream can hand the block out while the side stream still
reads it; side_sha256 (one hash per step) then differs from native's.
--ddp: one process per visible GPU (NCCL, DistributedDataParallel); the
JSON has rank 0's losses, each rank's weights hash and whether all are
identical.
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, "python"))

import cudefer  # noqa: E402  (standard library only until enable())
import cudefer.torch  # noqa: E402
from train_measure import (  # noqa: E402
    CallTimer, Sampler, host_cpu_sample, host_load)

ALLOCATORS = ["native", "native-async", "pluggable-async", "cudefer",
              "malloc-defer", "malloc-free", "cudefer-trace", "pluggable-floor"]
# allocator -> (alloc function, free function) in bench/torch_shims.c
SHIMS = {
    "pluggable-async": ("shim_async_alloc", "shim_async_free"),
    "malloc-defer": ("shim_malloc_alloc", "shim_defer_free"),
    "malloc-free": ("shim_malloc_alloc", "shim_cudafree"),
    "cudefer-trace": ("shim_traced_alloc", "shim_traced_free"),
    "pluggable-floor": ("shim_floor_alloc", "shim_floor_free"),
}
# Allocators that load libcudefer (their JSON carries its counters).
USES_CUDEFER = ("cudefer", "malloc-defer", "cudefer-trace")
# cudefer counters that torch_train reports per timed step as well.
COUNTERS_PER_STEP = ("deferred", "released", "event_queries", "wakeups",
                     "batches", "reused", "reused_same_stream",
                     "cache_mallocs", "cache_releases", "sync_releases",
                     "cap_releases", "idle_releases")

MODEL_DEFAULTS = {
    "cnn": dict(batch=64, image=224, classes=1000, lr=1e-3),
    "lm": dict(batch=8, seq=1024, vocab=32768, layers=12, dim=768, heads=12,
               lr=3e-4),
}



def log(msg):
    print("torch_train: " + msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODEL_DEFAULTS), required=True)
    p.add_argument("--allocator", choices=ALLOCATORS, required=True)
    p.add_argument("--steps", type=int, default=40,
                   help="timed steps after the warm-up (default 40)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed first steps (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ddp", action="store_true",
                   help="DistributedDataParallel over every visible GPU")
    p.add_argument("--lib", metavar="PATH",
                   help="libcudefer.so (default: cudefer.find_library)")
    p.add_argument("--side-stream", action="store_true",
                   help="add the record_stream side-stream computation")
    p.add_argument("--batch", type=int, help="override the model's batch size")
    p.add_argument("--no-record-stream-hook", action="store_true",
                   help="cudefer through PyTorch's pluggable allocator "
                   "(defer_pluggable_alloc/free), without cudefer.torch: "
                   "record_stream ignored (to show what it prevents)")
    p.add_argument("--no-amp", action="store_true", help="train in fp32")
    p.add_argument("--sample-ms", type=float, default=1.0,
                   help="NVML sampling period (default 1 ms)")
    p.add_argument("--time-calls", action="store_true",
                   help="time every allocation and free (through the timed "
                   "shims of bench/torch_shims.c; cudefer then has no "
                   "record_stream hook) and report their time per step")
    p.add_argument("--trace", metavar="FILE",
                   help="--allocator cudefer-trace: record the allocation "
                   "trace to FILE (default: $CUDEFER_TRACE_FILE)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if a.no_record_stream_hook and a.allocator != "cudefer":
        p.error("--no-record-stream-hook applies to --allocator cudefer only")
    if a.time_calls and a.allocator in ("native", "native-async",
                                        "cudefer-trace"):
        p.error("--time-calls applies to the pluggable allocators only")
    if a.trace and a.allocator != "cudefer-trace":
        p.error("--trace applies to --allocator cudefer-trace only")
    if a.allocator == "cudefer-trace" and not (
            a.trace or os.environ.get("CUDEFER_TRACE_FILE")):
        p.error("--allocator cudefer-trace needs --trace FILE or "
                "CUDEFER_TRACE_FILE")
    return a


# ---- preparation, in the parent before any rank starts ----------------------

def loaded_library(fragment):
    """Path of the first shared object mapped into this process whose name
    contains fragment (e.g. the libcudart torch loaded), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if fragment in os.path.basename(path) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def build_shims(lib_path):
    """Compile bench/torch_shims.c against the CUDA runtime torch loaded and
    libcudefer at lib_path, once per source and flags (cached beside the
    record_stream hook); return the shared object's path.  Blocks while cc
    runs.  Exits with a message on failure."""
    import torch
    source = os.path.join(HERE, "torch_shims.c")
    cudart = loaded_library("libcudart.so")
    from torch.utils import cpp_extension
    cuda_include = cudefer.torch._cuda_include_dir(cpp_extension)
    if cudart is None or cuda_include is None:
        sys.exit("torch_train: cannot build the shims: %s" % (
            "torch loaded no libcudart" if cudart is None
            else "no CUDA headers (set CUDA_HOME)"))
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-std=c11", "-O2", "-shared", "-fPIC",
           "-I" + os.path.join(TOP, "include"), "-I" + cuda_include, source]
    cmd += link_cudefer(lib_path) + [cudart,
                                     "-Wl,-rpath," + os.path.dirname(cudart)]
    with open(source, "rb") as f:
        key = hashlib.sha256(f.read())
    key.update(repr(cmd).encode())
    out_dir = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR") or
                           os.path.join(os.path.expanduser("~"), ".cache"),
                           "cudefer-bench")
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, "torch_shims-%s.so" % key.hexdigest()[:16])
    if os.path.isfile(target):
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        run = subprocess.run(cmd + ["-o", tmp], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            sys.exit("torch_train: %s failed:\n%s" % (" ".join(cmd),
                                                      run.stdout[-4000:]))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def link_cudefer(lib_path):
    """The linker's arguments for libcudefer at lib_path: the file and its
    directory as an rpath, or -lcudefer for the bare soname find_library
    gives an installed library (made a path in the current directory, it
    was not found)."""
    if os.sep not in lib_path:
        return ["-lcudefer"]
    path = os.path.abspath(lib_path)
    return [path, "-Wl,-rpath," + os.path.dirname(path)]


def prepare(args):
    """What every rank needs, resolved once: {'lib', 'shims', 'hook'}."""
    prep = {"lib": None, "shims": None}
    if args.allocator in USES_CUDEFER:
        prep["lib"] = cudefer.find_library(args.lib)
    if args.allocator in SHIMS or args.time_calls:
        lib = prep["lib"] or cudefer.find_library(args.lib)
        prep["shims"] = build_shims(lib)
    if args.allocator == "cudefer" and not args.no_record_stream_hook \
            and not args.time_calls:
        cudefer.torch.build()  # compiled once here, not by every rank
    return prep


def install_allocator(args, prep):
    """Make the chosen allocator PyTorch's, before any CUDA allocation.
    Returns whether Tensor.record_stream reaches it (None: n/a)."""
    import torch
    if args.allocator in ("native", "native-async"):
        return True
    if args.time_calls:
        import ctypes
        shims = ctypes.CDLL(prep["shims"])  # the object PyTorch loads, too
        shims.shim_timed_use.argtypes = [ctypes.c_char_p]
        if shims.shim_timed_use(args.allocator.encode()) != 0:
            sys.exit("torch_train: the timed shims know no %s" % args.allocator)
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(
                prep["shims"], "shim_timed_alloc", "shim_timed_free"))
        log("%s through the timed shims%s" % (
            args.allocator, " (no record_stream hook)"
            if args.allocator == "cudefer" else ""))
        return False
    if args.allocator == "cudefer":
        if args.no_record_stream_hook:
            torch.cuda.memory.change_current_allocator(
                torch.cuda.memory.CUDAPluggableAllocator(
                    prep["lib"], "defer_pluggable_alloc",
                    "defer_pluggable_free"))
            log("cudefer through the pluggable allocator, record_stream "
                "ignored (as asked)")
            return False
        cudefer.torch.enable(prep["lib"])
        return True
    alloc_fn, free_fn = SHIMS[args.allocator]
    allocator = torch.cuda.memory.CUDAPluggableAllocator(prep["shims"],
                                                         alloc_fn, free_fn)
    torch.cuda.memory.change_current_allocator(allocator)
    return False


def start_trace(args, prep, rank, world):
    """--allocator cudefer-trace: name this rank's trace file (FILE.rankN
    under --ddp) before the shims' first call reads it; return the shims
    library (ctypes), whose shim_trace_mark marks the steps, or None when
    not tracing."""
    if args.allocator != "cudefer-trace":
        return None
    import ctypes
    if world > 1:
        os.environ["CUDEFER_TRACE_FILE"] += ".rank%d" % rank
    shims = ctypes.CDLL(prep["shims"])  # the object PyTorch loads, too
    shims.shim_trace_mark.argtypes = [ctypes.c_long]
    return shims


# ---- models ------------------------------------------------------------------

def build_lm(torch, cfg):
    """A GPT-like decoder: token and position embeddings, pre-norm blocks
    of causal self-attention and an MLP, a head tied to the embedding."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg["dim"]
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            h = cfg["heads"]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.pos = nn.Embedding(cfg["seq"], cfg["dim"])
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln = nn.LayerNorm(cfg["dim"])

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.tok.weight.t()

    return GPT()


def build_model(torch, model, cfg):
    if model == "lm":
        return build_lm(torch, cfg)
    try:
        import torchvision
    except ImportError:
        sys.exit("torch_train: --model cnn needs torchvision")
    return torchvision.models.resnet50(weights=None,
                                       num_classes=cfg["classes"])


def make_batch(torch, model, cfg, gen, device):
    """(inputs, targets) drawn from gen on device."""
    b = cfg["batch"]
    if model == "cnn":
        x = torch.randn(b, 3, cfg["image"], cfg["image"], device=device,
                        generator=gen)
        y = torch.randint(0, cfg["classes"], (b,), device=device, generator=gen)
        return x, y
    tokens = torch.randint(0, cfg["vocab"], (b, cfg["seq"] + 1), device=device,
                           generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def tensor_bytes(t):
    """The bytes of a tensor's elements, in order (bf16 as raw 16-bit)."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().cpu().reshape(-1).numpy().tobytes()


def params_sha256(module):
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(name.encode())
        h.update(tensor_bytes(p))
    return h.hexdigest()


# ---- one rank ----------------------------------------------------------------

# Iterations of the empty loop timed before each step (steps_probe_us).
CPU_PROBE_LOOPS = 2000


def run_rank(rank, world, args, prep, port):
    """Train on GPU rank of world (1 without --ddp); return the rank's
    result dict.  Blocks for the whole run."""
    import torch
    nvml_index = torch.cuda._get_nvml_device_index(rank)
    sampler = Sampler(nvml_index, args.sample_ms / 1000.0)
    tracer = start_trace(args, prep, rank, world)
    hooked = install_allocator(args, prep)
    timer = CallTimer(prep["shims"]) if args.time_calls else None
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist = None
    if args.ddp:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=device)

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)

    cfg = dict(MODEL_DEFAULTS[args.model])
    if args.batch:
        cfg["batch"] = args.batch
    model = build_model(torch, args.model, cfg).to(device)
    net = model
    if dist is not None:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    gen = torch.Generator(device=device)
    total = args.warmup + args.steps
    losses = torch.zeros(total, device=device)

    side = None
    side_results = []
    if args.side_stream:
        side = torch.cuda.Stream(device=device)
        side_n = 2048
        side_w = torch.randn(side_n, side_n, device=device) / side_n ** 0.5
    main = torch.cuda.current_stream(device)

    def side_step(i):
        # x is made on the main stream, read on the side stream for several
        # milliseconds, freed on the main stream right away; same-size
        # blocks requested and overwritten on the main stream at once.
        gen.manual_seed(args.seed * 1000003 + rank * 7919 + i * 31 + 17)
        x = torch.randn(side_n, side_n, device=device, generator=gen)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            acc = x @ side_w
            for _ in range(12):
                acc = torch.tanh(acc) @ side_w + x
            side_results.append(acc.sum(dim=0))
        x.record_stream(side)
        del x
        return [torch.full((side_n, side_n), float(i), device=device)
                for _ in range(3)]

    def step(i):
        if tracer is not None:
            tracer.shim_trace_mark(i)
        fillers = side_step(i) if side is not None else None
        gen.manual_seed(args.seed * 1000003 + rank * 7919 + i)
        x, y = make_batch(torch, args.model, cfg, gen, device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not args.no_amp):
            out = net(x)
        loss = torch.nn.functional.cross_entropy(
            out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses[i].copy_(loss.detach())
        del fillers

    started = time.time()
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize(device)
    if dist is not None:
        dist.barrier()
        torch.cuda.synchronize(device)
    window_start = (cudefer.stats(prep["lib"])
                    if args.allocator in USES_CUDEFER else None)
    if timer is not None:
        timer.read()  # the warm-up's calls are not counted
    # At each timed step's start: how many earlier steps the GPU has not
    # finished.  About 0: the GPU waits for the launching thread (the CPU
    # sets the pace, so allocator calls cost time); 1 or more: the CPU runs
    # ahead and the GPU sets the pace.
    step_done = []
    behind = 0
    host_before = host_cpu_sample()
    window = [time.time()]
    step_cpu = []  # the launching thread's seconds per step, in order
    step_probe = []  # the same fixed Python loop's seconds before each step
    t0 = time.perf_counter()
    for i in range(args.warmup, total):
        behind += sum(1 for e in step_done[-8:] if not e.query())
        started_step = time.perf_counter()
        for _ in range(CPU_PROBE_LOOPS):
            pass
        step_probe.append(time.perf_counter() - started_step)
        started_step = time.perf_counter()
        step(i)
        step_done.append(torch.cuda.Event(enable_timing=True))
        step_done[-1].record()
        step_cpu.append(time.perf_counter() - started_step)
    enqueued = time.perf_counter() - t0
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    window.append(time.time())
    # The GPU's time between consecutive step ends: each step's GPU time
    # while the GPU is never idle (gpu_steps_behind near 1 or more).
    step_gpu = [a.elapsed_time(b) for a, b in zip(step_done, step_done[1:])]
    between = sorted(step_gpu)
    host = host_load(host_before, host_cpu_sample(), os.cpu_count() or 1)
    if side is not None:
        side.synchronize()
    calls = timer.per_step(args.steps) if timer is not None else None
    if tracer is not None:  # the last step's end; then the lines so far
        tracer.shim_trace_mark(total)
        tracer.shim_trace_flush()

    loss_hex = [float(v).hex() for v in losses.cpu().tolist()]
    result = {
        "rank": rank,
        "ms_per_step": elapsed * 1000.0 / args.steps,
        # The CPU's time to enqueue the timed steps: close to ms_per_step
        # when the launching thread, not the GPU, sets the pace.
        "enqueue_ms_per_step": enqueued * 1000.0 / args.steps,
        "gpu_steps_behind": behind / args.steps,
        "gpu_step_ms": {"min": between[0], "median": between[len(between) // 2],
                        "max": between[-1]} if between else None,
        # In order, to 0.01 ms: which steps were slow, on the GPU and on
        # the launching thread (a stall there starves the GPU).
        "steps_gpu_ms": [round(v, 2) for v in step_gpu],
        "steps_cpu_ms": [round(v * 1000.0, 2) for v in step_cpu],
        # A fixed loop of the interpreter's, timed before each step (about
        # 50 us; not in steps_cpu_ms): slower when the host's CPU is.
        "steps_probe_us": [round(v * 1e6, 1) for v in step_probe],
        **host,
        "losses": loss_hex,
        "losses_sha256": hashlib.sha256("\n".join(loss_hex).encode()).hexdigest(),
        "weights_sha256": params_sha256(model),
        "params": sum(p.numel() for p in model.parameters()),
        "record_stream_reaches_allocator": hooked,
        # record_stream calls that reached cudefer through cudefer.torch
        # (None without it): what shows it wired, not only installed.
        "record_stream_recorded": cudefer.torch.recorded(),
        "device": torch.cuda.get_device_name(device),
        "train_s": time.time() - started,
        "cfg": cfg,
    }
    if tracer is not None:
        result["trace"] = os.environ["CUDEFER_TRACE_FILE"]
    if calls is not None:
        result["calls"] = calls
    if side is not None:
        result["side_sha256"] = [hashlib.sha256(tensor_bytes(r)).hexdigest()
                                 for r in side_results]
    if args.allocator in USES_CUDEFER:
        result["cudefer_stats"] = cudefer.stats(prep["lib"])
        # Counters per timed step (the steady state, warm-up excluded).
        result["cudefer_per_step"] = {
            k: (v - window_start.get(k, 0)) / args.steps
            for k, v in result["cudefer_stats"].items()
            if k in COUNTERS_PER_STEP}
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    mem = sampler.finish(window)
    if "error" in mem:
        log("no peak memory: %s" % mem["error"])
        result["peak_mib"], result["peak_source"] = None, None
    else:
        result["peak_mib"] = mem["peak_bytes"] / 1048576.0
        result["peak_source"], result["nvml_samples"] = mem["source"], mem["samples"]
        result["window_clock"] = mem.get("window_clock")
    return result


def ddp_rank(rank, world, args, prep, port, out_dir):
    """torch.multiprocessing.spawn's entry: run the rank, write its result."""
    result = run_rank(rank, world, args, prep, port)
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.trace:
        os.environ["CUDEFER_TRACE_FILE"] = os.path.abspath(args.trace)
    if args.allocator == "native-async":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    elif "backend:" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        sys.exit("torch_train: PYTORCH_CUDA_ALLOC_CONF chooses a backend; "
                 "unset it (--allocator chooses)")
    import torch
    if not torch.cuda.is_available():
        sys.exit("torch_train: no CUDA device")
    prep = prepare(args)
    started = time.time()
    if args.ddp:
        import torch.multiprocessing as mp
        world = torch.cuda.device_count()
        with tempfile.TemporaryDirectory(prefix="torch_train.") as out_dir:
            mp.spawn(ddp_rank, args=(world, args, prep, free_port(), out_dir),
                     nprocs=world, join=True)
            ranks = []
            for r in range(world):
                with open(os.path.join(out_dir, "rank%d.json" % r)) as f:
                    ranks.append(json.load(f))
    else:
        world = 1
        ranks = [run_rank(0, 1, args, prep, None)]

    first = ranks[0]
    peaks = [r["peak_mib"] for r in ranks]
    result = {
        "model": args.model, "allocator": args.allocator,
        "device": first["device"], "gpus": world, "ddp": args.ddp,
        "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
        "side_stream": args.side_stream,
        "ms_per_step": first["ms_per_step"],
        "enqueue_ms_per_step": first["enqueue_ms_per_step"],
        "gpu_steps_behind": first["gpu_steps_behind"],
        **{k: first[k] for k in ("host_busy_cpus", "host_steal_pct",
                                 "gpu_step_ms", "steps_gpu_ms",
                                 "steps_cpu_ms", "steps_probe_us",
                                 "window_clock")
           if k in first},
        "peak_mib": None if None in peaks else max(peaks),
        "peak_source": first["peak_source"],
        "losses": first["losses"], "losses_sha256": first["losses_sha256"],
        "weights_sha256": first["weights_sha256"],
        "params": first["params"], "batch": first["cfg"]["batch"],
        "amp": "off" if args.no_amp else "bf16",
        "record_stream_reaches_allocator": first["record_stream_reaches_allocator"],
        "record_stream_recorded": first["record_stream_recorded"],
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "wall_s": time.time() - started,
    }
    if prep["lib"]:
        result["lib"] = prep["lib"]
    if args.side_stream:
        result["side_sha256"] = first["side_sha256"]
    if "trace" in first:
        result["trace"] = first["trace"]
    if "calls" in first:
        result["calls"] = first["calls"]
    if args.allocator in USES_CUDEFER:
        result["cudefer_stats"] = first["cudefer_stats"]
        result["cudefer_per_step"] = first["cudefer_per_step"]
    if args.ddp:
        result["ms_per_step_ranks"] = [r["ms_per_step"] for r in ranks]
        result["peak_mib_ranks"] = peaks
        result["weights_sha256_ranks"] = [r["weights_sha256"] for r in ranks]
        result["weights_identical_across_ranks"] = \
            len(set(result["weights_sha256_ranks"])) == 1
        result["losses_sha256_ranks"] = [r["losses_sha256"] for r in ranks]
        if args.side_stream:
            result["side_sha256_ranks"] = [r["side_sha256"] for r in ranks]
        if args.allocator in USES_CUDEFER:
            result["cudefer_stats_ranks"] = [r["cudefer_stats"] for r in ranks]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
