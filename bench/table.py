# SPDX-License-Identifier: MIT
"""bench/table.py: the table bench/run.py prints at the end, from the
summary records (one per workload and strategy; see bench/README.md for the
columns).  Python standard library only."""
import sys


# ---- the table ---------------------------------------------------------------

def fmt(v, prec=1, scale=1.0):
    return '-' if v is None else '%.*f' % (prec, v * scale)


def fmt_spread(s, key, prec=3):
    if s.get(key) is None:
        return '-'
    return '%.*f [%.*f-%.*f]' % (prec, s[key], prec, s[key + '_min'], prec,
                                 s[key + '_max'])


def fmt_slash(s, keys, prec=1):
    vals = [s.get(k) for k in keys]
    return '-' if all(v is None for v in vals) else '/'.join(fmt(v, prec) for v in vals)


def fmt_reps(s):
    """Repetitions with a result; those that failed, and those whose result
    counts but whose program then exited nonzero (e.g. its shutdown
    failed), said."""
    if s is None:
        return '-'
    notes = (['%d FAILED' % s['reps_failed']] if s['reps_failed'] else []) + \
        (['%d exit!=0' % s['reps_exit_nonzero']]
         if s.get('reps_exit_nonzero') else [])
    return '%d (%s)' % (s['reps'], ', '.join(notes)) if notes else '%d' % s['reps']


def print_grid(header, rows):
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        print('  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def table_loop(wl, rows, o):
    lim = next((s for s in rows if s['strategy'] == 'limit'), {})
    floor = next((s for s in rows if s['strategy'] == 'malloc-never-free'), {})
    print('   %d x %d iterations; limit: all GPU work done in %s ms%s' % (
        8 if wl.name == 'W4' else 1, o.iters, fmt(lim.get('done_ms')),
        '; floor (malloc-never-free): %s ms' % fmt(floor.get('done_ms'))
        if floor else ''))
    print_grid(['strategy', 'done x limit', 'done x floor', 'released x limit',
                'iter p50/p99/max us', 'call p50/p99 us', 'peak MiB', 'recl CPU ms',
                'q/rel', 'reps'],
               [[s['strategy'], fmt_spread(s, 'ratio_done'),
                 fmt_spread(s, 'ratio_done_floor'), fmt_spread(s, 'ratio_released'),
                 fmt_slash(s, ['iter_p50_us', 'iter_p99_us', 'iter_max_us']),
                 fmt_slash(s, ['call_p50_us', 'call_p99_us']),
                 fmt(s.get('peak_bytes'), 1, 1 / 1048576.0),
                 fmt(s.get('reclaimer_cpu_ms')), fmt(s.get('queries_per_release'), 2),
                 fmt_reps(s)] for s in rows])


def table_call(idle, busy, o):
    print('   %d release calls per process, each timed alone; busy: a 200 ms kernel '
          'queued first (held: still running after the last call); x async: '
          'to inline-async (cudaFreeAsync) of the same repetition' % o.w5_calls)
    names = list(dict.fromkeys([s['strategy'] for s in idle + busy]))
    get = lambda rows, n: next((s for s in rows if s['strategy'] == n), {})
    grid = []
    for n in names:
        i, b = get(idle, n), get(busy, n)
        pair = lambda k, p=2: '%s/%s' % (fmt(i.get(k), p), fmt(b.get(k), p))
        grid.append([n, fmt_slash(i, ['call_p50_us', 'call_p99_us', 'call_max_us'], 2),
                     fmt_slash(b, ['call_p50_us', 'call_p99_us', 'call_max_us'], 2),
                     fmt_slash(i, ['ratio_p50_async', 'ratio_p99_async'], 2),
                     fmt_slash(b, ['ratio_p50_async', 'ratio_p99_async'], 2),
                     fmt(b.get('busy_held'), 0),
                     pair('reclaimer_cpu_ms', 1), pair('queries_per_release'),
                     '%s/%s' % (fmt_reps(i or None), fmt_reps(b or None))])
    print_grid(['strategy', 'idle p50/p99/max us', 'busy p50/p99/max us',
                'idle p50/p99 x async', 'busy p50/p99 x async', 'held',
                'recl CPU ms i/b', 'q/rel i/b', 'reps i/b'], grid)


# bench-call-parts' parts, in its order (STREAM_PART_p50_us and so on).
PARTS = ['clock', 'is_capturing', 'stream_get_device', 'stream_get_id',
         'get_device', 'event_create', 'event_record', 'drv_is_capturing',
         'drv_get_device', 'drv_event_create', 'drv_event_record', 'own_query',
         'defer_free',
         'defer_call', 'event_record_rr16', 'defer_call_rr16', 'pair_defer',
         'pair_defer_alloc', 'pair_defer_free', 'pair_async',
         'pair_malloc_async', 'pair_free_async']


def table_parts(rows, o):
    print('   %d calls of each part, each timed alone; idle: the stream has no '
          'work; busy: a 2 s kernel queued first; medians over repetitions; '
          'own: defer_free less the capture check and the record it makes '
          '(the driver\'s, or with CUDEFER_DRIVER_CALLS=0 the runtime\'s)'
          % o.w5_calls)
    get = lambda n: next((s for s in rows if s['strategy'] == n), {})
    idle, busy = get('idle'), get('busy')
    cell = lambda s, key: fmt_slash(s, [key + '_p50_us', key + '_p99_us'], 2)
    grid = [[part] + [cell(s, stream + '_' + part)
                      for stream in ('created', 'legacy') for s in (idle, busy)]
            for part in PARTS]
    grid.append(['defer_free own p50'] +
                [fmt(s.get(stream + '_defer_free_own_p50_us'), 2)
                 for stream in ('created', 'legacy') for s in (idle, busy)])
    print_grid(['part', 'created idle p50/p99 us', 'created busy',
                'stream 0 idle', 'stream 0 busy'], grid)


def table_scale(rows, o):
    print('   %d calls; memory read while every entry waits behind the gate; '
          'x no-library: calls/s to the no-library row' % o.w6_entries)
    print_grid(['strategy', 'Mcalls/s', 'x no-library', 'call p50/p99/max us',
                'recl CPU ms', 'batches', 'us/batch', 'q/rel', 'bytes/entry',
                'drain ms', 'reps'],
               [[s['strategy'], fmt(s.get('enqueue_calls_per_s'), 3, 1e-6),
                 fmt_spread(s, 'ratio_calls_per_s'),
                 fmt_slash(s, ['call_p50_us', 'call_p99_us', 'call_max_us'], 2),
                 fmt(s.get('reclaimer_cpu_ms')), fmt(s.get('batches'), 0),
                 fmt(s.get('pass_us')), fmt(s.get('queries_per_release'), 2),
                 fmt(s.get('bytes_per_entry')), fmt(s.get('drain_ms')),
                 fmt_reps(s) + ('  (enqueue stalled: gate opened early)'
                                if s.get('gate_stalled') else '')] for s in rows])


def table_train(rows, o):
    gpus = next((s.get('gpus') for s in rows if s.get('gpus')), None)
    print('   %d steps timed after %d warm-up steps, %s GPU(s); x native: to '
          'PyTorch\'s caching allocator in the same repetition' % (
              o.train_steps, o.train_warmup, gpus or '?'))
    # of the repetitions compared (native's first is the reference)
    ident = lambda s, k: '-' if s.get(k) is None else '%s (%d/%d)' % (
        'yes' if s[k] else 'NO', s[k + '_reps'],
        s.get(k + '_compared', s['reps']))
    # GPU behind: steps the GPU had not finished when a step began (about
    # 1: the GPU sets the pace; below: the launching thread does); misses
    # and hand-backs: cudefer's per timed step.
    # alloc/free us: --time-calls, the allocator's own microseconds a step
    # in its allocations and its frees.
    # host busy/steal: the machine's CPUs busy on average (the run's own
    # threads among them) and the % of CPU time stolen by the hypervisor.
    timed = any(s.get('calls_alloc_us_per_step') is not None for s in rows)
    host = any(s.get('host_busy_cpus') is not None for s in rows)
    print_grid(['allocator', 'ms/step', 'x native', 'peak MiB', 'peak x native',
                'GPU behind', 'misses', 'hand-backs'] +
               (['alloc/free us'] if timed else []) +
               (['host busy/steal%'] if host else []) +
               ['losses identical', 'weights identical', 'reps'],
               [[s['strategy'], fmt(s.get('ms_per_step'), 2),
                 fmt_spread(s, 'ms_per_step_ratio'), fmt(s.get('peak_mib'), 0),
                 fmt_spread(s, 'peak_ratio'), fmt(s.get('gpu_steps_behind'), 2),
                 fmt(s.get('misses_per_step'), 2),
                 fmt(s.get('hand_backs_per_step'), 2)] +
                (['%s/%s' % (fmt(s.get('calls_alloc_us_per_step'), 0),
                             fmt(s.get('calls_free_us_per_step'), 0))]
                 if timed else []) +
                (['%s/%s' % (fmt(s.get('host_busy_cpus'), 1),
                             fmt(s.get('host_steal_pct'), 1))]
                 if host else []) +
                [ident(s, 'losses_identical'),
                 ident(s, 'weights_identical'), fmt_reps(s)] for s in rows])


def print_table(workloads, summaries, info, o, failures):
    by_wl = {}
    for s in summaries:
        by_wl.setdefault(s['workload'], []).append(s)
    print('\ncudefer bench: %s, CUDA %s, NVIDIA driver %s, cudefer %s, commit %s, %s'
          % (info.get('device', '?'), info.get('cuda', '?'),
             info.get('driver_version') or '?', info.get('cudefer_version', '?'),
             info.get('commit', '?'), info.get('date')))
    print('ratios: median [min-max] over repetitions, each to a bound row of the '
          'same repetition; other columns: medians over repetitions')
    done = set()
    for wl in workloads:
        if wl.group in done:
            continue
        done.add(wl.group)
        print('\n== %s %s' % (wl.group, wl.title))
        if wl.group == 'W5':
            table_call(by_wl.get('W5-idle', []), by_wl.get('W5-busy', []), o)
        elif wl.name == 'W5-parts':
            table_parts(by_wl.get('W5-parts', []), o)
        elif wl.name == 'W6':
            table_scale(by_wl.get('W6', []), o)
        elif wl.is_train:
            table_train(by_wl.get(wl.name, []), o)
        else:
            table_loop(wl, by_wl.get(wl.name, []), o)
    if failures:
        print('\n%d run(s) FAILED: see the messages on stderr above' % failures)
    sys.stdout.flush()
