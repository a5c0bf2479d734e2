"""The check that every rank built the same module: `check_same_module`.

A DataParallel whose ranks hold different modules would combine gradients that mean different
things. Two architectures with the same parameter count would even combine without any frame
refusal, silently. So at construction every rank says a sha256 of its module's architecture
(`architecture(module)`: the module's repr, its class names, and each parameter's and buffer's
name, shape, dtype and requires_grad) in the communicator's verdict round
(alpha_mpi.execution.Endpoint.verdict: point to point, no collective), with its own refusal of
the constructor's arguments if it has one; every rank then sees every digest and every status and
refuses alike (`torch-module-mismatch` naming the ranks that differ from rank 0, or the refusing
rank's code).

The parameters' values are not compared here: construction copies rank 0's parameters to every
rank (`take_rank0_values`, here: the same module means the same values to start from). A rank
that changes a parameter afterwards, or passes
another global batch, is what the audit's replica digests catch.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..execution import Allreducer, Endpoint
from ..model import ReplicateAll, star
from ..planning import plan
from ..refusals import Refusal

__all__ = [
    "architecture",
    "architecture_digest",
    "check_same_module",
    "take_rank0_values",
    "WORDS",
]

WORDS = 4
"""Words per rank in the round: a sha256 as four 64-bit words."""


def architecture(module) -> str:
    """The module's architecture as text: repr, submodule classes, parameter and buffer specs."""
    lines = [repr(module)]
    lines += [
        f"module {k or '.'}: {type(m).__module__}.{type(m).__qualname__}" for k, m in module.named_modules()
    ]
    for kind, named in (("param", module.named_parameters()), ("buffer", module.named_buffers())):
        for k, t in named:
            lines.append(f"{kind} {k}: {tuple(t.shape)} {t.dtype} requires_grad={t.requires_grad}")
    return "\n".join(lines)


def architecture_digest(module) -> str:
    """sha256 (hex) of `architecture(module)`."""
    return hashlib.sha256(architecture(module).encode()).hexdigest()


def _words(hexdigest: str) -> list[int]:
    raw = bytes.fromhex(hexdigest)
    return [int.from_bytes(raw[i : i + 8], "little") for i in range(0, 32, 8)]


def _hex(words) -> str:
    return b"".join(int(w).to_bytes(8, "little") for w in words).hex()


def check_same_module(module, comm, timeout: float | None = None, local: BaseException | None = None) -> None:
    """Refuse on every rank (`torch-module-mismatch`) unless every rank's architecture digest
    equals rank 0's. Collective over `comm` (one verdict round); `local`: this rank's failure in
    the constructor's local checks (its arguments, the module, the plan), which travels in the
    same round (every rank then raises: this
    one its own, the others `peer-refused` naming it)."""
    mine = architecture_digest(module) if local is None else "0" * 64
    if comm.Get_size() == 1:
        if local is not None:
            raise local
        return
    what = "building the DataParallel (comparing the modules' architectures)"
    v = Endpoint.of(comm, timeout).verdict(_words(mine), local, what, timeout=timeout)
    v.raise_failures(local, what)
    ref = v.words[0]
    other = [r for r in range(len(v.words)) if not np.array_equal(v.words[r], ref)]
    if other:
        raise Refusal(
            "torch-module-mismatch",
            f"ranks {other} hold another module than rank 0 (architecture digests differ; "
            f"rank 0's begins {_hex(ref)[:16]}, this rank's {mine[:16]})",
            ranks=other,
        )


def take_rank0_values(comm, tensors: list, timeout, contract: str) -> None:
    """Every rank takes rank 0's values of `tensors` (parameters, floating buffers), bit for bit:
    a star combine over one slot per rank in which ranks != 0 contribute -0.0 (x + -0.0 == x
    exactly), freed once done (its tags go back to the endpoint). Collective."""
    import torch

    from .convert import pack, unpack

    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return
    total = sum(t.numel() for t in tensors)
    p = plan(star(range(size), size), ReplicateAll(), total, size=size)
    bc = Allreducer(comm, p, timeout=timeout, contract=contract)
    try:
        mine = pack(tensors) if rank == 0 else np.full(total, -0.0)
        out = bc.run({rank: mine}, out=np.empty(total))
    finally:
        bc.free()
    with torch.no_grad():
        unpack(tensors, out)
