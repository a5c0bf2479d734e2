"""The operations of a numerical contract, in the order they run: a combine (named by its layout
order id) and formulas (named by id and exact evaluation order, formulas.py). Pure data (layer 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .deprecation import deprecated_order_id
from .formulas import ALIASES, FORMULAS
from .profile import check_keys, invalid

__all__ = ["CombineOrder", "Formula", "operation_from_dict"]

_HEX = frozenset("0123456789abcdef")
_COMBINE_KEY = {1: "order_id", 2: "layout_order_id"}  # contract format version -> the combine's key


@dataclass(frozen=True)
class CombineOrder:
    """A combine, named by its layout order id (`Plan.layout_order_id`: tree order + payload layout).

    Refuses anything but a 64-digit lower-case hex digest (`numerical-contract-invalid`). Its
    stored form is `{"kind": "combine", "layout_order_id": ...}` (contract format 2); format 1
    (0.1 and early 0.2) wrote the same value under `order_id`, and is still read.
    """

    layout_order_id: str
    kind: ClassVar[str] = "combine"

    order_id = deprecated_order_id("CombineOrder")

    def __post_init__(self):
        oid = self.layout_order_id
        if not isinstance(oid, str) or len(oid) != 64 or not set(oid) <= _HEX:
            raise invalid(f"a combine order id is a 64-digit lower-case hex digest, got {oid!r}")

    def to_dict(self, version: int = 2) -> dict:
        """`{"kind": "combine", "layout_order_id": ...}`; `version=1` writes format 1's key
        `order_id` (to check the digests of contracts stored in that format)."""
        return {"kind": "combine", _COMBINE_KEY[version]: self.layout_order_id}

    def describe(self) -> str:
        """Short text naming the order, for refusal messages."""
        return f"combine order {self.layout_order_id[:16]}"


@dataclass(frozen=True)
class Formula:
    """A formula id with its exact evaluation order (formulas.py). `Formula.named(id)` takes the
    text from FORMULAS; a formula whose text differs is another order."""

    formula_id: str
    expression: str
    kind: ClassVar[str] = "formula"

    def __post_init__(self):
        if not isinstance(self.formula_id, str) or not self.formula_id:
            raise invalid(f"a formula id is a non-empty string, got {self.formula_id!r}")
        if not isinstance(self.expression, str) or not self.expression:
            raise invalid(f"formula {self.formula_id!r} needs its evaluation order as text")

    @classmethod
    def named(cls, formula_id: str) -> Formula:
        """The registered formula `formula_id` (or an alias: `adam`, `sgd`); refuses an unknown id."""
        fid = ALIASES.get(formula_id, formula_id)
        if fid not in FORMULAS:
            raise invalid(f"formula {formula_id!r} is unknown (known: {', '.join(sorted(FORMULAS))})")
        return cls(fid, FORMULAS[fid])

    def to_dict(self, version: int = 2) -> dict:
        """`{"kind": "formula", "id": ..., "expression": ...}` (the same in contract formats 1 and 2)."""
        return {"kind": "formula", "id": self.formula_id, "expression": self.expression}

    def describe(self) -> str:
        """Short text naming the formula and its order, for refusal messages."""
        return f"formula {self.formula_id} ({self.expression})"


def operation_from_dict(d: dict, version: int = 2) -> CombineOrder | Formula:
    """Read one operation's `to_dict(version)` form (contract format `version`: 1 keys the
    combine's id `order_id`, 2 `layout_order_id`); refuses anything else
    (`numerical-contract-invalid`)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "combine":
        key = _COMBINE_KEY[version]
        check_keys(d, "operation", {"kind", key})
        return CombineOrder(d[key])
    if kind == "formula":
        check_keys(d, "operation", {"kind", "id", "expression"})
        return Formula(d["id"], d["expression"])
    raise invalid(f"operation {d!r} is neither a combine nor a formula")
