"""Numerical contracts: (profile, operations, relation), as frozen, hashable data.

DESIGN.md "Numerical contracts". A contract says what a combine or a learner computes, bit for
bit, and how its result may be related to the independent oracle:

- **profile**: formats (binary64; binary32 only through explicit conversion sites), rounding
  (nearest-even), subnormals (preserved), exceptional values (`FiniteOrRefuse`) and the
  conversions at each site: `KeepFormat`, `WidenBinary32` (exact) or `RoundBinary64` then
  `WidenBinary32` (an explicit nearest-even narrowing site, never inferred from a transport).
- **operations**: the ordered list of what runs: the combine's order id (a Plan's `order_id`:
  tree shape, slots, operation and payload layout), then formula ids with their exact
  evaluation order (formulas.py, checked against csrc/alpha_kernel.h).
- **relation**: `BitIdentical` (to the oracle), `BoundedDifference(tolerance)` (needs conformance
  evidence recorded on this kernel build before it may execute; a tolerance alone never
  authorizes anything) or `Unchecked` (may run, may never be claimed equal to anything).

`digest` is sha256 over a canonical JSON form with a domain prefix (never `hash()`), so it is the
same in every process and on every machine; frames carry it (Combiner(contract=c.digest)) and
checkpoints store `to_dict()`. The digest names what the contract *means*: conformance evidence
(the authorization to run a BoundedDifference contract on one kernel build) travels in
`to_dict()` but is not part of the digest, equality or hash.

This module is pure: numpy and the compiled kernel are imported only by the functions that need
them (authorize, claim_equal), so checkpoint code can read and compare contracts anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..refusals import NumericalOrderMismatch, NumericalProfileMismatch, Refusal
from .formulas import ALIASES, FORMULAS

FORMAT_NAME = "alpha-mpi/numerical-contract"
FORMAT_VERSION = 1
_DIGEST_TAG = b"alpha-mpi/numerical-contract/v1\0"

#: The conformance suite a BoundedDifference names unless told otherwise (conformance.py).
DEFAULT_SUITE = "binary32-contributions-v1"

ROUNDINGS = ("nearest-even", "toward-zero", "upward", "downward")
SUBNORMALS = ("preserved", "flush-to-zero")
EXCEPTIONAL = ("FiniteOrRefuse", "Propagate")
FORMATS = ("binary64", "binary32")
SITES = ("contribution",)


class ContractRefusal(Refusal):
    """A contract that is malformed, may not execute, or may not be claimed equal."""


def _invalid(message, **context):
    return ContractRefusal("numerical-contract-invalid", message, **context)


# ---------------------------------------------------------------------------------- profile


@dataclass(frozen=True)
class Conversion:
    """A conversion applied at a named site (today: `contribution`, before the combine tree)."""

    site: str = "contribution"
    kind: ClassVar[str] = "Conversion"

    def __post_init__(self):
        if self.site not in SITES:
            raise _invalid(f"conversion site {self.site!r} is unknown (known: {', '.join(SITES)})")

    def to_dict(self) -> dict:
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
    ("RoundBinary64", "WidenBinary32"): "binary64 contributions narrowed to binary32 (nearest-even), then widened",
}


@dataclass(frozen=True)
class Profile:
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
                raise _invalid(f"format {f!r} is unknown (known: {', '.join(FORMATS)})")
        if len(set(self.formats)) != len(self.formats) or "binary64" not in self.formats:
            raise _invalid(f"formats {list(self.formats)} must name binary64 once (and binary32 at most once)")
        for name, value, allowed in (
            ("rounding", self.rounding, ROUNDINGS),
            ("subnormals", self.subnormals, SUBNORMALS),
            ("exceptional", self.exceptional, EXCEPTIONAL),
        ):
            if value not in allowed:
                raise _invalid(f"{name} {value!r} is unknown (known: {', '.join(allowed)})")
        for c in self.conversions:
            if not isinstance(c, Conversion) or type(c) is Conversion:
                raise _invalid(f"conversion {c!r} is not KeepFormat, WidenBinary32 or RoundBinary64")
        for site in {c.site for c in self.conversions}:
            seq = tuple(c.kind for c in self.conversions if c.site == site)
            if seq not in SITE_SEQUENCES:
                raise _invalid(
                    f"site {site!r} declares {' then '.join(seq)}; a site declares one of: "
                    + "; ".join(" then ".join(s) for s in SITE_SEQUENCES)
                )
        uses32 = any(c.kind != "KeepFormat" for c in self.conversions)
        if uses32 != ("binary32" in self.formats):
            raise _invalid(
                "binary32 appears only through explicit conversion sites: "
                + ("a conversion site uses binary32 but formats do not name it" if uses32
                   else "formats name binary32 but no conversion site uses it")
            )

    def site(self, site: str) -> tuple:
        """The conversion kinds declared at `site`, in order (KeepFormat when none is declared)."""
        seq = tuple(c.kind for c in self.conversions if c.site == site)
        return seq or ("KeepFormat",)

    def to_dict(self) -> dict:
        return {
            "formats": list(self.formats),
            "rounding": self.rounding,
            "subnormals": self.subnormals,
            "exceptional": self.exceptional,
            "conversions": [c.to_dict() for c in self.conversions],
        }

    @classmethod
    def from_dict(cls, d) -> "Profile":
        _keys(d, "profile", {"formats", "rounding", "subnormals", "exceptional", "conversions"})
        convs = []
        for c in d["conversions"]:
            _keys(c, "conversion", {"kind", "site"})
            k = CONVERSIONS.get(c["kind"])
            if k is None:
                raise _invalid(f"conversion kind {c['kind']!r} is unknown")
            convs.append(k(c["site"]))
        return cls(tuple(d["formats"]), d["rounding"], d["subnormals"], d["exceptional"], tuple(convs))

    def describe_field(self, name: str) -> str:
        v = getattr(self, name)
        if name == "conversions":
            return "[" + ", ".join(map(str, v)) + "]"
        if name == "formats":
            return "[" + ", ".join(v) + "]"
        return str(v)


#: The one profile this process executes (authorize refuses others).
EXECUTABLE = {"rounding": "nearest-even", "subnormals": "preserved", "exceptional": "FiniteOrRefuse"}


# ------------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class CombineOrder:
    """A combine, named by its order id (Plan.order_id: tree order bound to the payload layout)."""

    order_id: str
    kind: ClassVar[str] = "combine"

    def __post_init__(self):
        if not isinstance(self.order_id, str) or len(self.order_id) != 64 or any(
            ch not in "0123456789abcdef" for ch in self.order_id
        ):
            raise _invalid(f"a combine order id is a 64-digit lower-case hex digest, got {self.order_id!r}")

    def to_dict(self) -> dict:
        return {"kind": "combine", "order_id": self.order_id}

    def describe(self) -> str:
        return f"combine order {self.order_id[:16]}"


@dataclass(frozen=True)
class Formula:
    """A formula id with its exact evaluation order (formulas.py)."""

    formula_id: str
    expression: str
    kind: ClassVar[str] = "formula"

    def __post_init__(self):
        if not isinstance(self.formula_id, str) or not self.formula_id:
            raise _invalid(f"a formula id is a non-empty string, got {self.formula_id!r}")
        if not isinstance(self.expression, str) or not self.expression:
            raise _invalid(f"formula {self.formula_id!r} needs its evaluation order as text")

    @classmethod
    def named(cls, formula_id: str) -> "Formula":
        fid = ALIASES.get(formula_id, formula_id)
        if fid not in FORMULAS:
            raise _invalid(f"formula {formula_id!r} is unknown (known: {', '.join(sorted(FORMULAS))})")
        return cls(fid, FORMULAS[fid])

    def to_dict(self) -> dict:
        return {"kind": "formula", "id": self.formula_id, "expression": self.expression}

    def describe(self) -> str:
        return f"formula {self.formula_id} ({self.expression})"


def _operation_from_dict(d):
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "combine":
        _keys(d, "operation", {"kind", "order_id"})
        return CombineOrder(d["order_id"])
    if kind == "formula":
        _keys(d, "operation", {"kind", "id", "expression"})
        return Formula(d["id"], d["expression"])
    raise _invalid(f"operation {d!r} is neither a combine nor a formula")


# -------------------------------------------------------------------------------- relations


def _hexfloat(x):
    return None if x is None else float(x).hex()


def _readfloat(x, what):
    if x is None:
        return None
    if isinstance(x, str):
        try:
            return float.fromhex(x)
        except ValueError:
            raise _invalid(f"{what} {x!r} is not a hex float") from None
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise _invalid(f"{what} must be a number, got {x!r}")


@dataclass(frozen=True)
class BitIdentical:
    kind: ClassVar[str] = "BitIdentical"

    def to_dict(self, evidence=True) -> dict:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Unchecked:
    kind: ClassVar[str] = "Unchecked"

    def to_dict(self, evidence=True) -> dict:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Tolerance:
    """Largest admitted difference from the binary64 oracle: ulps and/or absolute error."""

    max_ulp: int | None = None
    max_abs: float | None = None

    def __post_init__(self):
        if self.max_ulp is None and self.max_abs is None:
            raise _invalid("a tolerance bounds max_ulp, max_abs or both")
        if self.max_ulp is not None and (isinstance(self.max_ulp, bool) or not isinstance(self.max_ulp, int) or self.max_ulp < 0):
            raise _invalid(f"max_ulp must be an int >= 0, got {self.max_ulp!r}")
        if self.max_abs is not None:
            if isinstance(self.max_abs, bool) or not isinstance(self.max_abs, (int, float)):
                raise _invalid(f"max_abs must be a float, got {self.max_abs!r}")
            object.__setattr__(self, "max_abs", float(self.max_abs))
            if not math.isfinite(self.max_abs) or self.max_abs < 0:
                raise _invalid(f"max_abs must be finite and >= 0, got {self.max_abs!r}")

    def violations(self, max_ulp: int, max_abs: float) -> list:
        """What exceeds this tolerance, as readable phrases (empty when within it)."""
        out = []
        if self.max_ulp is not None and not (max_ulp <= self.max_ulp):
            out.append(f"max ulp {max_ulp} > {self.max_ulp}")
        if self.max_abs is not None and not (max_abs <= self.max_abs):
            out.append(f"max abs error {max_abs!r} > {self.max_abs!r}")
        return out

    def to_dict(self) -> dict:
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
    kernel build. Written by conformance.measure_evidence, which actually runs the suite."""

    suite: str
    suite_size: int  # cases in the suite
    build_id: str  # alpha_mpi.kernel.build_info()["build_id"] of the kernel that ran it
    max_ulp: int
    max_abs: float
    coordinates: int = 0  # binary64 results compared

    def __post_init__(self):
        if not isinstance(self.suite, str) or not self.suite:
            raise _invalid(f"evidence must name its suite, got {self.suite!r}")
        if isinstance(self.suite_size, bool) or not isinstance(self.suite_size, int) or self.suite_size < 1:
            raise _invalid(f"evidence suite_size must be an int >= 1, got {self.suite_size!r}")
        if not isinstance(self.build_id, str) or not self.build_id:
            raise _invalid(f"evidence must name the kernel build id, got {self.build_id!r}")
        if isinstance(self.max_ulp, bool) or not isinstance(self.max_ulp, int) or self.max_ulp < 0:
            raise _invalid(f"evidence max_ulp must be an int >= 0, got {self.max_ulp!r}")
        object.__setattr__(self, "max_abs", float(self.max_abs))
        if not math.isfinite(self.max_abs) or self.max_abs < 0:
            raise _invalid(f"evidence max_abs must be finite and >= 0, got {self.max_abs!r}")

    def to_dict(self) -> dict:
        return {
            "suite": self.suite,
            "suite_size": self.suite_size,
            "build_id": self.build_id,
            "max_ulp": self.max_ulp,
            "max_abs": _hexfloat(self.max_abs),
            "coordinates": self.coordinates,
        }

    @classmethod
    def from_dict(cls, d) -> "ConformanceEvidence":
        _keys(d, "evidence", {"suite", "suite_size", "build_id", "max_ulp", "max_abs", "coordinates"})
        return cls(d["suite"], d["suite_size"], d["build_id"], d["max_ulp"],
                   _readfloat(d["max_abs"], "evidence max_abs"), d["coordinates"])


@dataclass(frozen=True)
class BoundedDifference:
    """Within `tolerance` of the binary64 oracle over the named conformance suite. Executes only
    with evidence measured on this kernel build and within the tolerance."""

    tolerance: Tolerance
    suite: str = DEFAULT_SUITE
    evidence: ConformanceEvidence | None = field(default=None, compare=False)
    kind: ClassVar[str] = "BoundedDifference"

    def __post_init__(self):
        if not isinstance(self.tolerance, Tolerance):
            raise _invalid(f"BoundedDifference needs a Tolerance, got {self.tolerance!r}")
        if not isinstance(self.suite, str) or not self.suite:
            raise _invalid(f"BoundedDifference must name a conformance suite, got {self.suite!r}")
        if self.evidence is not None and not isinstance(self.evidence, ConformanceEvidence):
            raise _invalid(f"evidence must be ConformanceEvidence, got {self.evidence!r}")

    def with_evidence(self, evidence) -> "BoundedDifference":
        return replace(self, evidence=evidence)

    def to_dict(self, evidence=True) -> dict:
        d = {"kind": self.kind, "suite": self.suite, **self.tolerance.to_dict()}
        if evidence:
            d["evidence"] = None if self.evidence is None else self.evidence.to_dict()
        return d


def _relation_from_dict(d):
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind == "BitIdentical":
        _keys(d, "relation", {"kind"})
        return BitIdentical()
    if kind == "Unchecked":
        _keys(d, "relation", {"kind"})
        return Unchecked()
    if kind == "BoundedDifference":
        _keys(d, "relation", {"kind", "suite", "max_ulp", "max_abs", "evidence"}, optional={"evidence"})
        ev = d.get("evidence")
        return BoundedDifference(
            Tolerance(d["max_ulp"], _readfloat(d["max_abs"], "tolerance max_abs")),
            d["suite"],
            None if ev is None else ConformanceEvidence.from_dict(ev),
        )
    raise _invalid(f"relation {d!r} is not BitIdentical, BoundedDifference or Unchecked")


RELATIONS = (BitIdentical, BoundedDifference, Unchecked)


# --------------------------------------------------------------------------------- contract


def _keys(d, what, required, optional=frozenset()):
    if not isinstance(d, dict):
        raise _invalid(f"{what} must be a dict, got {type(d).__name__}")
    missing = sorted(set(required) - set(optional) - set(d))
    extra = sorted(set(d) - set(required))
    if missing or extra:
        raise _invalid(f"{what} {d!r}: missing keys {missing}, unknown keys {extra}")


@dataclass(frozen=True)
class NumericalContract:
    profile: Profile
    operations: tuple
    relation: object = BitIdentical()

    def __post_init__(self):
        if not isinstance(self.profile, Profile):
            raise _invalid(f"profile must be a Profile, got {self.profile!r}")
        ops = tuple(self.operations)
        object.__setattr__(self, "operations", ops)
        if not ops:
            raise _invalid("a contract names at least one operation")
        for op in ops:
            if not isinstance(op, (CombineOrder, Formula)):
                raise _invalid(f"operation {op!r} is neither a CombineOrder nor a Formula")
        if not isinstance(self.relation, RELATIONS):
            raise _invalid(f"relation {self.relation!r} is not BitIdentical, BoundedDifference or Unchecked")

    # -- identity --------------------------------------------------------------------------
    def canonical(self) -> bytes:
        """The canonical byte form the digest is taken over (evidence excluded)."""
        body = self.to_dict(evidence=False)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @property
    def digest(self) -> str:
        d = self.__dict__.get("_digest")
        if d is None:
            d = hashlib.sha256(_DIGEST_TAG + self.canonical()).hexdigest()
            object.__setattr__(self, "_digest", d)
        return d

    @property
    def order_ids(self) -> tuple:
        return tuple(op.order_id for op in self.operations if isinstance(op, CombineOrder))

    @property
    def formulas(self) -> tuple:
        return tuple(op for op in self.operations if isinstance(op, Formula))

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self, evidence: bool = True) -> dict:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "profile": self.profile.to_dict(),
            "operations": [op.to_dict() for op in self.operations],
            "relation": self.relation.to_dict(evidence=evidence),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, d) -> "NumericalContract":
        _keys(d, "contract", {"format", "version", "profile", "operations", "relation"})
        if d["format"] != FORMAT_NAME or d["version"] != FORMAT_VERSION:
            raise _invalid(
                f"contract format {d['format']!r} version {d['version']!r}; this alpha_mpi reads "
                f"{FORMAT_NAME!r} version {FORMAT_VERSION}"
            )
        if not isinstance(d["operations"], list):
            raise _invalid("contract operations must be a list")
        return cls(
            Profile.from_dict(d["profile"]),
            tuple(_operation_from_dict(op) for op in d["operations"]),
            _relation_from_dict(d["relation"]),
        )

    @classmethod
    def from_json(cls, text: str) -> "NumericalContract":
        return cls.from_dict(json.loads(text))

    # -- use -------------------------------------------------------------------------------
    def with_evidence(self, evidence) -> "NumericalContract":
        if not isinstance(self.relation, BoundedDifference):
            raise _invalid(f"only a BoundedDifference contract carries evidence; this one is {self.relation.kind}")
        return replace(self, relation=self.relation.with_evidence(evidence))

    def authorize(self, plan=None) -> "NumericalContract":
        return authorize(self, plan=plan)

    def claim_equal(self, result, reference, *, layout=None) -> None:
        return claim_equal(self, result, reference, layout=layout)

    assert_equal = claim_equal

    def describe(self) -> str:
        ops = "; ".join(op.describe() for op in self.operations)
        rel = self.relation.kind
        if isinstance(self.relation, BoundedDifference):
            rel += f"({self.relation.tolerance} over {self.relation.suite})"
        return f"contract {self.digest[:16]}: {rel}; ops: {ops}"

    def __repr__(self):
        return f"NumericalContract({self.describe()})"


Contract = NumericalContract


def _as_contract(c, what):
    if isinstance(c, NumericalContract):
        return c
    if isinstance(c, dict):
        return NumericalContract.from_dict(c)
    raise _invalid(f"{what} is not a NumericalContract or its to_dict(), got {type(c).__name__}")


# ------------------------------------------------------------------------------ compatibility


def numerical_compatibility(ours, theirs, *, ours_name: str = "this run", theirs_name: str = "the peer") -> None:
    """Refuse a peer or checkpoint whose profile (NumericalProfileMismatch) or operation order
    (NumericalOrderMismatch) differs from ours; return None when they are compatible.

    Either side may be a contract or its `to_dict()`. The relation is not compared: two sides
    with the same profile and operations compute the same bits; what may be *claimed* about them
    is each side's own business (and the frame digest still tells them apart).
    """
    a = _as_contract(ours, ours_name)
    b = _as_contract(theirs, theirs_name)
    diffs = [
        f"{f}: {ours_name} {a.profile.describe_field(f)}, {theirs_name} {b.profile.describe_field(f)}"
        for f in Profile.FIELDS
        if getattr(a.profile, f) != getattr(b.profile, f)
    ]
    if diffs:
        raise NumericalProfileMismatch(
            "numerical profiles differ: " + "; ".join(diffs),
            fields=[d.split(":", 1)[0] for d in diffs],
        )
    if a.operations != b.operations:
        n = min(len(a.operations), len(b.operations))
        i = next((k for k in range(n) if a.operations[k] != b.operations[k]), n)
        left = a.operations[i].describe() if i < len(a.operations) else "nothing"
        right = b.operations[i].describe() if i < len(b.operations) else "nothing"
        hint = ""
        if i < n and isinstance(a.operations[i], CombineOrder) and isinstance(b.operations[i], CombineOrder):
            hint = " (another tree shape, slot order or payload layout)"
        raise NumericalOrderMismatch(
            f"operation #{i} differs: {ours_name} has {left}, {theirs_name} has {right}{hint}",
            position=i,
        )
    return None


# ------------------------------------------------------------------------------- authorization

_BUILD_ID = None


def kernel_build_id() -> str:
    global _BUILD_ID
    if _BUILD_ID is None:
        from .. import kernel

        _BUILD_ID = kernel.build_info()["build_id"]
    return _BUILD_ID


def check_live_profile(profile: Profile) -> dict:
    """Refuse a profile this process cannot execute, or a floating-point environment that is off
    profile (kernel.fpenv_check: FTZ/DAZ on, or rounding not to nearest). Returns the FP state."""
    wrong = [
        f"{k} {getattr(profile, k)!r} (this process executes {v!r})"
        for k, v in EXECUTABLE.items()
        if getattr(profile, k) != v
    ]
    if wrong:
        raise NumericalProfileMismatch("the contract's profile cannot execute here: " + "; ".join(wrong), fields=list(EXECUTABLE))
    from .. import kernel

    return kernel.fpenv_check()


def check_evidence(relation: BoundedDifference) -> ConformanceEvidence:
    """The conformance-evidence rules of a BoundedDifference; returns the evidence if it holds."""
    ev = relation.evidence
    if ev is None:
        raise ContractRefusal(
            "bounded-difference-without-evidence",
            f"a BoundedDifference ({relation.tolerance}) over suite {relation.suite!r} carries no "
            "conformance evidence; a tolerance alone never authorizes execution",
            suite=relation.suite,
        )
    if ev.suite != relation.suite:
        raise ContractRefusal(
            "bounded-difference-without-evidence",
            f"the evidence was measured over suite {ev.suite!r}, the contract names suite {relation.suite!r}",
            suite=relation.suite,
        )
    from .conformance import SUITES

    suite = SUITES.get(relation.suite)
    if suite is None:
        raise ContractRefusal(
            "conformance-suite-unknown",
            f"suite {relation.suite!r} is not registered (known: {', '.join(sorted(SUITES))})",
        )
    if ev.suite_size != suite.size:
        raise ContractRefusal(
            "bounded-difference-without-evidence",
            f"the evidence covers {ev.suite_size} case(s) of suite {suite.name!r}, which has {suite.size}; "
            "evidence must come from the whole suite",
            suite=suite.name,
        )
    live = kernel_build_id()
    if ev.build_id != live:
        raise ContractRefusal(
            "evidence-build-mismatch",
            f"the evidence was recorded for kernel build {ev.build_id[:16]}, this process runs build {live[:16]}",
            recorded=ev.build_id,
            live=live,
        )
    over = relation.tolerance.violations(ev.max_ulp, ev.max_abs)
    if over:
        raise ContractRefusal(
            "evidence-outside-tolerance",
            f"suite {ev.suite!r} on build {ev.build_id[:16]} measured {'; '.join(over)} "
            f"(tolerance {relation.tolerance})",
            max_ulp=ev.max_ulp,
            max_abs=ev.max_abs,
        )
    return ev


def authorize(contract, *, plan=None) -> NumericalContract:
    """Authorization to execute `contract` in this process (optionally for `plan`).

    - the profile must be the executable one and the live FP environment on profile;
    - with `plan`, its order id must be a combine the contract names (NumericalOrderMismatch);
    - BitIdentical and Unchecked execute; BoundedDifference only with conformance evidence for
      its suite, measured on this kernel build and within its tolerance.
    Returns the contract; refuses by name otherwise.
    """
    c = _as_contract(contract, "the contract")
    check_live_profile(c.profile)
    if plan is not None:
        oid = getattr(plan, "order_id", plan)
        if oid not in c.order_ids:
            named = ", ".join(o[:16] for o in c.order_ids) or "no combine"
            raise NumericalOrderMismatch(
                f"the plan combines in order {str(oid)[:16]}, the contract names {named} "
                "(another tree shape, slot order or payload layout)",
            )
    if isinstance(c.relation, BoundedDifference):
        check_evidence(c.relation)
    return c


def claim_equal(contract, result, reference, *, layout=None) -> None:
    """Claim that `result` is related to the oracle's `reference` as the contract says.

    BitIdentical: the bits must be equal. BoundedDifference: the contract must be authorized
    (evidence) and every coordinate within its tolerance. Unchecked: always refused. A failed
    claim raises `oracle-mismatch` naming the coordinates that differ.
    """
    c = _as_contract(contract, "the contract")
    if isinstance(c.relation, Unchecked):
        raise ContractRefusal(
            "unchecked-claimed-equal",
            f"contract {c.digest[:16]} is Unchecked: its results may be used but never claimed equal to a reference",
        )
    from .oracle_check import compare

    if isinstance(c.relation, BitIdentical):
        compare(result, reference, layout=layout, what=f"contract {c.digest[:16]} (BitIdentical)")
    else:
        authorize(c)
        compare(result, reference, layout=layout, tolerance=c.relation.tolerance,
                what=f"contract {c.digest[:16]} (BoundedDifference {c.relation.tolerance})")


# ------------------------------------------------------------------------------- standard ones


def _optimizer_formula(optimizer):
    if optimizer is None:
        return None
    if isinstance(optimizer, Formula):
        return optimizer
    if isinstance(optimizer, str):
        return Formula.named(optimizer)
    raise _invalid(f"optimizer must be a formula id ({', '.join(sorted(FORMULAS))}) or a Formula, got {optimizer!r}")


def contract_for_plan(plan, optimizer=None, *, normalize=None, relation=None, contributions: str = "binary64"):
    """The standard contract of a combine plan (and the learner using it).

    profile: binary64, nearest-even, subnormals preserved, FiniteOrRefuse; contributions enter
    the tree as binary64 (`KeepFormat`), or with `contributions="binary32"` through an explicit
    `RoundBinary64` then `WidenBinary32` site (a BoundedDifference operation).
    operations: the plan's order id; then `normalize-once` (default: when the layout has a
    `mass` component); then the optimizer formula (`"adam-v1"`, `"sgd-momentum-v1"`, aliases
    `"adam"`, `"sgd"`, or a Formula). relation: BitIdentical unless given.
    """
    oid = getattr(plan, "order_id", None)
    if oid is None:
        raise _invalid(f"contract_for_plan needs a Plan (with an order_id), got {type(plan).__name__}")
    if contributions == "binary64":
        profile = Profile()
    elif contributions == "binary32":
        profile = Profile(("binary64", "binary32"), conversions=(RoundBinary64("contribution"), WidenBinary32("contribution")))
    else:
        raise _invalid(f"contributions must be 'binary64' or 'binary32', got {contributions!r}")
    ops = [CombineOrder(oid)]
    if normalize is None:
        layout = getattr(plan, "layout", None)
        normalize = layout is not None and "mass" in getattr(layout, "offsets", {})
    if normalize:
        ops.append(Formula.named("normalize-once"))
    f = _optimizer_formula(optimizer)
    if f is not None:
        ops.append(f)
    return NumericalContract(profile, tuple(ops), BitIdentical() if relation is None else relation)
