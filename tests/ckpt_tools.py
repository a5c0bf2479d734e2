"""Test helpers that forge checkpoints the way an attacker with write access would: edit a file,
then re-seal every hash above it (component manifest -> root manifest -> seal -> latest), so
that only the edit itself is wrong and the validation behind the hashes is what is tested."""

import hashlib
import json
import os

from alpha_mpi.checkpoint.paths import LATEST, MANIFEST, SEAL, latest_line, seal_line, step_of

# The small learner the checkpoint tests save and resume (4 slots, batch 29, Adam).
SLOTS, BATCH = 4, 29
CFG = {
    "slots": SLOTS,
    "batch": BATCH,
    "seed": 3,
    "hidden": 5,
    "data": None,
    "optimizer": "adam",
    "lr": 1e-2,
    "momentum": 0.9,
}


def comm_self():
    from mpi4py import MPI

    return MPI.COMM_SELF


def step_dir(root):
    return os.path.join(root, open(os.path.join(root, LATEST)).read().split()[0])


def seal_root(d, body: bytes):
    """Write root manifest bytes and re-seal them (seal file and, when it names this step, latest)."""
    open(os.path.join(d, MANIFEST), "wb").write(body)
    sha = hashlib.sha256(body).hexdigest()
    open(os.path.join(d, SEAL), "wb").write(seal_line(sha))
    root = os.path.dirname(d)
    pointer = os.path.join(root, LATEST)
    name = os.path.basename(d)
    if os.path.isfile(pointer) and open(pointer).read().split()[0] == name:
        open(pointer, "wb").write(latest_line(step_of(name), sha))


def edit_root(root, edit, d=None):
    d = d or step_dir(root)
    m = json.load(open(os.path.join(d, MANIFEST)))
    edit(m)
    seal_root(d, json.dumps(m).encode())


def rewrite_component(root, name, edit):
    """Edit a component manifest and re-seal the chain (so only `edit` is wrong)."""
    d = step_dir(root)
    mpath = os.path.join(d, name, MANIFEST)
    comp = json.load(open(mpath))
    edit(comp)
    body = json.dumps(comp).encode()
    open(mpath, "wb").write(body)
    edit_root(root, lambda m: m["components"][name].update(sha256=hashlib.sha256(body).hexdigest()), d)


def rewrite_shard(root, name, data: bytes, index=0):
    """Replace a shard file with `data` and re-seal its entry and everything above it."""
    d = step_dir(root)
    cdir = os.path.join(d, name)
    files = sorted(f for f in os.listdir(cdir) if f.endswith(".safetensors"))
    open(os.path.join(cdir, files[index]), "wb").write(data)

    def fix(c):
        e = sorted(c["shards"], key=lambda e: e["start"])[index]
        e.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    rewrite_component(root, name, fix)


def shard_file(root, name="params"):
    d = os.path.join(step_dir(root), name)
    return os.path.join(d, sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0])


def tree_bytes(root):
    """{relative path: bytes} of every file under root (to compare directories byte for byte)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out
