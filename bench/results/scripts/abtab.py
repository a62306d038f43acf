import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    rows.setdefault((d['workload'],d['build']),[]).append(d)
def f(v): return float('%.3g'%v)
for (w,b),ds in sorted(rows.items()):
    ds.sort(key=lambda d:d['rep'])
    def m(k):
        xs=[d[k] for d in ds]; return '%s [%s, %s]'%(f(st.median(xs)),f(min(xs)),f(max(xs)))
    if 'call_p95_us' in ds[0]:
        print('%-15s %-11s p50 %s  p95 %s  p99 %s  max %s us  slow %s  gap %s  ev %s  faults %s  vol %s'%(w,b,m('call_p50_us'),m('call_p95_us'),m('call_p99_us'),m('call_max_us'),m('slow_calls'),[d['slow_gap_mode'] for d in ds],[d.get('events_created_calls') for d in ds],[d['calls_minor_faults'] for d in ds],[d['calls_vol_switches'] for d in ds]))
    else:
        print('%-6s %-10s Mcalls/s %s  p50 %s  p99 %s  max %s us  over 1 ms %s  bytes/entry %s'%(w,b,m('enqueue_calls_per_s'),m('call_p50_us'),m('call_p99_us'),m('call_max_us'),m('calls_over_1ms'),m('bytes_per_entry')))
