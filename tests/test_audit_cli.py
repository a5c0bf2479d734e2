"""`alpha-mpi train --audit-slots` (issue 24): a flipped bit stops the run with exit 98 naming the
rank and host, the last audited state is saved, and a resume on the other ranks reaches the bits
of a run that never met the fault. Each case launches its own mpiexec jobs."""

import os
import re
import sys

import pytest

from conftest import ROOT, needs_mpiexec, printed_digest, run_mpi

SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "audit_train.py")
ARGS = ["--steps", "6", "--slots", "6", "--batch", "48", "--hidden", "16", "--log-every", "0", "--seed", "3"]


def digest_of(out):
    return printed_digest(out)


@needs_mpiexec
@pytest.mark.parametrize("ranks,faulty", [(3, 2), (2, 1)])
def test_sdc_stops_with_98_saves_and_a_resume_elsewhere_gets_the_healthy_bits(tmp_path, ranks, faulty):
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    ck = tmp_path / "ck"
    r, _ = run_mpi(
        ranks, SCRIPT, f"{faulty}:3:5:0", *ARGS, "--audit-slots", "6", "--checkpoint-dir", ck, env=env
    )
    assert r.returncode == 98, r.stdout + r.stderr
    assert "[sdc-detected] step 3" in r.stderr and "nothing was applied" in r.stderr
    named = re.search(r"suspected: (.*?); nothing", r.stderr).group(1)
    if ranks >= 3:
        assert named.startswith(f"rank {faulty} on host ") and "," not in named, named
    else:
        assert "rank 0 on host" in named and "rank 1 on host" in named and "both are named" in r.stderr
    assert "--exclude=" in r.stderr and "--resume" in r.stderr
    steps = sorted(p.name for p in ck.iterdir() if p.name.startswith("step-"))
    assert steps[-1] == "step-00000003", steps
    # The healthy ranks (here: a 2-rank job elsewhere) resume from the saved state.
    cmd = [sys.executable, "-m", "alpha_mpi", "train", *ARGS]
    resumed, _ = run_mpi(2, "-m", "alpha_mpi", "train", *ARGS, "--checkpoint-dir", ck, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    healthy, _ = run_mpi(2, "-m", "alpha_mpi", "train", *ARGS, env=env)
    assert healthy.returncode == 0, (cmd, healthy.stderr)
    assert digest_of(resumed.stdout) == digest_of(healthy.stdout)


@needs_mpiexec
def test_a_healthy_audited_run_has_the_bits_of_an_unaudited_one():
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    plain, _ = run_mpi(3, "-m", "alpha_mpi", "train", *ARGS, env=env)
    audited, _ = run_mpi(
        3, "-m", "alpha_mpi", "train", *ARGS, "--audit-slots", "1", "--audit-digests", "2", env=env
    )
    assert plain.returncode == 0 and audited.returncode == 0, plain.stderr + audited.stderr
    assert digest_of(plain.stdout) == digest_of(audited.stdout)
    # A healthy audited run says what it checked (issue 37 item 8); an unaudited one says nothing.
    # 6 steps, K = 1 on 3 ranks: rounds of 3 slots at steps 0 and 3; replicas after steps 2, 4, 6.
    assert "# audit:" not in plain.stdout
    line = re.search(r"^# audit: .*$", audited.stdout, re.M)
    assert line and line.group(0) == (
        "# audit: 6 slot payloads recomputed on another rank and matched (K = 1: 3 slots every 3 steps); "
        "replicas equal at 3 digest checks (every 2 steps)"
    ), audited.stdout


def listing(root):
    """Every file but the advisory lock (which the replay holds, as any trainer, while it reads)."""
    return sorted(
        (str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size)
        for p in root.rglob("*")
        if p.name != ".lock"
    )


@needs_mpiexec
def test_replay_matches_a_healthy_run_and_names_the_first_difference_of_a_faulty_one(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    good, bad = tmp_path / "good", tmp_path / "bad"
    every = ["--checkpoint-every", "2"]
    r, _ = run_mpi(3, "-m", "alpha_mpi", "train", *ARGS, "--checkpoint-dir", good, *every, env=env)
    assert r.returncode == 0, r.stderr
    before = listing(good)
    rep, _ = run_mpi(
        2, "-m", "alpha_mpi", "train", *ARGS, "--checkpoint-dir", good, "--replay", "2:4", env=env
    )
    assert rep.returncode == 0 and "bits match" in rep.stdout, rep.stdout + rep.stderr
    assert listing(good) == before  # nothing written
    # A run that met an unaudited fault at step 3 (rank 1, bit 40 of gradient word 5): rc 0, other bits.
    r, _ = run_mpi(3, SCRIPT, "1:3:5:40", *ARGS, "--checkpoint-dir", bad, *every, env=env)
    assert r.returncode == 0, r.stderr
    ok, _ = run_mpi(1, "-m", "alpha_mpi", "train", *ARGS, "--checkpoint-dir", bad, "--replay", "0:2", env=env)
    assert ok.returncode == 0 and "bits match" in ok.stdout, ok.stderr  # before the fault
    rep, _ = run_mpi(
        2, "-m", "alpha_mpi", "train", *ARGS, "--checkpoint-dir", bad, "--replay", "2:4", env=env
    )
    assert rep.returncode == 3 and "[replay-mismatch]" in rep.stderr, rep.stdout + rep.stderr
    assert re.search(r"optimizer\.m\[5\] differs|params\[\d+\] differs", rep.stderr), rep.stderr


@needs_mpiexec
@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--replay", "2:4"], "needs --checkpoint-dir"),
        (["--replay", "4:2", "--checkpoint-dir", "x"], "0 <= A < B"),
        (["--replay", "a:b", "--checkpoint-dir", "x"], "0 <= A < B"),
        (["--replay", "0:2", "--checkpoint-dir", "x", "--resume"], "neither --resume"),
    ],
)
def test_replay_usage_errors(extra, needle):
    r, _ = run_mpi(1, "-m", "alpha_mpi", "train", *ARGS, *extra)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


@needs_mpiexec
def test_bench_audit_smoke_runs_four_learners_with_one_digest():
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    small = ["--steps", "2", "--warmup", "1", "--block", "1", "--hidden", "16", "--batch", "32"]
    r, _ = run_mpi(2, "-m", "alpha_mpi", "bench", "audit", *small, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("K=0", "K=1", "K=8", "digests/10"):
        assert re.search(rf"^  {re.escape(name)} +\d", r.stdout, re.M), r.stdout
    assert "identical in all four learners" in r.stdout
    one, _ = run_mpi(1, "-m", "alpha_mpi", "bench", "audit", *small, env=env)
    assert one.returncode == 2 and "needs >= 2 ranks" in one.stdout
