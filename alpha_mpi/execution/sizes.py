"""The size round of the convenience calls: every rank says its call's payload size (layer 4).

A convenience call without layout= takes its size from each call (convenience.py), but its
cached executor has a fixed size: its buffers and messages were sized at the build, which is
what keeps every MPI receive inside its buffer. A call of another size therefore runs the
executor once on zeros, refused on that rank and flagged to every rank; then every rank runs
this round, and every rank decides from the same table whether to build for the new size,
refuse the mismatch by name, or let the run's own refusal stand.
"""

from __future__ import annotations

import numpy as np

from ..refusals import Refusal
from .endpoint import Endpoint
from .verdict import ranks_text

__all__ = ["Sizes"]


class Sizes:
    """The round after a refused run of a call sized per call: every rank says the payload size
    of its call (three words: kind 1 a vector / 2 a (numerator, mass) tuple / 0 no size this
    call can give, i.e. no mapping of arrays; then the element counts), and every rank decides
    from the same table."""

    WHAT = "allreduce() payload sizes"

    @staticmethod
    def infer(contributions):
        """The Layout a call's contributions give (the first slot's: the run checks the others).
        A bare array gives its size too, so that its rank builds with its peers and the run
        refuses it by name (`contributions-not-mapping`)."""
        from ..model import Layout

        if isinstance(contributions, np.ndarray):
            return Layout.vector(int(contributions.size))
        if isinstance(contributions, dict):
            for value in contributions.values():
                if isinstance(value, tuple):
                    return Layout(*[(n, int(np.size(v))) for n, v in zip(("numerator", "mass"), value)])
                return Layout.vector(int(np.size(value)))
        raise Refusal(
            "contribution-missing",
            "this rank passed no contributions, so the payload size is unknown; pass layout= (every rank the same)",
        )

    @classmethod
    def of(cls, contributions) -> tuple[int, int, int]:
        """This call's words: (0, 0, 0) unless it passed a mapping of non-empty arrays (or
        (numerator, mass) pairs of them)."""
        if not isinstance(contributions, dict) or not contributions:
            return (0, 0, 0)
        value = next(iter(contributions.values()))
        parts = value if isinstance(value, tuple) else (value,)
        if len(parts) > 2 or not all(isinstance(v, np.ndarray) and v.size for v in parts):
            return (0, 0, 0)
        return cls.of_layout(cls.infer(contributions))

    @staticmethod
    def of_layout(layout) -> tuple[int, int, int]:
        counts = [c for _, c in layout.components]
        if len(counts) > 2:  # not a layout a call's contributions can be inferred as
            return (0, 0, 0)
        return (len(counts), counts[0], counts[1] if len(counts) == 2 else 0)

    @staticmethod
    def layout(words) -> object:
        from ..model import Layout

        kind, n, m = (int(w) for w in words)
        return Layout.vector(n) if kind == 1 else Layout(("numerator", n), ("mass", m))

    @classmethod
    def agree(cls, comm, contributions, current, timeout):
        """The layout every rank's call asks for, when it is one and not `current`'s; None when
        the refused run was refused for something else (the caller raises that); raises
        `contribution-size-mismatch` on every rank when the ranks' sizes differ."""
        table = Endpoint.of(comm).verdict(cls.of(contributions), None, cls.WHAT, timeout=timeout)
        table.raise_failures(None, cls.WHAT)
        rows = [tuple(int(w) for w in row) for row in table.words]
        if any(kind == 0 for kind, _, _ in rows) or all(r == current for r in rows):
            return None  # a rank passed no sizable mapping, or nobody changed: its own refusal stands
        if len(set(rows)) == 1:
            return cls.layout(rows[0])
        groups: dict[tuple, list[int]] = {}
        for r, row in enumerate(rows):
            groups.setdefault(row, []).append(r)
        said = "; ".join(
            f"{ranks_text(ranks)}: {cls.text(row)}"
            for row, ranks in sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0]))
        )
        raise Refusal(
            "contribution-size-mismatch",
            f"the ranks passed payloads of different sizes to one call ({said}); nothing was combined "
            "and the next call works",
            sizes={r: row for r, row in enumerate(rows)},
        )

    @staticmethod
    def text(row) -> str:
        kind, n, m = row
        return f"{n} elements" if kind == 1 else f"numerator {n} + mass {m}"
