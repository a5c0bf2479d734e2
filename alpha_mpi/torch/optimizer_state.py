"""A torch optimizer in a DataParallel checkpoint: what is a vector, what a scalar, and what a
restore must share.

Apart from the checkpoint view (checkpointing.py, which lays the DataParallel's state out for the
Checkpointer) because these are rules about torch optimizers alone:

- `optimizer_vectors`: each per-parameter state tensor shaped like its parameter (Adam's
  `exp_avg`, `exp_avg_sq`, SGD's `momentum_buffer`), one vector `optimizer.<key>` over the
  parameters; one present for some parameters only is refused (`torch-optimizer-state`).
- `optimizer_scalars`: the optimizer's class, each param group's hyperparameters and the
  parameters it holds (by name), and the scalar state per parameter (Adam's `step`) with dtype.
- `check_optimizer`: on restore, the class, the hyperparameters but the learning rates, the
  groups' parameters and (unless `adopt_lr`) the configured learning rates where a scheduler
  records them (`initial_lr`, saved and now) must be the saved ones
  (`checkpoint-config-mismatch`); it returns the saved `lr` of each group to restore. A loop
  that sets `param_group["lr"]` itself (nanoGPT, minGPT) records no configured rate: its saved
  rate is restored and printed (checkpointing.py), nothing compared.
- `read_optimizer_scalars`: the saved scalar state back into per-parameter dicts.
"""

from __future__ import annotations

from ..refusals import CheckpointRefusal, Refusal
from ._env import require_torch
from .contract_and_digest import dtype_name

torch = require_torch()

__all__ = [
    "optimizer_vectors",
    "optimizer_scalars",
    "check_optimizer",
    "read_optimizer_scalars",
    "hyperparameters",
    "group_names",
    "WholeOptimizerState",
]


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


_LR_KEYS = ("lr", "initial_lr")


def _fixed(hyper: list) -> list:
    """The hyperparameters a resume must share: all but the (scheduled) learning rates."""
    return [{k: v for k, v in g.items() if k not in _LR_KEYS} for g in hyper]


def _configured(saved: list, now: list) -> tuple[list, list]:
    """The configured rates a resume must share: each group's `initial_lr` where a scheduler
    recorded it both at save time and now (a hand-set `lr` is the loop's state, not config)."""
    pairs = [(a.get("initial_lr"), b.get("initial_lr")) for a, b in zip(saved, now)]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _groups(optimizer, module) -> list:
    """Each param group's parameters by their names in `module`, sorted: what the group's
    hyperparameters apply to (frozen parameters included; one outside the module by its shape)."""
    return group_names(module, [g["params"] for g in optimizer.param_groups])


def group_names(module, groups: list) -> list:
    """Each group's parameters (a list of lists of tensors) by their names in `module`, sorted."""
    names = {id(p): k for k, p in module.named_parameters()}
    return [sorted(names.get(id(p), f"(outside the module: {list(p.shape)})") for p in ps) for ps in groups]


hyperparameters = _hyper  # each param group's settings as JSON (what a resume compares)


def optimizer_vectors(opt, params: list) -> dict:
    """`optimizer.<key>` -> the per-parameter state tensors (one per parameter, in order)."""
    out = {}
    keys = sorted({k for p in params for k, v in opt.state.get(p, {}).items() if _is_vector(v, p)})
    for k in keys:
        ts = [opt.state.get(p, {}).get(k) for p in params]
        if any(t is None for t in ts):
            raise Refusal("torch-optimizer-state", f"optimizer state {k!r} exists for some parameters only")
        out[f"optimizer.{k}"] = ts
    return out


def optimizer_scalars(opt, params: list, module) -> dict:
    """The manifest's optimizer scalars: class, hyperparameters, groups, scalar state."""
    sc = {
        "optimizer": type(opt).__name__,
        "optimizer_hyper": _hyper(opt),
        "param_groups": _groups(opt, module),
    }
    scalars = {}
    for i, p in enumerate(params):
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
                raise Refusal("torch-optimizer-state", f"optimizer state {k!r} is a {type(v).__name__}")
            scalars.setdefault(k, [None] * len(params))[i] = entry
    sc["optimizer_scalars"] = scalars
    return sc


def check_optimizer(sc: dict, opt, module, adopt_lr: bool, groups: list | None = None) -> list | None:
    """Refuse a checkpoint whose optimizer state `opt` may not continue from (the module
    docstring); return the saved `lr` of each group to restore (None: keep the present ones).
    `groups`: each group's parameters by name where `opt` holds other tensors (a sharded
    optimizer's pieces: alpha_mpi.torch.shard_state)."""
    saved_opt = sc.get("optimizer")
    if saved_opt not in (None, type(opt).__name__):
        raise CheckpointRefusal(
            "checkpoint-config-mismatch", f"checkpoint optimizer {saved_opt}, now {type(opt).__name__}"
        )
    if saved_opt is None:
        return None
    saved_hyper, now = sc.get("optimizer_hyper") or [], _hyper(opt)
    if len(saved_hyper) != len(now) or _fixed(saved_hyper) != _fixed(now):
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"optimizer hyperparameters differ: saved {_fixed(saved_hyper)}, now {_fixed(now)}",
        )
    saved_groups = sc.get("param_groups")
    groups = _groups(opt, module) if groups is None else groups
    if saved_groups is not None and saved_groups != groups:  # recorded since issue 36
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"the optimizer's param groups hold other parameters: saved {saved_groups}, "
            f"now {groups}; each group's hyperparameters and learning rate would apply "
            "to other parameters (build the optimizer's groups as at save time)",
        )
    if adopt_lr:
        return None
    was, is_ = _configured(saved_hyper, now)
    if was != is_:
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"initial_lr (the scheduler's configured rate): saved {was}, now {is_}; build the "
            "optimizer with the saved rate, or pass adopt_lr=True to continue with this one",
        )
    return [h["lr"] for h in saved_hyper]  # the scheduled rates at the saved step


def read_optimizer_scalars(sc: dict, per: list) -> None:
    """The saved scalar state (`optimizer_scalars`) into `per`, one state dict per parameter."""
    try:
        for k, entries in sc.get("optimizer_scalars", {}).items():
            for d, e in zip(per, entries):
                if e is None:
                    continue
                v = e["value"]
                if e["dtype"] is not None:
                    v = torch.tensor(v, dtype=getattr(torch, e["dtype"])).reshape(e["shape"])
                d[k] = v
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"the checkpoint's optimizer scalars are not readable here: {e!r}",
        ) from None


def read_vector(ck, name: str, tensors: list) -> None:
    """Component `name` of checkpoint `ck`, whole, into `tensors` laid end to end (RoundBinary64
    for float32, exact for values that were float32)."""
    from .convert import unpack

    total = sum(t.numel() for t in tensors)
    if ck.length(name) != total:
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"component {name} has {ck.length(name)} values, this module {total}",
        )
    unpack(tensors, ck.read_range(name, 0, total))


class WholeOptimizerState:
    """A torch optimizer over the whole parameters (every rank holds all of its state) as a
    checkpoint and a digest see it: the optimizer part of alpha_mpi.torch.checkpointing's view
    (alpha_mpi.torch.shard_state.ShardedOptimizerState is the sharded one)."""

    def __init__(self, opt, params: list, module) -> None:
        held = [p for g in opt.param_groups for p in g["params"]]
        if {id(p) for p in held} != {id(p) for p in params} or len(held) != len(params):
            raise Refusal(
                "torch-optimizer-state",
                "the optimizer must hold exactly the module's trainable parameters",
            )
        self.opt, self.params, self.module = opt, params, module

    def prepare(self) -> None:
        """Nothing to gather: this rank holds it all."""

    def pieces(self, own) -> dict:
        """name -> (length, [(a, b, float64 values)]) for the range `own(length)` this rank writes."""
        from .convert import pack

        out = {}
        for name, ts in optimizer_vectors(self.opt, self.params).items():
            flat = pack(ts)
            a, b = own(flat.size)
            if b > a:
                out[name] = (flat.size, [(a, b, flat[a:b])])
        return out

    def whole(self) -> dict:
        """name -> the whole vector, widened exactly."""
        from .convert import pack

        return {name: pack(ts) for name, ts in optimizer_vectors(self.opt, self.params).items()}

    def scalars(self) -> dict:
        return optimizer_scalars(self.opt, self.params, self.module)

    def check(self, sc: dict, adopt_lr: bool) -> list | None:
        return check_optimizer(sc, self.opt, self.module, adopt_lr)

    def read(self, ck, sc) -> list:
        """Per parameter, the optimizer state dict the checkpoint holds."""
        per = [{} for _ in self.params]
        if sc.get("optimizer") is None:
            return per
        names = [c[len("optimizer.") :] for c in ck.components if c.startswith("optimizer.")]
        for k in names:
            ts = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in self.params]
            read_vector(ck, f"optimizer.{k}", ts)
            for d, t in zip(per, ts):
                d[k] = t
        read_optimizer_scalars(sc, per)
        return per

    def apply(self, per: list, lrs: list | None) -> None:
        """Install what `read` returned, and the saved rates (`lrs`, None: keep the present)."""
        self.opt.state.clear()
        for p, d in zip(self.params, per):
            if d:
                self.opt.state[p].update(d)
        if lrs is not None:
            for g, lr in zip(self.opt.param_groups, lrs):
                g["lr"] = lr  # the scheduled rate at the saved step

    def tensors(self) -> list:
        """The tensors the optimizer's state holds."""
        return [v for st in self.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
