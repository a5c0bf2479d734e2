#!/usr/bin/env bash
# What matching every frame first costs (issue 45 item 1, execution/receives.py): `bench allreduce`
# with ALPHA_MPI_RECEIVES=posted (an executor alone on its tag block posts its receives, the old
# way) and unset (matched, the default), interleaved RUNS times, then the median over runs of
# each size's t_max (per-rank median over iterations) for auto, and new/old.
#
#   benchmarks/receives_cost.sh "LAUNCHER -n 2" PYTHON [RUNS] [SIZES]
#   e.g. benchmarks/receives_cost.sh "mpiexec -n 2" .venv/bin/python 5 8,1K,8K,64K,1M,4M
set -euo pipefail
LAUNCH=$1; PY=$2; RUNS=${3:-5}; SIZES=${4:-8,1K,8K,64K,1M,4M}
OUT=$(mktemp -d)
for i in $(seq 1 "$RUNS"); do
  for mode in posted matched; do
    ALPHA_MPI_RECEIVES=$([ $mode = posted ] && echo posted || echo "") \
      timeout 600 $LAUNCH "$PY" -m alpha_mpi bench allreduce --sizes "$SIZES" --realizations auto \
      --stat median --json "$OUT/$mode-$i.json" >/dev/null
  done
done
"$PY" - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
t = {}
for mode in ("posted", "matched"):
    for i in range(1, runs + 1):
        for r in json.load(open(f"{out}/{mode}-{i}.json"))["results"]:
            if r["requested"] == "auto":
                t.setdefault((r["bytes"], mode), []).append(r["t_max_us"])
print(f"# {runs} interleaved runs, median of t_max (us), auto")
print(f"{'bytes':>10} {'posted':>10} {'matched':>10} {'matched/posted':>15}")
for b in sorted({k[0] for k in t}):
    old, new = statistics.median(t[b, "posted"]), statistics.median(t[b, "matched"])
    print(f"{b:>10} {old:>10.2f} {new:>10.2f} {new / old:>15.3f}")
PY
