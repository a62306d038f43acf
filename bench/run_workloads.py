# SPDX-License-Identifier: MIT
"""bench/run_workloads.py: what bench/run.py can run: the workloads (which
program, strategies in table order, bound rows, ratios to them), the
strategies and the --variant rows built on them.  Python standard library
only."""
import re

LOOP_STRATEGIES = ['limit', 'malloc-never-free', 'inline-cudaFree', 'inline-async',
                   'naive-reclaimer', 'cudefer', 'cudefer-alloc', 'malloc-record',
                   'malloc-record-query']
CALL_STRATEGIES = ['inline-cudaFree', 'inline-async', 'naive-reclaimer', 'cudefer']
TRAIN_STRATEGIES = ['native', 'native-async', 'pluggable-floor', 'pluggable-async',
                    'cudefer', 'malloc-defer', 'malloc-free']

# A ratio: (key written, metric divided, strategy divided by, its metric).
LIMIT_RATIOS = [('ratio_done', 'done_ms', 'limit', 'done_ms'),
                ('ratio_released', 'released_ms', 'limit', 'done_ms')]
FLOOR_RATIOS = [('ratio_done_floor', 'done_ms', 'malloc-never-free', 'done_ms')]
ASYNC_RATIOS = [('ratio_p50_async', 'call_p50_us', 'inline-async', 'call_p50_us'),
                ('ratio_p99_async', 'call_p99_us', 'inline-async', 'call_p99_us')]
SCALE_RATIOS = [('ratio_calls_per_s', 'enqueue_calls_per_s', 'no-library',
                 'enqueue_calls_per_s')]
TRAIN_RATIOS = [('ms_per_step_ratio', 'ms_per_step', 'native', 'ms_per_step'),
                ('peak_ratio', 'peak_mib', 'native', 'peak_mib')]


class Workload:
    """One workload: which program runs it, its strategies in table order,
    the bound rows that always run (first in each repetition), the ratios."""

    def __init__(self, name, group, program, strategies, bounds, ratios,
                 model=None, ddp=False, title=''):
        self.name, self.group, self.program = name, group, program
        self.strategies, self.bounds, self.ratios = strategies, bounds, ratios
        self.model, self.ddp, self.title = model, ddp, title

    @property
    def is_train(self):
        return self.model is not None


def _loop(name, title, floor=True):
    return Workload(name, name, 'bench-launch-loop', LOOP_STRATEGIES,
                    ['limit', 'malloc-never-free'] if floor else ['limit'],
                    LIMIT_RATIOS + (FLOOR_RATIOS if floor else []), title=title)


def _train(model, ddp):
    name = 'train-%s%s' % (model, '-ddp' if ddp else '')
    title = '%s training, %s' % ('ResNet-class CNN' if model == 'cnn' else
                                 'transformer LM',
                                 'DistributedDataParallel over NCCL' if ddp
                                 else 'one GPU')
    return Workload(name, name, None, TRAIN_STRATEGIES, ['native'], TRAIN_RATIOS,
                    model=model, ddp=ddp, title=title)


WORKLOADS = [
    _loop('W1', 'steady: 1 thread, 1 stream, {allocate 1 MiB, 50 us kernel, '
                'release} per iteration, no host sync'),
    _loop('W2', 'bursty: W1 with cudaStreamSynchronize every 32 iterations'),
    Workload('W3', 'W3', 'bench-launch-loop', ['limit', 'inline-async', 'cudefer'],
             ['limit'], LIMIT_RATIOS,
             title='pool: W1 with cudaMallocAsync allocations '
                   '(cudefer: defer_free of pool memory)'),
    _loop('W4', 'threads: 8 launching threads, each W1 on its own stream'),
    # inline-async is what the W5 ratios divide by: a bound, so that it runs
    # first in each repetition and every ratio pairs with its own repetition.
    Workload('W5-idle', 'W5', 'bench-release-call', CALL_STRATEGIES,
             ['inline-async'], ASYNC_RATIOS,
             title='call cost: the release call alone, 1 MiB buffers'),
    Workload('W5-busy', 'W5', 'bench-release-call', CALL_STRATEGIES,
             ['inline-async'], ASYNC_RATIOS,
             title='call cost: the release call alone, 1 MiB buffers'),
    Workload('W5-parts', 'W5-parts', 'bench-call-parts', ['idle', 'busy'], [], [],
             title='the call\'s parts: each CUDA call a defer call may make, '
             'defer_free, defer_call, and the allocator pairs, timed alone on '
             'a created stream and on stream 0'),
    Workload('W6', 'W6', 'bench-scale', ['no-library', 'cudefer'], ['no-library'],
             SCALE_RATIOS, title='scale: 10^6 calls over 1024 streams from 64 '
             'threads, streams held back by a gate kernel (cudefer: defer_call '
             'of a trivial callback; no-library: cudaEventRecord)'),
    _train('cnn', False), _train('lm', False), _train('cnn', True), _train('lm', True),
]
GROUPS = []
for _w in WORKLOADS:
    if _w.group not in GROUPS:
        GROUPS.append(_w.group)
BUILTIN = sorted({s for w in WORKLOADS for s in w.strategies})


class Strategy:
    """A row: a built-in strategy, or a variant (a base strategy run with
    environment settings)."""

    def __init__(self, name, base, env=None, env_text=''):
        self.name, self.base, self.env, self.env_text = name, base, env or {}, env_text


def parse_variant(spec):
    """'NAME[:BASE]=ENV=VAL[,ENV=VAL...]' -> Strategy; ValueError says why."""
    head, sep, assigns = spec.partition('=')
    name, _, base = head.partition(':')
    base = base or 'cudefer'
    if not sep or not assigns:
        raise ValueError("expected NAME[:BASE]=ENV=VAL[,ENV=VAL...]")
    if not re.fullmatch(r'[A-Za-z0-9._+-]+', name):
        raise ValueError("bad name '%s' (letters, digits, . _ + -)" % name)
    if name in BUILTIN:
        raise ValueError("'%s' is a built-in strategy" % name)
    if base not in BUILTIN:
        raise ValueError("unknown base strategy '%s'" % base)
    env = {}
    for item in assigns.split(','):
        key, eq, val = item.partition('=')
        if not eq or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', key):
            raise ValueError("'%s' is not ENV=VAL" % item)
        env[key] = val
    return Strategy(name, base, env, assigns)
