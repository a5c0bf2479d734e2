"""The relation of a numerical contract to the independent binary64 oracle, and the conformance
evidence a BoundedDifference needs before it may execute. Pure data (layer 1).

- `BitIdentical`: equal bits to the oracle;
- `BoundedDifference(tolerance, suite, evidence)`: within `tolerance` over the named conformance
  suite; executes only with evidence measured on this kernel build and within the tolerance
  (checked by `alpha_mpi.numerics.authorize`; a tolerance alone never authorizes anything);
- `Unchecked`: may run, may never be claimed equal to anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar, Union

from .profile import check_keys, invalid

__all__ = [
    "DEFAULT_SUITE",
    "BitIdentical",
    "Unchecked",
    "Tolerance",
    "ConformanceEvidence",
    "BoundedDifference",
    "RELATIONS",
    "Relation",
    "relation_from_dict",
]

#: The conformance suite a BoundedDifference names unless told otherwise (numerics/evidence.py).
DEFAULT_SUITE = "binary32-contributions-v1"


def _hexfloat(x):
    return None if x is None else float(x).hex()


def _readfloat(x, what):
    if x is None:
        return None
    if isinstance(x, str):
        try:
            return float.fromhex(x)
        except ValueError:
            raise invalid(f"{what} {x!r} is not a hex float") from None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise invalid(f"{what} must be a number, got {x!r}")


def _is_count(x, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


@dataclass(frozen=True)
class BitIdentical:
    """The result has the oracle's bits, coordinate by coordinate."""

    kind: ClassVar[str] = "BitIdentical"

    def to_dict(self, evidence=True) -> dict:
        """`{"kind": "BitIdentical"}`."""
        return {"kind": self.kind}


@dataclass(frozen=True)
class Unchecked:
    """The result may be used, never claimed equal to a reference (`unchecked-claimed-equal`)."""

    kind: ClassVar[str] = "Unchecked"

    def to_dict(self, evidence=True) -> dict:
        """`{"kind": "Unchecked"}`."""
        return {"kind": self.kind}


@dataclass(frozen=True)
class Tolerance:
    """Largest admitted difference from the binary64 oracle: `max_ulp` (binary64 ulps) and/or
    `max_abs` (absolute error). Refuses neither bound, a negative or non-finite bound."""

    max_ulp: int | None = None
    max_abs: float | None = None

    def __post_init__(self):
        if self.max_ulp is None and self.max_abs is None:
            raise invalid("a tolerance bounds max_ulp, max_abs or both")
        if self.max_ulp is not None and not _is_count(self.max_ulp, 0):
            raise invalid(f"max_ulp must be an int >= 0, got {self.max_ulp!r}")
        if self.max_abs is not None:
            if isinstance(self.max_abs, bool) or not isinstance(self.max_abs, (int, float)):
                raise invalid(f"max_abs must be a float, got {self.max_abs!r}")
            object.__setattr__(self, "max_abs", float(self.max_abs))
            if not math.isfinite(self.max_abs) or self.max_abs < 0:
                raise invalid(f"max_abs must be finite and >= 0, got {self.max_abs!r}")

    def violations(self, max_ulp: int, max_abs: float) -> list:
        """What exceeds this tolerance, as readable phrases (empty when within it)."""
        out = []
        if self.max_ulp is not None and not (max_ulp <= self.max_ulp):
            out.append(f"max ulp {max_ulp} > {self.max_ulp}")
        if self.max_abs is not None and not (max_abs <= self.max_abs):
            out.append(f"max abs error {max_abs!r} > {self.max_abs!r}")
        return out

    def to_dict(self) -> dict:
        """`{"max_ulp": int | None, "max_abs": hex float | None}`."""
        return {"max_ulp": self.max_ulp, "max_abs": _hexfloat(self.max_abs)}

    def __str__(self):
        parts = []
        if self.max_ulp is not None:
            parts.append(f"{self.max_ulp} ulp")
        if self.max_abs is not None:
            parts.append(f"abs {self.max_abs!r}")
        return " and ".join(parts)


@dataclass(frozen=True)
class ConformanceEvidence:
    """A measurement: the largest differences from the binary64 oracle over a named suite, on one
    kernel build. Written by `alpha_mpi.numerics.measure_evidence`, which actually runs the suite.

    Fields: `suite`, `suite_size` (cases), `build_id` (`kernel.build_info()["build_id"]` of the
    kernel that ran it), `max_ulp`, `max_abs`, `coordinates` (binary64 results compared).
    """

    suite: str
    suite_size: int
    build_id: str
    max_ulp: int
    max_abs: float
    coordinates: int = 0

    def __post_init__(self):
        if not isinstance(self.suite, str) or not self.suite:
            raise invalid(f"evidence must name its suite, got {self.suite!r}")
        if not _is_count(self.suite_size, 1):
            raise invalid(f"evidence suite_size must be an int >= 1, got {self.suite_size!r}")
        if not isinstance(self.build_id, str) or not self.build_id:
            raise invalid(f"evidence must name the kernel build id, got {self.build_id!r}")
        if not _is_count(self.max_ulp, 0):
            raise invalid(f"evidence max_ulp must be an int >= 0, got {self.max_ulp!r}")
        object.__setattr__(self, "max_abs", float(self.max_abs))
        if not math.isfinite(self.max_abs) or self.max_abs < 0:
            raise invalid(f"evidence max_abs must be finite and >= 0, got {self.max_abs!r}")

    def to_dict(self) -> dict:
        """The evidence as JSON-able data (max_abs as a hex float)."""
        return {
            "suite": self.suite,
            "suite_size": self.suite_size,
            "build_id": self.build_id,
            "max_ulp": self.max_ulp,
            "max_abs": _hexfloat(self.max_abs),
            "coordinates": self.coordinates,
        }

    @classmethod
    def from_dict(cls, d) -> ConformanceEvidence:
        """Read `to_dict()`'s form; refuses unknown or missing keys."""
        check_keys(d, "evidence", {"suite", "suite_size", "build_id", "max_ulp", "max_abs", "coordinates"})
        max_abs = _readfloat(d["max_abs"], "evidence max_abs")
        return cls(d["suite"], d["suite_size"], d["build_id"], d["max_ulp"], max_abs, d["coordinates"])


@dataclass(frozen=True)
class BoundedDifference:
    """Within `tolerance` of the binary64 oracle over the named conformance suite. Executes only
    with evidence measured on this kernel build and within the tolerance. The evidence travels
    in `to_dict()` but is not part of equality (nor of the contract digest)."""

    tolerance: Tolerance
    suite: str = DEFAULT_SUITE
    evidence: ConformanceEvidence | None = field(default=None, compare=False)
    kind: ClassVar[str] = "BoundedDifference"

    def __post_init__(self):
        if not isinstance(self.tolerance, Tolerance):
            raise invalid(f"BoundedDifference needs a Tolerance, got {self.tolerance!r}")
        if not isinstance(self.suite, str) or not self.suite:
            raise invalid(f"BoundedDifference must name a conformance suite, got {self.suite!r}")
        if self.evidence is not None and not isinstance(self.evidence, ConformanceEvidence):
            raise invalid(f"evidence must be ConformanceEvidence, got {self.evidence!r}")

    def with_evidence(self, evidence) -> BoundedDifference:
        """The same relation carrying `evidence`."""
        return replace(self, evidence=evidence)

    def to_dict(self, evidence=True) -> dict:
        """Kind, suite and tolerance; with `evidence`, the evidence too (or None)."""
        d = {"kind": self.kind, "suite": self.suite, **self.tolerance.to_dict()}
        if evidence:
            d["evidence"] = None if self.evidence is None else self.evidence.to_dict()
        return d


RELATIONS = (BitIdentical, BoundedDifference, Unchecked)
Relation = Union[BitIdentical, BoundedDifference, Unchecked]


def relation_from_dict(d: dict) -> Relation:
    """Read one relation's `to_dict()` form; refuses anything else (`numerical-contract-invalid`)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "BitIdentical":
        check_keys(d, "relation", {"kind"})
        return BitIdentical()
    if kind == "Unchecked":
        check_keys(d, "relation", {"kind"})
        return Unchecked()
    if kind == "BoundedDifference":
        check_keys(d, "relation", {"kind", "suite", "max_ulp", "max_abs", "evidence"}, optional={"evidence"})
        ev = d.get("evidence")
        return BoundedDifference(
            Tolerance(d["max_ulp"], _readfloat(d["max_abs"], "tolerance max_abs")),
            d["suite"],
            None if ev is None else ConformanceEvidence.from_dict(ev),
        )
    raise invalid(f"relation {d!r} is not BitIdentical, BoundedDifference or Unchecked")
