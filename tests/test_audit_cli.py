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
def test_an_undetermined_step_is_retried_once_and_the_run_gets_the_healthy_bits():
    """2 ranks, a transient flip at step 3: no referee, so sdc-undetermined (no rank named);
    nothing was applied, `alpha-mpi train` retries the step once, the fault is gone, and the
    run ends at the bits of a run that never met it (exit 0)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    r, _ = run_mpi(2, SCRIPT, "1:3:5:0:once", *ARGS, "--audit-slots", "6", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# step 3: [sdc-undetermined] no rank shown wrong, nothing applied; retrying the step" in r.stdout
    healthy, _ = run_mpi(2, "-m", "alpha_mpi", "train", *ARGS, env=env)
    assert healthy.returncode == 0 and digest_of(r.stdout) == digest_of(healthy.stdout)


@needs_mpiexec
@pytest.mark.parametrize("ranks,faulty", [(3, 2), (2, 1)])
def test_sdc_stops_with_98_saves_and_a_resume_elsewhere_gets_the_healthy_bits(tmp_path, ranks, faulty):
    """At 3 ranks the faulty rank is named and its node advised for exclusion; at 2 (a fault
    that persists: the retried step fails again) no rank is named and no node advised."""
    persistent = ":persistent" if ranks == 2 else ""
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    ck = tmp_path / "ck"
    r, _ = run_mpi(
        ranks,
        SCRIPT,
        f"{faulty}:3:5:0{persistent}",
        *ARGS,
        "--audit-slots",
        "6",
        "--checkpoint-dir",
        ck,
        env=env,
    )
    assert r.returncode == 98, r.stdout + r.stderr
    assert "nothing was applied" in r.stderr
    if ranks >= 3:
        assert "[sdc-detected] step 3" in r.stderr
        named = re.search(r"suspected: (.*?); nothing", r.stderr).group(1)
        assert named.startswith(f"rank {faulty} on host ") and "," not in named, named
        assert "--exclude=" in r.stderr and "--resume" in r.stderr
    else:  # no referee: nothing says which of the two is wrong; retried once, then stopped
        assert "[sdc-undetermined] step 3" in r.stderr and "no referee" in r.stderr, r.stderr
        assert "# step 3: [sdc-undetermined] no rank shown wrong" in r.stdout, r.stdout
        assert "suspected" not in r.stderr and "--exclude" not in r.stderr and "--resume" in r.stderr
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
@pytest.mark.parametrize(
    "fault,steps,extra,found,clean,saved,aside",
    [
        # From step 7 on rank 2 faults (bit 40 of each slot's sample-count word, -3: every
        # coordinate's normalisation changes). 1 of 6 slots at p = 3: a round of 3 slots every 3
        # steps (0, 3, 6, 9, ...), W = 6. Rank 2 is met at step 9 (its slot 5, and slot 3 it
        # recomputes): steps 7 and 8 were applied with its corrupted unaudited slots. Clean is
        # step 4 (9 - 6 + 1), saved there; 6 and 8 are set aside.
        ("2:7:-3:40:persistent", 12, ["--checkpoint-every", "2"], 9, 4, 4, "6, 8"),
        # No periodic saves: met at step 15, clean 10, the state kept in memory at step 6 is saved.
        ("2:13:-3:40:persistent", 20, ["--partition", "grads"], 15, 10, 6, None),
    ],
)
def test_with_fewer_audited_slots_the_saved_state_is_known_clean_and_a_resume_gets_the_healthy_bits(
    tmp_path, fault, steps, extra, found, clean, saved, aside
):
    """--audit-slots 1 of 6 (issue 36 item 2): the steps before a detection were audited in part,
    so the exit-98 report saves (and `latest` names) a state from before the fault could start,
    never the state at the detection; the advised `--resume` ends at the fault-free bits."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    ck = tmp_path / "ck"
    args = ["--steps", str(steps), *ARGS[2:], *extra]
    r, _ = run_mpi(3, SCRIPT, fault, *args, "--audit-slots", "1", "--checkpoint-dir", ck, env=env)
    assert r.returncode == 98, r.stdout + r.stderr
    # What the report advises: resume in the same directory (here on the 2 healthy ranks).
    resumed, _ = run_mpi(2, "-m", "alpha_mpi", "train", *args, "--checkpoint-dir", ck, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    healthy, _ = run_mpi(2, "-m", "alpha_mpi", "train", "--steps", str(steps), *ARGS[2:], env=env)
    assert healthy.returncode == 0, healthy.stderr
    assert digest_of(resumed.stdout) == digest_of(healthy.stdout), r.stderr + resumed.stdout
    # The fault is observable: unaudited, it ends at other bits.
    silent, _ = run_mpi(3, SCRIPT, fault, "--steps", str(steps), *ARGS[2:], env=env)
    assert silent.returncode == 0 and digest_of(silent.stdout) != digest_of(healthy.stdout)
    assert f"resumed from {ck}/step-{saved:08d}" in resumed.stdout
    assert f"error [sdc-detected] step {found}:" in r.stderr, r.stderr
    assert f"the last state known clean is at step {clean}" in r.stderr, r.stderr
    assert f"step {saved}, is saved in {ck}, and `latest` names it" in r.stderr, r.stderr
    kept = sorted(p.name for p in ck.iterdir() if p.name.startswith("step-"))
    assert kept[-1] == f"step-{steps:08d}", kept  # the resumed run's own final save
    if aside:
        assert f"({aside}) may hold the fault's work and are set aside in {ck}/sdc-step-" in r.stderr
        assert sorted(p.name for p in (ck / f"sdc-step-{found:08d}").iterdir()) == [
            f"step-{int(k):08d}" for k in aside.split(", ")
        ]


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
    """Every file but the advisory lock (left by the trainer that wrote the directory)."""
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
def test_replay_across_an_adopt_lr_resume_replays_at_the_rates_the_run_used(tmp_path):
    """Issue 36 item 9: steps 0..4 at --lr 0.01, resumed to step 8 with --lr 0.02 --adopt-lr.
    Was: every replay across (or after) the adoption refused checkpoint-config-mismatch with
    advice (--adopt-lr) that did not help. Now the rates come from step B's manifest (the
    rate its run began with and each adoption): every interval matches bit for bit, whatever
    --lr the replay is given, and the adoption is visible in the bits (a run that kept 0.01
    ends elsewhere)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    base, ck = [*ARGS[2:], "--checkpoint-every", "2"], tmp_path / "ck"
    r, _ = run_mpi(
        2, "-m", "alpha_mpi", "train", *base, "--steps", "4", "--lr", "0.01", "--checkpoint-dir", ck, env=env
    )
    assert r.returncode == 0, r.stderr
    more = ["--steps", "8", "--lr", "0.02", "--adopt-lr", "--resume", "--checkpoint-dir", ck]
    adopted, _ = run_mpi(2, "-m", "alpha_mpi", "train", *base, *more, env=env)
    assert adopted.returncode == 0, adopted.stderr
    kept, _ = run_mpi(1, "-m", "alpha_mpi", "train", *ARGS[2:], "--steps", "8", "--lr", "0.01", env=env)
    assert digest_of(kept.stdout) != digest_of(adopted.stdout)
    for n, interval, extra in (
        (2, "2:6", []),
        (1, "0:8", ["--lr", "0.01"]),
        (2, "4:8", ["--lr", "0.02"]),
        (1, "0:2", []),
    ):
        rep, _ = run_mpi(
            n,
            "-m",
            "alpha_mpi",
            "train",
            *base,
            *extra,
            "--checkpoint-dir",
            ck,
            "--replay",
            interval,
            env=env,
        )
        assert rep.returncode == 0 and "bits match" in rep.stdout, interval + rep.stdout + rep.stderr
        crosses = int(interval.split(":")[0]) <= 4 < int(interval.split(":")[1])
        assert ("learning rate 0.02 from step 4" in rep.stdout) == crosses, rep.stdout


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


@needs_mpiexec
@pytest.mark.parametrize("ranks,k", [(3, 6), (3, 1)])
def test_bench_audit_inject_names_the_faulty_rank_and_accuses_no_other(ranks, k):
    """`bench audit --inject N` (issue 45 item 5): N seeded random flips, every outcome counted
    once, no false accusation (exit 0); with K = S every fired flip that changed anything is
    refused in its step, and at p = 3 every payload flip refused names the faulty rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="120")
    small = ["--slots", "6", "--batch", "48", "--hidden", "16", "--audit-slots", str(k), "--inject-seed", "7"]
    r, _ = run_mpi(ranks, "-m", "alpha_mpi", "bench", "audit", "--inject", "12", *small, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = dict(re.findall(r"^  (\S.*?) {2,}[\d ]+ (\d+)$", r.stdout, re.M))
    assert sum(map(int, rows.values())) == 12 and rows["FALSE ACCUSATION"] == "0", r.stdout
    assert re.search(r"false accusations 0$", r.stdout, re.M), r.stdout
    if k == 6:  # dual execution: nothing fired goes unseen unless it changed nothing
        assert rows["missed"] == "0" and rows["undetermined"] == "0", r.stdout
    assert re.search(r"^  missed +\d+ +0 ", r.stdout, re.M), r.stdout  # a persistent fault is met within W
