"""Checkpoints in one process: shards equal the oracle's state, refusals by name, immutability."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from ckpt_tools import BATCH, CFG, SLOTS, comm_self, edit_root, rewrite_component, shard_file, step_dir

from alpha_mpi import oracle
from alpha_mpi.checkpoint import Checkpointer, open_checkpoint
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.model import build
from alpha_mpi.refusals import Refusal

from conftest import bits


def make(topology="hierarchy:2", partition="none"):
    model = MLP(6, 5, 3)
    return DataParallelLearner(
        comm_self(), model, slots=SLOTS, topology=topology, lr=1e-2, seed=3, partition=partition
    ), model


def train(learner, data, steps):
    stream = SlotStream(len(data.y), BATCH, SLOTS, 3)
    for _ in range(steps):
        t = learner.step
        learner.train_step(
            {s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in range(SLOTS)}
        )


@pytest.fixture
def data():
    return synthetic(3, n=300, n_eval=8, inputs=6, classes=3)


@pytest.fixture
def saved(tmp_path, data):
    learner, model = make()
    train(learner, data, 3)
    ck = Checkpointer(comm_self(), str(tmp_path / "ck"), learner, CFG)
    ck.save()
    return str(tmp_path / "ck"), learner, model


def test_every_shard_equals_the_oracle_state(saved, data):
    root, learner, model = saved
    # The independent oracle: tree over (Σg, Σn, Σloss) payloads, one division, Adam in Python floats.
    tree = build("hierarchy:2", SLOTS, 1)
    stream = SlotStream(len(data.y), BATCH, SLOTS, 3)
    p = model.init(3).tolist()
    n = len(p)
    m, v, b1t, b2t = [0.0] * n, [0.0] * n, 0.9, 0.999
    for t in range(3):
        pay = {}
        for s in range(SLOTS):
            idx = stream.indices(t, s)
            g = np.zeros(n)
            loss = model.loss_and_grad_sum(np.array(p), data.X[idx], data.y[idx], g)
            pay[s] = g.tolist() + [float(len(idx)), loss]
        tot = oracle.evaluate(tree, pay)
        p, m, v = oracle.adam(p, m, v, [x / tot[n] for x in tot[:n]], 1e-2, 0.9, 0.999, 1e-8, b1t, b2t)
        b1t, b2t = b1t * 0.9, b2t * 0.999
    ck = open_checkpoint(root)
    for name, want in (("params", p), ("optimizer.m", m), ("optimizer.v", v)):
        for e in ck.components[name]["shards"]:
            got = ck.read_range(name, e["start"], e["stop"])
            assert np.array_equal(bits(got), bits(np.array(want[e["start"] : e["stop"]]))), name
    sc = ck.manifest["scalars"]["optimizer_scalars"]
    assert (sc["b1t"], sc["b2t"], sc["steps"]) == (b1t, b2t, 3)


def test_resume_continues_with_the_same_bits(saved, data):
    root, learner, _ = saved
    train(learner, data, 2)
    for partition in ("none", "state", "grads", "params"):
        again, _ = make(partition=partition)
        Checkpointer(comm_self(), root, again, CFG).restore_latest()
        assert again.step == 3
        train(again, data, 2)
        assert np.array_equal(bits(again.final_params()), bits(learner.final_params())), partition


def early_0_2_form(m):
    """The root manifest as early 0.2 wrote it: the layout order id under `order_id`, a contract of
    format 1 whose combines key it `order_id`, and that contract's digest (written out here, not
    by the contract code: sha256 of the tag and the canonical JSON; no evidence in this contract)."""
    m["order_id"] = m.pop("layout_order_id")
    c = m["contract"]
    c["version"] = 1
    for op in c["operations"]:
        if op["kind"] == "combine":
            op["order_id"] = op.pop("layout_order_id")
    body = json.dumps(c, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    m["contract_digest"] = hashlib.sha256(b"alpha-mpi/numerical-contract/v1\0" + body).hexdigest()


def test_a_checkpoint_of_early_0_2_naming_order_id_restores_with_the_same_bits(saved, data):
    root, learner, _ = saved
    edit_root(root, early_0_2_form)
    old = open_checkpoint(root)
    assert "layout_order_id" not in old.manifest and old.manifest["order_id"] == learner.layout_order_id
    assert old.verify()["layout_order_id"] == learner.layout_order_id
    train(learner, data, 2)
    again, _ = make(partition="state")
    ck = Checkpointer(comm_self(), root, again, CFG)
    ck.restore_latest()
    assert again.step == 3
    train(again, data, 2)
    assert np.array_equal(bits(again.final_params()), bits(learner.final_params()))
    ck.save()  # the next step is written in the current form
    m = open_checkpoint(root).manifest
    assert m["step"] == 5 and "order_id" not in m and m["layout_order_id"] == learner.layout_order_id
    assert m["contract"]["version"] == 2 and m["contract_digest"] == learner.contract.digest


def test_partial_reads_across_shards(tmp_path):
    from alpha_mpi.checkpoint import store

    root = str(tmp_path / "c")
    full = np.arange(100, dtype=np.float64) / 7
    tmp = store.prepare_tmp(root, 5)
    shards = store.write_shards(tmp, "x", [(0, 30, full[:30]), (30, 31, full[30:31]), (31, 100, full[31:])])
    store.publish(root, 5, tmp, {}, {"x": {"length": 100, "shards": shards}})
    ck = open_checkpoint(root)
    for a, b in ((0, 100), (25, 35), (30, 31), (99, 100), (10, 10)):
        assert np.array_equal(ck.read_range("x", a, b), full[a:b])


def test_second_save_of_a_step_is_refused(saved):
    root, learner, _ = saved
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, learner, CFG).save()
    assert e.value.code == "checkpoint-exists"


def corrupt(root):
    f = shard_file(root)
    b = bytearray(open(f, "rb").read())
    b[-3] ^= 0x01
    open(f, "wb").write(bytes(b))


def escape_absolute(root):
    rewrite_component(root, "params", lambda c: c["shards"][0].update(path="/etc/passwd"))


def escape_dotdot(root):
    rewrite_component(
        root,
        "params",
        lambda c: c["shards"][0].update(
            path="../optimizer.m/" + os.path.basename(shard_file(root, "optimizer.m"))
        ),
    )


def escape_symlink(root):
    f = shard_file(root)
    outside = os.path.join(os.path.dirname(root), "outside.safetensors")
    shutil.copy(f, outside)
    os.remove(f)
    os.symlink(outside, f)


def bad_version(root):
    edit_root(root, lambda m: m.update(version=99))


def bad_profile(root):
    """A checkpoint saved under another profile: contract and its digest both say flush-to-zero."""
    from alpha_mpi.numerics import NumericalContract

    def edit(m):
        m["contract"]["profile"]["subnormals"] = "flush-to-zero"
        m["contract_digest"] = NumericalContract.from_dict(m["contract"]).digest

    edit_root(root, edit)


CASES = [
    (corrupt, "checkpoint-corrupt"),
    (lambda r: os.remove(shard_file(r)), "checkpoint-shard-missing"),
    (lambda r: os.remove(os.path.join(step_dir(r), "params", "manifest.json")), "checkpoint-shard-missing"),
    (escape_absolute, "checkpoint-path-escape"),
    (escape_dotdot, "checkpoint-path-escape"),
    (escape_symlink, "checkpoint-path-escape"),
    (bad_version, "checkpoint-format-version"),
    (lambda r: rewrite_component(r, "params", lambda c: c["shards"].pop()), "checkpoint-manifest"),
    (lambda r: open(os.path.join(r, "latest"), "w").write("../../elsewhere\n"), "checkpoint-latest-invalid"),
]


@pytest.mark.parametrize("damage,code", CASES, ids=[c for _, c in CASES])
def test_damaged_checkpoints_are_refused_by_restore_and_verify(saved, damage, code):
    root, _, _ = saved
    damage(root)
    with pytest.raises(Refusal) as e:
        open_checkpoint(root).verify()
    assert e.value.code == code
    again, _ = make()
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, again, CFG).restore_latest()
    assert e.value.code == code
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "verify", root], capture_output=True, text=True
    )
    assert r.returncode == 3 and f"[{code}]" in r.stderr


def test_profile_and_order_mismatch_are_refused_unless_adopted(saved):
    root, _, _ = saved
    star_learner, _ = make(topology="star")
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, star_learner, CFG).restore_latest()
    assert e.value.code == "numerical-order-mismatch"
    adopting = Checkpointer(comm_self(), root, star_learner, CFG, adopt_contract=True)
    adopting.restore_latest()
    assert adopting.history and adopting.history[0]["to"] == star_learner.contract.digest
    bad_profile(root)
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, make()[0], CFG).restore_latest()
    assert e.value.code == "numerical-profile-mismatch"


def test_config_mismatch_and_missing_checkpoint(saved, tmp_path):
    root, _, _ = saved
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, make()[0], dict(CFG, batch=30)).restore_latest()
    assert e.value.code == "checkpoint-config-mismatch"
    assert Checkpointer(comm_self(), str(tmp_path / "none"), make()[0], CFG).restore_latest() is None
    with pytest.raises(Refusal) as e:
        open_checkpoint(str(tmp_path / "none"))
    assert e.value.code == "checkpoint-missing"


def test_inspect_and_verify_cli(saved):
    root, _, _ = saved
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "verify", root], capture_output=True, text=True
    )
    assert r.returncode == 0 and "ok:" in r.stdout and "step 3" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "inspect", root, "--json"],
        capture_output=True,
        text=True,
    )
    m = json.loads(r.stdout)
    assert m["step"] == 3 and m["format"] == "alpha-mpi-checkpoint"


# ------------------------------------------------------------------ rewind after a detection
def _state(learner):
    return bits(learner.params).tobytes(), bits(learner.opt.m).tobytes(), learner.step


def test_rewind_sets_aside_later_steps_and_points_latest_back(tmp_path, data):
    """After sdc-detected with K < S (issue 36 item 2): latest names the newest step at or before
    the clean step; later ones are moved whole into a folder (nothing deleted); a resume continues
    from the chosen step, and the next saves go on from there."""
    root = str(tmp_path / "ck")
    learner, _ = make()
    with Checkpointer(comm_self(), root, learner, CFG) as ck:
        states = {}
        for k in (2, 4, 6, 8):
            train(learner, data, k - learner.step)
            ck.save()
            states[k] = _state(learner)
        back = ck.rewind(5, None, "sdc-step-00000008")
        assert (back.step, back.save, back.set_aside) == (4, False, (6, 8))
        assert sorted(os.listdir(back.folder)) == ["step-00000006", "step-00000008"]
        assert open(os.path.join(root, "latest")).read().startswith("step-00000004 ")
        again = ck.rewind(5, None, "sdc-step-00000008")  # nothing newer is left: nothing moves
        assert (again.step, again.set_aside, again.folder) == (4, (), None)
    fresh, _ = make()
    with Checkpointer(comm_self(), root, fresh, CFG) as ck:
        assert ck.resume().step == 4 and _state(fresh) == states[4]
        train(fresh, data, 2)
        ck.save()  # step 6 again, now from the clean state
        assert _state(fresh) == states[6]  # a healthy run: the same bits as the set-aside step
    assert open(os.path.join(root, "latest")).read().startswith("step-00000006 ")


def test_rewind_to_a_state_held_in_memory_drops_latest_for_the_callers_save(tmp_path, data):
    root = str(tmp_path / "ck")
    learner, _ = make()
    with Checkpointer(comm_self(), root, learner, CFG) as ck:
        train(learner, data, 2)
        kept = learner.checkpoint_snapshot()
        want = _state(learner)
        train(learner, data, 3)
        ck.save()  # step 5: after the clean step
        back = ck.rewind(3, 2, "sdc-step-00000005")
        assert (back.step, back.save, back.set_aside) == (2, True, (5,))
        assert not os.path.lexists(os.path.join(root, "latest"))
        learner.checkpoint_apply(kept)
        assert _state(learner) == want
        ck.save()
    assert open(os.path.join(root, "latest")).read().startswith("step-00000002 ")
    nothing, _ = make()
    with Checkpointer(comm_self(), root, nothing, CFG) as ck:
        back = ck.rewind(1, None, "sdc-step-00000004")  # nothing at or before step 1
        assert back.step is None and back.set_aside == (2,)
        assert ck.resume().how == "none" and nothing.step == 0


def saved_at_2_and_4(root, data):
    """A learner trained 4 steps that saved steps 2 and 4 into `root` (latest: step 4)."""
    learner, _ = make()
    with Checkpointer(comm_self(), root, learner, CFG) as ck:
        for _ in range(2):
            train(learner, data, 2)
            ck.save()
    return learner


def flip_last_byte(path):
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))


def test_a_latest_left_naming_a_set_aside_step_is_refused_by_name(tmp_path, data):
    """set_aside runs before latest moves back: a crash in between leaves latest naming a step
    that is gone, which a resume refuses by name instead of resuming from a suspect step."""
    from alpha_mpi.checkpoint import store

    root = str(tmp_path / "ck")
    saved_at_2_and_4(root, data)
    first = store.set_aside(root, [4], "sdc-step-00000004")  # the crash: latest not moved yet
    assert os.listdir(first) == ["step-00000004"]
    fresh, _ = make()
    with Checkpointer(comm_self(), root, fresh, CFG) as ck:
        with pytest.raises(Refusal) as e:
            ck.resume()
    assert e.value.code == "checkpoint-missing" and fresh.step == 0
    second = store.set_aside(root, [2], "sdc-step-00000004")  # the folder name is taken: never merged
    assert second == first + ".2" and os.listdir(second) == ["step-00000002"]


# ------------------------------------------------- restore: what it reads, and that it only reads
def test_restore_without_latest_reads_the_newest_complete_step_as_resume_does(tmp_path, data):
    """A first save killed before it moved `latest` leaves complete steps and no pointer:
    restore(D, missing_ok=True) continues from the newest one, as `--resume` does, instead of
    starting again at step 0 (issue 36 item 6); a broken newest step is refused by name."""
    root = str(tmp_path / "ck")
    learner = saved_at_2_and_4(root, data)
    want = _state(learner)
    os.remove(os.path.join(root, "latest"))
    for kw in ({"missing_ok": True}, {}):
        fresh, _ = make()
        assert fresh.restore(root, CFG, **kw) == os.path.join(root, "step-00000004")
        assert _state(fresh) == want
    flip_last_byte(_a_shard(root, 4))  # the newest step no longer verifies
    fresh, _ = make()
    before = _state(fresh)
    with pytest.raises(Refusal) as e:
        fresh.restore(root, CFG, missing_ok=True)
    assert e.value.code == "checkpoint-corrupt" and "step-00000002" in e.value.message
    assert _state(fresh) == before
    empty, _ = make()
    assert empty.restore(str(tmp_path / "none"), CFG, missing_ok=True) is None and empty.step == 0


def _a_shard(root, step):
    d = os.path.join(root, f"step-{step:08d}", "params")
    return os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0])


def test_restore_takes_no_lock_and_the_first_save_into_the_directory_does(tmp_path, data):
    """Which Checkpointer takes the directory lock, and when (issue 36 item 7): a trainer's at
    construction; a learner's restore never (it reads published, immutable steps: a read-only
    checkpoint restores); its first save does. A lock file that cannot be taken (here a symlink,
    refused as any trainer refuses it) stops the writers by name and not the reader."""
    root = str(tmp_path / "ck")
    learner, _ = make()
    train(learner, data, 3)
    learner.save(root, CFG)
    want = _state(learner)
    lock = os.path.join(root, ".lock")
    os.remove(lock)
    os.symlink(os.path.join(str(tmp_path), "elsewhere"), lock)
    fresh, _ = make()
    assert fresh.restore(root, CFG) is not None and _state(fresh) == want
    assert fresh.restore(os.path.join(root, "step-00000003"), CFG) is not None  # a step directory too
    with pytest.raises(Refusal) as e:
        fresh.save(root, CFG)
    assert e.value.code == "checkpoint-locked"
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), root, fresh, CFG)  # a trainer: locked before it reads
    assert e.value.code == "checkpoint-locked"
    os.remove(lock)
    train(fresh, data, 1)
    assert fresh.save(root, CFG).endswith("step-00000004") and os.path.isfile(lock)


def test_the_advice_for_a_damaged_step_works_through_the_python_api(tmp_path, data):
    """Issue 36 item 11: checkpoint-corrupt advised restoring an earlier step only; saving on into
    the same directory then met checkpoint-exists. The advice says to save into a new directory,
    and doing so continues with the bits of an uninterrupted run."""
    root, new = str(tmp_path / "ck"), str(tmp_path / "new")
    learner = saved_at_2_and_4(root, data)
    train(learner, data, 2)
    want = _state(learner)
    flip_last_byte(_a_shard(root, 4))
    fresh, _ = make()
    with pytest.raises(Refusal) as e:
        fresh.restore(root, CFG)
    assert e.value.code == "checkpoint-corrupt" and "save into a new directory" in e.value.advice
    fresh.restore(os.path.join(root, "step-00000002"), CFG)  # an earlier step, as advised
    train(fresh, data, 2)
    with pytest.raises(Refusal) as e:
        fresh.save(root, CFG)  # what the advice warns of: the damaged step is in the way
    assert e.value.code == "checkpoint-exists"
    assert fresh.save(new, CFG) == os.path.join(new, "step-00000004")  # what it says to do
    train(fresh, data, 2)
    assert _state(fresh) == want
