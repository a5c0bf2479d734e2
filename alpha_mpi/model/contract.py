"""Numerical contracts: (profile, operations, relation), as frozen, hashable data.

DESIGN.md "Numerical contracts". A contract says what a combine or a learner computes, bit for
bit, and how its result may be related to the independent oracle:

- **profile** (profile.py): formats, rounding, subnormals, exceptional values and the
  conversions at each site;
- **operations** (operations.py): the ordered list of what runs: the combine's order id (a
  Plan's `layout_order_id`), then formula ids with their exact evaluation order (formulas.py);
- **relation** (relation.py): `BitIdentical`, `BoundedDifference(tolerance)` or `Unchecked`;
- **compute** (compute.py, a learner's contract only): the compute identity the slots' bits depend
  on (its compared fields), or `MachineIndependent(declared_by)`; None for a bare combine.
  `numerical_compatibility` does not compare it: peers compare identities when a learner is
  built (`compute-mismatch`), a checkpoint's is compared on resume (`compute-changed`).

`digest` is sha256 over a canonical JSON form with a domain prefix (never `hash()`), so it is the
same in every process and on every machine; frames carry it (Combiner(contract=c.digest)) and
checkpoints store `to_dict()`. The digest names what the contract *means*: conformance evidence
travels in `to_dict()` but is not part of the digest, equality or hash.

Format version 2 keys a combine's id `layout_order_id`; version 1 (0.1 and early 0.2) keyed the
same value `order_id`. `from_dict` reads both; `digest_in(1)` is the digest a version-1 record was
stored with (checkpoint manifests of that format are checked against it). The `compute` key is
written only when a contract has one, so every contract without it keeps its digest.

Pure data (layer 1): no numpy, no kernel. Whether a contract may execute *here* (live FP
environment, evidence on this kernel build) is decided next to the kernel, by
`alpha_mpi.numerics.authorization` (`authorize(contract, plan)`, `claim_equal(contract, ...)`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, replace

from ..refusals import NumericalOrderMismatch, NumericalProfileMismatch
from .compute import ComputeIdentity, MachineIndependent, compute_from_dict
from .formulas import FORMULAS
from .operations import CombineOrder, Formula, operation_from_dict
from .profile import Profile, RoundBinary64, WidenBinary32, check_keys, invalid
from .relation import RELATIONS, BitIdentical, BoundedDifference, Relation, relation_from_dict

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "NumericalContract",
    "Contract",
    "as_contract",
    "numerical_compatibility",
    "contract_for_plan",
]

FORMAT_NAME = "alpha-mpi/numerical-contract"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
_DIGEST_TAG = b"alpha-mpi/numerical-contract/v1\0"


@dataclass(frozen=True)
class NumericalContract:
    """`(profile, operations, relation)`: what runs, bit for bit, and what may be claimed of it.

    - `profile`: a `Profile`;
    - `operations`: a non-empty sequence of `CombineOrder` and `Formula`, in the order they run;
    - `relation`: `BitIdentical()` (default), `BoundedDifference(...)` or `Unchecked()`;
    - `compute`: a `ComputeIdentity` (its compared fields), `MachineIndependent(...)` or None.

    Refuses anything else with `numerical-contract-invalid`. Build the standard one of a plan with
    `contract_for_plan(plan, optimizer=...)`; compare two with `numerical_compatibility`.
    """

    profile: Profile
    operations: tuple[CombineOrder | Formula, ...]
    relation: Relation = BitIdentical()
    compute: ComputeIdentity | MachineIndependent | None = None

    def __post_init__(self):
        if not isinstance(self.profile, Profile):
            raise invalid(f"profile must be a Profile, got {self.profile!r}")
        ops = tuple(self.operations)
        object.__setattr__(self, "operations", ops)
        if not ops:
            raise invalid("a contract names at least one operation")
        for op in ops:
            if not isinstance(op, (CombineOrder, Formula)):
                raise invalid(f"operation {op!r} is neither a CombineOrder nor a Formula")
        if not isinstance(self.relation, RELATIONS):
            raise invalid(f"relation {self.relation!r} is not BitIdentical, BoundedDifference or Unchecked")
        if isinstance(self.compute, ComputeIdentity):
            object.__setattr__(self, "compute", self.compute.compared())
        elif self.compute is not None and not isinstance(self.compute, MachineIndependent):
            raise invalid(f"compute {self.compute!r} is not a ComputeIdentity, MachineIndependent or None")

    # -- identity --------------------------------------------------------------------------
    def canonical(self, version: int = FORMAT_VERSION) -> bytes:
        """The canonical byte form the digest is taken over (evidence excluded)."""
        body = self.to_dict(evidence=False, version=version)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @property
    def digest(self) -> str:
        """sha256 (hex) of the domain tag and `canonical()`: the same in every process."""
        d = self.__dict__.get("_digest")
        if d is None:
            d = self.digest_in(FORMAT_VERSION)
            object.__setattr__(self, "_digest", d)
        return d

    def digest_in(self, version: int) -> str:
        """The digest of this contract written in format `version` (1: what records stored by 0.1
        and early 0.2 name it by; `digest` is the current format's)."""
        return hashlib.sha256(_DIGEST_TAG + self.canonical(version)).hexdigest()

    @property
    def layout_order_ids(self) -> tuple:
        """The layout order ids of the combines this contract names."""
        return tuple(op.layout_order_id for op in self.operations if isinstance(op, CombineOrder))

    @property
    def order_ids(self) -> tuple:
        """Deprecated: `layout_order_ids` (what a contract's combines name is the layout order id)."""
        warnings.warn(
            "NumericalContract.order_ids is deprecated: use .layout_order_ids",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.layout_order_ids

    @property
    def formulas(self) -> tuple:
        """The `Formula` operations, in order."""
        return tuple(op for op in self.operations if isinstance(op, Formula))

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self, evidence: bool = True, version: int = FORMAT_VERSION) -> dict:
        """The contract as JSON-able data (what checkpoints store); `from_dict` reads it back.
        `version=1` writes the former format (to check records stored in it)."""
        if version not in READ_VERSIONS:
            raise invalid(f"contract format version {version!r}; this alpha_mpi writes versions 1 and 2")
        out = {
            "format": FORMAT_NAME,
            "version": version,
            "profile": self.profile.to_dict(),
            "operations": [op.to_dict(version) for op in self.operations],
            "relation": self.relation.to_dict(evidence=evidence),
        }
        if self.compute is not None:
            out["compute"] = self.compute.to_dict()
        return out

    def to_json(self) -> str:
        """`to_dict()` as indented JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, d) -> NumericalContract:
        """Read `to_dict()`'s form (format version 2, or 1 whose combines key their id
        `order_id`); refuses another format or version, unknown or missing keys."""
        check_keys(
            d, "contract", {"format", "version", "profile", "operations", "relation", "compute"}, {"compute"}
        )
        version = d["version"]
        if d["format"] != FORMAT_NAME or type(version) is not int or version not in READ_VERSIONS:
            raise invalid(
                f"contract format {d['format']!r} version {version!r}; this alpha_mpi reads "
                f"{FORMAT_NAME!r} versions {', '.join(map(str, READ_VERSIONS))}"
            )
        if not isinstance(d["operations"], list):
            raise invalid("contract operations must be a list")
        return cls(
            Profile.from_dict(d["profile"]),
            tuple(operation_from_dict(op, version) for op in d["operations"]),
            relation_from_dict(d["relation"]),
            compute_from_dict(d["compute"]) if "compute" in d else None,
        )

    @classmethod
    def from_json(cls, text: str) -> NumericalContract:
        """Read `to_json()`'s text."""
        return cls.from_dict(json.loads(text))

    # -- use -------------------------------------------------------------------------------
    def with_evidence(self, evidence) -> NumericalContract:
        """The same BoundedDifference contract carrying `evidence` (same digest); refuses others."""
        if not isinstance(self.relation, BoundedDifference):
            raise invalid(
                f"only a BoundedDifference contract carries evidence; this one is {self.relation.kind}"
            )
        return replace(self, relation=self.relation.with_evidence(evidence))

    def __getattr__(self, name):
        # The 0.1 methods that authorised or compared results needed the kernel, a layer below
        # this data: say where they went instead of a bare AttributeError.
        moved = {"authorize": "authorize", "claim_equal": "claim_equal", "assert_equal": "claim_equal"}
        if name in moved:
            raise AttributeError(
                f"NumericalContract.{name} moved to alpha_mpi.numerics.{moved[name]}(contract, ...): "
                "a contract is data; authorising it or comparing results needs the kernel's evidence"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def describe(self) -> str:
        """One line: digest prefix, relation, operations."""
        ops = "; ".join(op.describe() for op in self.operations)
        rel = self.relation.kind
        if isinstance(self.relation, BoundedDifference):
            rel += f"({self.relation.tolerance} over {self.relation.suite})"
        comp = "" if self.compute is None else f"; compute: {self.compute.describe()}"
        return f"contract {self.digest[:16]}: {rel}; ops: {ops}{comp}"

    def __repr__(self):
        return f"NumericalContract({self.describe()})"


Contract = NumericalContract


def as_contract(c: NumericalContract | dict, what: str) -> NumericalContract:
    """`c` itself, or the contract its `to_dict()` describes; refuses anything else."""
    if isinstance(c, NumericalContract):
        return c
    if isinstance(c, dict):
        return NumericalContract.from_dict(c)
    raise invalid(f"{what} is not a NumericalContract or its to_dict(), got {type(c).__name__}")


def numerical_compatibility(
    ours: NumericalContract | dict,
    theirs: NumericalContract | dict,
    *,
    ours_name: str = "this run",
    theirs_name: str = "the peer",
) -> None:
    """Refuse a peer or checkpoint whose profile (NumericalProfileMismatch) or operation order
    (NumericalOrderMismatch) differs from ours; return None when they are compatible.

    Either side may be a contract or its `to_dict()`. The relation is not compared: two sides
    with the same profile and operations compute the same bits; what may be *claimed* about them
    is each side's own business (and the frame digest still tells them apart). Nor is `compute`:
    a learner compares compute identities by name (`compute-mismatch` across ranks when it is
    built, `compute-changed` against a checkpoint, alpha_mpi.checkpoint.compatibility).
    """
    a = as_contract(ours, ours_name)
    b = as_contract(theirs, theirs_name)
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


def _optimizer_formula(optimizer: str | Formula | None) -> Formula | None:
    if optimizer is None:
        return None
    if isinstance(optimizer, Formula):
        return optimizer
    if isinstance(optimizer, str):
        return Formula.named(optimizer)
    known = ", ".join(sorted(FORMULAS))
    raise invalid(f"optimizer must be a formula id ({known}) or a Formula, got {optimizer!r}")


def contract_for_plan(
    plan: object,
    optimizer: str | Formula | None = None,
    *,
    normalize: bool | None = None,
    relation: Relation | None = None,
    contributions: str = "binary64",
    compute: ComputeIdentity | MachineIndependent | None = None,
) -> NumericalContract:
    """The standard contract of a combine plan (and the learner using it).

    profile: binary64, nearest-even, subnormals preserved, FiniteOrRefuse; contributions enter
    the tree as binary64 (`KeepFormat`), or with `contributions="binary32"` through an explicit
    `RoundBinary64` then `WidenBinary32` site (a BoundedDifference operation).
    operations: the plan's layout order id; then `normalize-once` (default: when the layout has a
    `mass` component); then the optimizer formula (`"adam-v1"`, `"adamw-v1"`, `"sgd-momentum-v1"`,
    aliases `"adam"`, `"adamw"`, `"sgd"`, or a Formula). relation: BitIdentical unless given. compute: what the
    slots' bits depend on (a learner's; see alpha_mpi.model.compute), None for a bare combine.
    Takes any plan or learner (with a `layout_order_id`; optionally a `layout`); refuses anything
    else (a tree's `order_id` is not bound to a payload layout).
    """
    oid = getattr(plan, "layout_order_id", None)
    if oid is None:
        raise invalid(f"contract_for_plan needs a Plan (with a layout_order_id), got {type(plan).__name__}")
    if contributions == "binary64":
        profile = Profile()
    elif contributions == "binary32":
        site = (RoundBinary64("contribution"), WidenBinary32("contribution"))
        profile = Profile(("binary64", "binary32"), conversions=site)
    else:
        raise invalid(f"contributions must be 'binary64' or 'binary32', got {contributions!r}")
    ops: list[CombineOrder | Formula] = [CombineOrder(oid)]
    if normalize is None:
        layout = getattr(plan, "layout", None)
        normalize = layout is not None and "mass" in getattr(layout, "offsets", {})
    if normalize:
        ops.append(Formula.named("normalize-once"))
    f = _optimizer_formula(optimizer)
    if f is not None:
        ops.append(f)
    return NumericalContract(profile, tuple(ops), BitIdentical() if relation is None else relation, compute)
