"""Every byte of a published step is covered: single-bit flips over the root manifest, its seal
and `latest`, refused by verify and by resume (in-process, so thousands of flips take seconds);
flips re-sealed by a forger, each refused by name or provably changing nothing; `latest` read as
data; shard headers against the manifest; byte-reproducible files; the directory lock."""

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from ckpt_tools import (
    BATCH,
    SLOTS,
    comm_self,
    edit_root,
    rewrite_component,
    rewrite_shard,
    seal_root,
    step_dir,
    tree_bytes,
)
from ckpt_tools import CFG as BASE_CFG

from alpha_mpi.checkpoint import Checkpointer, open_checkpoint, shardfile
from alpha_mpi.checkpoint.paths import LATEST, MANIFEST, SEAL
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.refusals import Refusal

from conftest import alpha_command, bits

CFG = {**BASE_CFG, "steps": 3}


def make(partition="none", **kw):
    return DataParallelLearner(
        comm_self(), MLP(6, 5, 3), slots=SLOTS, lr=kw.pop("lr", 1e-2), seed=3, partition=partition, **kw
    )


def train(learner, steps):
    data = synthetic(3, n=300, n_eval=8, inputs=6, classes=3)
    stream = SlotStream(len(data.y), BATCH, SLOTS, 3)
    for _ in range(steps):
        t = learner.step
        learner.train_step(
            {s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in range(SLOTS)}
        )


def state(learner):
    """Everything a restore installs, as bits."""
    o = learner.opt
    return (
        learner.step,
        bits(learner.params).tobytes(),
        bits(o.m).tobytes(),
        bits(o.v).tobytes(),
        o.b1t.hex(),
        o.b2t.hex(),
        o.steps,
    )


def save(root, steps=3, cfg=CFG, **kw):
    learner = make(**kw)
    train(learner, steps)
    with Checkpointer(comm_self(), root, learner, cfg) as ck:
        ck.save()
    return learner


@pytest.fixture
def saved(tmp_path):
    root = str(tmp_path / "ck")
    learner = save(root)
    return root, learner


def flips(data: bytes):
    for i in range(len(data)):
        for bit in range(8):
            b = bytearray(data)
            b[i] ^= 1 << bit
            yield i, bit, bytes(b)


def test_every_bit_flip_of_root_manifest_seal_and_latest_is_refused_by_verify_and_resume(saved):
    root, _ = saved
    d = step_dir(root)
    victim = make()
    before = state(victim)
    ck = Checkpointer(comm_self(), root, victim, CFG)
    counts = Counter()
    for fname in (os.path.join(d, MANIFEST), os.path.join(d, SEAL), os.path.join(root, LATEST)):
        original = open(fname, "rb").read()
        hows = ("verify", "resume latest") + (() if fname.endswith(LATEST) else ("resume-from step",))
        fd = os.open(fname, os.O_WRONLY)
        try:
            for i in range(len(original)):
                for bit in range(8):
                    os.pwrite(fd, bytes([original[i] ^ (1 << bit)]), i)  # flip one bit in place
                    # verify and resume for every bit; --resume-from (the same reader) for one bit a byte
                    for how in hows if bit == i % 8 else hows[:2]:
                        try:
                            if how == "verify":
                                open_checkpoint(root).verify()
                            elif how == "resume latest":
                                ck.resume()
                            else:
                                ck.resume(path=d)
                        except Refusal as e:
                            counts[(os.path.basename(fname), e.code)] += 1
                            continue
                        pytest.fail(f"{how} accepted a flip of bit {bit} of byte {i} of {fname}")
                os.pwrite(fd, original[i : i + 1], i)
                assert state(victim) == before, "a refused resume changed the learner"
        finally:
            os.close(fd)
        assert open(fname, "rb").read() == original
    ck.close()
    n_root = 8 * len(open(os.path.join(d, MANIFEST), "rb").read())
    assert sum(v for (f, _), v in counts.items() if f == MANIFEST) == 2 * n_root + n_root // 8
    assert n_root > 4000, n_root
    assert {c for _, c in counts} <= {
        "checkpoint-corrupt",
        "checkpoint-latest-invalid",
        "checkpoint-missing",
    }, counts
    open_checkpoint(root).verify()  # intact again


ACCEPTABLE = {  # fields a forger may change without changing what a resume installs (reported, not state)
    "config.momentum",  # Adam has no momentum: the value is recorded, never used
    "saved_on_ranks",
    "contract_history",
    "resume_history",
    "config.log_every",
    "config.timeout",
    "config.partition",
    "config.topology",
    "config.checkpoint_every",
    "config.steps",
    "data.source",
    "scalars.partition_saved",
    "compute",  # its recorded-only fields (cpu, kernel.isa, kernel.build); a compared one must equal the contract's
    "compute_history",
}


def test_resealed_flips_of_the_root_manifest_are_refused_by_name_or_change_nothing(saved):
    """A forger flips one bit and re-seals the manifest (seal and latest): the schema behind the
    hash must refuse each flip by name, or the restored state must be bit-identical. Every byte
    is flipped once, at a bit that rotates with the byte's position (all eight bit positions)."""
    root, _ = saved
    d = step_dir(root)
    files = {k: os.path.join(*p) for k, p in (("m", (d, MANIFEST)), ("s", (d, SEAL)), ("l", (root, LATEST)))}
    originals = {k: open(p, "rb").read() for k, p in files.items()}
    fds = {k: os.open(p, os.O_WRONLY) for k, p in files.items()}
    original = originals["m"]
    victim = make()
    ck = Checkpointer(comm_self(), root, victim, CFG)
    ck.resume()
    reference = state(victim)
    base = json.loads(original)
    outcomes, accepted_fields = Counter(), Counter()
    try:
        for i in range(len(original)):
            bit = (i * 3) % 8
            flipped = original[:i] + bytes([original[i] ^ (1 << bit)]) + original[i + 1 :]
            sha = hashlib.sha256(flipped).hexdigest().encode()
            if i:
                os.pwrite(fds["m"], original[i - 1 : i], i - 1)  # undo the previous flip
            os.pwrite(fds["m"], flipped[i : i + 1], i)  # re-seal: same lengths, so in place
            os.pwrite(fds["s"], sha, 0)
            os.pwrite(fds["l"], sha, len(b"step-00000003 "))
            try:
                open_checkpoint(root).verify()
                verified = True
            except Refusal as e:
                verified = False
                outcomes["verify " + e.code] += 1
            try:
                ck.resume()
            except Refusal as e:
                outcomes["resume " + e.code] += 1
                assert state(victim) == reference
                continue
            assert verified, f"resume accepted what verify refused (bit {bit} of byte {i})"
            assert state(victim) == reference, (
                f"a re-sealed flip of bit {bit} of byte {i} resumed with other bits"
            )
            accepted_fields.update(_changed_fields(base, json.loads(flipped)))
            outcomes["accepted"] += 1
    finally:
        for k, fd in fds.items():
            os.pwrite(fd, originals[k], 0)
            os.close(fd)
    ck.close()
    open_checkpoint(root).verify()
    # A flipped config key name is a key no run compares (a renamed compared key is refused).
    renamed = {f for f in accepted_fields if f.startswith("config.") and f[7:] not in base["config"]}
    assert set(accepted_fields) - renamed <= ACCEPTABLE, accepted_fields
    assert outcomes["accepted"] < 0.05 * len(original), outcomes  # almost every flip is refused by name
    print(dict(outcomes), dict(accepted_fields))


def _changed_fields(a, b, prefix=""):
    out = []
    for k in set(a) | set(b):
        if a.get(k) != b.get(k):
            top = prefix + k
            if (
                isinstance(a.get(k), dict)
                and isinstance(b.get(k), dict)
                and top in ("config", "data", "scalars")
            ):
                out += _changed_fields(a[k], b[k], top + ".")
            else:
                out.append(top)
    return out


# -------------------------------------------------------------------------- forged fields by name
def _adam_b1t(m):
    m["scalars"]["optimizer_scalars"]["b1t"] = float(
        np.nextafter(m["scalars"]["optimizer_scalars"]["b1t"], 1)
    )


FORGERIES = [
    ("b1t one ulp off", _adam_b1t, "checkpoint-manifest"),
    ("scalars step a string", lambda m: m["scalars"].update(step="3"), "checkpoint-manifest"),
    ("scalars missing", lambda m: m.pop("scalars"), "checkpoint-manifest"),
    (
        "optimizer_scalars a list",
        lambda m: m["scalars"].update(optimizer_scalars=[1, 2]),
        "checkpoint-manifest",
    ),
    ("steps field", lambda m: m["scalars"]["optimizer_scalars"].update(steps=4), "checkpoint-manifest"),
    ("step", lambda m: m.update(step=4), "checkpoint-manifest"),
    ("components a list", lambda m: m.update(components=[1]), "checkpoint-manifest"),
    ("config a string", lambda m: m.update(config="x"), "checkpoint-manifest"),
    ("config value an object", lambda m: m["config"].update(lr={"a": 1}), "checkpoint-manifest"),
    ("config lr vs hyper", lambda m: m["config"].update(lr=0.02), "checkpoint-manifest"),
    ("layout order id", lambda m: m.update(layout_order_id="0" * 64), "checkpoint-manifest"),
    ("both order names", lambda m: m.update(order_id=m["layout_order_id"]), "checkpoint-manifest"),
    (
        "former name, format-2 contract",
        lambda m: m.update(order_id=m.pop("layout_order_id")),
        "checkpoint-manifest",
    ),
    ("format-1 contract, new name", lambda m: m["contract"].update(version=1), "checkpoint-manifest"),
    ("contract digest", lambda m: m.update(contract_digest="0" * 64), "checkpoint-manifest"),
    ("contract a number", lambda m: m.update(contract=5), "checkpoint-manifest"),
    ("data position", lambda m: m["data"].update(position=1), "checkpoint-manifest"),
    ("data stream", lambda m: m["data"].update(stream="other"), "checkpoint-manifest"),
    ("unknown key", lambda m: m.update(extra=1), "checkpoint-manifest"),
    (
        "deep JSON",
        lambda m: m.update(contract_history=json.loads("[" * 200 + "]" * 200)),
        "checkpoint-manifest",
    ),
    ("history entry", lambda m: m.update(resume_history=[{"at_step": 1}]), "checkpoint-manifest"),
    ("saved_on_ranks bool", lambda m: m.update(saved_on_ranks=True), "checkpoint-manifest"),
    ("version", lambda m: m.update(version=1), "checkpoint-format-version"),
]


@pytest.mark.parametrize("edit,code", [f[1:] for f in FORGERIES], ids=[f[0] for f in FORGERIES])
def test_every_malformed_field_is_a_named_refusal(saved, edit, code):
    root, _ = saved
    edit_root(root, edit)
    with pytest.raises(Refusal) as e:
        open_checkpoint(root).verify()
    assert e.value.code == code, e.value
    victim = make()
    before = state(victim)
    with Checkpointer(comm_self(), root, victim, CFG) as ck, pytest.raises(Refusal) as e:
        ck.resume()
    assert e.value.code == code and state(victim) == before


def test_duplicate_keys_nan_bad_utf8_and_deep_nesting_are_refused(saved):
    root, _ = saved
    d = step_dir(root)
    body = open(os.path.join(d, MANIFEST), "rb").read()
    for forged in (
        body.replace(b'"saved_on_ranks": 1', b'"saved_on_ranks": 1, "saved_on_ranks": 2'),
        body.replace(b'"lr": 0.01', b'"lr": NaN', 1),
        body.replace(b'"lr": 0.01', b'"lr": 1e999', 1),
        b"\xff" + body,
        b"[" * 100000 + b"]" * 100000,
        b'{"a": ' * 100000,
    ):
        assert forged != body
        seal_root(d, forged)
        with pytest.raises(Refusal) as e:
            open_checkpoint(root)
        assert e.value.code == "checkpoint-manifest", e.value


def _f32_shard(component, start, stop):
    """A well-formed safetensors file holding float32 values where the manifest says float64."""
    import struct

    count = stop - start
    h = json.dumps({"values": {"dtype": "F32", "shape": [count], "data_offsets": [0, 4 * count]}}).encode()
    return struct.pack("<Q", len(h)) + h + np.zeros(count, "<f4").tobytes()


SHARDS = [
    ("float32 shard, hash chain rewritten", lambda e: _f32_shard("params", e["start"], e["stop"])),
    ("giant header length", lambda e: (1 << 62).to_bytes(8, "little") + b"{}"),
    (
        "shape disagrees",
        lambda e: shardfile.encode("params", e["start"], e["stop"] - 1, np.zeros(e["stop"] - e["start"] - 1)),
    ),
    (
        "other component's metadata",
        lambda e: shardfile.encode("optimizer.m", e["start"], e["stop"], np.zeros(e["stop"] - e["start"])),
    ),
    (
        "truncated",
        lambda e: shardfile.encode("params", e["start"], e["stop"], np.zeros(e["stop"] - e["start"]))[:-8],
    ),
]


@pytest.mark.parametrize("forge", [s[1] for s in SHARDS], ids=[s[0] for s in SHARDS])
def test_shard_headers_are_checked_against_the_manifest(saved, forge):
    root, _ = saved
    e = open_checkpoint(root).components["params"]["shards"][0]
    rewrite_shard(root, "params", forge(e))
    with pytest.raises(Refusal) as r:
        open_checkpoint(root).verify()
    assert r.value.code == "checkpoint-shard-invalid", r.value
    victim = make()
    before = state(victim)
    with Checkpointer(comm_self(), root, victim, CFG) as ck, pytest.raises(Refusal) as r:
        ck.resume()
    assert r.value.code == "checkpoint-shard-invalid" and state(victim) == before


def test_component_manifest_types_are_named(saved):
    root, _ = saved
    for edit in (
        lambda c: c.update(length="53"),
        lambda c: c["shards"][0].update(start=None),
        lambda c: c.update(shards={}),
        lambda c: c["shards"][0].update(shape=[1, 2]),
    ):
        save_dir = step_dir(root)
        snapshot = tree_bytes(save_dir)
        rewrite_component(root, "params", edit)
        with pytest.raises(Refusal) as e:
            open_checkpoint(root)
        assert e.value.code == "checkpoint-manifest", e.value
        for rel, data in snapshot.items():  # undo
            open(os.path.join(save_dir, rel), "wb").write(data)
        seal_root(save_dir, snapshot[MANIFEST])


# -------------------------------------------------------------------------- latest as data
def test_latest_symlink_to_a_secret_is_never_read_or_echoed(saved, tmp_path):
    root, _ = saved
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:TOP-SECRET-CONTENT:/root:/bin/bash\n")
    os.remove(os.path.join(root, LATEST))
    os.symlink(str(secret), os.path.join(root, LATEST))
    for args in (
        ["checkpoint", "verify", root],
        ["checkpoint", "inspect", root],
        ["checkpoint", "verify", root, "--all"],
    ):
        r = alpha_command(*args)
        assert "TOP-SECRET" not in r.stdout + r.stderr, args
    r = alpha_command("checkpoint", "verify", root)
    assert r.returncode == 3 and "[checkpoint-latest-invalid]" in r.stderr, r.stderr
    r = alpha_command(
        "train", "--hidden", "5", "--steps", "1", "--slots", "4", "--batch", "29", "--seed", "3",
        "--checkpoint-dir", root, "--resume",
    )  # fmt: skip
    assert (
        r.returncode == 3
        and "[checkpoint-latest-invalid]" in r.stderr
        and "TOP-SECRET" not in r.stdout + r.stderr
    )


@pytest.mark.parametrize(
    "content",
    [
        b"step-00000003\0\n",
        b"../../etc/passwd\n",
        b"step-00000003\n",
        b"step-00000003 " + b"0" * 64 + b"\n",
        b"x" * 10000,
        b"\xff\xfe",
    ],
)
def test_malformed_latest_is_refused_by_name_without_echo(saved, content):
    root, _ = saved
    open(os.path.join(root, LATEST), "wb").write(content)
    with pytest.raises(Refusal) as e:
        open_checkpoint(root)
    assert e.value.code in ("checkpoint-latest-invalid", "checkpoint-corrupt"), e.value
    assert content.decode("latin-1").strip() not in str(e.value) or len(content.strip()) < 14


def test_latest_naming_a_fifo_or_device_does_not_block(saved):
    root, _ = saved
    os.remove(os.path.join(root, LATEST))
    os.mkfifo(os.path.join(root, LATEST))
    with pytest.raises(Refusal) as e:
        open_checkpoint(root)
    assert e.value.code == "checkpoint-latest-invalid"


# -------------------------------------------------------------------------- reproducible files
def test_shard_files_are_byte_identical_across_runs_and_readable_by_safetensors(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    save(a, partition="state")
    save(b, partition="state")
    ta, tb = tree_bytes(a), tree_bytes(b)
    shards = [k for k in ta if k.endswith(".safetensors")]
    assert shards and ta.keys() == tb.keys()
    for k in ta:
        if k != ".lock":  # the lock file names the process that held it
            assert ta[k] == tb[k], k
    from safetensors import safe_open

    ck = open_checkpoint(a)
    e = ck.components["params"]["shards"][0]
    with safe_open(e["file"], framework="numpy") as f:
        assert f.metadata() == {"component": "params", "start": str(e["start"]), "stop": str(e["stop"])}
        assert np.array_equal(
            bits(f.get_tensor("values")), bits(ck.read_range("params", e["start"], e["stop"]))
        )


# -------------------------------------------------------------------------- the lock
def _cli(*args):
    return alpha_command(*args)


TINY = ["train", "--hidden", "5", "--slots", "4", "--batch", "29", "--seed", "3", "--log-every", "1000"]


def test_a_second_writer_on_a_directory_is_refused_before_it_writes(tmp_path):
    root = str(tmp_path / "ck")
    r = _cli(*TINY, "--steps", "2", "--checkpoint-dir", root)
    assert r.returncode == 0, r.stderr
    holder = Checkpointer(comm_self(), root, make(), CFG)  # this process now holds the directory
    before = tree_bytes(root)
    r = _cli(*TINY, "--steps", "4", "--checkpoint-dir", root, "--resume")
    assert r.returncode == 3 and "[checkpoint-locked]" in r.stderr, (r.stdout, r.stderr)
    assert f"pid {os.getpid()}" in r.stderr
    assert tree_bytes(root) == before  # it wrote nothing
    holder.close()
    r = _cli(*TINY, "--steps", "4", "--checkpoint-dir", root, "--resume")
    assert r.returncode == 0 and "# resumed from" in r.stdout, r.stderr


def test_one_process_shares_its_lock_and_a_killed_holder_leaves_none(tmp_path):
    root = str(tmp_path / "ck")
    a = Checkpointer(comm_self(), root, make(), CFG)
    b = Checkpointer(comm_self(), root, make(), CFG)  # same process: shared, reference-counted
    a.close()
    r = _cli(*TINY, "--steps", "1", "--checkpoint-dir", root)
    assert r.returncode == 3 and "[checkpoint-locked]" in r.stderr  # b still holds it
    b.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path[:0] = ['tests'];"
            "from alpha_mpi.checkpoint.lock import DirectoryLock; l = DirectoryLock(sys.argv[1]);"
            "print('held', flush=True); time.sleep(60)",
            root,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    r = _cli(*TINY, "--steps", "1", "--checkpoint-dir", root)
    assert r.returncode == 3 and "[checkpoint-locked]" in r.stderr
    holder.kill()
    holder.wait()
    r = _cli(*TINY, "--steps", "1", "--checkpoint-dir", root)
    assert r.returncode == 0, r.stderr  # the kernel dropped the dead holder's lock


def test_full_disk_is_named_as_such_and_keeps_the_previous_step(saved, monkeypatch):
    import errno

    from alpha_mpi.checkpoint import store

    root, learner = saved
    train(learner, 1)

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write_durable", full)
    with Checkpointer(comm_self(), root, learner, CFG) as ck, pytest.raises(Refusal) as e:
        ck.save()
    assert e.value.code == "checkpoint-write-failed" and "disk is full" in e.value.message
    monkeypatch.undo()
    assert open_checkpoint(root).step == 3


def test_an_unsealed_version_1_step_is_refused_as_another_format(saved):
    root, _ = saved
    d = step_dir(root)
    edit_root(root, lambda m: m.update(version=1))
    os.remove(os.path.join(d, SEAL))
    with pytest.raises(Refusal) as e:
        open_checkpoint(d)
    assert e.value.code == "checkpoint-format-version"
    edit_root(root, lambda m: m.update(version=2))
    os.remove(os.path.join(d, SEAL))
    with pytest.raises(Refusal) as e:
        open_checkpoint(d)
    assert e.value.code == "checkpoint-corrupt" and "not sealed" in e.value.message


def test_a_config_that_is_not_json_scalars_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(Refusal) as e:
        Checkpointer(comm_self(), str(tmp_path / "ck"), make(), dict(CFG, layers=[1, 2]))
    assert e.value.code == "checkpoint-config-invalid" and not (tmp_path / "ck").exists()
