"""Checkpoints of a `DataParallel` and its torch optimizer, in the learners' format.

`alpha_mpi.checkpoint.Checkpointer` saves logical float64 vectors by coordinate range plus JSON
scalars. A `TorchCheckpointView` presents a DataParallel and an optimizer that way:

- `params`: the trainable parameters, concatenated in `DataParallel.params` order, widened
  exactly to binary64 (restored with RoundBinary64, exact for values that were float32).
- `buffers`: the floating buffers (slot-mean mode), the same way; integer buffers are scalars.
- `optimizer.<key>`: each per-parameter state tensor shaped like its parameter (Adam's
  `exp_avg`, `exp_avg_sq`, SGD's `momentum_buffer`), concatenated like `params`.
- scalars: the step, the optimizer's class and hyperparameters (compared on restore:
  `checkpoint-config-mismatch`), and its scalar state per parameter (Adam's `step`) with dtype.

Rank r writes coordinates [r*n/p, (r+1)*n/p) of every vector; every rank reads all of them back,
whatever the rank count was at save time.
"""

from __future__ import annotations

from ..refusals import CheckpointRefusal, Refusal
from ._env import require_torch
from .contract_and_digest import dtype_name
from .convert import pack, unpack

torch = require_torch()

__all__ = ["TorchCheckpointView"]


def _jsonable(v):
    if isinstance(v, (bool, int, str)) or v is None:
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v)
    return repr(v)


def _is_vector(v, p) -> bool:
    """Per-coordinate optimizer state: a tensor shaped like its parameter (at least 1-d); a
    0-d tensor (Adam's `step`) is a scalar."""
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape == p.shape


def _hyper(optimizer) -> list:
    return [{k: _jsonable(v) for k, v in sorted(g.items()) if k != "params"} for g in optimizer.param_groups]


class TorchCheckpointView:
    """The checkpoint members `Checkpointer` reads (`step`, `order_id`, `contract`, `slots`,
    `comm`, `checkpoint_pieces`, `checkpoint_scalars`, `load_checkpoint`) over a DataParallel
    and an optional torch optimizer."""

    def __init__(self, dp, optimizer=None):
        self.dp, self.optimizer = dp, optimizer
        self.comm, self.slots, self.timeout = dp.comm, dp.slots, dp.timeout
        #: The combine's order id and the DataParallel's numerical contract (stored in the
        #: manifest, compared on restore); both are fixed when the DataParallel is built.
        self.order_id, self.contract = dp.order_id, dp.contract
        if optimizer is not None:
            held = [p for g in optimizer.param_groups for p in g["params"]]
            if {id(p) for p in held} != {id(p) for p in dp.params} or len(held) != len(dp.params):
                raise Refusal(
                    "torch-optimizer-state",
                    "the optimizer must hold exactly the module's trainable parameters",
                )

    # the members Checkpointer reads -------------------------------------------------------------
    @property
    def step(self) -> int:
        """Combined steps so far (DataParallel.steps)."""
        return self.dp.steps

    def _own(self, n: int):
        p, r = self.dp.size, self.dp.rank
        return r * n // p, (r + 1) * n // p

    def _vectors(self) -> dict:
        """name -> list of tensors (one per parameter / buffer), each flattened into the vector."""
        dp = self.dp
        out = {"params": [p.data for p in dp.params]}
        if dp.float_buffers:
            out["buffers"] = [b for _, b in dp.float_buffers]
        if self.optimizer is not None:
            keys = sorted(
                {k for p in dp.params for k, v in self.optimizer.state.get(p, {}).items() if _is_vector(v, p)}
            )
            for k in keys:
                ts = [self.optimizer.state.get(p, {}).get(k) for p in dp.params]
                if any(t is None for t in ts):
                    raise Refusal(
                        "torch-optimizer-state", f"optimizer state {k!r} exists for some parameters only"
                    )
                out[f"optimizer.{k}"] = ts
        return out

    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, float64 values)]) for the range this rank writes."""
        out = {}
        for name, ts in self._vectors().items():
            flat = pack(ts)
            a, b = self._own(flat.size)
            if b > a:
                out[name] = (flat.size, [(a, b, flat[a:b])])
        return out

    def checkpoint_scalars(self) -> dict:
        """JSON scalars: step, optimizer class, hyperparameters and scalar state, int buffers."""
        dp = self.dp
        sc = {
            "step": dp.steps,
            "optimizer": None,
            "framework": "torch",
            "dtype": dtype_name(dp.dtype),
            "int_buffers": {k: b.reshape(-1).tolist() for k, b in dp.other_buffers},
        }
        opt = self.optimizer
        if opt is not None:
            sc["optimizer"] = type(opt).__name__
            sc["optimizer_hyper"] = _hyper(opt)
            scalars = {}
            for i, p in enumerate(dp.params):
                for k, v in opt.state.get(p, {}).items():
                    if _is_vector(v, p):
                        continue  # a vector: saved as optimizer.<k>
                    if isinstance(v, torch.Tensor):
                        if v.numel() != 1:
                            raise Refusal(
                                "torch-optimizer-state",
                                f"optimizer state {k!r} has shape {tuple(v.shape)}, "
                                f"not the parameter's {tuple(p.shape)}",
                            )
                        entry = {
                            "value": float(v),
                            "dtype": dtype_name(v.dtype),
                            "shape": list(v.shape),
                        }
                    elif v is None or isinstance(v, (int, float, bool)):
                        entry = {"value": v, "dtype": None}
                    else:
                        raise Refusal(
                            "torch-optimizer-state", f"optimizer state {k!r} is a {type(v).__name__}"
                        )
                    scalars.setdefault(k, [None] * len(dp.params))[i] = entry
            sc["optimizer_scalars"] = scalars
        return sc

    def load_checkpoint(self, ck) -> None:
        """Read every vector whole (any rank count at save time) into the module and optimizer."""
        dp, opt = self.dp, self.optimizer
        sc = ck.manifest["scalars"]
        if sc.get("framework") != "torch":
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                "this checkpoint was not written by alpha_mpi.torch.DataParallel",
            )
        if ck.length("params") != dp.n:
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                f"checkpoint has {ck.length('params')} parameters, this module {dp.n}",
            )
        saved_opt = sc.get("optimizer")
        if opt is not None and saved_opt not in (None, type(opt).__name__):
            raise CheckpointRefusal(
                "checkpoint-config-mismatch", f"checkpoint optimizer {saved_opt}, now {type(opt).__name__}"
            )
        if opt is not None and saved_opt is not None and sc.get("optimizer_hyper") != _hyper(opt):
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                f"optimizer hyperparameters differ: saved {sc.get('optimizer_hyper')}, now {_hyper(opt)}",
            )
        with torch.no_grad():
            self._read(ck, "params", [p.data for p in dp.params])
            if dp.float_buffers:
                self._read(ck, "buffers", [b for _, b in dp.float_buffers])
            for k, b in dp.other_buffers:
                b.copy_(torch.tensor(sc["int_buffers"][k], dtype=b.dtype).reshape(b.shape))
        if opt is not None:
            opt.state.clear()
            if saved_opt is not None:
                names = [c[len("optimizer.") :] for c in ck.components if c.startswith("optimizer.")]
                for k in names:
                    ts = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in dp.params]
                    self._read(ck, f"optimizer.{k}", ts)
                    for p, t in zip(dp.params, ts):
                        opt.state[p][k] = t
                for k, entries in sc.get("optimizer_scalars", {}).items():
                    for p, e in zip(dp.params, entries):
                        if e is None:
                            continue
                        v = e["value"]
                        if e["dtype"] is not None:
                            v = torch.tensor(v, dtype=getattr(torch, e["dtype"])).reshape(e["shape"])
                        opt.state[p][k] = v
        dp.steps = int(sc["step"])

    @staticmethod
    def _read(ck, name, tensors) -> None:
        total = sum(t.numel() for t in tensors)
        if ck.length(name) != total:
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                f"component {name} has {ck.length(name)} values, this module {total}",
            )
        unpack(tensors, ck.read_range(name, 0, total))
