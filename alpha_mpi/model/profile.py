"""The profile of a numerical contract: formats, rounding, subnormals, exceptional values and the
conversion at each site (DESIGN.md "Numerical contracts").

Pure data (layer 1): no numpy, no kernel. Also holds `ContractRefusal` and the small validation
helpers the other contract modules share (operations.py, relation.py, contract.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..refusals import Refusal

__all__ = [
    "ContractRefusal",
    "Conversion",
    "KeepFormat",
    "WidenBinary32",
    "RoundBinary64",
    "CONVERSIONS",
    "SITE_SEQUENCES",
    "Profile",
    "ROUNDINGS",
    "SUBNORMALS",
    "EXCEPTIONAL",
    "FORMATS",
    "SITES",
]

ROUNDINGS = ("nearest-even", "toward-zero", "upward", "downward")
SUBNORMALS = ("preserved", "flush-to-zero")
EXCEPTIONAL = ("FiniteOrRefuse", "Propagate")
FORMATS = ("binary64", "binary32")
SITES = ("contribution",)


class ContractRefusal(Refusal):
    """A contract that is malformed, may not execute, or may not be claimed equal."""


def invalid(message: str, **context) -> ContractRefusal:
    """A `numerical-contract-invalid` refusal (returned, for the caller to raise)."""
    return ContractRefusal("numerical-contract-invalid", message, **context)


def check_keys(d, what: str, required, optional=frozenset()) -> None:
    """Refuse a serialised record `d` that is not a dict with exactly the `required` keys
    (those in `optional` may be absent)."""
    if not isinstance(d, dict):
        raise invalid(f"{what} must be a dict, got {type(d).__name__}")
    missing = sorted(set(required) - set(optional) - set(d))
    extra = sorted(set(d) - set(required))
    if missing or extra:
        raise invalid(f"{what} {d!r}: missing keys {missing}, unknown keys {extra}")


@dataclass(frozen=True)
class Conversion:
    """A conversion applied at a named site (today: `contribution`, before the combine tree).

    Use one of the three kinds: `KeepFormat`, `WidenBinary32`, `RoundBinary64`. Refuses an
    unknown site (`numerical-contract-invalid`).
    """

    site: str = "contribution"
    kind: ClassVar[str] = "Conversion"

    def __post_init__(self):
        if self.site not in SITES:
            raise invalid(f"conversion site {self.site!r} is unknown (known: {', '.join(SITES)})")

    def to_dict(self) -> dict:
        """`{"kind": ..., "site": ...}`."""
        return {"kind": self.kind, "site": self.site}

    def __str__(self):
        return f"{self.kind}@{self.site}"


@dataclass(frozen=True)
class KeepFormat(Conversion):
    """binary64 in, binary64 out: no conversion."""

    kind: ClassVar[str] = "KeepFormat"


@dataclass(frozen=True)
class WidenBinary32(Conversion):
    """binary32 -> binary64, exact for every binary32 value (kernel.widen_binary32)."""

    kind: ClassVar[str] = "WidenBinary32"


@dataclass(frozen=True)
class RoundBinary64(Conversion):
    """binary64 -> binary32, nearest-even (kernel.round_binary64): an explicit narrowing site."""

    kind: ClassVar[str] = "RoundBinary64"


CONVERSIONS = {c.kind: c for c in (KeepFormat, WidenBinary32, RoundBinary64)}
#: The conversion sequences a site may declare, in the order they run.
SITE_SEQUENCES = {
    ("KeepFormat",): "binary64 contributions, unchanged",
    ("WidenBinary32",): "binary32 contributions, widened exactly",
    (
        "RoundBinary64",
        "WidenBinary32",
    ): "binary64 contributions narrowed to binary32 (nearest-even), then widened",
}


@dataclass(frozen=True)
class Profile:
    """What arithmetic a contract runs under.

    - `formats`: binary64, and binary32 only when a conversion site uses it;
    - `rounding`: one of ROUNDINGS (only `nearest-even` executes);
    - `subnormals`: `preserved` or `flush-to-zero` (only `preserved` executes);
    - `exceptional`: `FiniteOrRefuse` (executes) or `Propagate`;
    - `conversions`: per site, one of SITE_SEQUENCES (default: KeepFormat at `contribution`).

    Refuses an unknown value, or binary32 named without a site that uses it (or the reverse),
    with `numerical-contract-invalid`.
    """

    formats: tuple = ("binary64",)
    rounding: str = "nearest-even"
    subnormals: str = "preserved"
    exceptional: str = "FiniteOrRefuse"
    conversions: tuple = (KeepFormat("contribution"),)

    FIELDS: ClassVar[tuple] = ("formats", "rounding", "subnormals", "exceptional", "conversions")

    def __post_init__(self):
        object.__setattr__(self, "formats", tuple(self.formats))
        object.__setattr__(self, "conversions", tuple(self.conversions))
        for f in self.formats:
            if f not in FORMATS:
                raise invalid(f"format {f!r} is unknown (known: {', '.join(FORMATS)})")
        if len(set(self.formats)) != len(self.formats) or "binary64" not in self.formats:
            raise invalid(f"formats {list(self.formats)} must name binary64 once (and binary32 at most once)")
        for name, value, allowed in (
            ("rounding", self.rounding, ROUNDINGS),
            ("subnormals", self.subnormals, SUBNORMALS),
            ("exceptional", self.exceptional, EXCEPTIONAL),
        ):
            if value not in allowed:
                raise invalid(f"{name} {value!r} is unknown (known: {', '.join(allowed)})")
        for c in self.conversions:
            if not isinstance(c, Conversion) or type(c) is Conversion:
                raise invalid(f"conversion {c!r} is not KeepFormat, WidenBinary32 or RoundBinary64")
        for site in {c.site for c in self.conversions}:
            seq = tuple(c.kind for c in self.conversions if c.site == site)
            if seq not in SITE_SEQUENCES:
                raise invalid(
                    f"site {site!r} declares {' then '.join(seq)}; a site declares one of: "
                    + "; ".join(" then ".join(s) for s in SITE_SEQUENCES)
                )
        uses32 = any(c.kind != "KeepFormat" for c in self.conversions)
        if uses32 != ("binary32" in self.formats):
            raise invalid(
                "binary32 appears only through explicit conversion sites: "
                + (
                    "a conversion site uses binary32 but formats do not name it"
                    if uses32
                    else "formats name binary32 but no conversion site uses it"
                )
            )

    def site(self, site: str) -> tuple:
        """The conversion kinds declared at `site`, in order (KeepFormat when none is declared)."""
        seq = tuple(c.kind for c in self.conversions if c.site == site)
        return seq or ("KeepFormat",)

    def to_dict(self) -> dict:
        """The profile as plain JSON-able data (`Profile.from_dict` reads it back)."""
        return {
            "formats": list(self.formats),
            "rounding": self.rounding,
            "subnormals": self.subnormals,
            "exceptional": self.exceptional,
            "conversions": [c.to_dict() for c in self.conversions],
        }

    @classmethod
    def from_dict(cls, d) -> Profile:
        """Read `to_dict()`'s form; refuses unknown or missing keys (`numerical-contract-invalid`)."""
        check_keys(d, "profile", {"formats", "rounding", "subnormals", "exceptional", "conversions"})
        convs = []
        for c in d["conversions"]:
            check_keys(c, "conversion", {"kind", "site"})
            k = CONVERSIONS.get(c["kind"])
            if k is None:
                raise invalid(f"conversion kind {c['kind']!r} is unknown")
            convs.append(k(c["site"]))
        return cls(tuple(d["formats"]), d["rounding"], d["subnormals"], d["exceptional"], tuple(convs))

    def describe_field(self, name: str) -> str:
        """One field as short text, for refusal messages."""
        v = getattr(self, name)
        if name == "conversions":
            return "[" + ", ".join(map(str, v)) + "]"
        if name == "formats":
            return "[" + ", ".join(v) + "]"
        return str(v)
