#!/bin/bash
# Stop the one-node Slurm started by tests/slurm/start-slurm.sh: drain the partitions (new
# submissions are refused), cancel every job, stop slurmd,
# slurmctld and munged by their pid files, wait until they are gone, and check that no
# slurmctld, slurmd, slurmstepd or munged process is left (non-zero exit otherwise).
#
# Environment: SLURM_STOP_TIMEOUT (seconds to wait for each stage, default 20),
#              SLURM_STOP_KEEP_MUNGE=1 (leave munged running; used by start-slurm.sh --restart).
set -uo pipefail

TIMEOUT=${SLURM_STOP_TIMEOUT:-20}
RUNDIR=/run/slurm
log() { echo "stop-slurm: $*"; }
T0=$(date +%s.%N)

pid_of() { [ -s "$1" ] && cat "$1"; }
# Wait until none of the given pids is alive; return non-zero on timeout.
wait_gone() {
    local deadline=$(( $(date +%s) + TIMEOUT )) p left
    while :; do
        left=""
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
        [ -z "$left" ] && return 0
        [ "$(date +%s)" -lt "$deadline" ] || { log "still alive after ${TIMEOUT}s:$left"; return 1; }
        sleep 0.2
    done
}
# Stop the daemon named $1 (exact process name) whose pid file is $2: SIGTERM, wait, SIGKILL.
stop_daemon() {
    local name=$1 pidfile=$2 pids p
    pids=$(pid_of "$pidfile")
    # A daemon whose pid file is gone (or stale) is still ours to stop: take its pid by exact name.
    for p in $(pgrep -x "$name"); do
        case " $pids " in *" $p "*) ;; *) log "$name pid $p has no pid file; stopping it too"; pids="$pids $p" ;; esac
    done
    pids=$(for p in $pids; do kill -0 "$p" 2>/dev/null && echo "$p"; done)
    [ -z "$pids" ] && { rm -f "$pidfile"; return 0; }
    log "stopping $name (pid $(echo $pids))"
    kill -TERM $pids 2>/dev/null
    if ! wait_gone $pids; then
        kill -KILL $pids 2>/dev/null
        wait_gone $pids
    fi
    rm -f "$pidfile"
}

# 1. jobs: refuse new submissions, then cancel until no job and no job step is left, while
#    slurmd still runs (without slurmd a step's processes would be orphaned).
if command -v scontrol >/dev/null && scontrol ping >/dev/null 2>&1; then
    for part in $(sinfo -h -o %R 2>/dev/null | sort -u); do
        scontrol update PartitionName="$part" State=DRAIN 2>/dev/null
    done
    deadline=$(( $(date +%s) + TIMEOUT ))
    said=""
    while :; do
        jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
        [ -z "$jobs" ] && ! pgrep -x slurmstepd >/dev/null && break
        if [ -n "$jobs" ]; then
            [ "$jobs" != "$said" ] && log "cancelling jobs: $jobs" && said=$jobs
            scancel $jobs 2>/dev/null
        fi
        [ "$(date +%s)" -lt "$deadline" ] || { log "jobs or steps still there after ${TIMEOUT}s"; break; }
        sleep 0.5
    done
fi

# 2. daemons, leaves first.
stop_daemon slurmd "$RUNDIR/slurmd.pid"
stop_daemon slurmctld "$RUNDIR/slurmctld.pid"
# slurmstepd outlives slurmd only if a step was still running; nothing can manage it any more.
# Take the job processes under it along, so that none is left orphaned.
descendants() {
    local p c
    for p in "$@"; do
        for c in $(ps -e -o pid=,ppid= | awk -v p="$p" '$2 == p { print $1 }'); do
            echo "$c"; descendants "$c"
        done
    done
}
steps=$(pgrep -x slurmstepd)
if [ -n "$steps" ]; then
    tree=$(descendants $steps)
    log "slurmstepd still running (pid $(echo $steps)); stopping it and its job processes ($(echo $tree))"
    # Without slurmd a slurmstepd ignores SIGTERM while it retries to reach it.
    kill -KILL $tree $steps 2>/dev/null
    wait_gone $steps
fi
[ "${SLURM_STOP_KEEP_MUNGE:-0}" = 1 ] || stop_daemon munged /run/munge/munged.pid

# 3. verify
names="slurmctld slurmd slurmstepd"
[ "${SLURM_STOP_KEEP_MUNGE:-0}" = 1 ] || names="$names munged"
left=""
for n in $names; do
    for p in $(pgrep -x "$n"); do left="$left $n:$p"; done
done
if [ -n "$left" ]; then
    log "ERROR: processes left:$left"
    exit 1
fi
log "stopped ($names gone) in $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
