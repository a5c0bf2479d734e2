"""save(dir) / restore(dir) for a user's own training loop: the CLI's checkpoints, as an API.

    learner.save("ckpt")          # every rank calls it at the same step; returns the step directory
    learner.restore("ckpt")       # on any rank count: each rank reads the ranges it now owns

Both wrap `alpha_mpi.checkpoint.Checkpointer`, so the files are exactly those `alpha-mpi train
--checkpoint-dir` writes (safetensors shards by logical range, a manifest tree with sha256, an
atomic `latest` pointer) and `alpha-mpi checkpoint verify/inspect` reads them. Any object with
the learner's checkpoint members works: `DataParallelLearner` and `alpha_mpi.torch.DataParallel`
(`step`, `layout_order_id`, `contract`, `checkpoint_pieces()`, `checkpoint_scalars()`,
`load_checkpoint(ck)`).

`restore(dir)` reads what `alpha-mpi train --resume` would: the step `latest` names, a complete
step newer than it, or (no `latest`: a first save killed before it moved) the newest step that
verifies; or the step directory given. It takes no lock and writes nothing, so a published,
read-only checkpoint restores; the directory's lock is taken at the first `save` into it.

`config` (a dict) is stored in the manifest; on restore the keys a resume must share
(`alpha_mpi.checkpoint.checkpointer.SAME_ON_RESUME`: slots, batch, seed, ...) are compared with
the saved ones and a difference is refused (`checkpoint-config-mismatch`). The default config is
`{"slots": learner.slots}`. A checkpoint whose numerical contract differs (another tree, another
optimizer formula, another torch build) is refused (`numerical-order-mismatch` /
`numerical-profile-mismatch`) unless `adopt_contract=True`; one computed under another compute
identity (alpha_mpi.model.compute: numpy's BLAS kernel and threads, torch's capability ...) is
refused (`compute-changed`, naming the old and the new) unless `accept_compute_change=True`, or
unless the learner's contract says machine-independent; either change is recorded in the
manifests saved afterwards (`compute_history`). AdamW's weight decay must be the saved one
(`checkpoint-config-mismatch` naming weight_decay) unless `adopt_weight_decay=True` (recorded in
`resume_history`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..refusals import CheckpointRefusal

if TYPE_CHECKING:
    from ..checkpoint.checkpointer import CheckpointedLearner, Checkpointer

__all__ = ["checkpointer", "save", "restore"]

_ATTR = "_alpha_mpi_checkpointers"


def _config(learner, config):
    cfg = {"slots": getattr(learner, "slots", None)} if config is None else dict(config)
    return {k: v for k, v in cfg.items() if v is not None}


def checkpointer(
    learner: CheckpointedLearner,
    directory: str,
    *,
    config: Mapping[str, object] | None = None,
    adopt_contract: bool = False,
    accept_compute_change: bool = False,
    adopt_weight_decay: bool = False,
    timeout: float | None = None,
) -> Checkpointer:
    """The `Checkpointer` for (learner, directory), built once (collectively) and reused. One per
    (directory, config), whatever the consents: what a restore adopted or accepted is recorded on
    it and written by the next `save` (the consents apply to the restore they are passed to)."""
    from ..checkpoint import Checkpointer

    cache = learner.__dict__.setdefault(_ATTR, {})
    cfg = _config(learner, config)
    key = (os.path.abspath(directory), tuple(sorted((k, repr(v)) for k, v in cfg.items())))
    ck = cache.get(key)
    if ck is not None:
        ck.adopt_contract, ck.accept_compute_change = adopt_contract, accept_compute_change
        ck.adopt_weight_decay = adopt_weight_decay
    else:
        # The lock is taken at the first save: a restore only reads (published steps are immutable).
        ck = cache[key] = Checkpointer(
            learner.comm,
            directory,
            learner,
            cfg,
            adopt_contract=adopt_contract,
            accept_compute_change=accept_compute_change,
            adopt_weight_decay=adopt_weight_decay,
            timeout=timeout if timeout is not None else getattr(learner, "timeout", None),
            lock_now=False,
        )
    return ck


def save(
    learner: CheckpointedLearner,
    directory: str,
    *,
    config: Mapping[str, object] | None = None,
    timeout: float | None = None,
) -> str:
    """Publish the learner's state at its current step under `directory`; returns the step
    directory. Collective: every rank calls it at the same step. A step already published is
    left as it is (published checkpoints are immutable)."""
    return checkpointer(learner, directory, config=config, timeout=timeout).save()


def restore(
    learner: CheckpointedLearner,
    directory: str,
    *,
    config: Mapping[str, object] | None = None,
    adopt_contract: bool = False,
    missing_ok: bool = False,
    timeout: float | None = None,
    accept_compute_change: bool = False,
    adopt_weight_decay: bool = False,
) -> str | None:
    """Load the checkpoint at `directory` into the learner, whatever the rank count was at save
        time; returns the step directory read. `directory`: one step directory, or a checkpoint
        directory, read as `alpha-mpi train --resume` reads it (the step `latest` names; a complete
        step newer than it; without `latest`, the newest step that verifies, refusing by name when
        newer ones do not). With `missing_ok`, a directory without any step returns None (start
        from scratch) instead of refusing with `checkpoint-missing`. Writes nothing and takes no
        lock: a read-only checkpoint restores. `accept_compute_change`: resume although the checkpoint
        was computed under another compute identity (recorded); `adopt_weight_decay`: with another
    weight decay than the saved one (recorded). Collective; a refusal leaves every
        learner as it was."""
    from ..checkpoint.paths import LATEST
    from ..checkpoint.reader import is_step_dir

    ck = checkpointer(
        learner,
        directory,
        config=config,
        adopt_contract=adopt_contract,
        accept_compute_change=accept_compute_change,
        adopt_weight_decay=adopt_weight_decay,
        timeout=timeout,
    )
    if is_step_dir(directory):
        return ck.restore(directory)
    found = ck.resume()  # every rank learns rank 0's choice; "none" on every rank alike
    if found.how != "none":
        return found.path
    if missing_ok:
        return None
    raise CheckpointRefusal(
        "checkpoint-missing", f"{directory} holds no checkpoint (no {LATEST} pointer, no step)"
    )
