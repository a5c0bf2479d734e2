#!/usr/bin/env bash
# Sweep `alpha-mpi bench allreduce` over MPICH's allreduce algorithms and rank counts.
#
# Runs the harness once per (p, MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM) under `timeout`, each run
# interleaving MPI_Allreduce with alpha_mpi's realizations and checking the bits on every
# iteration (its table goes to stdout), then merges the runs of each p into one document,
# $OUT/mpich-sweep-p$p.json (runs keyed by algorithm, each run's --json document unchanged; a
# run replaces the one of its algorithm there, the others are kept), and writes the summary of
# every $OUT/mpich-sweep-p*.json to $OUT/summary.txt: alpha_mpi against MPI_Allreduce with
# MPICH's default selection and against the best of the forced algorithms, per size.
#
#   benchmarks/sweep_allreduce.sh                     p = 2 4, algorithms below, 8 B .. 64 MiB
#   PS="2" ALGS="auto ring" SIZES=8,1M,64M benchmarks/sweep_allreduce.sh
#   OUT=/tmp/sweep EXTRA="--stat median --spin" benchmarks/sweep_allreduce.sh
#   OUT=/tmp/sweep PS=2 ALGS="auto ring" SIZES=8,64K EXTRA="--iters 2 --warmup 0" benchmarks/sweep_allreduce.sh
#
# By hand, the same two steps: `alpha-mpi bench summary --merge SWEEP.json RUN.json ...` and
# `alpha-mpi bench summary SWEEP.json ...` (python -m alpha_mpi.tools.bench.summary, no MPI).
#
# Algorithm names are MPICH 5.0's (`mpivars | grep -A12 ALLREDUCE_INTRA_ALGORITHM`): auto,
# recursive_doubling, reduce_scatter_allgather, ring, k_reduce_scatter_allgather,
# recursive_multiplying, recexch, tree, smp, nb. `auto` is MPICH's own selection (the default).
# With more ranks than cores (p = 4 on a 2-core machine) every number is oversubscribed: the
# table's machine line says so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MPIEXEC=${MPIEXEC:-$(dirname "$(command -v "$PY")")/mpiexec}
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)
OUT=${OUT:-benchmarks/results}
PS=${PS:-"2 4"}
ALGS=${ALGS:-"auto recursive_doubling reduce_scatter_allgather ring"}
SIZES=${SIZES:-8:64M}
LIMIT=${LIMIT:-1800}
EXTRA=${EXTRA:-}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$OUT"
RUNS=$(mktemp -d)
trap 'rm -rf "$RUNS"' EXIT
failed=0
for p in $PS; do
  runs=()
  for alg in $ALGS; do
    run="$RUNS/allreduce-p$p-$alg.json"
    echo "== p=$p MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=$alg"
    # shellcheck disable=SC2086  # EXTRA is a list of options
    env MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM="$alg" timeout -k 10 "$LIMIT" \
      "$MPIEXEC" -n "$p" "$PY" -m alpha_mpi.tools.bench allreduce --sizes "$SIZES" --json "$run" $EXTRA
    rc=$?
    if [ "$rc" -ne 0 ]; then echo "!! run p$p-$alg exited $rc"; failed=1; fi
    if [ -s "$run" ]; then runs+=("$run"); fi
  done
  if [ ${#runs[@]} -gt 0 ]; then
    "$PY" -m alpha_mpi.tools.bench.summary --merge "$OUT/mpich-sweep-p$p.json" "${runs[@]}" || failed=1
  fi
done
shopt -s nullglob
sweeps=("$OUT"/mpich-sweep-p*.json)
if [ ${#sweeps[@]} -gt 0 ]; then
  "$PY" -m alpha_mpi.tools.bench.summary "${sweeps[@]}" | tee "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
else
  echo "!! no sweep results in $OUT"; failed=1
fi
exit $failed
