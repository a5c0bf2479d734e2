"""A sharded torch optimizer (alpha_mpi.torch.shard_optimizer) as checkpoints and digests see it:
`ShardedOptimizerState`, the sharded twin of optimizer_state.WholeOptimizerState.

A checkpoint holds the same logical content in every partition mode, so any mode restores any
mode's checkpoint on any rank count:
- `optimizer.<key>`: each per-coordinate state (Adam's `exp_avg`, ...) as one vector over the
  flat parameters; each rank writes its shard's range and reads back its shard's range only.
- the manifest's scalars: the class, each group's settings and parameters by name (the caller's
  groups, not the pieces), and the per-parameter scalar state (Adam's `step`) as the whole
  optimizer writes it. A parameter's scalar state lives on every rank holding one of its pieces;
  the rank holding its first element (ShardLayout.leader) speaks for it. Before a save or a
  digest (`prepare`, collective) every rank's records (for each parameter it leads: each scalar
  key's presence, value and dtype, and each vector key's presence) are assembled by selection,
  so rank 0 writes the whole manifest and every rank digests the same scalars.
- the digest (`whole`): each vector assembled by selection on every rank (the bits the whole
  optimizer's state holds), then the same digest as partition="none".
A restore gives every piece its own copy of its parameter's scalars (Adam increments `step` in
place, once per tensor).
"""

from __future__ import annotations

import numpy as np

from ..refusals import CheckpointRefusal, Refusal
from ._env import require_torch
from .contract_and_digest import dtype_name
from .convert import from64, pack
from .optimizer_state import check_optimizer, group_names, hyperparameters, read_optimizer_scalars

torch = require_torch()

__all__ = ["ShardedOptimizerState"]

_DTYPES = (None, torch.float32, torch.float64)  # a scalar's dtype code: a Python number, or a 0-d tensor's


class ShardedOptimizerState:
    """The optimizer part of a checkpoint view for a ShardedOptimizer `binding` of `module`."""

    def __init__(self, binding, module) -> None:
        self.binding, self.module, self.opt = binding, module, binding.optimizer
        self.layout, self.params = binding.layout, binding.params
        safe = binding.safe
        self.scalar_keys, self.vector_keys = safe.scalars, safe.vectors
        self.width = 3 * len(self.scalar_keys) + len(self.vector_keys)
        self._records: np.ndarray | None = None
        self._assembler = None

    # gathered before a save or a digest ---------------------------------------------------------
    def _records_assembler(self):
        if self._assembler is None:  # built at the first prepare: collective, as prepare is
            from ..execution import Assembler
            from ..planning.assembly import plan_assembly

            w, lay = self.width, self.layout
            ranges = [(r, i * w, j * w) for r in range(lay.size) for i, j in [lay.led(r)] if j > i]
            self._assembler = Assembler(
                self.binding.ctx.comm,
                plan_assembly(ranges, len(self.params) * w, lay.size),
                timeout=self.binding.ctx.timeout,
                contract=self.binding.ctx.contract,
            )
        return self._assembler

    def _local_records(self) -> np.ndarray:
        """This rank's records of the parameters it leads: per scalar key (present, value, dtype
        code), per vector key present."""
        i0, i1 = self.layout.led(self.binding.rank)
        out = np.zeros((i1 - i0, self.width))
        for piece, view in zip(self.binding.pieces, self.binding.views):
            if piece.lo != 0:
                continue  # not the parameter's first element: its leader speaks for it
            st = self.opt.state.get(view, {})
            row = out[piece.index - i0]
            for k, key in enumerate(self.scalar_keys):
                v = st.get(key)
                if v is None:
                    continue
                code = 0 if not isinstance(v, torch.Tensor) else _DTYPES.index(v.dtype)
                row[3 * k : 3 * k + 3] = (1.0, float(v), float(code))
            base = 3 * len(self.scalar_keys)
            for k, key in enumerate(self.vector_keys):
                row[base + k] = 1.0 if isinstance(st.get(key), torch.Tensor) else 0.0
        return out

    def prepare(self) -> None:
        """Collective: every parameter's record on every rank (assembled by selection)."""
        local, mine = None, {}
        try:
            i0, i1 = self.layout.led(self.binding.rank)
            if i1 > i0:
                mine = {(i0 * self.width, i1 * self.width): self._local_records().reshape(-1)}
        except Exception as e:  # it rides on the assembly frames: every rank names it
            local = (
                e if isinstance(e, Refusal) else Refusal("torch-optimizer-state", f"{type(e).__name__}: {e}")
            )
        got = self._records_assembler().run(mine, out=np.empty(len(self.params) * self.width), refused=local)
        self._records = got.reshape(len(self.params), self.width)

    def _present_vectors(self) -> list[str]:
        """The vector keys every parameter holds (refused, as the whole optimizer's, where only
        some do)."""
        base, out = 3 * len(self.scalar_keys), []
        for k, key in enumerate(self.vector_keys):
            col = self._records[:, base + k]
            if col.all():
                out.append(key)
            elif col.any():
                raise Refusal(
                    "torch-optimizer-state", f"optimizer state {key!r} exists for some parameters only"
                )
        return out

    # the checkpoint view's optimizer part ---------------------------------------------------------
    def scalars(self) -> dict:
        """The manifest's optimizer scalars, as WholeOptimizerState writes them (after `prepare`)."""
        scalars = {}
        for k, key in enumerate(self.scalar_keys):
            col = self._records[:, 3 * k : 3 * k + 3]
            if not col[:, 0].any():
                continue
            entries = []
            for present, value, code in col:
                if not present:
                    entries.append(None)
                    continue
                dtype = _DTYPES[int(code)]
                if dtype is None:
                    entries.append({"value": float(value), "dtype": None})
                else:
                    entries.append({"value": float(value), "dtype": dtype_name(dtype), "shape": []})
            scalars[key] = entries
        return {
            "optimizer": type(self.opt).__name__,
            "optimizer_hyper": hyperparameters(self.opt),
            "param_groups": self._names(),
            "optimizer_scalars": scalars,
        }

    def _names(self) -> list:
        return group_names(self.module, [[self.params[i] for i in idx] for idx in self.binding.group_params])

    def pieces(self, own) -> dict:
        """Each present vector's range of this rank's shard (the range `own` would give is the
        whole optimizer's; a sharded rank writes what it holds)."""
        a, b = self.binding.own
        out = {}
        for key in self._present_vectors():
            if b > a:
                vals = pack([self.opt.state[v][key] for v in self.binding.views])
                out[f"optimizer.{key}"] = (self.layout.n, [(a, b, vals)])
        return out

    def whole(self) -> dict:
        """Each present vector, whole, on every rank (collective: assembled by selection)."""
        a, b = self.binding.own
        out = {}
        for key in self._present_vectors():
            mine = {(a, b): pack([self.opt.state[v][key] for v in self.binding.views])} if b > a else {}
            out[f"optimizer.{key}"] = self.binding.assembler.run(mine, out=np.empty(self.layout.n))
        return out

    def check(self, sc: dict, adopt_lr: bool) -> list | None:
        return check_optimizer(sc, self.opt, self.module, adopt_lr, groups=self._names())

    def read(self, ck, sc) -> list:
        """Per piece, the optimizer state dict the checkpoint holds for its range."""
        pieces, views = self.binding.pieces, self.binding.views
        per_piece = [{} for _ in pieces]
        if sc.get("optimizer") is None:
            return per_piece
        a, b = self.binding.own
        for name in ck.components:
            if not name.startswith("optimizer."):
                continue
            if ck.length(name) != self.layout.n:
                raise CheckpointRefusal(
                    "checkpoint-config-mismatch",
                    f"component {name} has {ck.length(name)} values, this module {self.layout.n}",
                )
            vals = ck.read_range(name, a, b) if b > a else np.empty(0)
            for piece, view, d in zip(pieces, views, per_piece):
                t = torch.empty_like(view, memory_format=torch.contiguous_format)
                s = piece.start - a
                from64(t, vals[s : s + piece.size])
                d[name[len("optimizer.") :]] = t
        per_param = [{} for _ in self.params]
        read_optimizer_scalars(sc, per_param)
        for piece, d in zip(pieces, per_piece):
            for k, v in per_param[piece.index].items():
                d[k] = v.clone() if isinstance(v, torch.Tensor) else v  # each piece steps its own
        return per_piece

    def apply(self, per_piece: list, lrs: list | None) -> None:
        self.opt.state.clear()
        for view, d in zip(self.binding.views, per_piece):
            if d:
                self.opt.state[view].update(d)
        if lrs is not None:
            for g, lr in zip(self.opt.param_groups, lrs):
                g["lr"] = lr  # the scheduled rate at the saved step

    def tensors(self) -> list:
        held = [v for st in self.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return held + list(self.binding.views)
