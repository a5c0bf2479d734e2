#!/usr/bin/env bash
# What matching every frame first costs (issue 45 item 1, execution/receives.py): `bench allreduce`
# with ALPHA_MPI_RECEIVES=posted (an executor alone on its tag block posts its receives, the old
# way) and unset (matched, the default), interleaved RUNS times, then the median over runs of
# each size's t_max (per-rank median over iterations) for auto, and new/old; also the fastest
# iteration and the ratio to MPI_Allreduce in the same run (steadier under load).
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
        rows = json.load(open(f"{out}/{mode}-{i}.json"))["results"]
        mpi = {r["bytes"]: r["t_max_us"] for r in rows if r["requested"] == "MPI_Allreduce"}
        for r in rows:
            if r["requested"] == "auto":
                b = r["bytes"]
                t.setdefault((b, mode), []).append((r["t_max_us"], r["t_iter_min_us"], r["t_max_us"] / mpi[b]))
print(f"# {runs} interleaved runs of auto: medians over runs of t_max (per-rank median over iterations),")
print("# of the fastest iteration, and of t_max / MPI_Allreduce's t_max in the same run")
print(f"{'bytes':>9} {'t posted':>9} {'t matched':>9} {'new/old':>7} {'fastest p':>9} {'fastest m':>9} {'new/old':>7}"
      f" {'vsMPI p':>7} {'vsMPI m':>7}")
for b in sorted({k[0] for k in t}):
    old, new = t[b, "posted"], t[b, "matched"]
    m = [(statistics.median(x[j] for x in old), statistics.median(x[j] for x in new)) for j in range(3)]
    print(f"{b:>9} {m[0][0]:>9.1f} {m[0][1]:>9.1f} {m[0][1] / m[0][0]:>7.3f} {m[1][0]:>9.1f} {m[1][1]:>9.1f}"
          f" {m[1][1] / m[1][0]:>7.3f} {m[2][0]:>7.3f} {m[2][1]:>7.3f}")
PY
