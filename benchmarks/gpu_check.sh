#!/usr/bin/env bash
# The CUDA path of alpha_mpi.torch on a machine with a GPU (issue 25 item 3), as one short
# script: a fresh venv with the torch extra (the CUDA build pip finds there), then
#   1. examples/torch_dataloader.py --device cuda on 1 and 2 ranks: one digest (both ranks
#      share GPU 0 when there is one GPU; rank % device count otherwise), also with buckets;
#   2. examples/torch_lm.py --device cuda on 1 and 2 ranks without autocast, with bfloat16 and
#      with float16 autocast (issue 34 item 3): one digest per precision (3 digests, each the
#      same on 1 and 2 ranks), and the three different from each other (autocast ran);
#   3. `alpha-mpi bench torch --device cuda --model transformer` at p = 2 (token mass): the rows
#      against DDP over NCCL, and the rows of one slot count agreeing bit for bit.
# Writes everything to ${OUT:-gpu-check}/ and ends with `gpu check: PASS` or `gpu check: FAIL`.
#
#   benchmarks/gpu_check.sh                      # from the repository root
#   VENV=/tmp/v STEPS=10 OUT=/tmp/g benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}; VENV=${VENV:-.venv-gpu}; STEPS=${STEPS:-8}
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -e ".[test]" torch >"$OUT/install.log" 2>&1 \
    || { tail -n 20 "$OUT/install.log"; echo "gpu check: FAIL (install)"; exit 1; }
fi
PY="$VENV/bin/python"; MPIEXEC="$VENV/bin/mpiexec"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.version.cuda)" \
  | tee "$OUT/device.txt" || { echo "gpu check: FAIL (no CUDA device visible to torch)"; exit 1; }
export OMP_NUM_THREADS=1
ok=1
digest() { grep -m1 '^digest' "$1" | awk '{print $NF}'; }
for run in "1" "2" "2 --bucket-mb 0.01"; do
  set -- $run
  n=$1; shift
  log="$OUT/dataloader-n$n${1:+-buckets}.log"
  timeout 300 "$MPIEXEC" -n "$n" "$PY" -m mpi4py examples/torch_dataloader.py --device cuda "$@" >"$log" 2>&1 \
    || { echo "!! dataloader -n $n $* failed:"; tail -n 15 "$log"; ok=0; }
  echo "dataloader -n $n $*: $(digest "$log")"
done
d=$(for f in "$OUT"/dataloader-*.log; do digest "$f"; done | sort -u)
[ "$(echo "$d" | wc -l)" = 1 ] && [ -n "$d" ] || { echo "!! the CUDA digests differ: $d"; ok=0; }
all=""
for prec in none bfloat16 float16; do
  for n in 1 2; do
    log="$OUT/lm-$prec-n$n.log"
    timeout 300 "$MPIEXEC" -n "$n" "$PY" -m mpi4py examples/torch_lm.py --device cuda --autocast "$prec" \
      --steps "$STEPS" >"$log" 2>&1 || { echo "!! torch_lm --autocast $prec -n $n failed:"; tail -n 15 "$log"; ok=0; }
    echo "torch_lm --autocast $prec -n $n: $(digest "$log")"
  done
  d=$(for n in 1 2; do digest "$OUT/lm-$prec-n$n.log"; done | sort -u)
  [ "$(echo "$d" | wc -l)" = 1 ] && [ -n "$d" ] || { echo "!! autocast $prec: the digests differ: $d"; ok=0; }
  all="$all $d"
done
[ "$(echo $all | tr ' ' '\n' | sort -u | wc -l)" = 3 ] || { echo "!! autocast changed no bits:$all"; ok=0; }
timeout 600 "$MPIEXEC" -n 2 "$PY" -m alpha_mpi bench torch --device cuda --model transformer \
  --steps "$STEPS" --warmup 2 --block 2 --json "$OUT/bench-torch-cuda.json" >"$OUT/bench.log" 2>&1 \
  || { echo "!! bench torch --device cuda failed or found a bits mismatch"; ok=0; }
cat "$OUT/bench.log" | grep -v '^MPI\|^mpi4py' | tail -n 20
[ $ok = 1 ] && echo "gpu check: PASS" || { echo "gpu check: FAIL"; exit 1; }
