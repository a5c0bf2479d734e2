"""What a DataParallel holds on this rank, by kind: `memory(...)`, behind `DataParallel.memory()`.

Counted from the arrays and tensors themselves (not from a model of them), in bytes:

    params           the trainable parameters (every rank holds them whole in `none` and `state`)
    grads            the `.grad` tensors' storage (one flat tensor, whole)
    optimizer_state  the optimizer's state tensors on this rank (its shard's in `state` mode)
    buffers          the module's buffers (replicated)
    accumulators     the binary64 buffers: the combine's (one payload per owned slot, the
                     combined payload), the gradient's quotient and accumulation scratch, and
                     the sums no_sync() carries (one vector, from the first carried step on)
    at_rest          their sum: what stays allocated between steps
    peak             at_rest plus what a step allocates for a while and frees: one slot's
                     gradient tensors (torch.autograd.grad's results) and, in a sharded mode,
                     the assembled binary64 vector of the update, this rank's widened shard and
                     what its step keeps to put back on a failure (its shard's values and
                     optimizer state: alpha_mpi.torch.shard_step).
                     The module's activations are the module's and are not counted.
"""

from __future__ import annotations

__all__ = ["memory"]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory(params: list, module, grads, combine, accumulation, optimizer=None, binding=None) -> dict:
    """Bytes this rank holds (see the module): `grads` the GradientWriter, `combine` the
    StepCombine, `accumulation` the no_sync() state (alpha_mpi.torch.accumulation), `optimizer`
    the torch optimizer (None: not counted), `binding` its ShardedOptimizer where it is sharded."""
    carried = accumulation.numerator
    out = {
        "params": _nbytes(params),
        "grads": _nbytes({id(grads.flat): grads.flat, id(grads.device_flat): grads.device_flat}.values()),
        "optimizer_state": 0,
        "buffers": _nbytes(module.buffers()),
        "accumulators": sum(b.nbytes for b in combine.payloads.values())
        + combine.reduced.nbytes
        + grads.g.nbytes
        + grads._prev.nbytes
        + (0 if carried is None else carried.nbytes),
    }
    if optimizer is not None:
        held = {
            id(v): v for st in optimizer.state.values() for v in st.values() if hasattr(v, "element_size")
        }
        out["optimizer_state"] = _nbytes(held.values())
    out["at_rest"] = sum(out.values())
    transient = out["params"]  # one slot's gradients, before they are widened into its payload
    if binding is not None:
        a, b = binding.own
        transient += 8 * binding.layout.n + 8 * (b - a) + binding.guard.kept_bytes()
    out["peak"] = out["at_rest"] + transient
    return out
