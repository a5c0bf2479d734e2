#!/usr/bin/env bash
# The figures of issue 33 (the round in C), each in one interleaved run at p = 2, for the record
# in docs/performance.md. Run it on a quiet machine (nothing else running: every ratio is
# against a baseline timed in the same run, but a loaded machine widens every spread).
#
#   benchmarks/issue33.sh                 everything below, output in $OUT (default /tmp/issue33)
#   STEPS="allreduce dot" benchmarks/issue33.sh
#   STEPS=twonode benchmarks/issue33.sh   as root: tc on the loopback device (removed on exit)
#
# Steps:
#   allreduce  alpha-mpi bench allreduce 8 B .. 64 MiB with allreduce() (--functional) and
#              auto+crc (--payload-check): prints the issue-33 target lines (met / MISSED)
#   calibrate  alpha-mpi bench calibrate: α0, α, α_msg, β, γ of the cost model on this machine
#   cost       alpha-mpi plan --cost at p = 1024 (8 B, 64 KiB, 1 MiB, 16 MiB): the model's choice
#   dot        alpha-mpi bench dot at 100 and 4,096 elements per rank (arrays.dot, and the same
#              call the ordinary way, vs np.dot + MPI_Allreduce), then the same in a loop
#              (benchmarks/arrays_dot_loop.py: the call, its C call alone, the ordinary path)
#   cg         examples/cg.py --time: the CG loop on arrays.dot against the same loop on
#              MPI_Allreduce, about 4,096 (grid 90) and 65,536 (grid 362) unknowns per rank
#   twonode    two emulated nodes x 2 ranks (../shared/notes/two-node-emulation.sh: shared
#              memory inside a node, TCP over lo between them, capped at 2 Gbit/s), 1 and 16 MiB
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BIN=$(dirname "$(command -v "$PY")")
MPIEXEC=${MPIEXEC:-$BIN/mpiexec}
OUT=${OUT:-/tmp/issue33}
STEPS=${STEPS:-allreduce calibrate cost dot cg}
TWO_NODE=${TWO_NODE:-/work/shared/notes/two-node-emulation.sh}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
run() { echo "\$ $*"; timeout -k 10 3600 "$@"; }

for s in $STEPS; do
  case $s in
    allreduce)
      run "$MPIEXEC" -n 2 "$PY" -m alpha_mpi bench allreduce --sizes 8,1K,64K,1M,16M,64M \
        --realizations auto,butterfly,halving --functional --payload-check --stat median --targets \
        --json "$OUT/allreduce-p2.json" | tee "$OUT/allreduce-p2.txt" ;;
    calibrate)
      run "$MPIEXEC" -n 2 "$PY" -m alpha_mpi bench calibrate --out "$OUT/calibration-p2.json" ;;
    cost)
      for e in 1 8192 131072 2097152; do
        run "$PY" -m alpha_mpi plan --slots 1024 --ranks 1024 --elements "$e" --realization butterfly --cost \
          | sed -n '/^cost/,$p'
      done | tee "$OUT/cost-p1024.txt" ;;
    dot)
      run "$MPIEXEC" -n 2 "$PY" -m alpha_mpi bench dot --lengths 1e2,4096 --iters 2000 --no-kernel \
        --json "$OUT/dot-p2.json" | tee "$OUT/dot-p2.txt"
      for L in 100 4096; do
        run "$MPIEXEC" -n 2 "$PY" benchmarks/arrays_dot_loop.py "$L" 2000 7
      done | tee "$OUT/dot-loop-p2.txt" ;;
    cg)
      for g in 90 362; do
        run "$MPIEXEC" -n 2 "$PY" examples/cg.py --grid "$g" --time --repeat 5
      done | tee "$OUT/cg-p2.txt" ;;
    twonode)
      run "$TWO_NODE" 2gbit 2 2 -- "$PY" -m alpha_mpi bench allreduce --sizes 1M,16M \
        --realizations auto,butterfly,halving --stat median --json "$OUT/twonode.json" | tee "$OUT/twonode.txt" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
