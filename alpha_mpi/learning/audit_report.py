"""What `alpha-mpi train` prints after an audit refused a step (layer 5): the refusal, what was
saved and how to resume without the named ranks' nodes (`sdc_report`)."""

from __future__ import annotations

from ..refusals import Refusal

__all__ = ["sdc_report"]


def sdc_report(e: Refusal, checkpoint_dir: str | None, size: int) -> str:
    """What `alpha-mpi train` prints after `sdc-detected`: the refusal, where the last state every
    audit passed is saved, and how to resume without the named ranks' nodes. After
    `sdc-undetermined` no node is named and no `--exclude=` is advised: only a rank shown wrong
    is ever offered for exclusion (jobs/train.sbatch excludes what the advice names)."""
    hosts = sorted(set(e.context.get("hosts", ()))) or ["(the nodes of the ranks named)"]
    ranks = ", ".join(map(str, e.context.get("ranks", ())))
    lines = [f"alpha-mpi: error [{e.code}] {e.message}"]
    if checkpoint_dir and e.code == "replica-diverged":
        lines.append(
            f"  what to do: resume from the newest step in {checkpoint_dir} at or before the last replica "
            f"check that passed (step {e.context.get('step')} minus --audit-digests), on nodes other than "
            f"those of rank(s) {ranks}: `alpha-mpi train ... --checkpoint-dir DIR2 --resume-from "
            f"{checkpoint_dir}/step-NNNNNNNN`"
        )
    elif e.code == "sdc-undetermined" or not e.context.get("ranks"):
        # No rank was shown wrong: advise no exclusion, so a job script excludes no healthy node.
        if checkpoint_dir:
            lines.append(_saved_line(e, checkpoint_dir))
        lines.append(
            "  what to do: no rank was shown wrong, so no node is named; the step was retried once and "
            "failed again: rerun"
            + (
                f" (`alpha-mpi train ... --checkpoint-dir {checkpoint_dir} --resume`)"
                if checkpoint_dir
                else ""
            )
            + f" on 3 or more ranks (4 or more against two faults at once) so that referees can name the "
            f"rank; this run had {size} ranks"
        )
    elif checkpoint_dir:
        lines.append(_saved_line(e, checkpoint_dir))
        lines.append(
            f"  what to do: resume without the suspected node(s) {', '.join(hosts)} (rank(s) {ranks}): "
            f"e.g. `sbatch --exclude={','.join(hosts)} jobs/train.sbatch`, or "
            f"`mpiexec -n P --hosts <other nodes> alpha-mpi train ... --checkpoint-dir {checkpoint_dir} --resume` "
            f"on any P <= --slots (the bits do not depend on P); this run had {size} ranks"
        )
    else:
        lines.append(
            f"  what to do: rerun without the suspected node(s) {', '.join(hosts)} (rank(s) {ranks}); "
            "with --checkpoint-dir the last audited state is saved and a resume continues from it"
        )
    return "\n".join(lines)


def _saved_line(e: Refusal, checkpoint_dir: str) -> str:
    """What the exit-98 report says was saved (rewind_after's record in `e.context`)."""
    step, clean = e.context.get("step"), e.context.get("clean_step", e.context.get("step"))
    saved = e.context.get("saved_step", clean)
    folder, aside = e.context.get("folder"), e.context.get("set_aside") or ()
    moved = (
        f"; the later steps ({', '.join(str(k) for k in aside)}) may hold the fault's work and are set aside "
        f"in {folder}"
        if folder
        else ""
    )
    if clean == step:
        return (
            f"  the state at step {step} (every slot of every step audited; the refused step was not "
            f"applied) is saved in {checkpoint_dir}, and `latest` names it{moved}"
        )
    if saved is None:
        return (
            f"  the last state known clean is at step {clean}, and no state at or before it was kept: "
            f"a resume in {checkpoint_dir} starts at step 0{moved}"
        )
    return (
        f"  the last state known clean is at step {clean} (the steps since were audited in part); the "
        f"newest kept at or before it, step {saved}, is saved in {checkpoint_dir}, and `latest` names it{moved}"
    )
