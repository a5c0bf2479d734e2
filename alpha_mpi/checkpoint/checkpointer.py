"""Sharded checkpoints of a data-parallel learner, written and read by logical coordinate range.

Protocol of `save()` (every rank calls it at the same step):
1. rank 0 prepares the temporary directory (refusing a step already published); all ranks vote;
2. every rank writes the shards of the coordinate range it owns, fsynced, and a fragment listing
   them; all ranks vote;
3. rank 0 writes the manifest tree, renames the step into place and moves `latest`; all vote.
No rank returns before the step is published (or refused on every rank), so a job may exit right
after a save, e.g. on preemption. The checkpoint directory must be visible to every rank (a
shared file system on a cluster).

`restore(path)` needs nothing but the path: each rank reads exactly the ranges it now owns, from
whichever shards hold them, whatever the rank count was at save time.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import numpy as np

from ..execution import Combiner
from ..model import ReplicateAll, star
from ..planning import plan
from ..refusals import CheckpointRefusal, Refusal
from . import store
from .layout import step_name
from .reader import Checkpoint

# Config fields a resume must share with the saved run (others, like --steps or --partition, may change).
SAME_ON_RESUME = ("slots", "batch", "seed", "hidden", "data", "optimizer", "lr", "momentum")


def learner_contract(learner):
    return learner.contract


def check_compatible(saved: dict, learner, adopt: bool = False) -> dict | None:
    """Refuse a checkpoint whose numerical contract differs, unless adopting it is asked for."""
    from ..numerics import NumericalContract, numerical_compatibility

    current = learner_contract(learner)
    old = NumericalContract.from_dict(saved["contract"])
    try:
        numerical_compatibility(current, old, theirs_name="the checkpoint")
    except Refusal:
        if not adopt:
            raise
        return {"from": old.digest, "to": current.digest, "at_step": saved["step"]}
    return None


class Checkpointer:
    def __init__(self, comm, root: str, learner, cfg=None, *, adopt_contract: bool = False, timeout=None):
        self.comm, self.root, self.learner = comm, root, learner
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.cfg = asdict(cfg) if cfg is not None and not isinstance(cfg, dict) else (cfg or {})
        self.adopt_contract = adopt_contract
        self.history = []
        if self.rank == 0:
            try:  # fail at start, not at the first save an hour later
                os.makedirs(root, exist_ok=True)
            except OSError as e:
                raise CheckpointRefusal("checkpoint-missing", f"cannot create checkpoint directory {root}: {e}")
        self._vote = Combiner(comm, plan(star(range(self.size), self.size), ReplicateAll(), 2, size=self.size), timeout=timeout)

    def _all(self, failure, skip: bool = False) -> bool:
        """Every rank learns whether any rank failed (all raise together, none is left waiting)
        and whether rank 0 found the step already complete (`skip`)."""
        total = self._vote.run({self.rank: np.array([1.0 if failure else 0.0, 1.0 if skip else 0.0])})
        if failure is not None:
            raise failure
        if total[0] > 0:
            raise Refusal("peer-failed", "another rank failed while saving the checkpoint; see its error")
        return total[1] > 0

    def has(self, step: int) -> bool:
        return os.path.isdir(os.path.join(self.root, step_name(step)))

    def save(self) -> str:
        lr = self.learner
        step = lr.step
        tmp, failure, complete = None, None, False
        final = os.path.join(self.root, step_name(step))
        if self.rank == 0:
            try:
                complete = store.prepare_tmp(self.root, step) is None
            except (Refusal, OSError) as e:
                failure = e if isinstance(e, Refusal) else CheckpointRefusal("checkpoint-manifest", f"cannot prepare {self.root}: {e}")
        if self._all(failure, complete):
            return final  # published before a crash; `latest` has now been moved to it
        tmp = os.path.join(self.root, f".tmp-{step_name(step)}")
        entries = {}
        try:
            for name, (length, pieces) in lr.checkpoint_pieces().items():
                entries[name] = {"length": length, "shards": store.write_shards(tmp, name, pieces)}
            store.write_durable(os.path.join(tmp, f".fragment-{self.rank}.json"), json.dumps(entries).encode())
        except (Refusal, OSError) as e:
            failure = e if isinstance(e, Refusal) else CheckpointRefusal("checkpoint-manifest", f"rank {self.rank} cannot write shards: {e}")
        self._all(failure)
        if self.rank == 0:
            try:
                comps = {}
                for r in range(self.size):
                    frag = os.path.join(tmp, f".fragment-{r}.json")
                    with open(frag) as f:
                        for name, c in json.load(f).items():
                            comps.setdefault(name, {"length": c["length"], "shards": []})["shards"] += c["shards"]
                    os.remove(frag)
                contract = learner_contract(lr)
                root_manifest = {
                    "order_id": lr.order_id,
                    "contract": contract.to_dict(),
                    "contract_digest": contract.digest,
                    "contract_history": self.history,
                    "config": {k: v for k, v in self.cfg.items() if k not in ("checkpoint_dir", "resume", "adopt_contract")},
                    "scalars": lr.checkpoint_scalars(),
                    "data": {"stream": "permutation-v1", "position": step * self.cfg.get("batch", 0)},
                    "saved_on_ranks": self.size,
                }
                final = store.publish(self.root, step, tmp, root_manifest, comps)
            except (Refusal, OSError) as e:
                failure = e if isinstance(e, Refusal) else CheckpointRefusal("checkpoint-manifest", f"cannot publish: {e}")
        self._all(failure)
        return final

    def restore(self, path: str) -> str:
        ck = Checkpoint(path)
        m = ck.manifest
        cfg = m.get("config", {})
        diffs = [f"{k}: saved {cfg.get(k)!r}, now {self.cfg.get(k)!r}" for k in SAME_ON_RESUME
                 if k in cfg and k in self.cfg and cfg[k] != self.cfg[k]]
        adopted = check_compatible(m, self.learner, self.adopt_contract)
        if diffs:
            raise CheckpointRefusal("checkpoint-config-mismatch", "; ".join(diffs))
        self.history = list(m.get("contract_history", [])) + ([adopted] if adopted else [])
        self.learner.load_checkpoint(ck)
        return ck.dir

    def restore_latest(self):
        """Restore the newest published step, or return None when there is none yet."""
        if not os.path.exists(os.path.join(self.root, "latest")):
            return None
        return self.restore(self.root)
