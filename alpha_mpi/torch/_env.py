"""The torch side of the bits: import with a named refusal, fixed threads, deterministic kernels.

torch's own environment code, defined here in alpha_mpi.torch (every torch module of alpha_mpi
imports it from here; the learning layer never does): `require_torch` (the `torch` module, or
`torch-unavailable`), `fix_environment(threads)` (set at construction, recorded in the contract),
`environment()` (the live settings) and `check_environment(expected)` (every step:
`torch-environment-changed`).
"""

from __future__ import annotations

from types import ModuleType

from ..refusals import Refusal

__all__ = ["require_torch", "fix_environment", "environment", "check_environment"]


def require_torch() -> ModuleType:
    """The `torch` module, or a `torch-unavailable` refusal naming the extra to install."""
    try:
        import torch
    except ImportError as e:
        raise Refusal(
            "torch-unavailable", f"alpha_mpi.torch needs PyTorch, which does not import here: {e}"
        ) from None
    return torch


def fix_environment(threads: int) -> dict:
    """Set torch's intra-op threads to `threads` and deterministic algorithms on; return the
    settings, as the contract records them. A slot's forward and backward then compute the same
    bits on whichever rank runs them (same shapes, same threads, same kernels)."""
    torch = require_torch()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise Refusal("usage", f"threads must be an int >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    return environment()


def environment() -> dict:
    """torch's live settings that a slot's bits depend on."""
    torch = require_torch()
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
    }


def check_environment(expected: dict) -> None:
    """Refuse (`torch-environment-changed`) when the live settings differ from `expected`."""
    live = environment()
    diff = [f"{k}: contract {expected[k]!r}, now {live[k]!r}" for k in expected if live.get(k) != expected[k]]
    if diff:
        raise Refusal(
            "torch-environment-changed",
            "torch settings changed since DataParallel fixed them: " + "; ".join(diff),
        )
