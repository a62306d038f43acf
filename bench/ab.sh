#!/bin/bash
# SPDX-License-Identifier: MIT
# bench/ab.sh OLD NEW: two builds of cudefer measured side by side on one
# GPU machine, through bench/run.py, in one results file.
#
# OLD and NEW are each a commit of this repository (unpacked with git
# archive, then ./bootstrap: needs autotools) or a tarball: make dist's
# (it carries bench/source-commit) or git archive's (it carries the commit
# in its header; needs autotools too).  A machine whose copy of the tree
# has no .git takes tarballs made beforehand, e.g.
#   git archive -o old.tar.gz OLD && git archive -o new.tar.gz NEW
# Each is built apart (./configure && make all bench), both at once, in
# AB_WORK/old and AB_WORK/new; a build already there for the same commit
# is used again.
#
# Then, for each repetition and each workload, this checkout's bench/run.py
# runs that workload once (--reps 1) with each build's programs and
# library, the two builds' order swapped from one (repetition, workload) to
# the next, so that neither always runs first.  Each run.py run takes its
# ratios against the bound rows of its own build and repetition.  The
# results file (bench/ab_merge.py) has one header with the device, this
# command and both commits; the rows that call the library are named
# ROW@old and ROW@new, the bound rows and peers keep their names (both
# builds' repetitions pooled).  Its table: OUT.txt, beside it
# (`run.py --from-json OUT`).
#
# Environment:
#   WORKLOADS       run.py workloads, by spaces (default: W1 W2 W3 W4 W5 W6
#                   train-cnn train-lm; training is skipped, said, without torch)
#   REPS            repetitions (3)
#   RUN_ARGS        more run.py options for every run, e.g.
#                   "--strategies limit,malloc-never-free,cudefer" or
#                   "--variant poll1ms=CUDEFER_POLL_US=1000" or "--time-calls"
#   OUT             the results file (ab-OLD-NEW.jsonl, short commits, here)
#   AB_WORK         where the builds go (${TMPDIR:-/tmp}/cudefer-ab)
#   CONFIGURE_ARGS  for both builds' ./configure, e.g. CPPFLAGS=-DX=1
#   JOBS            make -j (nproc)
#   PYTHON          (python3)
# Exit status: 0 when every run succeeded, 1 when one failed (its records
# say which), 2 for bad arguments or a failed build.
set -u

usage() {
  echo "usage: bench/ab.sh OLD NEW   (commits or tarballs; the environment" \
    "variables are in its header)" >&2
  exit 2
}
[ $# -eq 2 ] || usage
BENCH=$(cd "$(dirname "$0")" && pwd)
SRCDIR=$(dirname "$BENCH")
PY=${PYTHON:-python3}
WORKLOADS=${WORKLOADS:-W1 W2 W3 W4 W5 W6 train-cnn train-lm}
REPS=${REPS:-3}
RUN_ARGS=${RUN_ARGS:-}
WORK=${AB_WORK:-${TMPDIR:-/tmp}/cudefer-ab}
CONFIGURE_ARGS=${CONFIGURE_ARGS:-}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
case $REPS in ''|*[!0-9]*|0) echo "ab.sh: REPS must be a number of 1 or more," \
  "not '$REPS'" >&2; exit 2 ;; esac

# The commit that ARG names, on stdout; says why on stderr otherwise.
commit_of() {
  local arg=$1 c=
  if [ -f "$arg" ]; then
    c=$(tar -xOf "$arg" --wildcards '*bench/source-commit' 2>/dev/null | head -n 1)
    [ -n "$c" ] || c=$( (gzip -dc "$arg" 2>/dev/null || cat "$arg") |
                          git get-tar-commit-id 2>/dev/null)
    [ -n "$c" ] && { echo "$c"; return 0; }
    echo "ab.sh: $arg: no commit in this tarball (neither make dist's" \
      "bench/source-commit nor git archive's header)" >&2
    return 1
  fi
  if c=$(git -C "$SRCDIR" rev-parse --verify -q "$arg^{commit}" 2>/dev/null); then
    echo "$c"; return 0
  fi
  echo "ab.sh: '$arg' is neither a file nor a commit of $SRCDIR" >&2
  return 1
}

# Unpack and build ARG, commit COMMIT, in WORK/LABEL/tree (unless built).
build() {
  local label=$1 arg=$2 commit=$3 dir=$WORK/$1 top
  if [ "$(cat "$dir/.ab-built" 2>/dev/null)" = "$commit" ]; then
    echo "ab.sh: $label: the build of $commit in $dir/tree, as it is" >&2
    return 0
  fi
  rm -rf "$dir" && mkdir -p "$dir/unpack" || return 1
  if [ -f "$arg" ]; then
    tar -xf "$arg" -C "$dir/unpack" || return 1
  else
    git -C "$SRCDIR" archive --format=tar "$commit" | tar -xf - -C "$dir/unpack" ||
      return 1
  fi
  top=$dir/unpack
  # a tarball with one folder on top (make dist's, git archive --prefix's)
  if [ ! -f "$top/configure.ac" ] && [ "$(ls -A "$top" | wc -l)" = 1 ]; then
    top=$top/$(ls -A "$top")
  fi
  mv "$top" "$dir/tree" || return 1
  [ -s "$dir/tree/bench/source-commit" ] || echo "$commit" > "$dir/tree/bench/source-commit"
  echo "ab.sh: $label: building $commit in $dir/tree (log: $dir/build.log)" >&2
  # shellcheck disable=SC2086 # CONFIGURE_ARGS: words
  if (cd "$dir/tree" && { [ -x configure ] || ./bootstrap; } &&
      ./configure -q $CONFIGURE_ARGS && make -j"$JOBS" all bench) > "$dir/build.log" 2>&1
  then
    echo "$commit" > "$dir/.ab-built"
  else
    echo "ab.sh: $label: the build of $commit failed; the end of $dir/build.log:" >&2
    tail -n 15 "$dir/build.log" >&2
    return 1
  fi
}

OLDC=$(commit_of "$1") || exit 2
NEWC=$(commit_of "$2") || exit 2
OUT=${OUT:-$PWD/ab-${OLDC:0:7}-${NEWC:0:7}.jsonl}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
mkdir -p "$WORK" || exit 2
build old "$1" "$OLDC" & pid_old=$!
build new "$2" "$NEWC" & pid_new=$!
ok=0
wait $pid_old || ok=2
wait $pid_new || ok=2
[ $ok = 0 ] || exit 2

CMD="WORKLOADS='$WORKLOADS' REPS=$REPS"
[ -n "$RUN_ARGS" ] && CMD="$CMD RUN_ARGS='$RUN_ARGS'"
[ -n "$CONFIGURE_ARGS" ] && CMD="$CMD CONFIGURE_ARGS='$CONFIGURE_ARGS'"
CMD="$CMD bench/ab.sh $1 $2"
PARTS=$WORK/parts.$$
rm -rf "$PARTS" && mkdir -p "$PARTS" || exit 2
parts=()
status=0
for ((rep = 0; rep < REPS; rep++)); do
  wi=0
  for w in $WORKLOADS; do
    if (( (rep + wi) % 2 == 0 )); then order="old new"; else order="new old"; fi
    wi=$((wi + 1))
    for b in $order; do
      tree=$WORK/$b/tree
      part=$PARTS/$rep-$w-$b.jsonl
      lib=()
      [ -f "$tree/src/.libs/libcudefer.so" ] &&
        lib=(--torch-lib "$tree/src/.libs/libcudefer.so")
      echo "ab.sh: repetition $((rep + 1))/$REPS, $w, $b" >&2
      # shellcheck disable=SC2086 # RUN_ARGS: words
      (cd "$tree" && "$PY" "$BENCH/run.py" --workloads "$w" --reps 1 \
        --bindir "$tree/bench" ${lib[@]+"${lib[@]}"} $RUN_ARGS --json "$part") \
        > "$part.log" 2>&1
      rc=$?
      if [ $rc != 0 ]; then
        echo "ab.sh: $w, $b: run.py's exit status $rc; the end of $part.log:" >&2
        tail -n 5 "$part.log" >&2
        status=1
      fi
      [ -s "$part" ] && parts+=("$b:$rep:$part")
    done
  done
done
if [ ${#parts[@]} = 0 ]; then
  echo "ab.sh: no run gave results (logs: $PARTS)" >&2
  exit 1
fi
"$PY" "$BENCH/ab_merge.py" --old "$OLDC" --new "$NEWC" --command "$CMD" \
  --out "$OUT" "${parts[@]}" || exit 1
"$PY" "$BENCH/run.py" --from-json "$OUT" > "${OUT%.jsonl}.txt" || status=1
if [ $status = 0 ]; then rm -rf "$PARTS"; else echo "ab.sh: the runs' logs: $PARTS" >&2; fi
echo "ab.sh: $OUT and ${OUT%.jsonl}.txt written" >&2
exit $status
