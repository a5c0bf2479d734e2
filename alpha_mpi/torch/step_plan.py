"""What a DataParallel's steps are planned over, decided on one rank: `StepPlan`.

Apart from data_parallel.py (which builds the parts that talk to other ranks and holds the
public API) because this is pure planning from the module's checked parts and the arguments:
the declared precision, torch's environment (fixed here: threads, deterministic algorithms) and
the compute identity, the slot count's checks, the slot tree and its plan over the payload, this
rank's slots, the NumericalContract, the conversion sites and (audit_slots) the combine's longer
payload. Nothing here talks to another rank: a refusal raised here travels to every rank in the
constructor's first agreement round.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..learning.audit import audit_words, slot_owners
from ..learning.compute_check import ComputeCheck
from ..model import ReplicateAll, build
from ..planning import plan
from ..refusals import Refusal
from ._env import fix_environment, require_torch
from .contract_and_digest import torch_compute, torch_contract
from .devices import contract_environment
from .module_check import ModuleParts
from .payload import PayloadLayout
from .slot_rules import Precision, precision
from .step_agreement import MAX_SLOTS

if TYPE_CHECKING:
    import torch

    from ..model import Node
    from ..numerics import NumericalContract
    from ..planning import Plan
else:
    torch = require_torch()

__all__ = ["StepPlan", "default_topology", "replica_digests", "DIGESTS_EVERY"]

DIGESTS_EVERY = 100
"""The default `audit_digests` where replicas exist: the parameters compared every 100 steps
(measured on `alpha-mpi bench torch --model transformer`: docs/pytorch.md, below 1 % of the
step), so a rank whose `.grad` or parameters changed alone after a step is named within it."""


def replica_digests(audit_digests: int | None, size: int) -> int:
    """`audit_digests` as given, or (None) DIGESTS_EVERY with more than one rank, else 0 (one
    rank holds no replica to compare)."""
    if audit_digests is None:
        return DIGESTS_EVERY if size > 1 else 0
    return audit_digests


def default_topology() -> str:
    """The learners' default topology (DataParallelLearner's), so both follow one default."""
    from ..learning.learner import DataParallelLearner

    return inspect.signature(DataParallelLearner.__init__).parameters["topology"].default


def check_slots(slots: object, size: int) -> int:
    """`slots` as DataParallel takes it: an int from the rank count to MAX_SLOTS."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < size:
        raise Refusal(
            "placement-invalid",
            f"{slots!r} slots on {size} ranks leaves ranks without a contribution; use slots >= ranks",
        )
    if slots > MAX_SLOTS:  # the agreement words' sums stay exact below it (step_agreement.py)
        raise Refusal("placement-invalid", f"{slots} slots; DataParallel takes at most {MAX_SLOTS}")
    return slots


@dataclass(frozen=True)
class StepPlan:
    """The declared `precision`, torch's settings `env` and this rank's `compute` check, the
    slot `tree` over `slots`, its `plan` over the contract's payload layout (`payload`: the
    combine's, with the audit's words where asked; `combine_plan` its plan), this rank's
    `my_slots`, the `contract` and the `conversions` it names."""

    precision: Precision
    env: dict
    compute: ComputeCheck

    slots: int
    topology: str
    tree: Node
    plan: Plan
    combine_plan: Plan
    payload: PayloadLayout
    my_slots: list
    contract: NumericalContract
    conversions: tuple

    @property
    def layout_order_id(self) -> str:
        """What the contract and the frames name."""
        return self.plan.layout_order_id

    @classmethod
    def of(
        cls,
        parts: ModuleParts,
        size: int,
        rank: int,
        *,
        slots: int,
        topology: str | None,
        threads: int,
        autocast,
        machine_independent: bool,
        buffers: str,
        audit_slots: int,
    ) -> StepPlan:
        """The plan of `parts` on rank `rank` of `size` (the DataParallel's arguments)."""
        device = parts.params[0].device
        declared = precision(autocast, device, parts.dtype)
        if device.type == "cuda":  # deterministic cuBLAS needs it before its first call
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        env = fix_environment(threads)
        settings = contract_environment(env, device)
        compute = torch_compute(settings, machine_independent)
        slots = check_slots(slots, size)
        topology = default_topology() if topology is None else topology
        payload = PayloadLayout.of(parts.params, parts.float_buffers, slots)
        tree = build(topology, slots, size)
        step_plan = plan(tree, ReplicateAll(), payload.layout, size=size)
        contract = torch_contract(
            step_plan.layout_order_id, parts.dtype, settings, buffers, declared.name, compute.spec
        )
        # With audit_slots the combine carries the audit's words after the agreement words
        # (learning/audit.py): the same tree over a longer payload, every coordinate's bits
        # as before; the contract names the layout without them (an audited run and an
        # unaudited one are one contract, and their checkpoints one kind).
        words = audit_words(audit_slots, slot_owners(step_plan, size), size)
        combine_plan = step_plan
        if words:
            payload = PayloadLayout.of(parts.params, parts.float_buffers, slots, audit=words)
            combine_plan = plan(tree, ReplicateAll(), payload.layout, size=size)
        conversions = (
            (("WidenBinary32", "contribution"), ("RoundBinary64", "gradient"))
            if parts.dtype == torch.float32
            else (("KeepFormat", "contribution"),)
        )
        return cls(
            declared,
            env,
            compute,
            slots,
            topology,
            tree,
            step_plan,
            combine_plan,
            payload,
            step_plan.slots_of(rank),
            contract,
            conversions,
        )
