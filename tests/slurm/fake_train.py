"""A throwaway stand-in for `alpha-mpi train`, for the Slurm job-script tests only.

It honours the trainer's command-line contract so that jobs/train.sbatch's preemption,
checkpoint, requeue and resume plumbing can be tested before the real trainer exists:

    fake_train.py [--steps N] [--checkpoint-dir D] [--checkpoint-every N] [--resume] [...]

- The "state" is a hash chain over the steps: state_{t+1} = sha256(state_t || t). A resumed run
  ends with the same digest as an uninterrupted one only if the checkpoint and resume are right.
- On SIGUSR1 or SIGTERM it finishes the current step; all ranks agree on the stop step (point to
  point buffer messages through rank 0); rank 0 saves a checkpoint; every rank exits 99.
- With --resume and a checkpoint it continues from the latest one, and exits 0 at once when the
  step count was already reached.
- Rank 0 prints `step <t>` per step and finally `state digest: <64 hex>`.
- ALPHA_FAKE_STEP_SECONDS sets the time one step takes (default 0.1).
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

PREEMPTED = 99


def advance(state: bytes, step: int) -> bytes:
    return hashlib.sha256(state + step.to_bytes(8, "little")).digest()


def latest_checkpoint(folder):
    if not folder or not os.path.isdir(folder):
        return None
    names = [n for n in os.listdir(folder) if n.startswith("fake-ckpt-") and n.endswith(".json")]
    if not names:
        return None
    best = max(names, key=lambda n: int(n[len("fake-ckpt-") : -len(".json")]))
    with open(os.path.join(folder, best)) as f:
        return json.load(f)


def save_checkpoint(folder, step, state):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "fake-ckpt-%08d.json" % step)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "state": state.hex()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def agree(comm, flag: int) -> int:
    """OR of every rank's flag, by buffer point-to-point through rank 0."""
    out = np.array([flag], dtype=np.int32)
    if comm.rank == 0:
        buf = np.zeros(1, dtype=np.int32)
        for src in range(1, comm.size):
            comm.Recv([buf, MPI.INT], source=src, tag=7)
            out[0] |= buf[0]
        for dst in range(1, comm.size):
            comm.Send([out, MPI.INT], dest=dst, tag=8)
    else:
        comm.Send([out, MPI.INT], dest=0, tag=7)
        comm.Recv([out, MPI.INT], source=0, tag=8)
    return int(out[0])


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    # Accepted and ignored: the rest of the real trainer's contract.
    for opt in ("--slots", "--optimizer", "--partition", "--topology", "--seed"):
        p.add_argument(opt)
    a = p.parse_args(argv)

    stop = []
    signal.signal(signal.SIGUSR1, lambda s, f: stop.append(s))
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))

    comm = MPI.COMM_WORLD
    rank = comm.rank
    say = (lambda *m: print(*m, flush=True)) if rank == 0 else (lambda *m: None)
    step_seconds = float(os.environ.get("ALPHA_FAKE_STEP_SECONDS", "0.1"))

    step, state = 0, b"\0" * 32
    ck = latest_checkpoint(a.checkpoint_dir) if a.resume else None
    if ck is not None:
        step, state = ck["step"], bytes.fromhex(ck["state"])
        say("resumed from step %d on %d ranks" % (step, comm.size))
    else:
        say("starting at step 0 on %d ranks" % comm.size)

    while step < a.steps:
        time.sleep(step_seconds)
        state = advance(state, step)
        step += 1
        say("step %d" % step)
        if a.checkpoint_dir and a.checkpoint_every and step % a.checkpoint_every == 0 and rank == 0:
            save_checkpoint(a.checkpoint_dir, step, state)
        if agree(comm, 1 if stop else 0) and step < a.steps:
            if a.checkpoint_dir:
                if rank == 0:
                    save_checkpoint(a.checkpoint_dir, step, state)
                agree(comm, 0)  # nobody leaves before the checkpoint is written
                say("preempted at step %d, checkpoint saved" % step)
            else:
                say("preempted at step %d, no checkpoint dir" % step)
            return PREEMPTED

    say("state digest: %s" % state.hex())
    return 0


if __name__ == "__main__":
    sys.exit(main())
