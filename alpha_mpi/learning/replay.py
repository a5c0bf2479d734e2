"""Checkpoint replay: recompute a stored interval and compare every byte (issue 24 item 4; layer 5).

    alpha-mpi train ... --checkpoint-dir D --replay A:B

resumes a learner from step A of D (A = 0: the initial state, from the seed), on any rank count
(the bits do not depend on it), trains to step B on the same data order, restores step B of D
into a second learner, and compares every
component of the two states (parameters, each optimizer array, the optimizer's scalars) word for
word. Nothing is written: no step is saved, no `latest` moved, no lock taken (published steps are
immutable, as for `checkpoint verify`), so a read-only copy of a run replays. Each
rank compares the coordinate ranges it holds; the verdicts (first differing component and
coordinate, or none) travel through the communicator's verdict round (p rows of 2 words, no
collective), so every rank reports the same first difference: `replay-mismatch` names it.
This audits a finished run on other hardware, offline, at full coverage: hardware of the same
compute identity, or any for a machine-independent model (another identity is refused
`compute-changed` unless `--accept-compute-change`, and a mismatch then says it may be the
environment's).

Learning rates are the run's, not the command line's: step B's manifest records the rate its
run began with and every `--adopt-lr` resume on the way (`resume_history`), so the interval is
replayed at the rate each step was trained with, across an adoption too (issue 36 item 9).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..refusals import Refusal
from .verdicts import WordTable

if TYPE_CHECKING:
    from collections.abc import Callable

    from mpi4py import MPI

    from .trainer import TrainConfig

__all__ = ["replay", "first_difference"]


def first_difference(mine: dict, stored: dict) -> tuple[int, int] | None:
    """(component index in sorted-name order, global coordinate) of the first word where two
    `checkpoint_pieces()` differ, else None. Both hold the same ranges (same ranks, same mode)."""
    for i, name in enumerate(sorted(set(mine) | set(stored))):
        if name not in mine or name not in stored:
            return i, 0
        for (a, _, x), (_, _, y) in zip(mine[name][1], stored[name][1]):
            xb = np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
            yb = np.ascontiguousarray(y, dtype=np.float64).view(np.uint64)
            diff = np.flatnonzero(xb != yb)
            if diff.size:
                return i, a + int(diff[0])
    return None


def replay(
    comm: MPI.Comm, cfg: TrainConfig, start: int, stop: int, out: Callable[[str], object] = print
) -> dict:
    """Recompute steps start..stop from `cfg.checkpoint_dir` and compare with its stored step
    `stop`; returns {"steps": (start, stop), "match": True} or refuses `replay-mismatch`."""
    from ..checkpoint import Checkpointer
    from ..checkpoint.paths import step_name
    from .data import fingerprint
    from .trainer import build

    if not 0 <= start < stop:
        raise Refusal("usage", f"--replay A:B needs 0 <= A < B, got {start}:{stop}")
    say = out if comm.Get_rank() == 0 else (lambda *a, **k: None)
    root = cfg.checkpoint_dir
    first, adopted, last = _learning_rates(comm, root, stop, cfg)
    at_start, at_stop = replace(cfg, lr=_rate_before(start, first, adopted)), replace(cfg, lr=last)
    data, _, learner, stream = build(comm, at_start)
    _, _, stored, _ = build(comm, at_stop)
    kw = {
        "data": fingerprint(data),
        "timeout": cfg.timeout,
        "adopt_contract": cfg.adopt_contract,
        "accept_compute_change": cfg.accept_compute_change,  # else compute-changed, never a mismatch
    }
    opened = []
    try:
        for lr, step, c in ((learner, start, at_start), (stored, stop, at_stop)):
            if step == 0 and not os.path.isdir(os.path.join(root, step_name(0))):
                continue  # step 0 is the initial state, a function of the seed: nothing to read
            ck = Checkpointer(comm, root, lr, c, lock_now=False, **kw)  # it never saves: no lock
            opened.append(ck)
            ck.restore(os.path.join(root, step_name(step)))  # read only: no step is saved
        say(
            f"# replay: steps {start}..{stop} of {root} on {comm.Get_size()} ranks, comparing with step {stop}"
        )
        for t in sorted(k for k in adopted if start <= k < stop):
            say(f"# replay: learning rate {adopted[t]!r} from step {t} (adopted by a resume, --adopt-lr)")
        while learner.step < stop:
            t = learner.step
            if t in adopted:  # the run resumed here with another rate
                learner.opt.lr = adopted[t]
            batch = {}
            for s in learner.needed_slots:
                idx = stream.indices(t, s)
                batch[s] = (data.X[idx], data.y[idx])
            learner.train_step(batch)
    finally:
        for ck in opened:
            ck.close()
    mine, theirs = learner.checkpoint_pieces(), stored.checkpoint_pieces()
    names = sorted(set(mine) | set(theirs))
    local = first_difference(mine, theirs)
    if local is None and learner.checkpoint_scalars() != stored.checkpoint_scalars():
        names.append("scalars")
        local = (len(names) - 1, 0)
    first = _agree(comm, local, cfg.timeout, learner.contract.digest)
    if first is None:
        say(f"bits match: steps {start}..{stop} recomputed equal the stored step {stop} word for word")
        return {"steps": (start, stop), "match": True}
    comp, coord = first
    name = names[comp] if comp < len(names) else f"component {comp}"
    env = [h for ck in opened for h in ck.compute_history if h["at_step"] in (start, stop)]
    note = (
        "; this replay runs under another compute identity than the stored run (accepted): the "
        "difference may be the environment's, not a fault"
        if any(h["how"] == "accepted" for h in env)
        else ""
    )
    raise Refusal(
        "replay-mismatch",
        f"replaying steps {start}..{stop} of {root}: {name}[{coord}] differs from the stored step {stop} "
        f"(the first differing component in name order, and its first coordinate){note}",
        component=name,
        coordinate=coord,
    )


def _learning_rates(comm, root: str, stop: int, cfg: TrainConfig) -> tuple[float, dict, float]:
    """From step `stop`'s manifest: the rate its run began with, the rates adopted on the way
    ({step: rate}, the resume_history's lr entries) and the step's own rate. Every rank reads
    it; a refusal on any rank is named on every rank (a verdict round)."""
    from ..checkpoint import open_checkpoint
    from ..checkpoint.paths import step_name
    from ..execution import Endpoint

    failure, rates = None, (cfg.lr, {}, cfg.lr)
    try:
        m = open_checkpoint(os.path.join(root, step_name(stop))).manifest
        last = float(m.get("config", {}).get("lr", cfg.lr))
        changes = sorted(
            (h["at_step"], i, float(h["from"]), float(h["to"]))
            for i, h in enumerate(m.get("resume_history", []))
            if h["field"] == "lr"
        )
        first = changes[0][2] if changes else last
        rates = (first, {at: to for at, _, _, to in changes}, last)
    except Refusal as e:
        failure = e
    Endpoint.of(comm, cfg.timeout).agree(failure, f"reading step {stop} of {root}", timeout=cfg.timeout)
    return rates


def _rate_before(step: int, first: float, adopted: dict) -> float:
    """The rate in force when step `step` was saved: the last one adopted before it."""
    earlier = [t for t in adopted if t < step]
    return adopted[max(earlier)] if earlier else first


def _agree(comm, local, timeout, contract) -> tuple[int, int] | None:
    """Every rank's (component, coordinate) verdict through a verdict round; the smallest wins."""
    mine = np.array([-1.0, 0.0]) if local is None else np.array([float(local[0]), float(local[1])])
    table = WordTable(comm, 2, timeout=timeout, contract=contract, what="replaying").run(mine)
    found = sorted((int(c), int(x)) for c, x in table if c >= 0)
    return found[0] if found else None
