"""What a resume must share with the saved run: numerical contract, layout order id, config, data,
compute identity.

Apart from checkpointer.py because these are rules about two records (the saved manifest and
this run), not steps of the collective protocol: each function reads a manifest and the run's
side, and either refuses by name or returns what changed by consent (`adopt_contract`,
`adopt_lr`, `adopt_weight_decay`, `accept_compute_change`) for the manifest's history.
`Checkpointer` applies them on every rank before it installs anything.
"""

from __future__ import annotations

from ..model.compute import ComputeIdentity, MachineIndependent
from ..numerics import NumericalContract, numerical_compatibility
from ..refusals import CheckpointRefusal, NumericalOrderMismatch, Refusal
from .schema import layout_order_id_of

__all__ = [
    "SAME_ON_RESUME",
    "NOT_SAVED",
    "check_compatible",
    "check_compute",
    "compare_config",
    "compare_weight_decay",
    "compare_data",
]

SAME_ON_RESUME = ("slots", "batch", "seed", "hidden", "data", "model", "optimizer", "lr", "momentum")
"""Config fields a resume must share with the saved run (others, like --steps or --partition, may
change). `lr` may change with adopt_lr; `momentum` matters to SGD only. AdamW's weight decay is
compared apart (compare_weight_decay: the live optimizer's against the saved one, adopt_weight_decay)."""
NOT_SAVED = (
    "checkpoint_dir",
    "resume",
    "resume_from",
    "adopt_contract",
    "adopt_lr",
    "adopt_weight_decay",
    "accept_compute_change",
    "json",
)
"""Run options that are not part of a checkpoint's configuration."""


def learner_contract(learner):
    return learner.contract


def check_compatible(saved: dict, learner, adopt: bool = False) -> dict | None:
    """Refuse a checkpoint whose numerical contract (or layout order id) differs from the learner's,
    unless adopting it is asked for; then return the contract change to record, else None."""
    current = learner_contract(learner)
    old = NumericalContract.from_dict(saved["contract"])
    try:
        numerical_compatibility(current, old, theirs_name="the checkpoint")
    except Refusal:
        if not adopt:
            raise
        return {"from": old.digest, "to": current.digest, "at_step": saved["step"]}
    saved_order = layout_order_id_of(saved)
    if saved_order != learner.layout_order_id:
        if not adopt:
            raise NumericalOrderMismatch(
                f"the checkpoint's layout order id {str(saved_order)[:24]} differs from "
                f"this run's {learner.layout_order_id[:24]}"
            )
        return {"from": old.digest, "to": current.digest, "at_step": saved["step"]}
    return None


def check_compute(saved: dict, learner, accept: bool = False) -> dict | None:
    """Refuse (`compute-changed`) a resume under another compute identity than the manifest
    `saved` records, naming the old and the new text of each compared field that differs, unless
    `accept`; return the change to record in the manifest's `compute_history` (None: no change).

    - same compared fields (recorded-only ones may differ): None;
    - a contract that says machine-independent (the model's declaration or the caller's
      promise): resumed anywhere, recorded (`how: machine-independent`);
    - `accept`: recorded (`how: accepted`);
    - a manifest without an identity (saved by alpha_mpi before it recorded one): the identity it
      ran under is unknown, so nothing can be compared; it resumes as before and the resume is
      recorded (`how: unrecorded`, `from: null`), so later manifests say so.
    A learner without a `compute_identity` (a stand-in) is not compared."""
    now = getattr(learner, "compute_identity", None)
    if now is None:
        return None
    spec = getattr(learner_contract(learner), "compute", None)
    entry = {"at_step": saved["step"], "from": None, "to": dict(now.compared().fields)}
    if "compute" not in saved:
        return {**entry, "how": "unrecorded"}
    old = ComputeIdentity.of(saved["compute"]["fields"])
    diffs = old.differences(now)
    entry["from"] = dict(old.compared().fields)
    if not diffs:
        return None
    if isinstance(spec, MachineIndependent):
        return {**entry, "how": "machine-independent"}
    if accept:
        return {**entry, "how": "accepted"}
    named = "; ".join(f"{f}: saved {a!r}, now {b!r}" for f, a, b in diffs)
    raise CheckpointRefusal(
        "compute-changed",
        f"the checkpoint at step {saved['step']} was computed under another compute identity ({named}); "
        "this model's slot results depend on it, so the run would continue with other bits",
        fields=[f for f, _, _ in diffs],
    )


def compare_config(m: dict, now: dict, data: dict, learner, adopt_lr: bool = False) -> list:
    """Refuse (`checkpoint-config-mismatch`) a run whose config `now` differs from the manifest
    `m`'s in a SAME_ON_RESUME field (or whose live learning rate differs from the saved
    hyperparameters), except a learning rate changed with `adopt_lr`; return the recorded
    changes (`lr` adopted, `steps`) for the manifest's `resume_history`."""
    saved = m.get("config", {})
    optimizer = saved.get("optimizer", now.get("optimizer"))
    diffs, changes = [], []
    for k in SAME_ON_RESUME:
        if k in now and k not in saved and saved:
            diffs.append(f"{k}: the checkpoint's config does not record it, now {now[k]!r}")
            continue
        if k not in saved or k not in now or saved[k] == now[k]:
            continue
        if k == "momentum" and k not in _hyper_of(optimizer):
            continue
        if k == "data" and "sha256" in m.get("data", {}) and "sha256" in data:
            continue  # the data's content is compared (compare_data), not the path it was read from
        if k == "lr" and adopt_lr:
            changes.append({"at_step": m["step"], "field": "lr", "from": saved[k], "to": now[k]})
            continue
        hint = (
            "; resume with the saved --lr or pass --adopt-lr to continue with the new one"
            if k == "lr"
            else ""
        )
        diffs.append(f"{k}: saved {saved[k]!r}, now {now[k]!r}{hint}")
    hyper = m.get("scalars", {}).get("optimizer_hyper")
    live = getattr(getattr(learner, "opt", None), "lr", None)
    if isinstance(hyper, dict) and live is not None and hyper.get("lr") != live and "lr" not in now:
        if not adopt_lr:
            diffs.append(
                f"lr: saved {hyper.get('lr')!r}, now {live!r}; pass adopt_lr=True to continue with it"
            )
        else:
            changes.append({"at_step": m["step"], "field": "lr", "from": hyper.get("lr"), "to": live})
    if diffs:
        raise CheckpointRefusal("checkpoint-config-mismatch", "; ".join(diffs))
    if "steps" in saved and "steps" in now and saved["steps"] != now["steps"]:
        changes.append({"at_step": m["step"], "field": "steps", "from": saved["steps"], "to": now["steps"]})
    return changes


def _hyper_of(optimizer) -> tuple:
    """The hyperparameters the numpy learner's optimizer of that name records (none for another
    learner's, e.g. alpha_mpi.torch's)."""
    from ..learning.optim import OPTIMIZERS

    kind = OPTIMIZERS.get(optimizer) if isinstance(optimizer, str) else None
    return kind.hyper if kind is not None else ()


def compare_weight_decay(m: dict, learner, adopt: bool = False) -> list:
    """Refuse (`checkpoint-config-mismatch`, naming weight_decay) a resume whose optimizer decays
    weights by another amount than the manifest `m` saved, unless `adopt`; return the recorded
    change for the manifest's `resume_history` (empty: none). A learner or checkpoint without a
    weight decay (Adam, SGD, another learner's optimizer) is not compared here (another optimizer
    is refused by name on read)."""
    hyper = m.get("scalars", {}).get("optimizer_hyper")
    live = getattr(getattr(learner, "opt", None), "weight_decay", None)
    if not isinstance(hyper, dict) or "weight_decay" not in hyper or live is None:
        return []
    saved = hyper["weight_decay"]
    if saved == live:
        return []
    if not adopt:
        raise CheckpointRefusal(
            "checkpoint-config-mismatch",
            f"weight_decay: saved {saved!r}, now {live!r}; resume with the saved weight decay, or pass "
            "adopt_weight_decay=True (--adopt-weight-decay) to continue with the new one",
        )
    return [{"at_step": m["step"], "field": "weight_decay", "from": saved, "to": live}]


def compare_data(m: dict, data: dict) -> None:
    """Refuse (`checkpoint-data-mismatch`) a run on other data than the manifest `m` records
    (its sample count or sha256 differs from the fingerprint `data`)."""
    saved = m.get("data", {})
    diffs = [
        f"{k}: saved {str(saved[k])[:20]}, now {str(data[k])[:20]}"
        for k in ("samples", "sha256")
        if k in saved and k in data and saved[k] != data[k]
    ]
    if diffs:
        raise CheckpointRefusal(
            "checkpoint-data-mismatch",
            f"the checkpoint was trained on other data ({'; '.join(diffs)}; saved source "
            f"{str(saved.get('source'))[:80]!r}); its stream position means nothing for this data",
        )
