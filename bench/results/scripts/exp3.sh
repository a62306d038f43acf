#!/bin/bash
# W5 p99: is the entry calloc (and its page faults) the tail?  A large event pool keeps entries and events pooled.
OUT=$1; cd "$2"
for rep in 0 1 2; do
  for pool in default 32768; do
    for w in W5-idle-primed W5-busy; do
      if [ $pool = default ]; then
        bench/bench-release-call --workload $w --strategy cudefer --rep $rep | sed "s/^{/{\"pool\":\"$pool\",/" >> $OUT/w5pool.jsonl 2>>$OUT/w5pool.err
      else
        CUDEFER_EVENT_POOL=$pool bench/bench-release-call --workload $w --strategy cudefer --rep $rep | sed "s/^{/{\"pool\":\"$pool\",/" >> $OUT/w5pool.jsonl 2>>$OUT/w5pool.err
      fi
    done
  done
  for w in W5-idle-primed W5-busy; do
    bench/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"pool":"-",/' >> $OUT/w5pool.jsonl 2>>$OUT/w5pool.err
  done
done
python3 - $OUT <<'PY' > $OUT/w5pool.txt
import json,sys
o=sys.argv[1]
for l in open(o+'/w5pool.jsonl'):
    try: d=json.loads(l)
    except Exception: continue
    keys=['pool','workload','strategy','rep','call_p50_us','call_p99_us','call_max_us','events_created_calls','released_calls']
    print({k:d.get(k) for k in keys if k in d})
PY
cat $OUT/w5pool.txt
echo exp3 done
