"""jobs/train.sbatch's exit-98 branch (issue 24 item 3) without a Slurm: the script runs as the
batch shell would (SLURM_JOB_ID set, the mpiexec launcher), with a stand-in `scontrol` on PATH
that records its arguments, and a trainer with a fault injected (tests/mpi_scripts/audit_train.py).
The real-Slurm path (requeue honoured, the node excluded) needs more than one node; see
tests/test_slurm_jobs.py for the one-node tests of the other branches."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, mpiexec, needs_mpiexec

SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "audit_train.py")
ARGS = "--slots 6 --batch 48 --hidden 16 --log-every 0 --seed 3 --audit-slots 6"

SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
case "$1" in show) echo "JobId=4242 ExcNodeList={old}" ;; esac
{refuse}
exit 0
"""
#: What Slurm answers a user who may not change a running job's excluded nodes.
REFUSE_UPDATE = (
    """case "$1" in update) echo "slurm_update error: Access/permission denied" >&2; exit 1 ;; esac"""
)


def run_job(tmp_path, old, limit, refuse="", **env):
    """jobs/train.sbatch run as Slurm's batch shell would, the stand-in `scontrol` (whose calls
    go to the returned log) first on PATH and the job's ALPHA_* settings in `env`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "scontrol.log"
    (bin_ / "scontrol").write_text(SCONTROL.format(log=log, old=old, refuse=refuse))
    (bin_ / "scontrol").chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}",
        ALPHA_LAUNCHER="mpiexec",
        ALPHA_MPIEXEC=mpiexec(),
        ALPHA_CKPT_DIR=str(tmp_path / "run" / "ckpt"),
        **env,
    )
    r = subprocess.run(
        ["timeout", "-k", "5", str(limit), "bash", os.path.join(ROOT, "jobs", "train.sbatch")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    return r, log


@needs_mpiexec
@pytest.mark.parametrize("old", ["(null)", "n9"])
def test_sdc_exit_names_the_node_and_requeues_excluding_it(tmp_path, old):
    import socket

    r, log = run_job(
        tmp_path,
        old,
        200,
        SLURM_JOB_ID="4242",
        ALPHA_NP="3",
        ALPHA_STEPS="6",
        ALPHA_CKPT_EVERY="2",
        ALPHA_TRAIN_CMD=f"{sys.executable} {SCRIPT} 2:3:5:0",
        ALPHA_TRAIN_ARGS=ARGS,
        ALPHA_MPI_TIMEOUT="120",
        OMP_NUM_THREADS="1",
    )
    out = r.stdout + r.stderr
    host = socket.gethostname()
    assert r.returncode == 0, out  # requeued: this run of the job ends
    assert "trainer exited with status 98" in out and f"suspect node(s): {host}" in out, out
    want = host if old == "(null)" else f"{old},{host}"
    calls = log.read_text().splitlines()
    assert f"update JobId=4242 ExcNodeList={want}" in calls and "requeue 4242" in calls, calls
    assert f"requeueing job 4242 excluding {want}" in out
    assert (tmp_path / "run" / "ckpt" / "step-00000003").is_dir()


@needs_mpiexec
def test_sdc_exit_without_a_named_node_does_not_requeue(tmp_path):
    fake = tmp_path / "fake98.sh"
    fake.write_text("#!/bin/sh\necho 'alpha-mpi: error [sdc-detected] no host here' >&2\nexit 98\n")
    fake.chmod(0o755)
    r, log = run_job(tmp_path, "(null)", 100, SLURM_JOB_ID="4243", ALPHA_NP="1", ALPHA_TRAIN_CMD=str(fake))
    assert r.returncode == 98, r.stdout + r.stderr
    assert "not requeueing" in r.stdout
    assert not log.exists() or "requeue" not in log.read_text()


@needs_mpiexec
def test_sdc_exit_when_slurm_refuses_to_exclude_the_node_ends_98_and_says_how_to_resume(tmp_path):
    """`scontrol update JobId=... ExcNodeList=...` on a running job is refused where users may
    not change it: the job is not requeued (it could land on the suspect node again), it ends
    with 98, and the log gives the sbatch line that resumes from the checkpoint without it."""
    fake = tmp_path / "fake98.sh"
    fake.write_text("#!/bin/sh\necho 'alpha-mpi: error [sdc-detected] ... --exclude=node7' >&2\nexit 98\n")
    fake.chmod(0o755)
    r, log = run_job(
        tmp_path,
        "(null)",
        100,
        refuse=REFUSE_UPDATE,
        SLURM_JOB_ID="4244",
        ALPHA_NP="1",
        ALPHA_TRAIN_CMD=str(fake),
    )
    out = r.stdout + r.stderr
    assert r.returncode == 98, out
    assert (
        "Access/permission denied" in r.stderr
        and "scontrol update ExcNodeList=node7 failed; not requeueing" in out
    )
    ck = tmp_path / "run" / "ckpt"
    assert (
        f"resume excluding the node: sbatch --exclude=node7 --export=ALL,ALPHA_CKPT_DIR={ck} jobs/train.sbatch"
        in out
    )
    calls = log.read_text().splitlines()
    assert "update JobId=4244 ExcNodeList=node7" in calls and not any(
        c.startswith("requeue") for c in calls
    ), calls


@needs_mpiexec
def test_an_undetermined_fault_at_two_ranks_excludes_no_node(tmp_path):
    """Issue 45 item 5, end to end: at 2 ranks no referee can say which rank is wrong. A fault
    that persists makes the retried step refuse again; the exit-98 report names no rank and no
    `--exclude=`, so the job script excludes no (healthy or faulty) node and does not requeue;
    the last state known clean is saved all the same."""
    r, log = run_job(
        tmp_path,
        "(null)",
        300,
        SLURM_JOB_ID="4244",
        ALPHA_NP="2",
        ALPHA_STEPS="6",
        ALPHA_TRAIN_CMD=f"{sys.executable} {SCRIPT} 1:3:5:0:persistent",
        ALPHA_TRAIN_ARGS=ARGS,
        ALPHA_MPI_TIMEOUT="120",
        OMP_NUM_THREADS="1",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 98, out
    assert "[sdc-undetermined] step 3" in out and "--exclude=" not in out, out
    assert "suspect node(s): unknown" in out and "not requeueing" in out, out
    calls = log.read_text().splitlines() if log.exists() else []
    assert not [c for c in calls if c.startswith(("update", "requeue"))], calls
    assert (tmp_path / "run" / "ckpt" / "step-00000003").is_dir()
