#!/usr/bin/env bash
# Instructions per run on rank 0 (callgrind), collected inside the timed call only
# (--collect-atstart=no; proto.py toggles collection around run() on rank 0 when --settle is
# given). Rank 0 sleeps --settle seconds before each run, so the peer's frame is there at its
# first poll and the count is deterministic: what this rank executes per run, the wait excluded.
#   benchmarks/round_prototypes/cg_count.sh BUILD_DIR SIZE ITERS VARIANT...
set -euo pipefail
dir=$1 size=$2 iters=$3; shift 3
out=$(mktemp -d)
for v in "$@"; do
  timeout 1800 mpiexec -n 2 valgrind --tool=callgrind --collect-atstart=no \
    --callgrind-out-file="$out/$v.%q{PMI_RANK}" \
    python "$(dirname "$0")/proto.py" --only "$v" --iters "$iters" --sizes "$size" --settle "${SETTLE:-0.02}" \
    --build-dir "$dir" >/dev/null 2>&1
  total=$(callgrind_annotate "$out/$v.0" 2>/dev/null | grep "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,)
  echo "$size B $v: $((total / iters)) instructions per run on rank 0"
done
rm -rf "$out"
