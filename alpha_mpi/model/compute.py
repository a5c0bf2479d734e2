"""The compute identity as data: what a slot's arithmetic ran on, and what a contract says of it.

DESIGN.md "The same bits on every machine". The combine and the optimizer update are alpha_mpi's
own fixed-order kernels: their bits do not depend on the machine. What a slot computes inside a
user's model (numpy's SIMD exp/log, a BLAS kernel, torch's CPU kernels) does. A `ComputeIdentity`
names those facts of one rank as stable `field -> text` pairs; alpha_mpi.kernel.compute_identity()
reads them from the live process (layer 3). This module is the pure data (layer 1).

Fields (each a short text; numpy's where a learner's slots compute with numpy, torch's where they
compute with torch; `alpha-mpi env` shows both):

    changes bits (compared: `COMPARED`)
    machine              the processor architecture (x86_64, aarch64): every SIMD path differs
    numpy.version        numpy's version: its SIMD loops (exp, log, ...) change between releases
    numpy.simd           the SIMD targets numpy dispatches to on this CPU (baseline + dispatched)
    blas.library         numpy's BLAS library and version (threadpoolctl: internal_api version)
    blas.kernel          the BLAS kernel it chose for this CPU (OpenBLAS's core type, MKL's ...)
    blas.threads         its thread count (a split of a sum over threads changes its order)
    torch.version        torch's version
    torch.capability     ATen's CPU capability (torch.backends.cpu.get_cpu_capability())
    torch.backends       torch's BLAS, MKL (and MKL_CBWR) and oneDNN (on/off) backends
    torch.deterministic  torch.are_deterministic_algorithms_enabled()
    torch.threads        torch's intra-op threads
    torch.device         the device the slots run on (cpu, or the GPU's name and capability)

    only recorded (named in `alpha-mpi env` and checkpoint manifests, never compared)
    cpu                  the processor's model name (the kernel fields say what matters of it)
    kernel.isa           alpha_mpi's kernel ISA path (its fixed-order functions give the same
                         bits on every path: tests/test_isa_conformance.py holds them to it)
    kernel.build         alpha_mpi's kernel build id

`digest` covers the compared fields only, so two ranks on different processor models that run
the same kernels have one digest. A learner's `NumericalContract.compute` holds either the
compared fields (`ComputeIdentity.compared()`: the slots' bits depend on them) or
`MachineIndependent(declared_by)`: the model declared (`Model.machine_independent`), or the
caller promised (`machine_independent=True`), that its slot results do not depend on them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .profile import invalid

__all__ = [
    "COMPARED",
    "RECORDED",
    "FIELDS",
    "ComputeIdentity",
    "MachineIndependent",
    "compute_from_dict",
]

COMPARED = (
    "machine",
    "numpy.version",
    "numpy.simd",
    "blas.library",
    "blas.kernel",
    "blas.threads",
    "torch.version",
    "torch.capability",
    "torch.backends",
    "torch.deterministic",
    "torch.threads",
    "torch.device",
)
"""The fields that change a slot's bits: ranks must agree on them (unless independent)."""
RECORDED = ("cpu", "kernel.isa", "kernel.build")
"""The fields only recorded (they say where a run ran, not what it computed)."""
FIELDS = COMPARED + RECORDED
_DIGEST_TAG = b"alpha-mpi/compute-identity/v1\0"
_MAX_TEXT = 200


@dataclass(frozen=True)
class ComputeIdentity:
    """One rank's compute identity: `fields`, a tuple of (name, text) pairs in `FIELDS` order.

    Build it from a dict with `ComputeIdentity.of({...})` (unknown names and non-text values are
    refused, `numerical-contract-invalid`); alpha_mpi.kernel.compute_identity() reads the live one.
    """

    fields: tuple[tuple[str, str], ...]

    def __post_init__(self):
        names = [k for k, _ in self.fields]
        for k, v in self.fields:
            if k not in FIELDS:
                raise invalid(f"compute identity field {k!r} is unknown (known: {', '.join(FIELDS)})")
            if not isinstance(v, str) or not v or len(v) > _MAX_TEXT:
                raise invalid(f"compute identity field {k} must be a text of 1..{_MAX_TEXT} characters")
        if names != [k for k in FIELDS if k in names]:
            raise invalid(f"compute identity fields {names} are not distinct and in FIELDS order")

    @classmethod
    def of(cls, values: dict) -> ComputeIdentity:
        """The identity holding `values` (name -> text), in FIELDS order."""
        if not isinstance(values, dict):
            raise invalid(f"a compute identity is a dict of texts, got {type(values).__name__}")
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise invalid(f"compute identity fields {unknown} are unknown (known: {', '.join(FIELDS)})")
        return cls(tuple((k, values[k]) for k in FIELDS if k in values))

    def get(self, name: str, default: str | None = None) -> str | None:
        """The text of field `name` (default when the identity has no such field)."""
        return dict(self.fields).get(name, default)

    def compared(self) -> ComputeIdentity:
        """The fields that change bits (COMPARED) only: what a contract records."""
        return ComputeIdentity(tuple((k, v) for k, v in self.fields if k in COMPARED))

    @property
    def digest(self) -> str:
        """sha256 (hex) of the compared fields' canonical JSON: the same for two ranks that
        compute alike, whatever they only record."""
        body = json.dumps(dict(self.compared().fields), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(_DIGEST_TAG + body.encode("utf-8")).hexdigest()

    def differences(self, other: ComputeIdentity) -> list[tuple[str, str, str]]:
        """[(field, this text, other's text)] for every compared field that differs (a field one
        side lacks reads "absent")."""
        mine, theirs = dict(self.fields), dict(other.fields)
        return [
            (k, mine.get(k, "absent"), theirs.get(k, "absent"))
            for k in COMPARED
            if (k in mine or k in theirs) and mine.get(k) != theirs.get(k)
        ]

    def describe(self) -> str:
        """One line: the compared fields, `name text; ...`."""
        return "; ".join(f"{k} {v}" for k, v in self.fields if k in COMPARED)

    def to_dict(self) -> dict:
        """{"kind": "compute-identity", "fields": {name: text}}: what contracts and manifests store."""
        return {"kind": "compute-identity", "fields": dict(self.fields)}


@dataclass(frozen=True)
class MachineIndependent:
    """A contract's word that the slots' results do not depend on the compute identity, and who
    said so: `declared_by` "model" (the model's `machine_independent = True`: it computes only
    with alpha_mpi's fixed-order functions) or "caller" (the learner's `machine_independent=True`,
    a promise the library cannot check; the audit names it when it turns out false)."""

    declared_by: str

    def __post_init__(self):
        if self.declared_by not in ("model", "caller"):
            raise invalid(
                f"machine independence is declared by 'model' or 'caller', not {self.declared_by!r}"
            )

    def describe(self) -> str:
        """One line for headers and messages."""
        how = "declared by the model" if self.declared_by == "model" else "promised by the caller"
        return f"machine-independent ({how})"

    def to_dict(self) -> dict:
        """{"kind": "machine-independent", "declared_by": ...}."""
        return {"kind": "machine-independent", "declared_by": self.declared_by}


def compute_from_dict(d) -> ComputeIdentity | MachineIndependent:
    """Read `to_dict()`'s form of either; refuses anything else (`numerical-contract-invalid`)."""
    if not isinstance(d, dict):
        raise invalid(f"a compute entry must be a dict, got {type(d).__name__}")
    kind = d.get("kind")
    if kind == "compute-identity" and set(d) == {"kind", "fields"}:
        return ComputeIdentity.of(d["fields"])
    if kind == "machine-independent" and set(d) == {"kind", "declared_by"}:
        return MachineIndependent(d["declared_by"])
    raise invalid(f"compute entry {str(d)[:120]} is neither a compute-identity nor machine-independent")
