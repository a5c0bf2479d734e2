#!/bin/bash
# Training with alpha_mpi on a machine without Slurm: plain mpiexec/mpirun.
#
#   ALPHA_NP=4 ALPHA_STEPS=2000 jobs/mpirun-train.sh
#   ALPHA_MPIEXEC="mpirun --oversubscribe" ALPHA_NP=8 jobs/mpirun-train.sh   # Open MPI, few cores
#
# SIGUSR1, SIGINT or SIGTERM to this script asks the trainer to finish its step, save a
# checkpoint and exit 99; run the script again (same ALPHA_CKPT_DIR) to resume. With
# ALPHA_RESTART_ON_PREEMPT=1 it restarts at once instead (handy for testing resume).
#
# Environment parameters (defaults in brackets), the same as jobs/train.sbatch:
#   ALPHA_STEPS          total optimizer steps [1000]
#   ALPHA_CKPT_DIR       checkpoint folder [$PWD/runs/train/ckpt]
#   ALPHA_CKPT_EVERY     checkpoint every N steps [100]
#   ALPHA_SLOTS, ALPHA_OPTIMIZER, ALPHA_PARTITION, ALPHA_TOPOLOGY, ALPHA_SEED  (--slots ... when set)
#   ALPHA_TRAIN_ARGS     further arguments for the trainer []
#   ALPHA_TRAIN_CMD      the trainer command, split on blanks [alpha-mpi train]; or a torch script
#                        with those options that exits 99 when preempted (alpha_mpi.Preemption):
#                        ALPHA_TRAIN_CMD="python -m mpi4py examples/torch_preempt.py"
#   ALPHA_MPIEXEC        mpiexec command line [mpiexec]. Open MPI as root needs --allow-run-as-root
#                        and, with more ranks than cores, --oversubscribe (see .ci/openmpi.sh).
#   ALPHA_NP             number of ranks [2]
#   ALPHA_VENV           a virtual environment to activate []
#   ALPHA_SETUP          a shell snippet to eval first, e.g. "module load openmpi/4.1" []
set -uo pipefail
# Possibly-empty arrays are expanded as ${A[@]+"${A[@]}"}: bash before 4.4 (RHEL/CentOS 7's
# 4.2) calls "${A[@]}" of an empty array an unbound variable under set -u
# (tests/test_job_scripts.py checks every such expansion).

log() { echo "[mpirun-train.sh $(date +%H:%M:%S)] $*"; }

[ -n "${ALPHA_SETUP:-}" ] && eval "$ALPHA_SETUP"
# shellcheck disable=SC1091
[ -n "${ALPHA_VENV:-}" ] && source "$ALPHA_VENV/bin/activate"

STEPS=${ALPHA_STEPS:-1000}
CKPT_DIR=${ALPHA_CKPT_DIR:-$PWD/runs/train/ckpt}
CKPT_EVERY=${ALPHA_CKPT_EVERY:-100}
NP=${ALPHA_NP:-2}

read -r -a TRAIN <<< "${ALPHA_TRAIN_CMD:-alpha-mpi train}"
TRAIN+=(--steps "$STEPS" --checkpoint-dir "$CKPT_DIR" --checkpoint-every "$CKPT_EVERY" --resume)
[ -n "${ALPHA_SLOTS:-}" ] && TRAIN+=(--slots "$ALPHA_SLOTS")
[ -n "${ALPHA_OPTIMIZER:-}" ] && TRAIN+=(--optimizer "$ALPHA_OPTIMIZER")
[ -n "${ALPHA_PARTITION:-}" ] && TRAIN+=(--partition "$ALPHA_PARTITION")
[ -n "${ALPHA_TOPOLOGY:-}" ] && TRAIN+=(--topology "$ALPHA_TOPOLOGY")
[ -n "${ALPHA_SEED:-}" ] && TRAIN+=(--seed "$ALPHA_SEED")
read -r -a EXTRA <<< "${ALPHA_TRAIN_ARGS:-}"
TRAIN+=(${EXTRA[@]+"${EXTRA[@]}"})
read -r -a L <<< "${ALPHA_MPIEXEC:-mpiexec} -n $NP"

mkdir -p "$CKPT_DIR"

LPID=""
STOP=0
# MPICH's hydra and Open MPI's mpirun both forward SIGUSR1 to every rank.
on_signal() {
    STOP=1
    log "$1: asking the trainer to checkpoint and stop"
    [ -n "$LPID" ] && kill -USR1 "$LPID" 2>/dev/null
}
trap 'on_signal SIGUSR1' USR1
trap 'on_signal SIGINT' INT
trap 'on_signal SIGTERM' TERM

while :; do
    log "${L[*]} ${TRAIN[*]}"
    "${L[@]}" "${TRAIN[@]}" &
    LPID=$!
    while :; do
        wait "$LPID"
        rc=$?
        if [ "$rc" -gt 128 ] && kill -0 "$LPID" 2>/dev/null; then continue; fi
        break
    done
    LPID=""
    case "$rc" in
        0)  log "done: $STEPS steps"; exit 0 ;;
        99) if [ "${ALPHA_RESTART_ON_PREEMPT:-0}" = 1 ] && [ "$STOP" = 0 ]; then
                log "preempted, checkpoint saved; restarting with --resume"
                continue
            fi
            log "preempted, checkpoint saved in $CKPT_DIR; run this script again to resume"
            exit 99 ;;
        *)  log "trainer exited with status $rc"; exit "$rc" ;;
    esac
done
