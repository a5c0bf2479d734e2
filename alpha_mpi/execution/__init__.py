"""Execution layer: runs plans over mpi4py with identity-checked frames (point-to-point only)."""

from .combiner import Combiner, combine  # noqa: F401
