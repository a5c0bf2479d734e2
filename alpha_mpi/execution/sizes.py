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
    def of(contributions) -> tuple[int, int, int]:
        if not isinstance(contributions, dict) or not contributions:
            return (0, 0, 0)
        value = next(iter(contributions.values()))
        if isinstance(value, tuple):
            if len(value) != 2 or not all(isinstance(v, np.ndarray) for v in value):
                return (0, 0, 0)
            return (2, int(value[0].size), int(value[1].size))
        return (1, int(value.size), 0) if isinstance(value, np.ndarray) and value.size else (0, 0, 0)

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
            f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks_text(ranks)}: {cls.text(row)}"
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
