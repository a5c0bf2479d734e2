"""Data-parallel learning over declared-order combines (layer 5).

The global batch is cut into logical slots; the combine tree is over slots, not ranks, so the same
run on 1, 2, 4 or 8 ranks gives the same bits. Each leaf carries (Σ gradients, Σ samples, Σ loss)
of one slot; after the combine the learner divides once, Σg / Σn.

Partition modes, each bit for bit equal to the replicated learner (every coordinate goes through
the same tree and the same kernel formula; only where it is computed and stored changes):

    none    gradients combined to every rank; every rank updates all parameters.
    state   gradients combined to every rank; each rank keeps optimizer state for its coordinate
            range only and updates that range; parameters are assembled by selection.
    grads   gradients are reduce-scattered (the scatter realization of the same tree without its
            gather): each coordinate's reduced gradient exists only at its owner; update and
            assembly as in `state`.
    params  as `grads`, and parameters themselves are sharded: the full vector is assembled for
            the forward pass and dropped after the step.

The mode is read once, at construction, into a holder object (alpha_mpi.learning.partition) that
keeps this rank's arrays and knows how the step combines, updates and gathers them.

No rank commits an update another rank refused (FiniteOrRefuse), and a preemption signal stops
every rank after the same step; see train_step for how both travel without an extra round.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from .. import kernel
from ..model import Layout, ReplicateAll, build
from ..model.deprecation import deprecated_order_id
from ..planning import plan
from ..refusals import KernelRefusal, Refusal
from .audit import audit_words, build_checks, check_options, slot_owners
from .learner_checkpoint import LearnerCheckpoint
from .optim import optimizer_class
from .partition import MODES, Coordinates, partition_mode
from .rng import slot_generator
from .same_start import start_params

if TYPE_CHECKING:
    import numpy.typing as npt
    from mpi4py import MPI

    from ..checkpoint.reader import Checkpoint
    from .audit import FaultHook
    from .protocol import Model

__all__ = ["DataParallelLearner", "MODES"]


def _weighted(n: int, audit: int = 0) -> Layout:
    """Each slot's payload: Σ gradients, Σ samples, Σ loss, a stop request word, and (`audit`
    > 0) the audit's words (alpha_mpi.learning.audit: a digest difference per audited slot)."""
    return Layout(
        ("numerator", n), ("mass", 1), ("loss", 1), ("stop", 1), *([("audit", audit)] if audit else [])
    )


class DataParallelLearner:
    """Data-parallel training of a `Model` (alpha_mpi.learning.protocol) with the same bits on
    every rank count that places the same slot tree.

    Build it on every rank of `comm` (collective: it plans the tree and builds its executors):

        learner = DataParallelLearner(comm, model, slots=8, optimizer="adam", lr=1e-3)
        for X, y in global_batches:                         # the same global batch on every rank
            loss, stop = learner.train_step(slice_batch(X, y, 8, learner.my_slots))
        params = learner.final_params()                     # identical bits on every rank count

    Arguments:
        comm: an mpi4py communicator (COMM_WORLD, COMM_SELF, a split); the learner works on
            its own duplicates, so user messages never match its frames.
        model: an object satisfying `alpha_mpi.learning.Model` (n_params, init(seed),
            loss_and_grad_sum(params, X, y, grad_out)); checked here (`model-protocol`).
        slots: the number of logical micro-batch shards per step (>= the rank count). The
            combine tree is over slots, not ranks: slot s is owned by one rank (`my_slots`) and
            its (Σ gradients, Σ samples, Σ loss) enter the tree as leaf s.
        topology: the slot tree: "pairwise" (default: a balanced tree over slots, realized by the
            butterfly/halving algorithms on 2^k ranks), "star", "star:HUB", "hierarchy:K" (and whatever
            alpha_mpi.model.build accepts). Part of the numerical contract: two topologies are
            two contracts, and a checkpoint saved under one is refused under the other.
        optimizer: "adam" (adam-v1), "adamw" (adamw-v1) or "sgd" (sgd-momentum-v1): C kernel formulas
            (csrc/kernel/alpha_kernel.h; one class each in alpha_mpi.learning.optim); FiniteOrRefuse.
        lr, momentum: learning rate; SGD momentum (0 = plain SGD; ignored by Adam).
        weight_decay: AdamW's decoupled weight decay (torch.optim.AdamW's order: p * (1 - lr*wd),
            then the Adam step); default torch's 0.01; `usage` with another optimizer.
        partition: "none" | "state" | "grads" | "params" (see the module docstring): where
            optimizer state, reduced gradients and parameters live. Every mode gives the bits of
            "none"; they differ only in memory per rank and traffic.
        seed: passed to `model.init(seed)`, unless `init_params` (a float64 vector) is given;
            and the seed of the slots' generators: a model whose `loss_and_grad_sum` takes `rng`
            gets `rng=alpha_mpi.learning.slot_generator(seed, step, slot)` for each slot.
            Every rank must start from the same bits: a digest round here refuses otherwise on
            every rank (`initial-params-mismatch`, naming the ranks; learning/same_start.py).
        timeout: seconds a rank waits for a peer before `peer-timeout` (default
            ALPHA_MPI_TIMEOUT, else the executors' default).
        audit_slots: K >= 0 slots per step recomputed by another rank and compared by digest
            before the step is applied (alpha_mpi.learning.audit; `sdc-detected` on a mismatch,
            nothing applied). K = slots is dual execution. Needs >= 2 ranks. Batches must then
            hold the slots in `needed_slots` (its own and those it audits this step).
        audit_digests: N >= 0: every N steps (after the step) the ranks compare digests of the
            state they must share (alpha_mpi.learning.replicas; `replica-diverged` naming the
            minority). Not with partition="params" (nothing is replicated there).
        fault_hook: for verification only (alpha_mpi_verify.faults): called as
            `hook(rank, step, slot, payload)` after each slot payload this rank computes, to
            inject a fault; None in production.
        machine_independent: the caller's promise that the model's slot results do not depend
            on the compute identity (alpha_mpi.model.compute; recorded in the contract as
            "machine-independent (promised by the caller)"). Without it (and without the model's
            own `machine_independent = True`), ranks whose compute identities differ are refused
            here on every rank (`compute-mismatch`, naming the ranks and the field), and a
            checkpoint of another identity is refused on restore (`compute-changed`).

    Attributes: `my_slots` (this rank's slots, in order), `step` (steps applied), `partition`
    (the mode's name), `holder` (what this rank holds in that mode: alpha_mpi.learning.partition), `contract`
    (the NumericalContract: combine order, normalise-once, optimizer formula, and `compute`:
    what the slots' bits depend on), `compute_identity` (this rank's, alpha_mpi.model.compute),
    `layout_order_id`, `times` (seconds in compute / combine / update), `realization` (tree or
    scatter).

    Checkpoints: `save(dir)` / `restore(dir)` (alpha_mpi.learning.checkpoints), the same
    manifests as `alpha-mpi train --checkpoint-dir`, restorable on any rank count.
    """

    order_id = deprecated_order_id("DataParallelLearner")

    def __init__(
        self,
        comm: MPI.Comm,
        model: Model,
        *,
        slots: int,
        topology: str = "pairwise",
        optimizer: str = "adam",
        lr: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float | None = None,
        partition: str = "none",
        seed: int = 0,
        timeout: float | None = None,
        init_params: npt.ArrayLike | None = None,
        audit_slots: int = 0,
        audit_digests: int = 0,
        fault_hook: FaultHook | None = None,
        machine_independent: bool = False,
    ) -> None:
        # Every check this rank makes alone (the arguments, the model's protocol, the plan, the
        # contract, the audit's options) runs first; its outcome travels in the first agreement
        # round (start_params), so a rank that refuses is named on every rank at once (its own
        # code there, `peer-refused` elsewhere) and no rank is left waiting for it or pairs its
        # next learner with this one (issue 36).
        from ..numerics import contract_for_plan
        from .compute_check import ComputeCheck
        from .protocol import check_model, takes_rng

        local, compute = None, None
        try:
            mode = partition_mode(partition)  # the only look at the string: refused here if unknown
            kind = optimizer_class(optimizer)  # the same for the optimizer (and its options)
            opt_options = kind.options(lr=lr, momentum=momentum, weight_decay=weight_decay)
            check_model(model)  # a model that breaks the protocol is refused by name, before any collective
            # A model whose loss_and_grad_sum takes rng= gets each slot's own generator (seed, step, slot).
            self.seed, self.takes_rng = seed, takes_rng(model)
            kernel.fpenv_check()  # FTZ/DAZ or a non-nearest rounding mode would change the bits: refuse
            self.comm, self.model = comm, model
            self.size, self.rank = comm.Get_size(), comm.Get_rank()
            if slots < self.size:
                raise Refusal(
                    "placement-invalid",
                    f"{slots} slots on {self.size} ranks leaves ranks without a contribution; use --slots >= ranks",
                )
            self.topology, self.optimizer_name = topology, optimizer
            self.slots = slots
            n = self.n = model.n_params
            self.tree = build(topology, slots, self.size)
            # Plans and executors, built once. Their order ids are what the contract names.
            self.full_plan = plan(self.tree, ReplicateAll(), _weighted(n), size=self.size)
            self.my_slots = self.full_plan.slots_of(self.rank)
            # What the slots' bits depend on: this rank's compute identity, unless the model declares
            # (or the caller promises) machine independence; compared across ranks in the first round.
            self.compute = compute = ComputeCheck.for_model(model, machine_independent)
            self.compute_identity = self.compute.identity
            # The learner's numerical contract: the combine order, normalise-once, the optimizer
            # formula, and the compute identity (or the machine-independence declaration).
            spec = self.compute.spec
            self.contract = contract_for_plan(self.full_plan, optimizer=kind.formula, compute=spec)
            cd = self.contract.digest
            check_options((audit_slots, audit_digests, mode.name), slots, self.size)
            # With audit_slots the combine carries the audit's words after the stop word (its
            # digests' differences, audit.py): the same tree over a longer payload, so every
            # coordinate keeps its bits; the contract names the payload without them, so an
            # audited run and an unaudited one are one contract (checkpoints move between them).
            words = audit_words(audit_slots, slot_owners(self.full_plan, self.size), self.size)
            self._audit_at = n + 3
            combine_plan = (
                plan(self.tree, ReplicateAll(), _weighted(n, words), size=self.size)
                if words
                else self.full_plan
            )
            self.payloads = {s: np.zeros(n + 3 + words) for s in self.my_slots}
            # Coordinate ranges of the partitioned modes (every mode writes its own range of a
            # checkpoint): the reduce-scatter chunks of the payload, clipped to the n parameters.
            coords = Coordinates.of(combine_plan, n, self.rank)
            self.ranges, self.own = coords.ranges, coords.own
        except Exception as e:  # it travels to every rank, then is re-raised here
            local = e
        # Collective: every rank computes alike (or declares it need not) and holds the same start,
        # or every rank refuses, naming the ranks (and the identity's field). A rank whose checks
        # stopped before its ComputeCheck still says as many words (the fields come from the
        # identity alone): a round's records have one width on every rank.
        full = start_params(
            comm,
            model,
            seed=seed,
            init_params=init_params,
            timeout=timeout,
            compute=compute or ComputeCheck.for_model(model),
            local=local,
        )
        # What this rank holds and how the step combines, updates and gathers it (collective:
        # the holder builds its executors).
        self.holder = mode.build(comm, combine_plan, coords, full, timeout=timeout, contract=cd)
        lo, hi = self.holder.state_range
        self.opt = kind(hi - lo, **opt_options)
        self.checkpoint_view = LearnerCheckpoint(self.holder, self.opt, n, self.own)
        self.step = 0
        self.times = {"compute": 0.0, "combine": 0.0, "update": 0.0}
        self.layout_order_id = self.full_plan.layout_order_id  # what checkpoints and the contract name
        self.fault_hook = fault_hook
        opts = (audit_slots, audit_digests, mode.name)
        self.audit, self.replicas = build_checks(
            comm, self.full_plan, opts, timeout=timeout, contract=cd, compute=self.compute
        )
        self._audit_buf = np.zeros(n + 3 + words) if self.audit is not None else None
        self.realization = self.holder.gradient.realization

    # ------------------------------------------------------------------------------------------
    @property
    def partition(self) -> str:
        """The partition mode's name ("none", "state", "grads", "params")."""
        return self.holder.name

    @property
    def params(self) -> np.ndarray:
        """What this rank holds of the parameters: the whole vector, or its own range in `params`
        mode (`full_params()` assembles the whole)."""
        return self.holder.params

    def full_params(self) -> np.ndarray:
        """The whole parameter vector on this rank (assembled in `params` mode: every rank calls)."""
        return self.holder.full_params()

    @property
    def needed_slots(self) -> list[int]:
        """The slots whose (X, y) the next `train_step` needs on this rank: `my_slots`, then (with
        audit_slots) the slots it recomputes as auditor or referee this step."""
        from .audit import needed_slots

        return needed_slots(self.audit, self.my_slots, self.step)

    def _compute_slot(self, s: int, data: tuple[np.ndarray, np.ndarray], buf: np.ndarray) -> None:
        """Slot s's payload (Σ gradients, Σ samples, Σ loss) into buf[:n+2] at the current step."""
        n, (X, y) = self.n, data
        extra = {"rng": slot_generator(self.seed, self.step, s)} if self.takes_rng else {}
        buf[n + 1] = self.model.loss_and_grad_sum(self._params_now, X, y, buf[:n], **extra)
        buf[n] = float(len(y))
        if self.fault_hook is not None:  # the slot's words, not the audit's after them
            self.fault_hook(self.rank, self.step, s, buf[: n + 3])

    def _settle(self, recompute) -> None:
        """The audit's verdict on the combined words, on every rank alike. After a mismatch the
        referees recompute from the step's parameters (assembled again in `params` mode: every
        rank is here, since every rank read the same words)."""
        words = self.holder.gradient.extra
        if words.any():
            self._params_now = self.holder.full_params()
        try:
            self.audit.settle(self.step, words, recompute, self._audit_buf, words=self.n + 2)
        finally:
            self._params_now = None
            self.holder.forward_done()

    def train_step(
        self, batch: Mapping[int, tuple[np.ndarray, np.ndarray]], stop: bool = False
    ) -> tuple[float, np.bool_]:
        """One step over this rank's slots: `batch[slot] = (X, y)`. Returns (mean loss, stop?).

        `batch` holds exactly the slots in `my_slots` (`slice_batch` / `stream_batch` build it).
        Every rank calls train_step the same number of times. The returned loss is the global
        batch's mean, Σ loss / Σ samples over all slots (the same float on every rank); `stop?`
        is True on every rank when any rank passed `stop=True` (a preemption signal), so all stop
        after the same step. A non-finite value anywhere is refused on every rank
        (`non-finite-*`, or `peer-refused` naming it on the ranks that did not see it) and no rank applies
        the update: parameters and optimizer state stay as they were.

        Agreement without an extra round: the stop request travels as a payload word through the
        gradient combine; in `none` mode every rank proposes the identical update, so all refuse
        alike; in the partitioned modes each rank's refusal travels as the refusal flag on its
        assembly frames, and no rank commits unless no rank refused.
        """
        n, held = self.n, self.holder
        t0 = time.perf_counter()
        if self.audit is not None:  # refused before any exchange: every rank runs the same check
            missing = [s for s in self.needed_slots if s not in batch]
            if missing:
                raise Refusal(
                    "contribution-missing",
                    f"with audit_slots the batch must hold learner.needed_slots {self.needed_slots} "
                    f"at step {self.step}; it lacks {missing}",
                )
        self._params_now = held.full_params()
        first = True
        for s in self.my_slots:
            buf = self.payloads[s]
            self._compute_slot(s, batch[s], buf)
            buf[n + 2] = 1.0 if (stop and first) else 0.0
            first = False

        def recompute(s: int, out: np.ndarray) -> None:  # what the audit's auditors and referees run
            self._compute_slot(s, batch[s], out)

        if self.audit is not None:  # this rank's digests, carried by the combine (audit.py)
            carrier = self.payloads[self.my_slots[0]]  # the words ride in its first slot's payload
            self.audit.contribute(
                self.step,
                self.payloads,
                recompute,
                self._audit_buf,
                carrier[self._audit_at :],
                words=n + 2,
                at=self._audit_at,
                tamper=getattr(self.fault_hook, "carried", None),  # a hook that flips the carried words
            )
        self._params_now = None
        held.forward_done()
        t1 = time.perf_counter()
        failure = None
        try:  # the numerator over the coordinates this rank updates, and the scalar words
            num, mass, loss, stops = held.gradient.run(self.payloads)
        except KernelRefusal as e:
            if not e.code.startswith("non-finite"):
                raise
            failure = e
        t2 = time.perf_counter()
        if self.audit is not None and failure is None:  # before the update: a mismatch applies nothing
            self._settle(recompute)
        if failure is None:
            g = num / mass  # normalised once, after the combine
            try:
                self.opt.propose(held.updating(), g, held.next)
            except KernelRefusal as e:
                failure = e
        held.install(failure)  # raises this rank's refusal or a peer's before anything is applied
        self.opt.commit()
        t3 = time.perf_counter()
        self.times["compute"] += t1 - t0
        self.times["combine"] += t2 - t1
        self.times["update"] += t3 - t2
        self.step += 1
        if self.replicas is not None and self.replicas.due(self.step):
            self.replicas.check(self.step, self._replicated())
        return loss / mass, stops > 0

    def _replicated(self) -> list[np.ndarray]:
        """The arrays every rank holds in full (what the replica digests compare)."""
        return self.holder.replicated(self.opt.state()["arrays"].values())

    def final_params(self) -> np.ndarray:
        """The full parameters on every rank (assembled in `params` mode: every rank calls)."""
        return self.full_params()

    def state_digest(self) -> str:
        """The digest of the whole learner state (alpha_mpi.learning.digests, STATE_COVERS): the
        parameters, every optimizer array, the step, the optimizer's carried scalars and the seed
        (with the step, the position of the slots' random numbers and of the data order). The
        same on every rank, rank count and partition mode; collective (the sharded arrays are
        assembled by selection). `digest(final_params())` is the parameters' alone."""
        from .digests import state_digest

        st = self.opt.state()
        arrays = {"params": self.full_params()}
        for name, values in st["arrays"].items():  # assembled where this rank holds its range only
            arrays[f"optimizer.{name}"] = self.holder.whole(values)
        scalars = {"step": self.step, "seed": self.seed, "optimizer": self.optimizer_name, **st["scalars"]}
        return state_digest(arrays, scalars)

    # -- checkpoints: every component is a logical vector of length n, saved by coordinate range --
    def save(self, directory: str, config: Mapping[str, object] | None = None) -> str:
        """Publish a checkpoint of this step under `directory` (collective); returns its step
        directory. See alpha_mpi.learning.checkpoints.save."""
        from .checkpoints import save

        return save(self, directory, config=config)

    def restore(
        self,
        directory: str,
        config: Mapping[str, object] | None = None,
        *,
        adopt_contract: bool = False,
        missing_ok: bool = False,
        accept_compute_change: bool = False,
        adopt_weight_decay: bool = False,
    ) -> str | None:
        """Load the latest checkpoint in `directory` (or that step directory) saved on any rank
        count (collective); returns the step directory. `accept_compute_change`: resume although
        computed under another compute identity (`compute-changed` otherwise), `adopt_weight_decay`:
        with another weight decay (both recorded). See alpha_mpi.learning.checkpoints.restore."""
        from .checkpoints import restore

        consents = {"adopt_contract": adopt_contract, "accept_compute_change": accept_compute_change}
        consents["adopt_weight_decay"] = adopt_weight_decay
        return restore(self, directory, config=config, missing_ok=missing_ok, **consents)

    # -- the CheckpointedLearner protocol (alpha_mpi.checkpoint.checkpointer): the checkpoint view
    #    (learner_checkpoint.py) does the work; the learner hands it the step and takes it back.
    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, values)]) for the range this rank writes."""
        return self.checkpoint_view.pieces()

    def checkpoint_scalars(self) -> dict:
        return self.checkpoint_view.scalars(self.step)

    def checkpoint_read(self, ck: Checkpoint) -> dict:
        """Read this rank's ranges of `ck` into fresh arrays, checking it is this learner's."""
        return self.checkpoint_view.read(ck)

    def checkpoint_apply(self, state: dict) -> None:
        """Install what checkpoint_read returned (after every rank read its part)."""
        self.step = self.checkpoint_view.apply(state)

    def checkpoint_snapshot(self) -> dict:
        """A copy of this rank's state in the form checkpoint_apply installs."""
        return self.checkpoint_view.snapshot(self.step)

    def load_checkpoint(self, ck: Checkpoint) -> None:
        """Read this rank's ranges of `ck` and install them (checkpoint_read, then checkpoint_apply)."""
        self.checkpoint_apply(self.checkpoint_read(ck))

    def memory(self) -> dict:
        """Bytes this rank holds per kind of state (frames and transport buffers excluded)."""
        held = self.holder
        grads = sum(p.nbytes for p in self.payloads.values()) + held.gradient.reduced.nbytes
        return {"params": held.nbytes, "optimizer": self.opt.nbytes, "gradients": grads}
