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
- `registered`: the `state_dict()` of every object registered with the DataParallel (an LR
  scheduler, a sampler, a loss scaler ...) by name, as JSON (`encode_state`); on restore the
  same names must be registered and each gets `load_state_dict(saved)`.

Learning rates: a scheduler changes each param group's `lr`, so `lr` is state, not config. The
configured rate is `initial_lr`, which a scheduler records; where it is recorded at save time
and now it is compared on restore (`checkpoint-config-mismatch`, unless `adopt_lr=True`). A loop
that sets `param_group["lr"]` itself records none: nothing is compared. The saved `lr` of each
group is restored and printed by rank 0 (a wrong base rate is visible in the log's first line).
With `adopt_lr=True` the optimizer keeps its present `lr`/`initial_lr` and a scheduler its
`base_lrs`; the schedule's position (last_epoch) is restored. `dp.updates` (the optimizer
updates) is saved beside `dp.steps` (the combined calls) where it differs from it (no_sync()),
so a run without accumulation keeps the checkpoints and state digests it had.

Rank r writes coordinates [r*n/p, (r+1)*n/p) of every vector; every rank reads all of them back,
whatever the rank count was at save time.

The compute identity (DataParallel.compute_identity) is recorded in every manifest; a restore under
another one is refused (`compute-changed`) unless `accept_compute_change=True` (recorded).

`DataParallel.state_digest(optimizer)` is the digest of what a checkpoint holds (every vector above,
widened exactly, and the scalars) and the seed: the whole state a resume continues from
(alpha_mpi.learning.digests).

Objects: DataParallel's `save`, `restore` and `state_digest` call `Checkpoints`, which keeps one
`TorchCheckpointView` per optimizer; a view is built from the DataParallel's `ModuleState`
(alpha_mpi.torch.state) and a `CheckpointContext` (what the checkpoints are of), never from the
DataParallel itself. The optimizer's part (what is a vector, what a scalar, what a restore must
share) is alpha_mpi.torch.optimizer_state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..refusals import CheckpointRefusal
from ._env import require_torch
from .contract_and_digest import dtype_name
from .convert import pack
from .optimizer_state import WholeOptimizerState, read_vector
from .registered import class_name, decode_state, encode_state, load_all, try_load
from .same_module import architecture_digest

if TYPE_CHECKING:
    from mpi4py import MPI

    from .state import ModuleState

torch = require_torch()

__all__ = ["TorchCheckpointView", "CheckpointContext", "Checkpoints", "encode_state", "decode_state"]


@dataclass(frozen=True)
class CheckpointContext:
    """What a DataParallel's checkpoints are of, fixed when it is built: its communicator, slot
    count and timeout, the combine's order id and the numerical contract (stored in the
    manifest, compared on restore), the compute identity (recorded, compared on restore), and
    the objects a trial copy of a registered object shares instead of copying (`shared`: the
    DataParallel itself, so an object that refers to it is not copied with it)."""

    comm: MPI.Comm
    slots: int
    timeout: float | None
    layout_order_id: str
    contract: object
    compute_identity: object
    shared: tuple = ()
    bindings: dict = field(default_factory=dict)  # id(optimizer) -> its ShardedOptimizer (sharding.py)

    def optimizer_part(self, state: ModuleState, optimizer):
        """The optimizer as checkpoints see it: sharded (alpha_mpi.torch.shard_state) where
        DataParallel.optimizer built it over shards, else whole (None without one)."""
        if optimizer is None:
            return None
        binding = self.bindings.get(id(optimizer))
        if binding is not None and binding.optimizer is optimizer:
            from .shard_state import ShardedOptimizerState

            return ShardedOptimizerState(binding, state.module)
        return WholeOptimizerState(optimizer, state.params, state.module)


class TorchCheckpointView:
    """The checkpoint members `Checkpointer` reads (`step`, `layout_order_id`, `contract`, `slots`,
    `comm`, `checkpoint_pieces`, `checkpoint_scalars`, `load_checkpoint`) over a DataParallel's
    `state` (alpha_mpi.torch.state.ModuleState), its `context` and an optional torch optimizer."""

    def __init__(
        self, state: ModuleState, context: CheckpointContext, optimizer=None, adopt_lr: bool = False
    ) -> None:
        self.state, self.optimizer, self.adopt_lr = state, optimizer, adopt_lr
        self.comm, self.slots, self.timeout = context.comm, context.slots, context.timeout
        self.layout_order_id, self.contract = context.layout_order_id, context.contract
        self.compute_identity = context.compute_identity
        self.shared = context.shared
        self.part = context.optimizer_part(state, optimizer)  # the optimizer's state, whole or sharded

    # the members Checkpointer reads -------------------------------------------------------------
    @property
    def step(self) -> int:
        """Combined steps so far (DataParallel.steps)."""
        return self.state.steps

    def _own(self, n: int):
        p, r = self.comm.Get_size(), self.comm.Get_rank()
        return r * n // p, (r + 1) * n // p

    def _vectors(self) -> dict:
        """name -> list of tensors (one per parameter / buffer), each flattened into the vector
        (the optimizer's vectors are its part's)."""
        dp = self.state
        out = {"params": [p.data for p in dp.params]}
        if dp.float_buffers:
            out["buffers"] = [b for _, b in dp.float_buffers]
        return out

    def prepare(self) -> None:
        """Collective, before a save or a digest: what the optimizer's part gathers (a sharded
        optimizer's per-parameter scalars, from the rank that holds each parameter's start)."""
        if self.part is not None:
            self.part.prepare()

    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, float64 values)]) for the range this rank writes."""
        out = {}
        for name, ts in self._vectors().items():
            flat = pack(ts)
            a, b = self._own(flat.size)
            if b > a:
                out[name] = (flat.size, [(a, b, flat[a:b])])
        if self.part is not None:
            out.update(self.part.pieces(self._own))
        return out

    def checkpoint_scalars(self) -> dict:
        """JSON scalars: step, optimizer class, hyperparameters and scalar state, int buffers."""
        dp = self.state
        sc = {
            "step": dp.steps,
            "optimizer": None,
            "framework": "torch",
            "dtype": dtype_name(dp.dtype),
            "int_buffers": {k: b.reshape(-1).tolist() for k, b in dp.other_buffers},
            "registered": {k: encode_state(o.state_dict(), k) for k, o in sorted(dp.registered.items())},
            "registered_classes": {k: class_name(o) for k, o in sorted(dp.registered.items())},
        }
        if dp.updates != dp.steps:  # absent: as many updates as steps (no no_sync(); before issue 44)
            sc["updates"] = dp.updates
        if self.part is not None:
            sc.update(self.part.scalars())
        return sc

    def checkpoint_read(self, ck) -> dict:
        """Check that `ck` is this DataParallel's and read everything a restore installs into
        fresh tensors and values (any rank count at save time); nothing is installed. Each
        registered object's saved state is tried on a copy of the object: one whose
        `load_state_dict` raises is refused here by name (`checkpoint-config-mismatch`), so the
        Checkpointer's vote makes every rank refuse before any rank installs anything."""
        dp, opt = self.state, self.optimizer
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
        lrs = self.part.check(sc, self.adopt_lr) if opt is not None else None
        saved_reg, reg = sc.get("registered", {}), dp.registered
        if sorted(saved_reg) != sorted(reg):
            raise CheckpointRefusal(
                "checkpoint-config-mismatch",
                f"the checkpoint holds the state of {sorted(saved_reg)}, this DataParallel has "
                f"{sorted(reg)} registered; register (or pass scheduler=) the same objects to restore",
            )
        saved_classes = sc.get("registered_classes")
        if saved_classes is not None:  # recorded since issue 36
            classes = {k: class_name(o) for k, o in reg.items()}
            odd = [
                f"{k}: saved {saved_classes.get(k)}, now {c}"
                for k, c in sorted(classes.items())
                if saved_classes.get(k) != c
            ]
            if odd:
                raise CheckpointRefusal(
                    "checkpoint-config-mismatch",
                    f"registered objects of another class ({'; '.join(odd)}); their state would load "
                    "into an object that reads it otherwise",
                )
        read = {"params": [torch.empty_like(p.data) for p in dp.params]}
        self._read(ck, "params", read["params"])
        read["buffers"] = [torch.empty_like(b) for _, b in dp.float_buffers]
        if dp.float_buffers:
            self._read(ck, "buffers", read["buffers"])
        try:
            ints = sc["int_buffers"]
            read["int_buffers"] = [
                torch.tensor(ints[k], dtype=b.dtype).reshape(b.shape) for k, b in dp.other_buffers
            ]
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointRefusal(
                "checkpoint-config-mismatch", f"the checkpoint's integer buffers do not fit this module: {e}"
            ) from None
        read["optimizer"] = self.part.read(ck, sc) if opt is not None else None
        read["lrs"] = lrs
        read["registered"] = {k: decode_state(saved_reg[k]) for k in reg}
        for k, o in reg.items():
            try_load(k, o, read["registered"][k], shared=self._shared())
        read["steps"] = int(sc["step"])
        read["updates"] = int(sc.get("updates", sc["step"]))  # absent: one per step
        return read

    def _shared(self) -> dict:
        """What a trial copy of a registered object shares with the original instead of copying
        (a deepcopy memo): the optimizer, the module and every tensor they hold. A scheduler's
        copy then costs a few dicts, not another model."""
        dp, opt = self.state, self.optimizer
        keep = [*self.shared, dp, dp.module, *dp.params, *(b for _, b in dp.float_buffers + dp.other_buffers)]
        if opt is not None:
            keep.append(opt)
            keep += self.part.tensors()
        return {id(x): x for x in keep}

    def checkpoint_apply(self, state: dict) -> None:
        """Install what checkpoint_read returned (after every rank read without refusing).
        Registered objects first, each from a state its copy already took: should one raise all
        the same, those already loaded are put back and it is refused before any tensor moves."""
        dp, opt = self.state, self.optimizer
        load_all(dp.registered, state["registered"], keep_base_lrs=self.adopt_lr)
        with torch.no_grad():
            for p, t in zip(dp.params, state["params"]):
                p.data.copy_(t)
            for (_, b), t in zip(dp.float_buffers, state["buffers"]):
                b.copy_(t)
            for (_, b), t in zip(dp.other_buffers, state["int_buffers"]):
                b.copy_(t)
        if opt is not None:
            self.part.apply(state["optimizer"], state["lrs"])
        dp.steps, dp.updates = state["steps"], state["updates"]
        if self.comm.Get_rank() == 0:  # a wrong base rate shows in the first line of the log
            lrs = [g["lr"] for g in opt.param_groups] if opt is not None else None
            kept = " (adopt_lr: the present rates kept)" if self.adopt_lr else ""
            print(f"alpha_mpi: restored step {dp.steps}, {dp.updates} updates; lr {lrs}{kept}", flush=True)

    def load_checkpoint(self, ck) -> None:
        """Read every vector whole (any rank count at save time) and install it (read, then apply)."""
        self.checkpoint_apply(self.checkpoint_read(ck))

    def state_digest(self) -> str:
        """The digest of the whole state (learning.digests.state_digest): every vector a
        checkpoint holds (parameters, floating buffers, each optimizer tensor), widened exactly,
        and its scalars (step, optimizer class, hyperparameters and scalar state, integer
        buffers, registered objects' state) with the seed of the slots' generators."""
        from ..learning.digests import state_digest

        arrays = {name: pack(ts) for name, ts in self._vectors().items()}
        if self.part is not None:
            self.part.prepare()  # collective: every rank digests
            arrays.update(self.part.whole())
        return state_digest(arrays, {**self.checkpoint_scalars(), "seed": self.state.seed})

    _read = staticmethod(read_vector)


class Checkpoints:
    """Checkpoints of one `state` in its `context`: `save`, `restore`, `state_digest`, each
    through a `TorchCheckpointView` (one per optimizer and adopt_lr, kept)."""

    def __init__(self, state: ModuleState, context: CheckpointContext) -> None:
        self.state, self.context = state, context
        self._views: dict[tuple[int, bool], TorchCheckpointView] = {}

    def view(self, optimizer, adopt_lr: bool = False) -> TorchCheckpointView:
        """The view over the state and `optimizer` (alpha_mpi.torch.checkpointing)."""
        key = (id(optimizer), adopt_lr)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = TorchCheckpointView(self.state, self.context, optimizer, adopt_lr)
        return v

    def _with_scheduler(self, scheduler) -> None:
        if scheduler is not None and self.state.registered.get("scheduler") is not scheduler:
            self.state.register("scheduler", scheduler)

    def _config(self, config: Mapping[str, object] | None) -> dict:
        """The checkpoint config: the caller's (default: slots), with the architecture's digest
        as `model`, so a changed module is named as such on restore."""
        cfg = {"slots": self.context.slots} if config is None else dict(config)
        cfg.setdefault("model", f"torch-architecture:{architecture_digest(self.state.module)[:16]}")
        return cfg

    def save(self, directory: str, optimizer, *, config, scheduler) -> str:
        """DataParallel.save."""
        from ..learning.checkpoints import save

        self._with_scheduler(scheduler)
        view = self.view(optimizer)
        view.prepare()  # collective, before the Checkpointer asks rank 0 for the scalars
        return save(view, directory, config=self._config(config))

    def restore(
        self, directory: str, optimizer, *, config, scheduler, adopt_lr: bool, **options
    ) -> str | None:
        """DataParallel.restore (`options`: adopt_contract, missing_ok, accept_compute_change)."""
        from ..learning.checkpoints import restore

        self._with_scheduler(scheduler)
        return restore(self.view(optimizer, adopt_lr), directory, config=self._config(config), **options)

    def state_digest(self, optimizer) -> str:
        """DataParallel.state_digest."""
        return self.view(optimizer).state_digest()
