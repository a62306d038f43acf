#!/bin/sh
# SPDX-License-Identifier: MIT
# make check: bench/replay-trace replays t/replay_small.trace (a small trace
# in bench/torch_shims.c's format, made by t/replay_small.py) on the fake
# runtime, as TAP.  It checks that the replay runs with the oracle clean,
# that its numbers are sane (the steps it measured, misses and hand-backs
# no more than the requests, the pool holding at least the live peak and
# not twice it, the GPU behind), that a steady trace's window closes on
# itself (every free of an earlier block paired, none skipped), that the
# pluggable pair on the legacy stream (--pluggable) replays as well, and that a
# malformed trace is refused with a message naming its line.  Then the
# round trip: t/trace_record records a loop through bench/torch_shims.c's
# cudefer-trace pair on the fake runtime, and replay-trace replays what it
# wrote.  It bounds no policy: t/alloc_steady does.
srcdir=${srcdir:-.}
replay=./bench/replay-trace
trace=$srcdir/t/replay_small.trace
tmp=${TMPDIR:-/tmp}/replay_trace.$$
trap 'rm -f "$tmp".*' EXIT
n=0

# ok COND_STATUS DESCRIPTION: one TAP line.
ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
}

# field NAME: the value of "NAME" in the JSON line of $tmp.out.
field() {
    tail -n 1 "$tmp.out" | sed -n "s/.*\"$1\": \"*\([^,}\"]*\).*/\1/p"
}

# holds AWK_CONDITION: status 0 if the condition on the fields holds.
holds() {
    awk "BEGIN { exit !($1) }"
}

echo "1..17"
"$replay" "$trace" >"$tmp.out" 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.out" "$tmp.err"
ok $status "replay-trace replays $trace (exit status $status)"
ok "$([ "$(field oracle_violations)" = 0 ]; echo $?)" \
   "the oracle saw no early release or reuse ($(field oracle_violations))"
# 6 recorded steps: 3 warm up, the window is the last 3, replayed 3 times,
# the first time unmeasured.
ok "$([ "$(field steps_measured)" = 6 ] && [ "$(field trace_steps)" = 6 ]; echo $?)" \
   "6 steps measured of 6 recorded ($(field steps_measured))"
requests=$(field requests_per_step)
misses=$(field misses_per_step)
releases=$(field releases_per_step)
ok "$(holds "$requests == 32"; echo $?)" \
   "32 requests a step, as t/replay_small.py makes ($requests)"
ok "$(holds "$misses >= 0 && $misses <= $requests && $releases >= 0 && $releases <= $requests"; echo $?)" \
   "misses ($misses) and hand-backs ($releases) a step within the requests"
ratio=$(field reserved_over_live_peak)
ok "$(holds "$ratio >= 1 && $ratio < 2"; echo $?)" \
   "the pool reserves at least the live peak and less than twice it (${ratio}x)"
behind=$(field gpu_steps_behind)
ok "$(holds "$behind > 0.25"; echo $?)" \
   "the simulated GPU runs behind the CPU ($behind step; its queue: 1 step)"
ok "$([ "$(field carried_in_frees)" = 8 ] && [ "$(field paired_frees)" = 8 ] &&
      [ "$(field skipped_frees)" = 0 ] && [ "$(field implicit_frees)" = 0 ]; echo $?)" \
   "the window closes on itself: the 8 gradients freed in its first step pair with its last step's"

# The pool's granularity: 2 MiB unless told; 1 (exact reservations) is
# accepted; a value that is no positive number is refused.
ok "$([ "$(field pool_granularity)" = 2097152 ]; echo $?)" \
   "the pool reserves in 2 MiB granules by default ($(field pool_granularity))"
"$replay" --pool-granularity 1 "$trace" >"$tmp.out" 2>"$tmp.err"
status=$?
"$replay" --pool-granularity 2M "$trace" >/dev/null 2>"$tmp.err2"
bad=$?
sed 's/^/# /' "$tmp.err2"
ok "$([ $status = 0 ] && [ "$(field pool_granularity)" = 1 ] &&
      [ "$(field oracle_violations)" = 0 ] && [ $bad = 2 ] &&
      grep -q "pool-granularity needs a positive number" "$tmp.err2"; echo $?)" \
   "--pool-granularity 1 replays with exact reservations; 2M is refused (exit status $bad)"

# PyTorch's path: the pluggable pair on the legacy stream (what callgrind
# measures, bench/callgrind_calls.py), the oracle clean and no call refused.
"$replay" --pluggable --legacy-stream "$trace" >"$tmp.out" 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.err"
ok "$([ $status = 0 ] && [ "$(field entry_points)" = pluggable ] &&
      [ "$(field stream)" = legacy ] && [ "$(field oracle_violations)" = 0 ] &&
      [ "$(field misses_per_step)" = "$misses" ]; echo $?)" \
   "--pluggable --legacy-stream replays through the pluggable pair, the oracle clean, as many misses (exit status $status)"

# A malformed trace: exit status 2 and the line named.
printf 'm 0\na 4096 0 0x1000\nfree 0x1000 0\n' >"$tmp.bad"
"$replay" "$tmp.bad" >/dev/null 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.err"
ok "$([ $status = 2 ] && grep -q "bad:3: not a trace line" "$tmp.err"; echo $?)" \
   "a line that is no trace line: refused, its line named (exit status $status)"
printf 'm 0\na 4096 0 0x1000\na 8192 0 0x1000\n' >"$tmp.bad"
"$replay" "$tmp.bad" >/dev/null 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.err"
ok "$([ $status = 2 ] && grep -q "bad:3: 0x1000 handed out again (line 2)" "$tmp.err"; echo $?)" \
   "a pointer handed out twice without a free: refused (exit status $status)"
printf 'a 4096 0 0x1000\n' >"$tmp.bad"
"$replay" "$tmp.bad" >/dev/null 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.err"
ok "$([ $status = 2 ] && grep -q "0 step marks" "$tmp.err"; echo $?)" \
   "a trace without step marks: refused (exit status $status)"

# The round trip: recorded by the shims (4 steps of 36 requests, the last
# ended by a mark; 12 gradients live from one step to the next), replayed.
./t/trace_record "$tmp.rec" >"$tmp.out" 2>&1
status=$?
sed 's/^/# /' "$tmp.out"
ok $status "t/trace_record records a loop through the traced shims (exit status $status)"
"$replay" "$tmp.rec" >"$tmp.out" 2>"$tmp.err"
status=$?
sed 's/^/# /' "$tmp.out" "$tmp.err"
ok "$([ $status = 0 ] && [ "$(field oracle_violations)" = 0 ]; echo $?)" \
   "replay-trace replays what the shims recorded, the oracle clean (exit status $status)"
ok "$([ "$(field steps_measured)" = 4 ] && [ "$(field requests_per_step)" = 36.0 ] &&
      [ "$(field carried_in_frees)" = 12 ] && [ "$(field paired_frees)" = 12 ] &&
      [ "$(field skipped_frees)" = 0 ]; echo $?)" \
   "its steps, requests and gradients as recorded (4 steps measured, 36 requests a step, 12 of 12 frees paired)"
