#!/bin/bash
# Start a real one-node Slurm (munge + slurmctld + slurmd) on this Debian machine, as root,
# without systemd. Idempotent: when Slurm is already up with the same configuration, it only
# reports; otherwise it (re)starts the daemons with a freshly cleared StateSaveLocation, so no
# job of an earlier session lingers. Fails loudly (non-zero, with log tails) if Slurm does not
# come up. Stop it with tests/slurm/stop-slurm.sh.
#
#   tests/slurm/start-slurm.sh            # install if needed, start, wait for the node to be idle
#   tests/slurm/start-slurm.sh --restart  # always restart from cleared state
#
# Environment: SLURM_START_TIMEOUT (seconds to wait for the node, default 60),
#              SLURM_CRED_EXPIRE (AuthInfo cred_expire; a requeued job waits this + 1 s before it
#              may start again; Slurm's default is 120, default here 10 so tests stay short).
set -euo pipefail

RESTART=0
case "${1:-}" in
    --restart) RESTART=1 ;;
    "") ;;
    *) echo "usage: $0 [--restart]" >&2; exit 2 ;;
esac

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
T0=$(now)
log() { echo "start-slurm: $*"; }
die() {
    echo "start-slurm: ERROR: $*" >&2
    for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; do
        [ -f "$f" ] && { echo "---- tail $f" >&2; tail -n 25 "$f" >&2; }
    done
    exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (installs packages and starts daemons)"

TIMEOUT=${SLURM_START_TIMEOUT:-60}
CRED_EXPIRE=${SLURM_CRED_EXPIRE:-10}
CONF=/etc/slurm/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGDIR=/var/log/slurm
RUNDIR=/run/slurm
CTLD_PID=$RUNDIR/slurmctld.pid
SLURMD_PID=$RUNDIR/slurmd.pid
MUNGE_PID=/run/munge/munged.pid

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---- 1. packages --------------------------------------------------------------------------
missing=0
for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged; do
    [ -x "$b" ] || missing=1
done
if [ "$missing" = 1 ]; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 \
        slurmctld slurmd slurm-client munge >/dev/null || die "apt-get install failed"
    log "packages installed in $(since "$T0") s"
else
    log "packages already present"
fi
T1=$(now)

# ---- 2. munge -------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
if ! alive "$MUNGE_PID"; then
    rm -f "$MUNGE_PID"
    runuser -u munge -- /usr/sbin/munged || die "munged did not start"
fi
munge -n | unmunge >/dev/null || die "munge round trip failed"

# ---- 3. slurm.conf --------------------------------------------------------------------------
H=$(hostname -s)
N=$(nproc)
getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts
mkdir -p /etc/slurm "$STATE" "$SPOOL" "$LOGDIR" "$RUNDIR"
NEWCONF=$(mktemp)
trap 'rm -f "$NEWCONF"' EXIT
cat > "$NEWCONF" <<EOF
# Written by tests/slurm/start-slurm.sh: a one-node test cluster. Do not edit by hand.
ClusterName=ci
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only cred_expire + 1 s later (Slurm default 120 s).
AuthInfo=cred_expire=$CRED_EXPIRE
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (default 60/30 s): a requeued job starts as soon as it may.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
MailProg=/bin/true
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
NodeName=$H CPUs=$N State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

node_state() { sinfo -h -n "$H" -o %T 2>/dev/null | head -n 1; }

if [ "$RESTART" = 0 ] && alive "$CTLD_PID" && alive "$SLURMD_PID" \
        && cmp -s "$NEWCONF" "$CONF" && scontrol ping >/dev/null 2>&1; then
    st=$(node_state)
    case "$st" in
        idle|mixed|allocated)
            log "already running (node $H $st), configuration unchanged; nothing to do"
            sinfo
            exit 0 ;;
    esac
    log "running but node state is '$st'; restarting"
fi

# ---- 4. (re)start the daemons from a clean state --------------------------------------------
if alive "$CTLD_PID" || alive "$SLURMD_PID" || pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; then
    log "stopping the running Slurm daemons first"
    SLURM_STOP_KEEP_MUNGE=1 "$(dirname "$0")/stop-slurm.sh" || die "could not stop the old daemons"
fi
cp "$NEWCONF" "$CONF"
chmod 644 "$CONF"
# Stale state: saved jobs, node state, job scripts of earlier sessions.
find "$STATE" "$SPOOL" -mindepth 1 -delete
: > "$LOGDIR/slurmctld.log"
: > "$LOGDIR/slurmd.log"
/usr/sbin/slurmctld -c || die "slurmctld did not start"
/usr/sbin/slurmd || die "slurmd did not start"

# ---- 5. wait for the node ---------------------------------------------------------------------
deadline=$(( $(date +%s) + TIMEOUT ))
st=""
while :; do
    st=$(node_state)
    [ "$st" = idle ] && break
    case "$st" in
        down*|drain*|fail*) scontrol update nodename="$H" state=resume 2>/dev/null || true ;;
    esac
    alive "$CTLD_PID" || die "slurmctld exited"
    alive "$SLURMD_PID" || die "slurmd exited"
    [ "$(date +%s)" -lt "$deadline" ] || die "node $H not idle after ${TIMEOUT}s (state '$st')"
    sleep 0.5
done
T2=$(now)
sinfo
log "Slurm up: node $H ($N CPUs) idle; packages $(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.1f", b-a}') s, daemons $(awk -v a="$T1" -v b="$T2" 'BEGIN{printf "%.1f", b-a}') s, total $(since "$T0") s"
