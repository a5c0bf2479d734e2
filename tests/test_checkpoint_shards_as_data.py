"""Shards are opened as data, like `latest`: a FIFO, a directory, a symlink or a file of another
size in place of a shard is refused by name by verify, by restore, by `alpha-mpi checkpoint
verify` and by `alpha-mpi train --resume`, and never blocks (a FIFO with no writer would block a
plain open for ever). In-process checks run under an alarm, commands under a hard timeout."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from ckpt_tools import CFG, comm_self, shard_file

from alpha_mpi.checkpoint import Checkpointer, open_checkpoint
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.refusals import Refusal

from conftest import needs_mpiexec, run_mpi

SLOTS = CFG["slots"]


def make():
    return DataParallelLearner(comm_self(), MLP(6, 5, 3), slots=SLOTS, lr=1e-2, seed=3)


def fifo(path):
    os.remove(path)
    os.mkfifo(path)


def directory(path):
    os.remove(path)
    os.mkdir(path)


def inner_symlink(path):
    """A symlink to a byte-identical copy inside the same step: still not followed."""
    copy = path + ".copy"
    shutil.move(path, copy)
    os.symlink(os.path.basename(copy), path)


def truncated(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)


def grown(path):
    with open(path, "ab") as f:
        f.write(b"\0" * 8)


DAMAGE = [
    (fifo, "checkpoint-corrupt", "FIFO"),
    (directory, "checkpoint-corrupt", "directory"),
    (inner_symlink, "checkpoint-path-escape", "symbolic link"),
    (truncated, "checkpoint-corrupt", "bytes"),
    (grown, "checkpoint-corrupt", "bytes"),
]


class Alarm:
    """Fail instead of hanging: SIGALRM after `seconds` raises in the main thread."""

    def __init__(self, seconds=20):
        self.seconds = seconds

    def __enter__(self):
        def fire(signum, frame):
            raise TimeoutError("blocked opening a shard")

        self.old = signal.signal(signal.SIGALRM, fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


@pytest.fixture
def saved(tmp_path):
    from test_checkpoint_trust import save

    root = str(tmp_path / "ck")
    save(root)
    return root


@pytest.mark.parametrize("damage,code,word", DAMAGE, ids=[d[0].__name__ for d in DAMAGE])
def test_a_shard_that_is_not_its_regular_file_is_refused_by_verify_and_restore(saved, damage, code, word):
    damage(shard_file(saved))
    with Alarm():
        with pytest.raises(Refusal) as e:
            open_checkpoint(saved).verify()
        assert e.value.code == code and word in e.value.message, e.value
        with pytest.raises(Refusal) as e:
            Checkpointer(comm_self(), saved, make(), CFG).restore_latest()
        assert e.value.code == code, e.value
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "verify", saved],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3 and f"[{code}]" in r.stderr and "Traceback" not in r.stderr, r.stderr


@needs_mpiexec
@pytest.mark.parametrize("n", [1, 2, 5])
def test_train_resume_over_a_fifo_shard_refuses_by_name_on_every_rank(tmp_path, n):
    """Under mpiexec the rank that owns the FIFO's range names it; every rank refuses, none hangs."""
    ck = str(tmp_path / "ck")
    argv = ["-m", "alpha_mpi", "train", "--hidden", "8", "--log-every", "0", "--checkpoint-dir", ck]
    argv += ["--partition", "params", "--slots", "5"]
    r, _ = run_mpi(n, *argv, "--steps", "2", limit=120)
    assert r.returncode == 0, r.stderr
    fifo(shard_file(ck))
    r, _ = run_mpi(n, *argv, "--steps", "3", "--resume", limit=120)
    assert r.returncode == 3 and "[checkpoint-corrupt]" in r.stderr and "(a FIFO)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "verify", ck, "--all"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3 and "FIFO" in r.stdout + r.stderr, r.stdout + r.stderr
