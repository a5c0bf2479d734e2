"""torch's own gradient clipping over a module whose gradient is sharded: refused by name.

In `partition="grads"` and `"params"` every parameter's `.grad` is None after `dp.step`: a rank
holds only its shard of the combined gradient (`dp.grads.flat`, alpha_mpi.torch.shard_grads).
`torch.nn.utils.clip_grad_norm_` (and `clip_grad_value_`, `clip_grads_with_norm_`) skip a
parameter whose `.grad` is None, so over such a module they clip nothing and report a norm of 0:
the run trains on unclipped gradients and differs from the same script in `"none"`, with no
word said. FSDP answers the same problem with its own `clip_grad_norm_` method and leaves torch's
silent; alpha_mpi has `dp.clip_grad_norm_` and, because a silent difference is what the project
exists to remove, also refuses torch's functions on those parameters (`torch-clip-sharded`).

Why wrap torch's functions: torch offers no hook on them, and `.grad` cannot say "sharded" (a
tensor there would be clipped as if it were the whole gradient). The wrappers are installed once,
when the first DataParallel that shards its gradient is built, and pass every other call to
torch's own function unchanged (the parameters are read once, as torch reads them, and handed on
as a list). A parameter is marked by a weak reference to its DataParallel's ShardContext: a
DataParallel freed (`dp.free()`) or dropped stops refusing, and a `"none"` DataParallel built
over the same module afterwards is clipped by torch as usual. A call made before alpha_mpi.torch
was imported through `from torch.nn.utils import clip_grad_norm_` keeps torch's own function;
the docs say to call `dp.clip_grad_norm_`.

Every rank runs the same script, so every rank makes the same call and refuses it alike: the
refusal is local and needs no flag on the wire.
"""

from __future__ import annotations

import functools
import weakref

from ..refusals import Refusal
from ._env import require_torch

torch = require_torch()

__all__ = ["hold", "release"]

MARK = "_alpha_mpi_sharded_grad"  # the attribute a marked parameter carries: weakref to a ShardContext
GUARDED = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_")


def _owner(p):
    ref = getattr(p, MARK, None)
    return ref() if ref is not None else None


def _guard(original):
    function = original.__name__

    @functools.wraps(original)
    def guarded(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for p in params:
            ctx = _owner(p)
            if ctx is not None:
                raise Refusal(
                    "torch-clip-sharded",
                    f"torch.nn.utils.{function} over the parameters of a DataParallel with "
                    f"partition={ctx.partition!r} would clip nothing: their .grad is None",
                )
        return original(params, *args, **kwargs)

    guarded.__alpha_mpi_wraps__ = original
    return guarded


@functools.cache
def _install() -> None:
    """Wrap torch's clipping functions where torch exports them (once per process)."""
    import torch.nn.utils as utils
    import torch.nn.utils.clip_grad as clip_grad

    for name in GUARDED:
        original = getattr(clip_grad, name, None) or getattr(utils, name, None)
        if original is None or hasattr(original, "__alpha_mpi_wraps__"):
            continue
        guarded = _guard(original)
        for namespace in (utils, clip_grad):
            if getattr(namespace, name, None) is original:
                setattr(namespace, name, guarded)


def hold(params: list, ctx) -> None:
    """Mark `params` as sharded by `ctx` (a ShardContext whose mode shards the gradient): torch's
    clipping over any of them is refused from now on (local)."""
    _install()
    ref = weakref.ref(ctx)
    for p in params:
        setattr(p, MARK, ref)


def release(params: list, ctx) -> None:
    """Unmark the `params` that `ctx` marked (its DataParallel was freed); a parameter marked by a
    later DataParallel keeps that mark (local)."""
    for p in params:
        if _owner(p) is ctx:
            delattr(p, MARK)
