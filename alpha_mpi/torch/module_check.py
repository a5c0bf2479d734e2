"""What DataParallel refuses about a module before it builds anything: `check_module`.

Apart from data_parallel.py because it is a check of the user's torch.nn.Module alone (no
communicator, no plan): the kinds of module whose gradients and buffers the slot tree can
combine bit for bit, and a named refusal for every other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..refusals import Refusal
from ._env import require_torch
from .contract_and_digest import dtype_name

torch = require_torch()

__all__ = [
    "BUFFER_RULES",
    "DEVICE_TYPES",
    "ModuleParts",
    "check_module",
    "check_parameters",
    "check_not_compiled",
]

DEVICE_TYPES = ("cpu", "cuda")
"""Where a module's slot passes may run: its gradients then cross to the host once per slot."""

BUFFER_RULES = ("refuse", "slot-mean")
"""The values of DataParallel's `buffers=`: refuse a module with buffers, or the slot-mean rule."""


@dataclass(frozen=True)
class ModuleParts:
    """The parts of a checked module DataParallel combines: the trainable parameters in order,
    their one dtype, the floating buffers (combined in `slot-mean` mode) and the other buffers
    (counters, taken as the slot forwards left them), each as (name, tensor)."""

    params: list
    dtype: object
    float_buffers: list
    other_buffers: list


def check_module(module, buffers: str = "refuse") -> ModuleParts:
    """The parts of `module` DataParallel combines, or a refusal by name.

    Refused: `torch-module-unsupported` (not a torch.nn.Module; no trainable parameters;
    parameters not all float32 or all float64; parameters or buffers not all on one CPU or CUDA
    device, or a buffer not contiguous),
    `torch-buffers-refused` (a module with buffers when `buffers="refuse"`), `usage` (`buffers`
    not one of BUFFER_RULES), `torch-compile-refused` (check_not_compiled).
    """
    if not isinstance(module, torch.nn.Module):
        raise Refusal(
            "torch-module-unsupported",
            f"DataParallel needs a torch.nn.Module, got {type(module).__name__}",
        )
    if buffers not in BUFFER_RULES:
        raise Refusal("usage", f"buffers must be one of {', '.join(BUFFER_RULES)}, got {buffers!r}")
    check_not_compiled(module)
    params = [p for p in module.parameters() if p.requires_grad]
    names = {id(p): k for k, p in module.named_parameters()}
    if not params:
        raise Refusal("torch-module-unsupported", f"{type(module).__name__} has no trainable parameters")
    dtypes = sorted({dtype_name(p.dtype) for p in params})
    if len(dtypes) != 1 or dtypes[0] not in ("float32", "float64"):
        raise Refusal(
            "torch-module-unsupported",
            f"trainable parameters have dtypes {dtypes}; use one of float32, float64 "
            "(module.float() or module.double())",
        )
    device = params[0].device
    if device.type not in DEVICE_TYPES:
        raise Refusal(
            "torch-module-unsupported",
            f"the module is on {device}; DataParallel runs modules on {' or '.join(DEVICE_TYPES)}",
        )
    elsewhere = [names.get(id(p), "?") for p in params if p.device != device]
    if elsewhere:
        raise Refusal(
            "torch-module-unsupported", f"parameters {elsewhere[:4]} are not on {device} like the first"
        )
    named_buffers = list(module.named_buffers())
    if named_buffers and buffers == "refuse":
        raise Refusal(
            "torch-buffers-refused",
            f"{type(module).__name__} has buffers "
            f"{[k for k, _ in named_buffers][:6]}{' ...' if len(named_buffers) > 6 else ''}; "
            "their per-slot updates have no rank-count-independent meaning unless a rule is chosen",
            buffers=[k for k, _ in named_buffers],
        )
    for k, b in named_buffers:
        if b.device != device or not b.is_contiguous():
            raise Refusal("torch-module-unsupported", f"buffer {k} must be a contiguous tensor on {device}")
    return ModuleParts(
        params,
        params[0].dtype,
        [(k, b) for k, b in named_buffers if b.is_floating_point()],
        [(k, b) for k, b in named_buffers if not b.is_floating_point()],
    )


def compiled_parts(module) -> list[str]:
    """Names of the submodules torch.compile wraps (`torch.compile(m)`'s OptimizedModule, which
    holds `_orig_mod`) or compiled in place (`m.compile()` sets `_compiled_call_impl`)."""
    return [
        k or "(the module)"
        for k, m in module.named_modules()
        if hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
    ]


def check_not_compiled(module) -> None:
    """Refuse (`torch-compile-refused`) a module torch.compile has compiled, whole or in part.

    Why: the kernels torch.compile generates depend on the shapes it has met before (the first
    shape of a slot compiles statically; another one recompiles with dynamic shapes; past the
    recompile limit it runs eagerly), and which shapes a rank meets first depends on which slots
    it owns. A slot's bits could then depend on the rank count, and the generated code is not in
    the contract. The eager module gives the same bits everywhere."""
    found = compiled_parts(module)
    if found:
        raise Refusal(
            "torch-compile-refused",
            f"{found[:4]} {'is' if len(found) == 1 else 'are'} compiled by torch.compile; its generated "
            "kernels depend on the shapes a rank has met, so a slot's bits could depend on the rank count",
        )


def check_parameters(module, params: list) -> None:
    """Refuse (`torch-module-changed`) when the module's trainable parameters are no longer
    `params`, those DataParallel was built with (checked at every step, by identity: a few
    microseconds): a parameter registered or replaced afterwards would be neither synchronised,
    trained, checkpointed nor digested, and one frozen or unfrozen would change the payload."""
    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile() afterwards
        check_not_compiled(module)
    now = [p for p in module.parameters() if p.requires_grad]
    if len(now) == len(params) and all(a is b for a, b in zip(now, params)):
        return
    names = {id(p): k for k, p in module.named_parameters()}
    built = {id(p) for p in params}
    new = [names.get(id(p), "?") for p in now if id(p) not in built]
    gone = len(built - {id(p) for p in now})
    what = (
        f"{len(new)} new ({new[:4]}{' ...' if len(new) > 4 else ''}), {gone} gone or frozen"
        if new or gone
        else "the same parameters in another order"
    )
    raise Refusal(
        "torch-module-changed",
        f"the module's trainable parameters changed since DataParallel was built: {what}",
        parameters=new,
    )
