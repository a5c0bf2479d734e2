"""Crash safety: SIGKILL the saving process at 50+ points of publication.

After every kill the previous checkpoint restores and verifies, `latest` never names a partial
step, and the next save succeeds. Kill points are publication filesystem operations chosen at
random (seeded) through the store's explicit test hook (`store.hooks.point`, set by the saver
script from its CRASH_AT argument), plus kills at random wall-clock moments.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

from alpha_mpi.checkpoint import open_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
SAVER = os.path.join(HERE, "mpi_scripts", "ckpt_saver.py")


def run_saver(root, first, crash_at=None, kill_after=None):
    args = [sys.executable, SAVER, root, "1" if first else "0"] + (
        [str(crash_at)] if crash_at is not None else []
    )
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        time.sleep(kill_after)
        p.send_signal(signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def check_previous_intact(root, allowed_steps):
    ck = open_checkpoint(root)  # the step `latest` names
    assert ck.step in allowed_steps, ck.step
    ck.verify()
    ck.read_range("params", 0, ck.length("params"))


def test_sigkill_during_publication_never_exposes_a_partial_checkpoint(tmp_path):
    base = str(tmp_path / "base")
    rc, out, err = run_saver(base, True)
    assert rc == 0, err
    rng = random.Random(20261129)
    points = int(out.split("points")[1])  # publication operations of one save, as counted by the saver
    assert points >= 8, out
    kills = 0
    # Operation-level kills: every publication point once (then a retry must succeed), then random
    # points; one past the last point shows the save completing untouched.
    plan = list(range(1, points + 2)) + [rng.randint(1, points) for _ in range(50 - points)]
    for i, k in enumerate(plan):
        root = str(tmp_path / f"op{i}")
        shutil.copytree(base, root)
        rc, out, err = run_saver(root, False, crash_at=k)
        if rc == -signal.SIGKILL:
            kills += 1
            check_previous_intact(root, {2})
            if i < points:  # a later save goes through (the stale temporary directory is discarded)
                rc2, _, err2 = run_saver(root, False)
                assert rc2 == 0, err2
                check_previous_intact(root, {4})
        else:
            assert rc == 0 and "saved 4" in out, err  # k beyond the last point: the save completed
            check_previous_intact(root, {4})
    assert kills >= 50, kills
    # Wall-clock kills at random moments of the whole run (often mid-save).
    for i in range(8):
        root = str(tmp_path / f"t{i}")
        shutil.copytree(base, root)
        rc, out, err = run_saver(root, False, kill_after=rng.uniform(0.3, 1.2))
        check_previous_intact(root, {4} if rc == 0 else {2, 4})
