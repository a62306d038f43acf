#!/bin/bash
# W5 A/B/C/D in one run: 190681f against entry slabs of 256 populated (default), 256 not populated, 64 populated
OUT=$1; R=$2
mkdir -p /tmp/w && cd /tmp/w && rm -rf prev v1 v2 v3 && for v in v1 v2 v3; do mkdir $v; (cd $v && tar xzf $R/.dist/cudefer-0.2.0.tar.gz); done && mkdir prev && (cd prev && tar xzf $R/.dist/prev-190681f.tar.gz)
(cd prev/cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "prev build failed") &
(cd v1/cudefer-0.2.0 && ./configure -q && make -j16 all bench >/dev/null 2>&1 || echo "v1 build failed") &
(cd v2/cudefer-0.2.0 && ./configure -q CPPFLAGS=-DENTRY_SLAB_POPULATE=0 && make -j16 all bench >/dev/null 2>&1 || echo "v2 build failed") &
(cd v3/cudefer-0.2.0 && ./configure -q CPPFLAGS=-DENTRY_SLAB_ENTRIES=64 && make -j16 all bench >/dev/null 2>&1 || echo "v3 build failed") &
wait
for rep in 0 1 2 3 4; do
  for w in W5-idle W5-busy; do
    for b in prev:190681f v1:slab256 v2:slab256-nopop v3:slab64; do
      d=${b%%:*}; n=${b##*:}
      /tmp/w/$d/cudefer-0.2.0/bench/bench-release-call --workload $w --strategy cudefer --rep $rep | sed "s/^{/{\"build\":\"$n\",/" >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
    done
    /tmp/w/v1/cudefer-0.2.0/bench/bench-release-call --workload $w --strategy inline-async --rep $rep | sed 's/^{/{"build":"-",/' >> $OUT/w5ab.jsonl 2>>$OUT/w5ab.err
  done
done
python3 $R/.dist/abtab.py $OUT/w5ab.jsonl
