#!/bin/sh
# plot.sh JSONFILE OUT.png — draw cudefer-bench results with gnuplot.
#
# Panel 1: ratio_done (median, whiskers min..max) per workload W1-W4, one bar
#          per strategy; 1.0 is the preallocated 'limit' of the same run.
# Panel 2: W5 call cost, p50 and p99 of the release call (us, log scale),
#          idle and busy stream, one bar per strategy.
# Needs gnuplot (Debian: gnuplot-nox) and awk; reads the JSON lines that
# cudefer-bench writes with --json.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 JSONFILE OUT.png" >&2
    exit 2
fi
json=$1
out=$2
[ -r "$json" ] || { echo "$0: cannot read $json" >&2; exit 1; }
command -v gnuplot >/dev/null 2>&1 || { echo "$0: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cudefer-plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# Extract tab-separated tables from the JSON lines (flat objects, one a line).
awk -v dir="$tmp" '
function jget(line, key,    pat, i, s, c, out, k) {
    pat = "\"" key "\":"
    i = index(line, pat)
    if (i == 0) return "NaN"
    s = substr(line, i + length(pat))
    if (substr(s, 1, 1) == "\"") {
        out = ""
        for (k = 2; k <= length(s); k++) {
            c = substr(s, k, 1)
            if (c == "\\") { k++; out = out substr(s, k, 1); continue }
            if (c == "\"") break
            out = out c
        }
        return out
    }
    if (match(s, /^[^,}]*/) == 0) return "NaN"
    s = substr(s, 1, RLENGTH)
    gsub(/[ \t]/, "", s)
    if (s == "null" || s == "") return "NaN"
    return s
}
function addstrat(list, n, name,    i) {
    if (!(name in color)) color[name] = ++ncolor   # one colour per strategy
    for (i = 1; i <= n[list]; i++) if (S[list, i] == name) return
    n[list]++
    S[list, n[list]] = name
}
/^[ \t]*\{/ {
    wl = jget($0, "workload"); st = jget($0, "strategy")
    if (device == "") {
        device = jget($0, "device"); date = jget($0, "date"); cuda = jget($0, "cuda")
    }
    if (wl ~ /^W[1-4]$/) {
        if (!(wl in seenwl)) { seenwl[wl] = 1; wls[++nwl] = wl }
        addstrat("r", n, st)
        R[wl, st] = jget($0, "ratio_done") "\t" jget($0, "ratio_done_min") "\t" jget($0, "ratio_done_max")
    } else if (wl == "W5-idle" || wl == "W5-busy") {
        addstrat("c", n, st)
        ph = (wl == "W5-idle") ? "idle" : "busy"
        C[ph " p50", st] = jget($0, "call_p50_us")
        C[ph " p99", st] = jget($0, "call_p99_us")
    }
}
END {
    gsub(/["\\]/, "", device); gsub(/["\\]/, "", cuda); gsub(/["\\]/, "", date)
    print device " | " cuda " | " date > (dir "/title")

    f = dir "/ratio.tsv"
    printf "workload" > f
    for (i = 1; i <= n["r"]; i++) printf "\t%s\t%s_min\t%s_max", S["r", i], S["r", i], S["r", i] > f
    printf "\n" > f
    # workloads in W1..W4 order
    for (w = 1; w <= 4; w++) {
        wl = "W" w
        if (!(wl in seenwl)) continue
        printf "%s", wl > f
        for (i = 1; i <= n["r"]; i++) {
            v = ((wl, S["r", i]) in R) ? R[wl, S["r", i]] : "NaN\tNaN\tNaN"
            printf "\t%s", v > f
        }
        printf "\n" > f
    }
    print n["r"] + 0 > (dir "/nratio")
    cr = ""
    for (i = 1; i <= n["r"]; i++) cr = cr " " color[S["r", i]]
    print cr > (dir "/cratio")

    f = dir "/call.tsv"
    printf "measure" > f
    for (i = 1; i <= n["c"]; i++) printf "\t%s", S["c", i] > f
    printf "\n" > f
    split("idle p50,idle p99,busy p50,busy p99", ms, ",")
    for (m = 1; m <= 4; m++) {
        printf "%s", ms[m] > f
        for (i = 1; i <= n["c"]; i++) {
            v = ((ms[m], S["c", i]) in C) ? C[ms[m], S["c", i]] : "NaN"
            printf "\t%s", v > f
        }
        printf "\n" > f
    }
    print n["c"] + 0 > (dir "/ncall")
    cc = ""
    for (i = 1; i <= n["c"]; i++) cc = cc " " color[S["c", i]]
    print cc > (dir "/ccall")
}' "$json"

nratio=$(cat "$tmp/nratio")
ncall=$(cat "$tmp/ncall")
title=$(cat "$tmp/title")
cratio=$(cat "$tmp/cratio")
ccall=$(cat "$tmp/ccall")
if [ "$nratio" -eq 0 ] && [ "$ncall" -eq 0 ]; then
    echo "$0: no W1-W5 results in $json" >&2
    exit 1
fi

panels=0
[ "$nratio" -gt 0 ] && panels=$((panels + 1))
[ "$ncall" -gt 0 ] && panels=$((panels + 1))

{
    echo 'set terminal pngcairo size 1400,'"$((panels * 480 + 40))"' font ",10" noenhanced'
    echo "set output '$out'"
    echo "cr = \"$cratio\""
    echo "cc = \"$ccall\""
    printf '%s\n' 'set datafile separator "\t"'
    echo 'set datafile missing "NaN"'
    echo 'set style data histograms'
    echo 'set style fill solid 0.85 border -1'
    echo 'set key outside right top vertical noenhanced'
    echo 'set grid ytics'
    echo "set multiplot layout $panels,1 title \"cudefer-bench: $title\""
    if [ "$nratio" -gt 0 ]; then
        echo 'set title "time until all GPU work is done, ratio to the preallocated limit (median; whiskers min..max)"'
        echo 'set style histogram errorbars gap 2 lw 1'
        echo 'set ylabel "ratio_done (limit = 1)"'
        echo 'set yrange [0:*]'
        echo 'set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb "black"'
        echo "plot for [i=0:$((nratio - 1))] '$tmp/ratio.tsv' using (column(2+3*i)):(column(3+3*i)):(column(4+3*i)):xtic(1) title columnheader(2+3*i) lt (int(word(cr, i+1)))"
        echo 'unset arrow 1'
    fi
    if [ "$ncall" -gt 0 ]; then
        echo 'set title "W5: cost of the release call alone (us, log scale)"'
        echo 'set style histogram clustered gap 2'
        echo 'set ylabel "us per call"'
        echo 'set logscale y'
        echo 'set yrange [0.01:*]'
        echo "plot for [i=2:$((ncall + 1))] '$tmp/call.tsv' using i:xtic(1) title columnheader(i) lt (int(word(cc, i-1)))"
    fi
    echo 'unset multiplot'
} > "$tmp/plot.gp"

gnuplot "$tmp/plot.gp"
echo "$0: wrote $out" >&2
