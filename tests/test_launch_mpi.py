"""Tests that launch their own mpiexec: fault injection, ten ranks, the debug log.

Each launch runs under a hard `timeout`, so a hang fails the test instead of the suite.
"""

import os
import re

import pytest

from conftest import needs_mpiexec, run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))


pytestmark = needs_mpiexec


def launch(n, script, *args, env=None, limit=90):
    """One of tests/mpi_scripts on `n` ranks; `env` adds to this environment."""
    return run_mpi(
        n, os.path.join(HERE, "mpi_scripts", script), *args, limit=limit, env={**os.environ, **(env or {})}
    )


def test_a_rank_that_leaves_makes_every_other_rank_fail_with_peer_timeout():
    bound = 3.0
    r, elapsed = launch(3, "fault_exit.py", str(bound))
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 124, 137), out  # non-zero, and not killed by our own timeout
    for rank in (0, 1):
        m = re.search(rf"rank {rank}: peer-timeout after ([0-9.]+)s", out)
        assert m, out
        assert bound <= float(m.group(1)) < bound + 15.0  # generous: CI oversubscribes the cores
    assert "completed without its peer" not in out
    assert elapsed < 60


def test_ten_owners_on_ten_ranks_match_the_hierarchy_oracle():
    r, _ = launch(10, "ten_owners.py", limit=120)
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = re.findall(
        r"rank (\d+) (observable=\S+ hierarchy_run=\(\w+, \w+\) star_run=\(\w+, \w+\))", r.stdout
    )
    assert sorted(int(k) for k, _ in verdicts) == list(range(10)), r.stdout
    assert {v for _, v in verdicts} == {"observable=True hierarchy_run=(True, False) star_run=(False, True)"}


def test_ten_slots_on_two_ranks_match_the_same_oracle():
    r, _ = launch(2, "ten_owners.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("observable=True hierarchy_run=(True, False) star_run=(False, True)") == 2


def test_debug_log_names_every_frame():
    r, _ = launch(2, "ten_owners.py", env={"ALPHA_MPI_DEBUG": "1"})
    assert r.returncode == 0, r.stderr
    sends = re.findall(r"^r(\d) \| send -> (\d) (\w+) frame (\d+) step (\d+) (\d+)B$", r.stderr, re.M)
    recvs = re.findall(r"^r(\d) \| recv <- (\d) (\w+) frame (\d+) step (\d+) (\d+)B$", r.stderr, re.M)
    assert sends and len(sends) == len(recvs)
    assert {s[5] for s in sends} == {str(128 + 8 * 2048)}
    # every frame sent is received, by the rank it names, with the same index and step
    assert sorted((s[2], s[0], s[1], s[3], s[4]) for s in sends) == sorted(
        (r[2], r[1], r[0], r[3], r[4]) for r in recvs
    )


def test_a_40_second_straggler_survives_the_default_bound():
    """A peer that is slow, not dead, never kills a healthy job (the default bound is minutes)."""
    env = {k: v for k, v in os.environ.items() if k != "ALPHA_MPI_TIMEOUT"}
    r, _ = run_mpi(2, os.path.join(HERE, "mpi_scripts", "straggler.py"), "40", limit=150, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"rank \d: \w+ n=\d+ ok=True", r.stdout)) == 4, r.stdout


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stopped_or_killed_peer_ends_the_job_by_itself(how):
    bound = 3.0
    r, elapsed = launch(3, "stopped_peer.py", how, str(bound), limit=120)
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 124, 137), out  # non-zero, and not killed by our own timeout
    assert "completed without its peer" not in out
    if how == "stop":
        # A survivor names what happened and the job is aborted at exit, not left hanging (the
        # first survivor's abort may end the other before its own bound runs out).
        waits = [float(t) for t in re.findall(r"rank [01]: peer-timeout after ([0-9.]+)s", out)]
        assert waits, out
        assert all(bound <= t < bound + 20.0 for t in waits), out
        assert "aborting it with exit status 70" in out
    else:
        # A dead rank: the survivors name it (peer-failed / peer-timeout) or the launcher ends
        # the job first; either way it ends by itself, never with a frame-size complaint.
        assert "frame-size-mismatch" not in out
    assert elapsed < 100


@pytest.mark.parametrize("n", [2, 5])
def test_a_job_that_recovered_with_reset_exits_0(n):
    """One rank passes another realization to a warm allreduce(); every rank refuses
    `executor-identity-mismatch` at once (a bound of 60 s that is never reached), recovers with
    reset() and the next call gives the sum; then the job ends cleanly, exit status 0 (not the
    abort at exit, 70: the reset forgave the failure it drained)."""
    r, _ = launch(n, "warm_mismatch_reset.py", "60", limit=50)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for rank in range(n):
        assert f"rank {rank}: executor-identity-mismatch" in r.stdout, out
        assert f"rank {rank}: ok" in r.stdout, out
