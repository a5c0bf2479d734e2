"""Resume semantics a user can predict (docs/checkpoints.md), in-process and from the command:

- no step in the directory: step 0, said loudly;
- `latest` missing, steps present: the newest step that verifies, said; newer broken steps or
  no verifying step: refused by name;
- `--resume-from PATH`: that step, into a directory holding no newer step;
- a run at or past `--steps`: reported, no `nan`; the final state always saved;
- `--lr` changed: refused unless `--adopt-lr`, recorded; `--steps` changed: recorded;
- other data: refused; a step directory as `--checkpoint-dir`: refused;
- every bad flag a usage error (exit 2), every bad input a named refusal (exit 3)."""

import json
import os
import shutil

import numpy as np
import pytest
from test_checkpoint_trust import CFG, comm_self, make, state, train

from alpha_mpi.checkpoint import Checkpointer, open_checkpoint
from alpha_mpi.checkpoint.paths import LATEST, step_name
from alpha_mpi.learning import MLP
from alpha_mpi.refusals import Refusal

from conftest import alpha_command, printed_digest


def saved_steps(root, steps=(2, 4), cfg=CFG, data=None):
    learner = make()
    with Checkpointer(comm_self(), root, learner, cfg, data=data) as ck:
        for k in steps:
            train(learner, k - learner.step)
            ck.save()
    return learner


def resume(root, path=None, cfg=CFG, **kw):
    learner = make(lr=cfg["lr"])
    with Checkpointer(comm_self(), root, learner, cfg, **kw) as ck:
        r = ck.resume(path=path)
        return r, learner, ck


def test_no_checkpoint_starts_at_step_0_loudly(tmp_path):
    r, learner, _ = resume(str(tmp_path / "fresh"))
    assert r.how == "none" and learner.step == 0
    assert r.lines == [f"# no checkpoint in {tmp_path / 'fresh'}: starting at step 0"]


def test_latest_missing_resumes_from_the_newest_step_that_verifies_and_says_so(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(root)
    _, want, _ = resume(root)
    os.remove(os.path.join(root, LATEST))
    r, got, _ = resume(root)
    assert r.how == "fallback" and r.step == 4 and state(got) == state(want)
    assert any("latest is missing" in line for line in r.lines) and r.lines[-1].startswith("# resumed from")


def test_latest_missing_and_newest_step_broken_is_refused_naming_the_one_that_verifies(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(root)
    os.remove(os.path.join(root, LATEST))
    d4 = os.path.join(root, step_name(4), "params")
    shard = os.path.join(d4, sorted(os.listdir(d4))[0])
    b = bytearray(open(shard, "rb").read())
    b[-1] ^= 1
    open(shard, "wb").write(b)
    victim = make()
    before = state(victim)
    with Checkpointer(comm_self(), root, victim, CFG) as ck, pytest.raises(Refusal) as e:
        ck.resume()
    assert (
        e.value.code == "checkpoint-corrupt" and step_name(2) in e.value.message and state(victim) == before
    )
    shutil.rmtree(os.path.join(root, step_name(2)))  # now no step verifies
    with Checkpointer(comm_self(), root, victim, CFG) as ck, pytest.raises(Refusal) as e:
        ck.resume()
    assert e.value.code == "checkpoint-corrupt" and "none of its steps verifies" in e.value.message


def test_a_latest_naming_a_broken_step_is_refused_not_skipped(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(root)
    d4 = os.path.join(root, step_name(4), "optimizer.v")
    shard = os.path.join(d4, sorted(f for f in os.listdir(d4) if f.endswith(".safetensors"))[0])
    os.remove(shard)
    with pytest.raises(Refusal) as e:
        resume(root)
    assert e.value.code == "checkpoint-shard-missing"


def test_a_complete_step_newer_than_latest_is_resumed_and_a_broken_one_refused(tmp_path):
    from alpha_mpi.checkpoint.paths import latest_line

    root = str(tmp_path / "ck")
    saved_steps(root)
    _, want, _ = resume(root)
    sha2 = open_checkpoint(os.path.join(root, step_name(2))).manifest_sha256
    open(os.path.join(root, LATEST), "wb").write(latest_line(2, sha2))  # as if killed before latest moved
    r, got, _ = resume(root)
    assert r.how == "newer" and r.step == 4 and state(got) == state(want) and "interrupted" in r.lines[0]
    os.remove(os.path.join(root, step_name(4), "params", "manifest.json"))
    with pytest.raises(Refusal) as e:
        resume(root)
    assert e.value.code == "checkpoint-corrupt" and step_name(4) in e.value.message


def test_resume_from_a_chosen_step_continues_with_the_uninterrupted_bits(tmp_path):
    root, other = str(tmp_path / "ck"), str(tmp_path / "other")
    uninterrupted = saved_steps(root)  # at step 4
    r, learner, _ = resume(other, path=os.path.join(root, step_name(2)))
    assert r.how == "chosen" and learner.step == 2 and "(--resume-from)" in r.lines[0]
    train(learner, 2)
    assert state(learner) == state(uninterrupted)
    # A chosen step older than what the directory already holds would collide with it.
    with pytest.raises(Refusal) as e:
        resume(root, path=os.path.join(root, step_name(2)))
    assert e.value.code == "checkpoint-exists" and step_name(4) in e.value.message
    # Another checkpoint directory is followed through its latest.
    r, learner, _ = resume(str(tmp_path / "third"), path=root)
    assert r.step == 4 and state(learner) == state(uninterrupted)


def test_a_step_directory_as_checkpoint_dir_is_refused(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(root)
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), os.path.join(root, step_name(4)), make(), CFG)
    assert e.value.code == "checkpoint-dir-is-step" and f"--checkpoint-dir {root}" in e.value.message


def test_lr_change_is_refused_unless_adopted_and_then_recorded(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(root)
    new = dict(CFG, lr=5e-3, steps=10)
    with pytest.raises(Refusal) as e:
        resume(root, cfg=new)
    assert e.value.code == "checkpoint-config-mismatch" and "--adopt-lr" in e.value.message
    learner = make(lr=5e-3)
    with Checkpointer(comm_self(), root, learner, new, adopt_lr=True) as ck:
        ck.resume()
        train(learner, 1)
        ck.save()
    m = open_checkpoint(root).manifest
    assert m["config"]["lr"] == 5e-3 and m["scalars"]["optimizer_hyper"]["lr"] == 5e-3
    assert {"at_step": 4, "field": "lr", "from": 1e-2, "to": 5e-3} in m["resume_history"]
    assert {"at_step": 4, "field": "steps", "from": 3, "to": 10} in m["resume_history"]


def test_other_data_is_refused(tmp_path):
    root = str(tmp_path / "ck")
    saved_steps(
        root, cfg=dict(CFG, data="x.npz"), data={"samples": 300, "sha256": "a" * 64, "source": "x.npz"}
    )
    with pytest.raises(Refusal) as e:
        resume(
            root, cfg=dict(CFG, data="x.npz"), data={"samples": 300, "sha256": "b" * 64, "source": "x.npz"}
        )
    assert e.value.code == "checkpoint-data-mismatch"
    moved = {"samples": 300, "sha256": "a" * 64, "source": "moved/x.npz"}
    r, learner, _ = resume(root, cfg=dict(CFG, data="moved/x.npz"), data=moved)
    assert learner.step == 4  # the same data under another path is the same data
    with pytest.raises(Refusal) as e:  # without fingerprints only the path can be compared
        resume(root, cfg=dict(CFG, data="moved/x.npz"))
    assert e.value.code == "checkpoint-config-mismatch"


def test_model_and_data_inputs_are_refused_by_name(tmp_path):
    from alpha_mpi.learning.data import load_npz

    with pytest.raises(Refusal) as e:
        MLP(6, 0, 3)
    assert e.value.code == "model-invalid"
    with pytest.raises(Refusal) as e:
        MLP(100000, 100000, 100000)
    assert e.value.code == "model-invalid" and "GiB" in e.value.message
    cases = {
        "npy": lambda p: np.save(p, np.ones((4, 2))),
        "complex": lambda p: np.savez(p, X=np.ones((10, 3)) * 1j, y=np.zeros(10, np.int64)),
        "label 10^9": lambda p: np.savez(p, X=np.ones((10, 3)), y=np.array([10**9] + [0] * 9)),
        "no features": lambda p: np.savez(p, X=np.ones((10, 0)), y=np.zeros(10, np.int64)),
        "text": lambda p: open(p, "w").write("not an archive"),
        "objects": lambda p: np.savez(p, X=np.array([[None]] * 10, dtype=object), y=np.zeros(10, np.int64)),
        "bool labels": lambda p: np.savez(p, X=np.ones((10, 3)), y=np.zeros(10, bool)),
        "string X": lambda p: np.savez(p, X=np.array([["a"]] * 10), y=np.zeros(10, np.int64)),
    }
    for name, write in cases.items():
        p = str(tmp_path / f"{name.replace(' ', '_')}.npz")
        write(p)
        if not os.path.exists(p):  # np.save appends .npy
            p += ".npy"
        with pytest.raises(Refusal) as e:
            load_npz(p)
        assert e.value.code == "data-invalid", name
        if name == "label 10^9":
            assert "1000000000" in e.value.message


# ------------------------------------------------------------------------------ the command
def cli(*args, n=None, limit=120):
    r = alpha_command("train", "--hidden", "8", "--log-every", "1000", *args, n=n or None, limit=limit)
    return r, printed_digest(r.stdout, required=False)


def test_command_final_state_saved_loud_start_and_nothing_to_train(tmp_path):
    ck = str(tmp_path / "ck")
    r, want = cli("--steps", "5", "--checkpoint-dir", ck, "--checkpoint-every", "3", "--resume")
    assert r.returncode == 0 and f"# no checkpoint in {ck}: starting at step 0" in r.stdout, r.stderr
    assert sorted(os.listdir(ck)) == [
        ".lock",
        "latest",
        step_name(3),
        step_name(5),
    ]  # step 5: the final state
    r, got = cli("--steps", "5", "--checkpoint-dir", ck, "--resume")
    assert (
        r.returncode == 0
        and got == want
        and "nothing to train: the state is at step 5, --steps 5" in r.stdout
    )
    assert "nan" not in r.stdout and "final loss n/a (no step run)" in r.stdout
    r, got = cli("--steps", "4", "--checkpoint-dir", ck, "--resume", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0 and "past --steps 4" in r.stdout and got == want
    assert json.load(open(tmp_path / "r.json"))["loss"] is None
    only = str(tmp_path / "final")
    r, _ = cli("--steps", "2", "--checkpoint-dir", only)
    assert r.returncode == 0 and sorted(os.listdir(only)) == [".lock", "latest", step_name(2)]


def test_command_resume_rules_end_with_the_uninterrupted_digest(tmp_path):
    _, want = cli("--steps", "6")
    ck = str(tmp_path / "ck")
    r, _ = cli("--steps", "4", "--checkpoint-dir", ck, "--checkpoint-every", "2")
    assert r.returncode == 0, r.stderr
    os.remove(os.path.join(ck, LATEST))
    r, got = cli("--steps", "6", "--checkpoint-dir", ck, "--resume", n=2)
    assert r.returncode == 0 and got == want, r.stderr
    assert "latest is missing: resuming from the newest step that verifies" in r.stdout
    assert f"# resumed from {ck}/{step_name(4)} at step 4" in r.stdout
    other = str(tmp_path / "other")
    r, got = cli("--steps", "6", "--checkpoint-dir", other, "--resume-from", os.path.join(ck, step_name(2)))
    assert r.returncode == 0 and got == want and "(--resume-from)" in r.stdout, r.stderr
    r, _ = cli("--steps", "8", "--checkpoint-dir", os.path.join(ck, step_name(4)), "--resume")
    assert r.returncode == 3 and "[checkpoint-dir-is-step]" in r.stderr
    r, _ = cli("--steps", "8", "--checkpoint-dir", ck, "--resume", "--lr", "0.01")
    assert r.returncode == 3 and "[checkpoint-config-mismatch]" in r.stderr and "--adopt-lr" in r.stderr
    r, _ = cli("--steps", "8", "--checkpoint-dir", ck, "--resume", "--lr", "0.01", "--adopt-lr")
    assert r.returncode == 0 and "# resumed from" in r.stdout, r.stderr
    h = open_checkpoint(ck).manifest["resume_history"]
    assert h == [
        {"at_step": 4, "field": "steps", "from": 4, "to": 6},
        {"at_step": 6, "field": "lr", "from": 2e-3, "to": 0.01},
        {"at_step": 6, "field": "steps", "from": 6, "to": 8},
    ], h


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--checkpoint-every", "-1", "--checkpoint-dir", "X"], "--checkpoint-every"),
        (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint-dir"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--momentum", "2"], "--momentum"),
        (["--hidden", "0"], "--hidden"),
        (["--slots", "0"], "--slots"),
        (["--steps", "-3"], "--steps"),
        (["--seed", "-1"], "--seed"),
        (["--timeout", "0"], "--timeout"),
        (["--log-every", "-1"], "--log-every"),  # 0 is quiet mode
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--resume-from", "X"], "--resume-from needs"),
        (["--resume", "--resume-from", "X", "--checkpoint-dir", "Y"], "not both"),
    ],
)
def test_bad_flags_are_usage_errors(args, needle, tmp_path):
    r = alpha_command("train", *args, cwd=str(tmp_path))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []  # nothing written


def test_unwritable_json_is_refused_before_training(tmp_path):
    r, _ = cli(
        "--steps",
        "3",
        "--json",
        str(tmp_path / "missing" / "r.json"),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    assert r.returncode == 3 and "[output-unwritable]" in r.stderr and "step " not in r.stdout
    assert not (tmp_path / "ck").exists()


def test_bad_data_from_the_command_exits_3_by_name(tmp_path):
    np.savez(tmp_path / "big.npz", X=np.ones((10, 3)), y=np.array([10**9] + [0] * 9))
    np.save(tmp_path / "a.npy", np.ones((10, 3)))
    for f in ("big.npz", "a.npy"):
        r, _ = cli("--steps", "1", "--data", str(tmp_path / f))
        assert r.returncode == 3 and "[data-invalid]" in r.stderr and "Traceback" not in r.stderr, r.stderr
