"""The debug log (ALPHA_MPI_DEBUG=1): one line per message, `r0 | S3 -> 1 tag 106 ...`, on stderr
(as mpi4jax's debug variable logs every message)."""

from __future__ import annotations

import os
import sys


def debug_enabled() -> bool:
    """ALPHA_MPI_DEBUG=1: log every message (read once per executor, at construction)."""
    return os.environ.get("ALPHA_MPI_DEBUG", "") not in ("", "0")


def log(rank: int, text: str) -> None:
    """Write `r<rank> | text` to stderr at once."""
    sys.stderr.write(f"r{rank} | {text}\n")
    sys.stderr.flush()


__all__ = ["debug_enabled", "log"]
