"""Authorization: may this contract execute in this process, on this kernel build? (layer 3)

A contract is data (alpha_mpi.model.contract); whether it may *run here* depends on the kernel:
the live floating-point environment (FTZ/DAZ, rounding) and, for a BoundedDifference, the
conformance evidence recorded for this kernel build (evidence.py measures it).

- `authorize(contract, plan=None)`: refuses what may not execute; returns the contract;
- `claim_equal(contract, result, reference)`: refuses a result not related to the oracle's
  reference as the contract says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import kernel
from ..kernel.env import FpEnvState
from ..model.contract import NumericalContract, as_contract
from ..model.layout import Layout
from ..model.profile import ContractRefusal, Profile
from ..model.relation import BitIdentical, BoundedDifference, ConformanceEvidence, Unchecked
from ..planning.base import PlanBase
from ..refusals import NumericalOrderMismatch, NumericalProfileMismatch
from .evidence import SUITES, kernel_build_id
from .oracle_check import compare

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "EXECUTABLE",
    "kernel_build_id",
    "check_live_profile",
    "check_evidence",
    "authorize",
    "claim_equal",
]

#: The one profile this process executes (authorize refuses others).
EXECUTABLE = {"rounding": "nearest-even", "subnormals": "preserved", "exceptional": "FiniteOrRefuse"}


def check_live_profile(profile: Profile) -> FpEnvState:
    """Refuse a profile this process cannot execute, or a floating-point environment that is off
    profile (kernel.fpenv_check: FTZ/DAZ on, or rounding not to nearest). Returns the FP state."""
    wrong = [
        f"{k} {getattr(profile, k)!r} (this process executes {v!r})"
        for k, v in EXECUTABLE.items()
        if getattr(profile, k) != v
    ]
    if wrong:
        raise NumericalProfileMismatch(
            "the contract's profile cannot execute here: " + "; ".join(wrong), fields=list(EXECUTABLE)
        )
    return kernel.fpenv_check()


def _no_evidence(message: str, suite: str) -> ContractRefusal:
    return ContractRefusal("bounded-difference-without-evidence", message, suite=suite)


def check_evidence(relation: BoundedDifference) -> ConformanceEvidence:
    """The conformance-evidence rules of a BoundedDifference; returns the evidence if it holds.

    Refuses `bounded-difference-without-evidence` (none, another suite, part of a suite),
    `conformance-suite-unknown`, `evidence-build-mismatch` (another kernel build) and
    `evidence-outside-tolerance`.
    """
    ev = relation.evidence
    if ev is None:
        raise _no_evidence(
            f"a BoundedDifference ({relation.tolerance}) over suite {relation.suite!r} carries no "
            "conformance evidence; a tolerance alone never authorizes execution",
            relation.suite,
        )
    if ev.suite != relation.suite:
        raise _no_evidence(
            f"the evidence was measured over suite {ev.suite!r}, the contract names suite {relation.suite!r}",
            relation.suite,
        )
    suite = SUITES.get(relation.suite)
    if suite is None:
        raise ContractRefusal(
            "conformance-suite-unknown",
            f"suite {relation.suite!r} is not registered (known: {', '.join(sorted(SUITES))})",
        )
    if ev.suite_size != suite.size:
        raise _no_evidence(
            f"the evidence covers {ev.suite_size} case(s) of suite {suite.name!r}, which has {suite.size}; "
            "evidence must come from the whole suite",
            suite.name,
        )
    live = kernel_build_id()
    if ev.build_id != live:
        raise ContractRefusal(
            "evidence-build-mismatch",
            f"the evidence was recorded for kernel build {ev.build_id[:16]}, "
            f"this process runs build {live[:16]}",
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


def authorize(contract: NumericalContract | dict, *, plan: PlanBase | str | None = None) -> NumericalContract:
    """Authorization to execute `contract` (or its `to_dict()`) in this process, optionally for
    `plan` (a Plan or an order id).

    - the profile must be the executable one and the live FP environment on profile;
    - with `plan`, its order id must be a combine the contract names (NumericalOrderMismatch);
    - BitIdentical and Unchecked execute; BoundedDifference only with conformance evidence for
      its suite, measured on this kernel build and within its tolerance.
    Returns the contract; refuses by name otherwise.
    """
    c = as_contract(contract, "the contract")
    check_live_profile(c.profile)
    if plan is not None:
        oid = getattr(plan, "layout_order_id", plan)
        if oid not in c.layout_order_ids:
            named = ", ".join(o[:16] for o in c.layout_order_ids) or "no combine"
            raise NumericalOrderMismatch(
                f"the plan combines in order {str(oid)[:16]}, the contract names {named} "
                "(another tree shape, slot order or payload layout)",
            )
    if isinstance(c.relation, BoundedDifference):
        check_evidence(c.relation)
    return c


def claim_equal(
    contract: NumericalContract | dict,
    result: ArrayLike,
    reference: ArrayLike,
    *,
    layout: Layout | None = None,
) -> None:
    """Claim that `result` is related to the oracle's `reference` as the contract says.

    BitIdentical: the bits must be equal. BoundedDifference: the contract must be authorized
    (evidence) and every coordinate within its tolerance. Unchecked: always refused
    (`unchecked-claimed-equal`). A failed claim raises `oracle-mismatch` naming the coordinates
    that differ (and their payload components, given a `layout`).
    """
    c = as_contract(contract, "the contract")
    if isinstance(c.relation, Unchecked):
        raise ContractRefusal(
            "unchecked-claimed-equal",
            f"contract {c.digest[:16]} is Unchecked: its results may be used "
            "but never claimed equal to a reference",
        )
    if isinstance(c.relation, BitIdentical):
        compare(result, reference, layout=layout, what=f"contract {c.digest[:16]} (BitIdentical)")
    else:
        authorize(c)
        compare(
            result,
            reference,
            layout=layout,
            tolerance=c.relation.tolerance,
            what=f"contract {c.digest[:16]} (BoundedDifference {c.relation.tolerance})",
        )
