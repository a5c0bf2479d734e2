"""Which step a resume reads (rank 0 decides, before any rank reads a byte): `locate`.

Apart from checkpointer.py because it is a pure question about a directory tree, with no
communicator and no learner: what `latest` names, a complete step newer than it, the newest
step that verifies when `latest` is missing, a step chosen by path, or none; and what to refuse
(a broken `latest`, steps that would collide with the run). `Checkpointer.resume` asks it on
rank 0 and tells every rank the answer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..refusals import CheckpointRefusal
from . import store
from .paths import published_steps, step_name, step_of
from .reader import Checkpoint, is_step_dir, newest_verifying, read_latest

__all__ = ["Resumed", "locate", "Rewind", "rewind_plan"]


@dataclass
class Resumed:
    """What `resume()` did. `how`: latest | newer (a complete step newer than latest) | fallback
    (no latest) | chosen (--resume-from) | none. `lines`: what rank 0 says."""

    how: str
    path: str | None = None
    step: int = 0
    lines: list = field(default_factory=list)
    sha: str | None = None


def _from(how: str, ck: Checkpoint, lines: list) -> Resumed:
    return Resumed(how, ck.dir, ck.step, lines, ck.manifest_sha256)


def locate(root: str, path: str | None = None) -> Resumed:
    """The step to resume from in the checkpoint directory `root`, or from `path` (a step
    directory, or another checkpoint directory whose `latest` is read) when given.

    Refused (`checkpoint-exists`): a chosen step older than steps already published in `root`;
    (`checkpoint-corrupt`): steps newer than `latest` that do not verify, or no `latest` and
    broken steps newer than the newest that verifies (or none that verifies). A missing or
    broken chosen checkpoint is refused by `Checkpoint` by name.
    """
    if path is not None:
        return _chosen(root, path)
    found = read_latest(root)
    steps = published_steps(root)
    if found is not None:
        return _after_latest(root, found, steps)
    if not steps:
        return Resumed("none", None, 0, [f"# no checkpoint in {root}: starting at step 0"])
    ck, skipped = newest_verifying(root)
    broken = ", ".join(f"{step_name(k)} [{code}]" for k, code in skipped)
    if ck is None:
        raise CheckpointRefusal(
            "checkpoint-corrupt",
            f"{root} has no latest pointer and none of its steps verifies ({broken}); "
            f"nothing to resume from. Move them out of {root} to start over",
            path=root,
        )
    if skipped:
        raise CheckpointRefusal(
            "checkpoint-corrupt",
            f"{root} has no latest pointer; its newest steps do not verify ({broken}); the newest "
            f"that does is {ck.dir}. Move the broken steps out of {root} and resume again, or pass "
            f"--resume-from {ck.dir} with another --checkpoint-dir",
            path=root,
        )
    return _from(
        "fallback",
        ck,
        [
            f"# {root}/latest is missing: resuming from the newest step that verifies, {ck.dir}",
            f"# resumed from {ck.dir} at step {ck.step}",
        ],
    )


def _chosen(root: str, path: str) -> Resumed:
    if is_step_dir(path):
        ck = Checkpoint(path)
    else:
        found = read_latest(path)
        if found is None:
            Checkpoint(path)  # refuses by name: no checkpoint there
        ck = Checkpoint(found[0], found[1])
    newer = [k for k in published_steps(root) if k > ck.step]
    cur = store.current_latest(root)
    if cur is not None and cur > ck.step:
        newer.append(cur)
    if newer:
        raise CheckpointRefusal(
            "checkpoint-exists",
            f"{root} already holds {step_name(max(newer))}, newer than the chosen step {ck.step}; "
            f"continuing from step {ck.step} here would collide with published steps. Give another "
            f"--checkpoint-dir, or move the newer steps out of {root}",
        )
    return _from("chosen", ck, [f"# resumed from {ck.dir} at step {ck.step} (--resume-from)"])


def _after_latest(root: str, found, steps: list) -> Resumed:
    k = step_of(os.path.basename(found[0]))
    if not steps or steps[-1] <= k:
        return Resumed("latest", found[0], k, [f"# resumed from {found[0]} at step {k}"], found[1])
    # A step newer than `latest`: a save was interrupted after publishing it, before it
    # moved `latest`. It is complete if it verifies; a broken one would collide later.
    ck, skipped = newest_verifying(root)
    if ck is not None and ck.step > k and not skipped:
        return _from(
            "newer",
            ck,
            [
                f"# {root}/latest names {step_name(k)}, but {step_name(ck.step)} is complete "
                "(a save was interrupted before it moved latest): resuming from it",
                f"# resumed from {ck.dir} at step {ck.step}",
            ],
        )
    broken = ", ".join(f"{step_name(s)} [{code}]" for s, code in skipped if s > k)
    raise CheckpointRefusal(
        "checkpoint-corrupt",
        f"{root} holds steps newer than the {step_name(k)} latest names that do not verify "
        f"({broken}); a run from step {k} would collide with them. Move them out of {root} and "
        "resume again",
        path=root,
    )


@dataclass(frozen=True)
class Rewind:
    """Where a run went back to after a detection (`Checkpointer.rewind`). `step`: the state
    known clean that `latest` now names or that the caller saves next (None: none was kept, a
    resume starts at step 0); `save`: that state is only in the caller's memory (it saves it);
    `set_aside`: the published steps moved out of the step namespace, into `folder` (rank 0
    knows these two; the other ranks hold () and None)."""

    step: int | None
    save: bool
    set_aside: tuple = ()
    folder: str | None = None


def rewind_plan(published: list, clean: int, held: int | None) -> tuple:
    """(step, save, set_aside) of a rewind to the newest state at or before step `clean`: a
    published step, or `held` (a state the caller holds in memory, at that step) when it is
    newer; every published step after the chosen one is set aside (all of them when none is
    chosen). Pure: `published` is the directory's step numbers."""
    on_disk = max((k for k in published if k <= clean), default=None)
    candidates = [k for k in (on_disk, held) if k is not None and k <= clean]
    step = max(candidates, default=None)
    save = step is not None and step not in published
    return step, save, tuple(k for k in published if step is None or k > step)
