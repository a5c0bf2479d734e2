"""The training loop behind `alpha-mpi train`: data cut into slots, steps, progress, digest."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..refusals import Refusal
from .data import SlotStream, load_npz, synthetic
from .digests import STATE_COVERS, digest  # noqa: F401 (digest: its old home, re-exported)
from .learner import DataParallelLearner
from .mlp import MLP
from .preemption import PREEMPTED, Preemption  # noqa: F401 (PREEMPTED: its old home)

if TYPE_CHECKING:
    from mpi4py import MPI

    from .audit import FaultHook

PROBE_SAMPLES = 8  # samples of the probe slot `train` runs a --model on before training


@dataclass
class TrainConfig:
    """What `train` runs: the options of `alpha-mpi train`, one field per option of the same name
    (steps, the slot tree and batch, the optimizer, the model: `model` "module:factory", else the
    built-in MLP with `hidden` units; the data: `data` an .npz file, else synthetic; checkpoints
    and resume)."""

    steps: int = 200
    slots: int = 8
    batch: int = 256
    optimizer: str = "adam"
    lr: float = 2e-3
    momentum: float = 0.9
    weight_decay: float | None = None  # AdamW's decoupled weight decay; None: its default (0.01)
    topology: str = "pairwise"
    partition: str = "none"
    seed: int = 0
    hidden: int = 700
    data: str | None = None
    log_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    timeout: float | None = None
    adopt_contract: bool = False
    resume_from: str | None = None
    adopt_lr: bool = False
    adopt_weight_decay: bool = False  # resume AdamW with another weight decay (recorded)
    accept_compute_change: bool = False  # resume under another compute identity (recorded)
    model: str | None = None  # "module:factory" (alpha_mpi.learning.model_from_spec); None: the built-in MLP
    audit_slots: int = 0  # slots per step recomputed on another rank (alpha_mpi.learning.audit)
    audit_digests: int = 0  # steps between replica digest checks (alpha_mpi.learning.replicas)


StopFlag = Preemption  # the name train() used before Preemption was public


def memory_per_rank(learner) -> dict:
    """Bytes this rank holds, by what they are (from the learner's arrays; frames and transport
    buffers excluded): `params` (the parameter vector, or this rank's shard in `params` mode),
    `optimizer_state` (Adam's m and v, SGD's momentum; this rank's range when partitioned),
    `gradients` (each owned slot's gradient sum and the combined gradient, or this rank's chunk
    of it), `update_buffers` (the proposed next parameters and optimizer state, kept apart so a
    refused step applies nothing, and the assembled full parameters of the partitioned modes),
    and their `total`."""
    held = learner.memory()  # params and optimizer there include their update buffers
    params = learner.params.nbytes
    state = sum(a.nbytes for a in learner.opt.state()["arrays"].values())
    out = {
        "params": params,
        "optimizer_state": state,
        "gradients": held["gradients"],
        "update_buffers": held["params"] - params + held["optimizer"] - state,
    }
    out["total"] = sum(out.values())
    return out


def compute_line(learner) -> str:
    """The start-up line naming the compute identity (rank 0's; every rank's matched it unless
    the contract says machine-independent) and what the slots' bits depend on."""
    ident, spec = learner.compute_identity, learner.contract.compute
    said = "every rank matches it" if learner.compute.dependent else f"{spec.describe()}; rank 0's"
    return f"# compute identity {ident.digest[:16]} ({said}): {ident.describe()}"


def memory_line(mem: dict) -> str:
    """The start-up line of train() from memory_per_rank()."""
    mib = {k: f"{v / 2**20:.2f} MiB" for k, v in mem.items()}
    return (
        f"# memory per rank: params {mib['params']}, optimizer state {mib['optimizer_state']}, "
        f"gradients {mib['gradients']}, update buffers {mib['update_buffers']}; total {mib['total']}"
    )


class Progress:
    """train()'s progress line every `cfg.log_every` steps and after the last (0: never). The
    elapsed time counts from the start of training; the rest is over the steps since the
    previous line: samples/s, and the mean time per step in compute, combine and update."""

    def __init__(self, learner, cfg: TrainConfig, t_start: float):
        self.learner, self.cfg, self.t_start = learner, cfg, t_start
        self.t_last, self.step_last, self.times_last = t_start, learner.step, dict(learner.times)

    def due(self) -> bool:
        step, every = self.learner.step, self.cfg.log_every
        return bool(every) and (step % every == 0 or step == self.cfg.steps)

    def line(self, loss: float) -> str:
        now, step, times = time.perf_counter(), self.learner.step, self.learner.times
        k = step - self.step_last
        per_step = {key: (times[key] - self.times_last[key]) / k * 1e3 for key in times}
        rate = k * self.cfg.batch / (now - self.t_last)
        first = self.step_last + 1
        self.t_last, self.step_last, self.times_last = now, step, dict(times)
        return (
            f"step {step:5d}/{self.cfg.steps}  loss {loss:.6f}  elapsed {now - self.t_start:6.2f} s  | "
            f"steps {first}-{step}: {rate:.0f} samples/s, ms/step: compute {per_step['compute']:.2f} "
            f"combine {per_step['combine']:.2f} update {per_step['update']:.2f}"
        )


def audit_summary(learner) -> tuple[dict, str] | None:
    """What an audited run checked, as a result entry and the line `train` prints at the end;
    None when neither audit ran. A healthy audited run says so: silence would read the same as
    an audit that never ran."""
    audit, replicas = learner.audit, learner.replicas
    if audit is None and replicas is None:
        return None
    doc, parts = {}, []
    if audit is not None:
        sch = audit.schedule
        doc["slots_checked"] = audit.checked
        parts.append(
            f"{audit.checked} slot payloads recomputed on another rank and matched (K = {audit.k}: "
            f"{sch.per_round} slots every {sch.every} step{'s' if sch.every > 1 else ''})"
        )
    if replicas is not None:
        doc["replica_checks"] = replicas.checked
        parts.append(f"replicas equal at {replicas.checked} digest checks (every {replicas.every} steps)")
    return doc, "# audit: " + "; ".join(parts)


def build(comm, cfg: TrainConfig, fault_hook=None):
    data = load_npz(cfg.data) if cfg.data else synthetic(cfg.seed)
    if cfg.batch < cfg.slots:  # before any tree over the slots is built
        raise Refusal(
            "options-conflict",
            f"--batch {cfg.batch} is smaller than --slots {cfg.slots}: every slot needs a sample",
        )
    if cfg.batch > len(data.y):  # a step reads each sample at most once (and allocates the batch)
        raise Refusal(
            "options-conflict", f"--batch {cfg.batch} is more than the {len(data.y)} samples of {data.name}"
        )
    if cfg.model:  # a user's model: a Model or an nn.Module (summed cross-entropy, binary64)
        from .protocol import model_from_spec

        model = model_from_spec(cfg.model, data.inputs, data.classes)
        # A user's model is probed on every rank before anything trains: a gradient that is not the
        # same bits twice, or not the same on every rank, is refused by name on every rank.
        from .compute_check import ComputeCheck
        from .same_start import probe_model

        k = min(len(data.y), PROBE_SAMPLES)
        probe = (data.X[:k], data.y[:k])
        check = ComputeCheck.for_model(model)  # ranks that compute differently are named first
        probe_model(comm, model, probe, seed=cfg.seed, timeout=cfg.timeout, compute=check)
    else:
        model = MLP(data.inputs, cfg.hidden, data.classes)
    learner = DataParallelLearner(
        comm,
        model,
        slots=cfg.slots,
        topology=cfg.topology,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        partition=cfg.partition,
        seed=cfg.seed,
        timeout=cfg.timeout,
        audit_slots=cfg.audit_slots,
        audit_digests=cfg.audit_digests,
        fault_hook=fault_hook,
    )
    stream = SlotStream(len(data.y), cfg.batch, cfg.slots, cfg.seed)
    return data, model, learner, stream


def train(
    comm: MPI.Comm,
    cfg: TrainConfig,
    out: Callable[[str], object] = print,
    fault_hook: FaultHook | None = None,
) -> dict:
    """Run `cfg.steps` steps (continuing from a checkpoint with `resume`). Rank 0 prints.
    `fault_hook`: the learner's verification hook (alpha_mpi_verify.faults); None in production.
    An `sdc-undetermined` refusal (no rank shown wrong, nothing applied) retries the step once;
    an `sdc-detected` refusal, or `sdc-undetermined` again, first saves the newest state known
    clean (audit_recovery.rewind_after: the state at the refused step with --audit-slots =
    --slots, an earlier one with fewer) and makes `latest` name it, then propagates."""
    rank = comm.Get_rank()
    say = out if rank == 0 else (lambda *a, **k: None)
    data, model, learner, stream = build(comm, cfg, fault_hook)
    ckpt = None
    if cfg.checkpoint_dir:
        from ..checkpoint import Checkpointer
        from .data import fingerprint

        # Rank 0 locks the directory first: a second trainer on it is refused before it reads or writes.
        ckpt = Checkpointer(
            comm,
            cfg.checkpoint_dir,
            learner,
            cfg,
            adopt_contract=cfg.adopt_contract,
            adopt_lr=cfg.adopt_lr,
            adopt_weight_decay=cfg.adopt_weight_decay,
            accept_compute_change=cfg.accept_compute_change,
            data=fingerprint(data),
            timeout=cfg.timeout,
        )
        if cfg.resume or cfg.resume_from:
            try:
                resumed = ckpt.resume(path=cfg.resume_from)
            except BaseException:
                ckpt.close()  # a refused resume leaves the directory to the next trainer at once
                raise
            for line in resumed.lines:
                say(line)
    wd = getattr(learner.opt, "weight_decay", None)  # AdamW's, said only where it decays
    say(
        f"# alpha-mpi train: {data.name}, {model.n_params} parameters, {cfg.slots} slots on {comm.Get_size()} ranks, "
        f"batch {cfg.batch}, {cfg.optimizer} lr {cfg.lr:g}{'' if wd is None else f' weight decay {wd:g}'}, "
        f"topology {cfg.topology}, partition {cfg.partition}"
    )
    say(compute_line(learner))
    say(f"# layout order id {learner.layout_order_id}")
    mem = memory_per_rank(learner)
    say(memory_line(mem))
    start_step = learner.step
    if start_step >= cfg.steps:
        say(
            f"# nothing to train: the state is at step {start_step}, "
            + ("--steps" if start_step == cfg.steps else "past --steps")
            + f" {cfg.steps}"
        )
    kept = None
    if ckpt and learner.audit is not None and learner.audit.window > 1:  # states to go back to
        from .audit_recovery import KeptStates

        kept = KeptStates(learner.audit.window)
    stop = Preemption().install()
    preempted = False
    t_start = time.perf_counter()
    progress = Progress(learner, cfg, t_start)
    loss = float("nan")
    history = []  # every step's loss: the same float on every rank (the global batch mean)
    retried = -1  # the step retried after sdc-undetermined (once per step)
    try:
        while learner.step < cfg.steps:
            t = learner.step
            batch = {}
            for s in learner.needed_slots:  # its own slots, and those it audits this step
                idx = stream.indices(t, s)
                batch[s] = (data.X[idx], data.y[idx])
            if kept is not None:
                kept.offer(learner)
            try:
                loss, stop_now = learner.train_step(batch, stop=stop.requested)
            except Refusal as e:
                if e.code == "sdc-undetermined" and retried != t:  # no rank shown wrong: once more
                    retried = t
                    say(
                        f"# step {t}: [sdc-undetermined] no rank shown wrong, nothing applied; retrying the step"
                    )
                    continue
                if e.code in ("sdc-detected", "sdc-undetermined") and ckpt:  # save the last state known clean
                    from .audit_recovery import rewind_after

                    e.context["checkpoint"] = rewind_after(e, learner, ckpt, kept)
                raise
            history.append(
                {"step": learner.step, "loss": float(loss), "seconds": time.perf_counter() - t_start}
            )
            if ckpt and cfg.checkpoint_every and learner.step % cfg.checkpoint_every == 0:
                ckpt.save()
            if stop_now:
                if ckpt and not ckpt.has(learner.step):
                    ckpt.save()
                say(f"# stopped by signal after step {learner.step}" + (", checkpoint saved" if ckpt else ""))
                preempted = True
                break
            if progress.due():
                say(progress.line(loss))
        if ckpt and not preempted and not ckpt.has(learner.step):
            ckpt.save()  # the final state is always saved
    finally:
        stop.restore()
        if ckpt:
            ckpt.close()
    params = learner.final_params()
    state = learner.state_digest()  # collective: the whole state, assembled where it is sharded
    predict = getattr(model, "predict", None)  # optional in the Model protocol
    acc = float(np.mean(predict(params, data.X_eval) == data.y_eval)) if predict else float("nan")
    result = {
        "steps": learner.step,
        "loss": float(loss) if learner.step > start_step else None,
        "accuracy": acc,
        "digest": state,  # the state digest (STATE_COVERS); the parameters alone: params_digest
        "params_digest": digest(params),
        "layout_order_id": learner.layout_order_id,
        "preempted": preempted,
        "memory": mem,
        "config": asdict(cfg),
        "seconds": time.perf_counter() - t_start,
        "history": history,
    }
    audited = audit_summary(learner)
    if audited is not None:
        result["audit"] = audited[0]
        say(audited[1])
    if preempted:  # not the run's final state: keep it out of `state digest:` parsers
        say(f"# state digest ({STATE_COVERS}) at step {learner.step}: {result['digest']}")
    else:
        shown = f"{loss:.6f}" if result["loss"] is not None else "n/a (no step run)"
        say(f"final loss {shown}  accuracy {acc:.4f}  ({learner.step} steps, {result['seconds']:.1f}s)")
        say(f"state digest ({STATE_COVERS}): {result['digest']}")
    return result
