"""Former home of the replicate and scatter realizations (now realizations/replicate.py and scatter.py):
the names 0.1 callers imported from here."""

from .realizations.scatter import DEFAULT_SEGMENT, chunk_bounds

__all__ = ["DEFAULT_SEGMENT", "chunk_bounds"]
