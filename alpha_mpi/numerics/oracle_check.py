"""Comparing an executed result with the independent oracle, by bits or within a tolerance.

The oracle (alpha_mpi.oracle) evaluates the declared tree with plain Python floats; this module
only compares its answer with what ran and says *where* they differ (coordinates, and the payload
component of each when a layout is given). Differences are measured in binary64 ulps (distance
between the two values along the ordered binary64 line; +0 and -0 are 0 apart) and in absolute
error. A non-finite value on either side is an infinite difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np

from .. import oracle
from ..model.layout import Layout
from ..model.relation import Tolerance
from ..model.tree import Node
from ..refusals import Refusal

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "INFINITE_ULP",
    "OracleMismatch",
    "ulp_distance",
    "differences",
    "component_names",
    "compare",
    "check_against_oracle",
]

_MAG = np.uint64(0x7FFFFFFFFFFFFFFF)
#: The ulp distance reported when either side is non-finite.
INFINITE_ULP = 1 << 64


class OracleMismatch(Refusal):
    """The executed result is not what the oracle says the declared order gives."""

    def __init__(self, message: str, **context: object) -> None:
        super().__init__("oracle-mismatch", message, **context)

    @property
    def coordinates(self) -> list[int]:
        """The coordinates whose bits differ (or lie outside the tolerance)."""
        return cast("list[int]", self.context.get("coordinates", []))


def _f64(x: ArrayLike) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float64)).reshape(-1)


def ulp_distance(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """|ord(a) - ord(b)| per coordinate as uint64 (ord: binary64 values in order along the line)."""
    ua, ub = _f64(a).view(np.uint64), _f64(b).view(np.uint64)
    ma, mb = ua & _MAG, ub & _MAG
    sa, sb = (ua >> np.uint64(63)).astype(bool), (ub >> np.uint64(63)).astype(bool)
    same = sa == sb
    d_same = np.where(ma >= mb, ma - mb, mb - ma)
    d_cross = ma + mb  # <= 2**64 - 2**53: no wrap for finite values
    return np.where(same, d_same, d_cross)


def differences(result: ArrayLike, reference: ArrayLike) -> tuple[list[int], int, float]:
    """(coordinates that differ in bits, max ulp, max abs error), non-finite counted infinite."""
    r, w = _f64(result), _f64(reference)
    if r.size != w.size:
        raise OracleMismatch(f"the result has {r.size} coordinates, the oracle {w.size}", coordinates=[])
    diff_bits = np.nonzero(r.view(np.uint64) != w.view(np.uint64))[0]
    if diff_bits.size == 0:
        return [], 0, 0.0
    finite = np.isfinite(r) & np.isfinite(w)
    if not finite.all():
        return diff_bits.tolist(), INFINITE_ULP, float("inf")
    max_ulp = int(ulp_distance(r, w).max())
    with np.errstate(over="ignore"):
        max_abs = float(np.max(np.abs(r - w)))
    return diff_bits.tolist(), max_ulp, max_abs


def component_names(layout: Layout | None, coordinates: Iterable[int]) -> list[str]:
    """'numerator[3]', 'mass[0]' ... for coordinates of a Layout's payload."""
    if layout is None:
        return [f"[{i}]" for i in coordinates]
    spans = sorted(layout.offsets.items(), key=lambda kv: kv[1][0])
    out = []
    for i in coordinates:
        for name, (lo, hi) in spans:
            if lo <= i < hi:
                out.append(f"{name}[{i - lo}]")
                break
        else:
            out.append(f"[{i}]")
    return out


def compare(
    result: ArrayLike,
    reference: ArrayLike,
    *,
    layout: Layout | None = None,
    tolerance: Tolerance | None = None,
    what: str = "the result",
) -> None:
    """Refuse (`oracle-mismatch`) unless result equals reference bit for bit, or, with a
    `tolerance` (contract.Tolerance), lies within it at every coordinate."""
    coords, max_ulp, max_abs = differences(result, reference)
    if not coords:
        return
    if tolerance is not None:
        over = tolerance.violations(max_ulp, max_abs)
        if not over:
            return
        detail = f"outside the tolerance: {'; '.join(over)}"
    else:
        detail = f"differs in bits (max {max_ulp} ulp, max abs error {max_abs!r})"
    names = component_names(layout, coords[:8])
    raise OracleMismatch(
        f"{what} {detail} at {len(coords)} coordinate(s), first {', '.join(names)}",
        coordinates=coords,
        components=component_names(layout, coords),
        max_ulp=max_ulp,
        max_abs=max_abs,
    )


def check_against_oracle(
    tree: Node,
    data: Mapping[int, Iterable[float]],
    result: ArrayLike,
    *,
    layout: Layout | None = None,
    tolerance: Tolerance | None = None,
    what: str = "the executed result",
) -> list[float]:
    """Evaluate the DECLARED `tree` with the oracle over `data` (slot -> vector) and compare the
    executed `result` with it; refuse with `oracle-mismatch` naming the coordinates. Returns the
    oracle's answer (a list of floats)."""
    want = oracle.evaluate(tree, {s: oracle.to_list(v) for s, v in data.items()})
    compare(result, want, layout=layout, tolerance=tolerance, what=what)
    return want
