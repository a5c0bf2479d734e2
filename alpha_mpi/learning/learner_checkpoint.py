"""The checkpoint side of DataParallelLearner (a mixin): what this rank writes, what it reads
back on another rank count, and the checks that a checkpoint is this learner's.

Apart from learner.py because it is the contract with alpha_mpi.checkpoint (the
CheckpointedLearner protocol: checkpoint_pieces, checkpoint_scalars, load_checkpoint), read
beside the checkpoint code rather than the training step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..checkpoint.reader import Checkpoint


class LearnerCheckpoint:
    """Mixin of DataParallelLearner: uses its n, own, partition, params, opt, optimizer_name,
    step and _full."""

    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, values)]) for the range this rank writes."""
        n, (a, b) = self.n, self.own
        if b <= a:
            return {}
        p = self.params if self.partition == "params" else self.params[a:b]
        out = {"params": (n, [(a, b, p)])}
        for name, arr in self.opt.state()["arrays"].items():
            out[f"optimizer.{name}"] = (n, [(a, b, arr if self.partition != "none" else arr[a:b])])
        return out

    def _optimizer_hyper(self) -> dict:
        o = self.opt
        if self.optimizer_name == "adam":
            return {"lr": o.lr, "b1": o.b1, "b2": o.b2, "eps": o.eps}
        return {"lr": o.lr, "momentum": o.momentum}

    def checkpoint_scalars(self) -> dict:
        return {
            "step": self.step,
            "optimizer": self.optimizer_name,
            "optimizer_hyper": self._optimizer_hyper(),
            "optimizer_scalars": self.opt.state()["scalars"],
            "partition_saved": self.partition,
        }

    def checkpoint_read(self, ck: Checkpoint) -> dict:
        """Read exactly the ranges this rank now owns (whatever the rank count was at save time)
        into fresh arrays, checking that the checkpoint is this learner's; nothing is installed."""
        from ..refusals import CheckpointRefusal

        n, (a, b) = self.n, self.own
        sc = ck.manifest["scalars"]
        if not isinstance(sc, dict) or sc.get("optimizer") != self.optimizer_name:
            got = sc.get("optimizer") if isinstance(sc, dict) else None
            raise CheckpointRefusal(
                "checkpoint-config-mismatch", f"checkpoint optimizer {got!r}, now {self.optimizer_name!r}"
            )
        if "optimizer_hyper" not in sc:
            raise CheckpointRefusal("checkpoint-manifest", "the checkpoint's scalars lack optimizer_hyper")
        live = self._optimizer_hyper()
        diffs = [
            f"{k}: saved {sc['optimizer_hyper'][k]!r}, now {v!r}"
            for k, v in live.items()
            if k != "lr" and sc["optimizer_hyper"][k] != v
        ]  # lr: the Checkpointer compares it (adopt_lr)
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
        params = (
            ck.read_range("params", a, b) if self.partition == "params" else ck.read_range("params", 0, n)
        )
        lo, hi = (0, n) if self.partition == "none" else (a, b)
        arrays = {k: ck.read_range(f"optimizer.{k}", lo, hi) for k in names}
        for name, arr in [("params", params)] + [(f"optimizer.{k}", v) for k, v in arrays.items()]:
            if not np.all(np.isfinite(arr)):
                raise CheckpointRefusal("checkpoint-corrupt", f"checkpoint {name} holds NaN or Inf")
        return {"params": params, "arrays": arrays, "scalars": sc["optimizer_scalars"], "step": sc["step"]}

    def checkpoint_apply(self, state: dict) -> None:
        """Install what checkpoint_read returned (after every rank read its part)."""
        self.params[...] = state["params"]
        self.opt.load(state["arrays"], state["scalars"])
        self.step = int(state["step"])
        if self.partition == "params":
            self._full = None  # assembled again from the restored shards at the next forward pass

    def checkpoint_snapshot(self) -> dict:
        """A copy of what this rank holds (parameters, optimizer arrays and scalars, step), in
        the form checkpoint_apply installs: the state to go back to without reading files (the
        trainer keeps a few after audited steps, alpha_mpi.learning.audit_recovery.KeptStates)."""
        st = self.opt.state()
        return {
            "params": self.params.copy(),
            "arrays": {k: v.copy() for k, v in st["arrays"].items()},
            "scalars": dict(st["scalars"]),
            "step": self.step,
        }

    def load_checkpoint(self, ck: Checkpoint) -> None:
        """Read this rank's ranges of `ck` and install them (checkpoint_read, then checkpoint_apply)."""
        self.checkpoint_apply(self.checkpoint_read(ck))
