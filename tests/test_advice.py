"""A refusal's advice leads somewhere: what it tells the caller to do next works (issue 37 item 4).

- `checkpoint-corrupt` (and the other step-level refusals): the advice once said "resume from an
  earlier step with --resume-from DIR/step-NNNNNNNN", which in DIR itself is refused a second
  time (`checkpoint-exists`: the newer broken step would collide with the continued run). Both
  ways the advice names now continue with the uninterrupted run's bits, from the API and from
  the command line; the way it warns against is still refused.
- `model-nondeterministic`: the commonest cause, drawing from `np.random` instead of the `rng`
  the learner passes, is named, and the model that follows the advice passes the probe.
- `peer-failed`: worded for a peer that refused and exited as well as for one that died.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from test_checkpoint_trust import CFG, comm_self, make, state, train

from alpha_mpi.checkpoint import Checkpointer
from alpha_mpi.checkpoint.paths import LATEST, step_name
from alpha_mpi.learning import check_model
from alpha_mpi.refusals import ADVICE, CLI_ADVICE, Refusal

from conftest import needs_mpiexec, printed_digest, run_mpi

STEP_LEVEL = (
    "checkpoint-corrupt",
    "checkpoint-shard-missing",
    "checkpoint-manifest",
    "checkpoint-shard-invalid",
)


def _flip_a_shard(step_dir: str) -> None:
    """One bit of one params shard: the step no longer verifies (checkpoint-corrupt)."""
    d = os.path.join(step_dir, "params")
    shard = os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0])
    b = bytearray(open(shard, "rb").read())
    b[-1] ^= 1
    open(shard, "wb").write(b)


def _saved_with_a_broken_newest_step(root: str):
    """Steps 2 and 4 in `root` (latest names 4), step 4 broken; returns the learner at step 4."""
    learner = make()
    with Checkpointer(comm_self(), root, learner, CFG) as ck:
        for k in (2, 4):
            train(learner, k - learner.step)
            ck.save()
    _flip_a_shard(os.path.join(root, step_name(4)))
    return learner


def _resume(root: str, path: str | None = None):
    learner = make()
    with Checkpointer(comm_self(), root, learner, CFG) as ck:
        ck.resume(path=path)
    return learner


@pytest.mark.parametrize("code", STEP_LEVEL)
def test_step_level_advice_names_both_ways_on_and_the_trap(code):
    for advice in (ADVICE[code], CLI_ADVICE[code]):
        assert "another" in advice and "`latest` out of DIR" in advice and "checkpoint-exists" in advice, (
            advice
        )
    assert "resume(path=DIR/step-NNNNNNNN)" in ADVICE[code] and "resume() again" in ADVICE[code]
    assert "--resume-from DIR/step-NNNNNNNN and another --checkpoint-dir" in CLI_ADVICE[code]
    assert "--resume again" in CLI_ADVICE[code] and "checkpoint verify DIR --all" in CLI_ADVICE[code]


def test_checkpoint_corrupt_advice_from_the_api_continues_with_the_uninterrupted_bits(tmp_path):
    root = str(tmp_path / "ck")
    uninterrupted = _saved_with_a_broken_newest_step(root)
    with pytest.raises(Refusal) as e:
        _resume(root)
    assert e.value.code == "checkpoint-corrupt", e.value
    step2 = os.path.join(root, step_name(2))
    # What the old advice led to: continuing in DIR from the earlier step is refused again.
    with pytest.raises(Refusal) as e:
        _resume(root, path=step2)
    assert e.value.code == "checkpoint-exists", e.value
    # The first way: resume(path=DIR/step-2) on a Checkpointer of another directory.
    learner = _resume(str(tmp_path / "other"), path=step2)
    assert learner.step == 2
    train(learner, 2)
    assert state(learner) == state(uninterrupted)
    # The second way: the broken step and `latest` moved out of DIR, resume() again.
    aside = tmp_path / "aside"
    aside.mkdir()
    shutil.move(os.path.join(root, step_name(4)), aside)
    shutil.move(os.path.join(root, LATEST), aside)
    learner = _resume(root)
    assert learner.step == 2
    train(learner, 2)
    assert state(learner) == state(uninterrupted)


@needs_mpiexec
def test_checkpoint_corrupt_advice_from_the_command_line_runs(tmp_path):
    """The advice `alpha-mpi train` prints, followed: each way it names exits 0 with the digest of
    the uninterrupted run; the way it warns against exits 3 with checkpoint-exists."""

    def train_cli(*args):
        r, _ = run_mpi(
            1, "-m", "alpha_mpi", "train", "--hidden", "16", "--log-every", "1000", *args, limit=180
        )
        return r

    ck = tmp_path / "ck"
    r = train_cli("--steps", "4", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    want = printed_digest(r.stdout)
    _flip_a_shard(str(ck / step_name(4)))
    r = train_cli("--steps", "4", "--checkpoint-dir", str(ck), "--resume")
    assert r.returncode == 3 and "[checkpoint-corrupt]" in r.stderr, r.stderr[-2000:]
    advice = r.stderr.split("what to do:", 1)[1].splitlines()[0]
    assert "--resume-from DIR/step-NNNNNNNN and another --checkpoint-dir" in advice, advice
    verify, _ = run_mpi(1, "-m", "alpha_mpi", "checkpoint", "verify", str(ck), "--all")
    assert verify.returncode == 3 and step_name(2) in verify.stdout + verify.stderr
    step2 = str(ck / step_name(2))
    r = train_cli("--steps", "4", "--checkpoint-dir", str(ck), "--resume-from", step2)
    assert r.returncode == 3 and "[checkpoint-exists]" in r.stderr, r.stderr[-2000:]
    r = train_cli("--steps", "4", "--checkpoint-dir", str(tmp_path / "new"), "--resume-from", step2)
    assert r.returncode == 0 and printed_digest(r.stdout) == want, r.stderr[-2000:]
    aside = tmp_path / "aside"
    aside.mkdir()
    shutil.move(str(ck / step_name(4)), aside)
    shutil.move(str(ck / LATEST), aside)
    r = train_cli("--steps", "4", "--checkpoint-dir", str(ck), "--resume")
    assert r.returncode == 0 and printed_digest(r.stdout) == want, r.stderr[-2000:]


class _Drawing:
    """A tiny linear model whose gradient carries one random draw (as dropout would)."""

    n_params = 3

    def init(self, seed):
        return np.random.default_rng(seed).standard_normal(3)

    def _loss(self, params, X, y, grad_out, noise):
        r = X @ params - y
        grad_out[:] = X.T @ r + noise
        return float(0.5 * r @ r)


class GlobalDraws(_Drawing):
    def loss_and_grad_sum(self, params, X, y, grad_out):
        return self._loss(params, X, y, grad_out, np.random.random())  # the global generator


class RngDraws(_Drawing):
    def loss_and_grad_sum(self, params, X, y, grad_out, rng=None):
        return self._loss(params, X, y, grad_out, rng.random())  # the slot's generator


def test_model_nondeterministic_advice_names_the_global_generator_and_following_it_passes():
    advice = ADVICE["model-nondeterministic"]
    assert "np.random" in advice and "torch's global generator" in advice and "`rng`" in advice
    probe = (np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0]))
    with pytest.raises(Refusal) as e:
        check_model(GlobalDraws(), probe=probe)
    assert e.value.code == "model-nondeterministic"
    assert check_model(RngDraws(), probe=probe) is not None


def test_peer_failed_advice_covers_a_peer_that_refused_and_one_that_died():
    advice = ADVICE["peer-failed"]
    assert "refused by name and exited" in advice and "die" in advice and "interconnect" in advice
    assert "the peer process died" not in advice
