"""A published checkpoint on a read-only mount restores (issue 36 item 7): reading takes no lock
and writes nothing. The mount is a read-only bind mount inside a private mount namespace
(`unshare -m`), so nothing outside the test sees it; chmod would not stop root. Skipped where
this process may not make one. The decision itself (which Checkpointer takes the lock, and
when) is tested without a mount: tests/test_checkpoint.py."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import printed_digest

TRAIN = ["--slots", "4", "--batch", "32", "--hidden", "8", "--log-every", "0", "--seed", "5"]


def _in_read_only_mount(src, dst, script):
    """Run `sh -c script` with `dst` a read-only bind mount of `src`, in a private namespace."""
    mount = f"mount --bind {src} {dst} && mount -o remount,bind,ro {dst} && "
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", mount + script],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


@pytest.fixture
def read_only(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    src, dst = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    dst.mkdir()
    probe = _in_read_only_mount(src, dst, f"! touch {dst}/probe 2>/dev/null")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {probe.stderr.strip()[:200]}")
    return src, dst


def test_a_checkpoint_on_a_read_only_mount_restores_replays_and_resumes_elsewhere(tmp_path, read_only):
    src, ro = read_only
    py = sys.executable
    first = subprocess.run(
        [py, "-m", "alpha_mpi", "train", *TRAIN, "--steps", "4", "--checkpoint-dir", src / "ck",
         "--checkpoint-every", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    (src / "ck" / ".lock").unlink()  # as published: only the steps and latest
    ck = ro / "ck"
    restore = (
        "import sys\n"
        "from mpi4py import MPI\n"
        "from alpha_mpi.learning import MLP, DataParallelLearner\n"
        "from alpha_mpi.learning.data import synthetic\n"
        "d = synthetic(5)\n"
        "for path in sys.argv[1:]:\n"
        "    lr = DataParallelLearner(MPI.COMM_SELF, MLP(d.inputs, 8, d.classes), slots=4, lr=2e-3, seed=5)\n"
        "    lr.restore(path, {'slots': 4, 'batch': 32, 'seed': 5, 'hidden': 8})\n"
        "    print('restored', path, lr.step)\n"
    )
    (tmp_path / "restore.py").write_text(restore)
    out = tmp_path / "out"
    r = _in_read_only_mount(
        src,
        ro,
        f"{py} {tmp_path}/restore.py {ck} {ck}/step-00000002 && "
        f"{py} -m alpha_mpi train {' '.join(TRAIN)} --steps 4 --checkpoint-dir {ck} --replay 2:4 && "
        f"{py} -m alpha_mpi train {' '.join(TRAIN)} --steps 6 --checkpoint-dir {out} --resume-from {ck}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"restored {ck} 4" in r.stdout and f"restored {ck}/step-00000002 2" in r.stdout
    assert "bits match" in r.stdout
    straight = subprocess.run(
        [py, "-m", "alpha_mpi", "train", *TRAIN, "--steps", "6"], capture_output=True, text=True, timeout=300
    )
    assert printed_digest(r.stdout) == printed_digest(straight.stdout)
    assert sorted(os.listdir(src / "ck")) == ["latest", "step-00000002", "step-00000004"]  # nothing written
