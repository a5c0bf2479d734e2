"""The checkpoint view of DataParallelLearner: what this rank writes, what it reads back on
another rank count, and the checks that a checkpoint is this learner's.

Apart from learner.py because it is the contract with alpha_mpi.checkpoint (the
CheckpointedLearner protocol: checkpoint_pieces, checkpoint_scalars, load_checkpoint), read
beside the checkpoint code rather than the training step. An object with explicit data (the
learner's partition holder and optimizer, whose class says what a checkpoint records of it:
alpha_mpi.learning.optim), not a mixin: the learner's
`checkpoint_*` methods hand it the step and take the step it read back.

The partition holder says which coordinates this rank's parameters and optimizer arrays cover
(`params_range`, `state_range`: the whole vector or this rank's own range); every rank writes
exactly its own range `own` of each, whatever its mode, so a checkpoint is the same files in
every mode and restores in any mode on any rank count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..checkpoint.reader import Checkpoint
    from .partition import Holder


class LearnerCheckpoint:
    """The checkpoint side of one learner: `holder` (its partition holder: the parameters and
    the ranges they and the optimizer state cover), `opt` (an optimizer of
    alpha_mpi.learning.optim: its `name`, `hyper_values()`, `adoptable` and state), `n` (the
    parameters' count) and `own` (the range this rank writes)."""

    def __init__(self, holder: Holder, opt, n: int, own: tuple[int, int]) -> None:
        self.holder, self.opt, self.optimizer_name = holder, opt, opt.name
        self.n, self.own = n, own

    def pieces(self) -> dict:
        """name -> (length, [(start, stop, values)]) for the range this rank writes."""
        (a, b), h = self.own, self.holder
        if b <= a:
            return {}
        p0, s0 = h.params_range[0], h.state_range[0]
        out = {"params": (self.n, [(a, b, h.params[a - p0 : b - p0])])}
        for name, arr in self.opt.state()["arrays"].items():
            out[f"optimizer.{name}"] = (self.n, [(a, b, arr[a - s0 : b - s0])])
        return out

    def scalars(self, step: int) -> dict:
        return {
            "step": step,
            "optimizer": self.optimizer_name,
            "optimizer_hyper": self.opt.hyper_values(),
            "optimizer_scalars": self.opt.state()["scalars"],
            "partition_saved": self.holder.name,
        }

    def read(self, ck: Checkpoint) -> dict:
        """Read exactly the ranges this rank now holds (whatever the rank count was at save time)
        into fresh arrays, checking that the checkpoint is this learner's; nothing is installed."""
        from ..refusals import CheckpointRefusal

        n = self.n
        sc = ck.manifest["scalars"]
        if not isinstance(sc, dict) or sc.get("optimizer") != self.optimizer_name:
            got = sc.get("optimizer") if isinstance(sc, dict) else None
            raise CheckpointRefusal(
                "checkpoint-config-mismatch", f"checkpoint optimizer {got!r}, now {self.optimizer_name!r}"
            )
        if "optimizer_hyper" not in sc:
            raise CheckpointRefusal("checkpoint-manifest", "the checkpoint's scalars lack optimizer_hyper")
        live = self.opt.hyper_values()
        diffs = [
            f"{k}: saved {sc['optimizer_hyper'][k]!r}, now {v!r}"
            for k, v in live.items()
            if k not in self.opt.adoptable and sc["optimizer_hyper"][k] != v
        ]  # the adoptable ones (lr, weight_decay): the Checkpointer compares them (adopt_lr, ...)
        if diffs:
            raise CheckpointRefusal(
                "checkpoint-config-mismatch", f"optimizer hyperparameters differ: {'; '.join(diffs)}"
            )
        names = self.opt.state()["arrays"]
        need = {"params"} | {f"optimizer.{k}" for k in names}
        if set(ck.components) != need:
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                f"checkpoint holds {sorted(ck.components)}, this learner needs {sorted(need)}",
            )
        for name in need:
            if ck.length(name) != n:
                raise CheckpointRefusal(
                    "checkpoint-config-mismatch",
                    f"checkpoint {name} has {ck.length(name)} values, this model {n} parameters",
                )
        params = ck.read_range("params", *self.holder.params_range)
        arrays = {k: ck.read_range(f"optimizer.{k}", *self.holder.state_range) for k in names}
        for name, arr in [("params", params)] + [(f"optimizer.{k}", v) for k, v in arrays.items()]:
            if not np.all(np.isfinite(arr)):
                raise CheckpointRefusal("checkpoint-corrupt", f"checkpoint {name} holds NaN or Inf")
        return {"params": params, "arrays": arrays, "scalars": sc["optimizer_scalars"], "step": sc["step"]}

    def apply(self, state: dict) -> int:
        """Install what `read` returned (after every rank read its part); returns its step."""
        self.holder.load_params(state["params"])
        self.opt.load(state["arrays"], state["scalars"])
        return int(state["step"])

    def snapshot(self, step: int) -> dict:
        """A copy of what this rank holds (parameters, optimizer arrays and scalars, step), in
        the form `apply` installs: the state to go back to without reading files (the trainer
        keeps a few after audited steps, alpha_mpi.learning.audit_recovery.KeptStates)."""
        st = self.opt.state()
        return {
            "params": self.holder.params.copy(),
            "arrays": {k: v.copy() for k, v in st["arrays"].items()},
            "scalars": dict(st["scalars"]),
            "step": step,
        }
