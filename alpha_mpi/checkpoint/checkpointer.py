"""Sharded checkpoints of a data-parallel learner, written and read by logical coordinate range.

Protocol of `save()` (every rank calls it at the same step):
1. rank 0 prepares the temporary directory (refusing a step already published); all ranks vote;
2. every rank writes the shards of the coordinate range it owns, fsynced, and a fragment listing
   them; all ranks vote;
3. rank 0 writes the manifest tree and its seal, renames the step into place and moves `latest`;
   all vote.
No rank returns before the step is published (or refused on every rank), so a job may exit right
after a save, e.g. on preemption. The checkpoint directory must be visible to every rank (a
shared file system on a cluster).

Protocol of `resume()` (every rank calls it once, before training):
1. rank 0 decides which step to read (what `latest` names; the newest step that verifies when
   `latest` is missing; the step `--resume-from` names; or none) and every rank learns it;
2. every rank opens that step (seal, schema, config, compute identity, contract, layout order id,
   data), reads the ranges it now owns into fresh buffers; all vote;
3. only then every rank installs what it read. A refusal anywhere leaves every learner as it was.

The constructor takes an advisory lock on the directory (lock.py) on rank 0; `close()` (or
leaving a `with` block) releases it. Built with `lock_now=False` it takes the lock (and creates
the directory) at its first save instead: until then it only reads, and reading a published step
needs no write access (a read-only checkpoint restores), as `checkpoint verify` takes no lock.

This module holds the collective protocol (who writes, reads and votes when); the questions it
asks are apart, each a pure function of files and records: which step to resume from
(locate.py) and what a resume must share with the saved run (compatibility.py). Their public
names are re-exported here.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

from ..execution import Endpoint
from ..refusals import CheckpointRefusal, Refusal
from . import schema, store
from .compatibility import (
    NOT_SAVED,
    SAME_ON_RESUME,
    check_compatible,
    check_compute,
    compare_config,
    compare_data,
    compare_weight_decay,
    learner_contract,
)
from .locate import Resumed, Rewind, locate, rewind_plan
from .lock import DirectoryLock
from .paths import published_steps, step_name, step_of
from .reader import Checkpoint, is_step_dir

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from mpi4py import MPI

    from ..model.contract import NumericalContract

DATA_STREAM = "permutation-v1"

__all__ = [
    "Checkpointer",
    "CheckpointedLearner",
    "Resumed",
    "SAME_ON_RESUME",
    "NOT_SAVED",
    "check_compatible",
]


class CheckpointedLearner(Protocol):
    """What checkpoints need of a learner (DataParallelLearner, alpha_mpi.torch.DataParallel's
    checkpoint view): its communicator (the learner's `save`/`restore` use it), step, layout order id and
    numerical contract, the pieces this rank writes, its scalars, and `load_checkpoint(ck)`. A
    learner may also offer `checkpoint_read(ck)` and `checkpoint_apply(state)`; the Checkpointer
    then reads on every rank before any rank installs (DataParallelLearner does)."""

    @property
    def comm(self) -> MPI.Comm: ...

    @property
    def step(self) -> int: ...

    @property
    def layout_order_id(self) -> str: ...

    @property
    def contract(self) -> NumericalContract: ...

    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, values)]) for the ranges this rank writes."""
        ...

    def checkpoint_scalars(self) -> dict:
        """The JSON scalars stored in the manifest (step, optimizer, ...)."""
        ...

    def load_checkpoint(self, ck: Checkpoint) -> None:
        """Read this rank's ranges of `ck` and install them."""
        ...


class Checkpointer:
    """Sharded checkpoints of one learner in one directory, written and read collectively.

        with Checkpointer(comm, "ckpt", learner, cfg, data=fingerprint(data)) as ck:
            for line in ck.resume().lines:   # every rank; rank 0 prints what it did
                print(line)
            ...
            ck.save()                        # every rank, at the same step

    Arguments:
        comm: the learner's communicator (every rank constructs the Checkpointer).
        root: the checkpoint directory (not a step directory: `checkpoint-dir-is-step`).
            Rank 0 creates it and takes its lock (`checkpoint-locked` if another process holds it).
        learner: a DataParallelLearner (or any object with `step`, `layout_order_id`, `contract`,
            `checkpoint_pieces()`, `checkpoint_scalars()` and `checkpoint_read`/`checkpoint_apply`
            or `load_checkpoint`).
        cfg: the run's configuration (a dict or a dataclass of JSON scalars), saved in every
            manifest; on resume the keys in SAME_ON_RESUME are compared.
        adopt_contract: resume from a checkpoint of another numerical contract (recorded).
        adopt_lr: resume with another learning rate (recorded in `resume_history`).
        adopt_weight_decay: resume with another weight decay (AdamW; recorded the same way).
        accept_compute_change: resume a checkpoint computed under another compute identity
            (`compute-changed` otherwise; recorded in `compute_history`).
        data: the data's fingerprint (`alpha_mpi.learning.data.fingerprint`), compared on resume.
        timeout: seconds a rank waits for the others' votes.
        lock_now: take the lock now (a trainer: before it reads `latest`, so a second trainer is
            refused before it reads or writes); False: at the first `save()` (a learner's
            `restore`, a replay: reading needs no write access, and published steps are
            immutable). `root` may then be a step directory, to restore from.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        root: str,
        learner: CheckpointedLearner,
        cfg: dict | DataclassInstance | None = None,
        *,
        adopt_contract: bool = False,
        adopt_lr: bool = False,
        accept_compute_change: bool = False,
        data: dict | None = None,
        adopt_weight_decay: bool = False,
        timeout: float | None = None,
        lock_now: bool = True,
    ) -> None:
        self.comm, self.root, self.learner = comm, root, learner
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        cfg = asdict(cfg) if cfg is not None and not isinstance(cfg, dict) else dict(cfg or {})
        self.cfg = cfg
        self.adopt_contract, self.adopt_lr = adopt_contract, adopt_lr
        self.adopt_weight_decay = adopt_weight_decay
        self.accept_compute_change = accept_compute_change
        self.data = dict(data or {})
        self.history, self.resume_history, self.compute_history = [], [], []
        self._lock = None
        self._endpoint = Endpoint.of(comm, timeout)  # its verdict round carries every vote
        self._timeout = timeout
        failure = None
        try:
            for k, v in self.cfg.items():
                if k not in NOT_SAVED:
                    schema.text(k, "config key", schema.NAME_RE, limit=64)
                    schema.scalar(v, f"config.{k}")
        except Refusal as e:
            failure = CheckpointRefusal("checkpoint-config-invalid", e.message)
        self._lock_now, self._opened = lock_now, False
        if lock_now:
            self._open(failure)
        else:
            self._all(failure)

    def _open(self, failure=None) -> None:
        """Rank 0 checks the root, creates it and takes its lock; every rank learns the outcome."""
        try:
            if self.rank == 0 and failure is None:
                failure = self._open_root()
        except Refusal as e:
            failure = e
        self._all(failure)
        self._opened = True

    def _open_root(self):
        root = self.root
        if is_step_dir(root) or step_of(os.path.basename(os.path.normpath(root))) is not None:
            parent = os.path.dirname(os.path.normpath(root)) or "."
            return CheckpointRefusal(
                "checkpoint-dir-is-step",
                f"{root} is a step directory, not a checkpoint directory; pass --checkpoint-dir {parent} "
                f"(and --resume-from {root} to start from that step)",
                path=root,
            )
        try:  # fail at start, not at the first save an hour later
            os.makedirs(root, exist_ok=True)
        except OSError as e:
            return store.write_failed(e, f"cannot create checkpoint directory {root}")
        self._lock = DirectoryLock(root)
        return None

    def close(self) -> None:
        """Release the directory lock (rank 0). Idempotent."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if not self._lock_now:
            self._opened = False  # a later save takes the lock again

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _all(self, failure, skip: bool = False, value: int = 0, flag: bool = False, moment: str = ""):
        """Every rank learns whether any rank failed (all raise together, none is left waiting:
        this rank its own refusal, the others `peer-refused` naming the lowest failing rank and
        its code, and `moment`, what it was doing), whether rank 0 found the step already
        complete (`skip`), and rank 0's `value`/`flag`. One verdict round of the communicator's
        endpoint."""
        mine = [int(skip), int(value), int(flag)] if self.rank == 0 else [0, 0, 0]
        v = self._endpoint.verdict(mine, failure, "the checkpoint protocol", timeout=self._timeout)
        v.raise_failures(failure, moment or "in the checkpoint protocol")
        skip, value, flag = (int(w) for w in v.words[0])
        return skip > 0, value, flag > 0

    def has(self, step: int) -> bool:
        """Step `step` is published in the checkpoint directory."""
        return os.path.isdir(os.path.join(self.root, step_name(step)))

    # ------------------------------------------------------------------------------ save
    def save(self) -> str:
        """Publish the learner's state at its current step (collective); returns the step
        directory. A step already published is left as it is."""
        if not self._opened:  # built with lock_now=False: the first write takes the lock
            self._open()
        lr = self.learner
        step = lr.step
        failure, complete = None, False
        final = os.path.join(self.root, step_name(step))
        if self.rank == 0:
            try:
                complete = store.prepare_tmp(self.root, step) is None
            except Refusal as e:
                failure = e
            except OSError as e:
                failure = store.write_failed(e, f"cannot prepare step {step} in {self.root}")
        if self._all(failure, complete)[0]:
            return final  # published before a crash; `latest` has now been moved to it
        tmp = os.path.join(self.root, f".tmp-{step_name(step)}")
        entries = {}
        try:
            for name, (length, pieces) in lr.checkpoint_pieces().items():
                entries[name] = {"length": length, "shards": store.write_shards(tmp, name, pieces)}
            store.write_durable(
                os.path.join(tmp, f".fragment-{self.rank}.json"), store.manifest_bytes(entries)
            )
        except Refusal as e:
            failure = e
        except OSError as e:
            failure = store.write_failed(e, f"rank {self.rank} cannot write its shards of step {step}")
        self._all(failure)
        if self.rank == 0:
            try:
                final = store.publish(
                    self.root, step, tmp, self._root_manifest(step), self._merge_fragments(tmp)
                )
            except Refusal as e:
                failure = e
            except OSError as e:
                failure = store.write_failed(e, f"cannot publish step {step}")
        self._all(failure)
        return final

    def _merge_fragments(self, tmp: str) -> dict:
        comps = {}
        for r in range(self.size):
            frag = os.path.join(tmp, f".fragment-{r}.json")
            with open(frag, "rb") as f:
                body = schema.loads(f.read(), f"fragment of rank {r}")
            for name, c in body.items():
                comps.setdefault(name, {"length": c["length"], "shards": []})["shards"] += c["shards"]
            os.remove(frag)
        return comps

    def _root_manifest(self, step: int) -> dict:
        lr = self.learner
        contract = learner_contract(lr)
        config = {k: v for k, v in self.cfg.items() if k not in NOT_SAVED}
        data = {
            "stream": DATA_STREAM,
            "position": step * config["batch"] if type(config.get("batch")) is int else 0,
        }
        data.update({k: v for k, v in self.data.items() if k in ("samples", "sha256", "source")})
        identity = getattr(lr, "compute_identity", None)  # rank 0's: the ranks' agree unless independent
        compute = {} if identity is None else {"compute": identity.to_dict()}
        return {
            "layout_order_id": lr.layout_order_id,
            "contract": contract.to_dict(),
            "contract_digest": contract.digest,
            "contract_history": self.history,
            "resume_history": self.resume_history,
            "compute_history": self.compute_history,
            **compute,
            "config": config,
            "scalars": lr.checkpoint_scalars(),
            "data": data,
            "saved_on_ranks": self.size,
        }

    def rewind(self, clean: int, held: int | None, folder: str) -> Rewind:
        """Go back to the newest state at or before step `clean` (collective; after a detection
        that says the steps after `clean` may hold a fault's work): rank 0 moves every published
        step after the chosen one into `root/folder` (store.set_aside) and points `latest` at
        the chosen step, or removes it when the chosen state is `held` (a state every rank holds
        in memory at that step: `save` says the caller saves it next) or when none is left
        (step None: a resume starts at step 0). Every rank learns the step and `save`."""
        if not self._opened:
            self._open()
        failure, chosen, save, aside, where = None, None, False, (), None
        if self.rank == 0:
            try:
                chosen, save, aside = rewind_plan(published_steps(self.root), clean, held)
                where = store.set_aside(self.root, aside, folder) if aside else None
                if chosen is None or save:
                    store.drop_latest(self.root)
                else:
                    store.point_latest(self.root, chosen)
            except Refusal as e:
                failure = e
            except OSError as e:
                failure = store.write_failed(
                    e, f"cannot set aside the steps after step {clean} in {self.root}"
                )
        _, value, save = self._all(failure, value=0 if chosen is None else chosen + 1, flag=save)
        return Rewind(None if value == 0 else value - 1, save, aside, where)

    # ------------------------------------------------------------------------------ restore
    def restore(self, path: str) -> str:
        """Read the checkpoint at `path` (a checkpoint directory, whose `latest` is read, or a
        step directory) into the learner, on any rank count. Collective; returns the step dir."""
        return self._load(path)

    def restore_latest(self) -> str | None:
        """Restore what `resume()` finds in the checkpoint directory; None when there is none."""
        r = self.resume()
        return r.path

    def resume(self, *, path: str | None = None) -> Resumed:
        """Continue from `path` (a step directory or another checkpoint directory) or, without it,
        from this directory: the step `latest` names; when `latest` is missing, the newest step
        that verifies (refused when newer steps fail); when there is no step, none (step 0).
        Collective. Refused: a broken `latest`, a chosen step older than steps already published
        here (the run would collide with them)."""
        failure, info = None, Resumed("none")
        if self.rank == 0:
            try:
                info = locate(self.root, path)
            except Refusal as e:
                failure = e
        _, value, itself = self._all(
            failure,
            value=0 if info.how == "none" else info.step + 1,
            flag=info.how == "chosen" and info.path == path,
        )
        if value == 0:
            return info if self.rank == 0 else Resumed("none")
        step = value - 1
        target = path if itself else os.path.join(path or self.root, step_name(step))
        got = self._load(target, expected=info.sha if self.rank == 0 else None)
        if self.rank != 0:
            info = Resumed("resumed", got, step)
        return info

    def _load(self, path: str, expected=None) -> str:
        failure, ck, state, adopted, changes, computed = None, None, None, None, [], None
        try:
            ck = Checkpoint(path, expected)
            m = ck.manifest
            missing = [k for k in schema.learner_fields(m) if k not in m]
            if missing:
                raise CheckpointRefusal(
                    "checkpoint-manifest", f"{ck.dir} is not a learner checkpoint: it lacks {missing}"
                )
            # The config first: a changed model or --slots is named as such, not as the
            # numerical-order mismatch it also causes.
            changes = compare_config(m, self.cfg, self.data, self.learner, self.adopt_lr)
            changes += compare_weight_decay(m, self.learner, self.adopt_weight_decay)
            # Then the compute identity: a slot computed by other kernels is named as such, not as
            # the contract difference it also makes.
            computed = check_compute(m, self.learner, self.accept_compute_change)
            adopted = check_compatible(m, self.learner, self.adopt_contract)
            compare_data(m, self.data)
            read = getattr(self.learner, "checkpoint_read", None)
            state = read(ck) if read is not None else None
        except Exception as e:  # not only refusals: any error travels, so no peer waits the bound
            failure = e
        self._all(failure, moment=f"reading {path} (no rank installed anything)")
        try:  # every rank read everything it needs: install it
            if state is not None:
                self.learner.checkpoint_apply(state)
            else:
                self.learner.load_checkpoint(ck)
        except Exception as e:
            failure = e
        self._all(
            failure, moment=f"installing {path} (the other ranks installed it: restore again on every rank)"
        )
        m = ck.manifest
        self.history = list(m.get("contract_history", [])) + ([adopted] if adopted else [])
        self.resume_history = list(m.get("resume_history", [])) + changes
        self.compute_history = list(m.get("compute_history", [])) + ([computed] if computed else [])
        return ck.dir
