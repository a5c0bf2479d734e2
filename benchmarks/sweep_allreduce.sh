#!/usr/bin/env bash
# Sweep `alpha-mpi bench allreduce` over MPICH's allreduce algorithms and rank counts.
#
# Runs the harness once per (p, MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM) under `timeout`, each run
# interleaving MPI_Allreduce with alpha_mpi's auto / tree / scatter realizations and checking the
# bits on every iteration, writes one JSON (and the printed table) per run, then prints a summary:
# alpha_mpi against MPI_Allreduce with MPICH's default selection and against the best of the
# forced algorithms, per size.
#
#   benchmarks/sweep_allreduce.sh                     p = 2 4, algorithms below, 8 B .. 64 MiB
#   PS="2" ALGS="auto ring" SIZES=8,1M,64M benchmarks/sweep_allreduce.sh
#   OUT=/tmp/sweep EXTRA="--stat median --spin" benchmarks/sweep_allreduce.sh
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
failed=0
for p in $PS; do
  for alg in $ALGS; do
    tag="p$p-$alg"
    echo "== p=$p MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=$alg"
    env MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM="$alg" timeout -k 10 "$LIMIT" \
      "$MPIEXEC" -n "$p" "$PY" -m alpha_mpi.tools.bench allreduce --sizes "$SIZES" \
      --json "$OUT/allreduce-$tag.json" $EXTRA | tee "$OUT/allreduce-$tag.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then echo "!! run $tag exited $rc"; failed=1; fi
  done
done
"$PY" -m alpha_mpi.tools.bench.summary "$OUT"/allreduce-p*.json | tee "$OUT/summary.txt"
exit $failed
