"""The check that every rank built the same module: `check_same_module`.

A DataParallel whose ranks hold different modules would combine gradients that mean different
things. Two architectures with the same parameter count would even combine without any frame
refusal, silently. So at construction every rank exchanges a sha256 of its module's architecture
(`architecture(module)`: the module's repr, its class names, and each parameter's and buffer's
name, shape, dtype and requires_grad) through a star combine of one slot per rank (each rank
writes its digest, as sixteen 16-bit integers held exactly in binary64, into its own row and -0.0
elsewhere; x + -0.0 == x, so the combined rows are every rank's digest bit for bit). No MPI
collective; every rank then sees every digest and refuses alike (`torch-module-mismatch`), naming
the ranks that differ from rank 0.

The parameters' values are not compared here: construction copies rank 0's parameters to every
rank (`take_rank0_values`, here: the same module means the same values to start from). A rank
that changes a parameter afterwards, or passes
another global batch, is what the audit's replica digests catch.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..execution import Allreducer
from ..model import ReplicateAll, star
from ..planning import plan
from ..refusals import Refusal

__all__ = [
    "architecture",
    "architecture_digest",
    "check_same_module",
    "take_rank0_values",
    "rows_hex",
    "WORDS",
]

WORDS = 16
"""Words per rank in the exchange: a sha256 as sixteen 16-bit integers."""


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


def _words(hexdigest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(hexdigest), dtype=">u2").astype(np.float64)


def rows_hex(row: np.ndarray) -> str:
    """The first 16 hex digits of the digest a row of WORDS words holds."""
    return row.astype(">u2").tobytes().hex()[:16]


def check_same_module(module, comm, timeout: float | None = None) -> Allreducer | None:
    """Refuse on every rank (`torch-module-mismatch`) unless every rank's architecture digest
    equals rank 0's. Collective over `comm`; returns the exchange's Allreducer (kept by the
    caller: see take_rank0_values on why communicators are not freed), None on one rank."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return None
    mine = architecture_digest(module)
    total = WORDS * size
    p = plan(star(range(size), size), ReplicateAll(), total, size=size)
    ex = Allreducer(comm, p, timeout=timeout, contract="torch-same-module-v1")
    row = np.full(total, -0.0)
    row[WORDS * rank : WORDS * (rank + 1)] = _words(mine)
    out = ex.run({rank: row}, out=np.empty(total))
    rows = out.reshape(size, WORDS)
    ref = rows[0].view(np.uint64)
    other = [r for r in range(size) if not np.array_equal(rows[r].view(np.uint64), ref)]
    if other:
        raise Refusal(
            "torch-module-mismatch",
            f"ranks {other} hold another module than rank 0 (architecture digests differ; "
            f"rank 0's begins {rows_hex(rows[0])}, this rank's {mine[:16]})",
            ranks=other,
        )
    return ex


def take_rank0_values(comm, tensors: list, timeout, contract: str):
    """Every rank takes rank 0's values of `tensors` (parameters, floating buffers), bit for bit:
    a star combine over one slot per rank in which ranks != 0 contribute -0.0 (x + -0.0 == x
    exactly). Returns the executor (None alone): the caller keeps it, not freed, because a freed
    communicator's handle may be reused by the next one, and the executors cache
    per-communicator facts by handle (transport.polls_before_yield), which would then differ
    between ranks."""
    import torch

    from .convert import pack, unpack

    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return None
    total = sum(t.numel() for t in tensors)
    p = plan(star(range(size), size), ReplicateAll(), total, size=size)
    bc = Allreducer(comm, p, timeout=timeout, contract=contract)
    mine = pack(tensors) if rank == 0 else np.full(total, -0.0)
    out = bc.run({rank: mine}, out=np.empty(total))
    with torch.no_grad():
        unpack(tensors, out)
    return bc
