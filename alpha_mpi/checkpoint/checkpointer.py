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
2. every rank opens that step (seal, schema, contract, order id, config, data), reads the ranges
   it now owns into fresh buffers; all vote;
3. only then every rank installs what it read. A refusal anywhere leaves every learner as it was.

The constructor takes an advisory lock on the directory (lock.py) on rank 0; `close()` (or
leaving a `with` block) releases it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from ..execution import Combiner
from ..model import ReplicateAll, star
from ..planning import plan
from ..refusals import CheckpointRefusal, Refusal
from . import schema, store
from .layout import published_steps, step_name, step_of
from .lock import DirectoryLock
from .reader import Checkpoint, is_step_dir, newest_verifying, read_latest

# Config fields a resume must share with the saved run (others, like --steps or --partition, may
# change). `lr` may change with adopt_lr; `momentum` matters to SGD only.
SAME_ON_RESUME = ("slots", "batch", "seed", "hidden", "data", "model", "optimizer", "lr", "momentum")
# Run options that are not part of a checkpoint's configuration.
NOT_SAVED = ("checkpoint_dir", "resume", "resume_from", "adopt_contract", "adopt_lr", "json")
DATA_STREAM = "permutation-v1"


def learner_contract(learner):
    return learner.contract


def check_compatible(saved: dict, learner, adopt: bool = False) -> dict | None:
    """Refuse a checkpoint whose numerical contract differs, unless adopting it is asked for."""
    from ..numerics import NumericalContract, numerical_compatibility

    current = learner_contract(learner)
    old = NumericalContract.from_dict(saved["contract"])
    try:
        numerical_compatibility(current, old, theirs_name="the checkpoint")
    except Refusal:
        if not adopt:
            raise
        return {"from": old.digest, "to": current.digest, "at_step": saved["step"]}
    if saved.get("order_id") != learner.order_id:
        if not adopt:
            from ..refusals import NumericalOrderMismatch

            raise NumericalOrderMismatch(
                f"the checkpoint's order id {str(saved.get('order_id'))[:24]} differs from "
                f"this run's {learner.order_id[:24]}"
            )
        return {"from": old.digest, "to": current.digest, "at_step": saved["step"]}
    return None


@dataclass
class Resumed:
    """What `resume()` did. `how`: latest | newer (a complete step newer than latest) | fallback
    (no latest) | chosen (--resume-from) | none. `lines`: what rank 0 says."""

    how: str
    path: str | None = None
    step: int = 0
    lines: list = field(default_factory=list)
    sha: str | None = None


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
        learner: a DataParallelLearner (or any object with `step`, `order_id`, `contract`,
            `checkpoint_pieces()`, `checkpoint_scalars()` and `checkpoint_read`/`checkpoint_apply`
            or `load_checkpoint`).
        cfg: the run's configuration (a dict or a dataclass of JSON scalars), saved in every
            manifest; on resume the keys in SAME_ON_RESUME are compared.
        adopt_contract: resume from a checkpoint of another numerical contract (recorded).
        adopt_lr: resume with another learning rate (recorded in `resume_history`).
        data: the data's fingerprint (`alpha_mpi.learning.data.fingerprint`), compared on resume.
        timeout: seconds a rank waits for the others' votes.
    """

    def __init__(
        self,
        comm,
        root: str,
        learner,
        cfg=None,
        *,
        adopt_contract: bool = False,
        adopt_lr: bool = False,
        data: dict | None = None,
        timeout=None,
    ):
        self.comm, self.root, self.learner = comm, root, learner
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        cfg = asdict(cfg) if cfg is not None and not isinstance(cfg, dict) else dict(cfg or {})
        self.cfg = cfg
        self.adopt_contract, self.adopt_lr = adopt_contract, adopt_lr
        self.data = dict(data or {})
        self.history, self.resume_history = [], []
        self._lock = None
        self._vote = Combiner(
            comm, plan(star(range(self.size), self.size), ReplicateAll(), 4, size=self.size), timeout=timeout
        )
        failure = None
        try:
            for k, v in self.cfg.items():
                if k not in NOT_SAVED:
                    schema.text(k, "config key", schema.NAME_RE, limit=64)
                    schema.scalar(v, f"config.{k}")
        except Refusal as e:
            failure = CheckpointRefusal("checkpoint-config-invalid", e.message)
        try:
            if self.rank == 0 and failure is None:
                failure = self._open_root()
        except Refusal as e:
            failure = e
        self._all(failure)

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _all(self, failure, skip: bool = False, value: float = 0.0, flag: bool = False):
        """Every rank learns whether any rank failed (all raise together, none is left waiting),
        whether rank 0 found the step already complete (`skip`), and rank 0's `value`/`flag`."""
        mine = [1.0 if failure else 0.0, 1.0 if skip else 0.0, float(value), 1.0 if flag else 0.0]
        if self.rank != 0:
            mine[1:] = [0.0, 0.0, 0.0]
        total = self._vote.run({self.rank: np.array(mine)})
        if failure is not None:
            raise failure
        if total[0] > 0:
            raise Refusal(
                "peer-failed", "another rank refused or failed in the checkpoint protocol; see its error"
            )
        return total[1] > 0, int(total[2]), total[3] > 0

    def has(self, step: int) -> bool:
        return os.path.isdir(os.path.join(self.root, step_name(step)))

    # ------------------------------------------------------------------------------ save
    def save(self) -> str:
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
        return {
            "order_id": lr.order_id,
            "contract": contract.to_dict(),
            "contract_digest": contract.digest,
            "contract_history": self.history,
            "resume_history": self.resume_history,
            "config": config,
            "scalars": lr.checkpoint_scalars(),
            "data": data,
            "saved_on_ranks": self.size,
        }

    # ------------------------------------------------------------------------------ restore
    def restore(self, path: str) -> str:
        """Read the checkpoint at `path` (a checkpoint directory, whose `latest` is read, or a
        step directory) into the learner, on any rank count. Collective; returns the step dir."""
        return self._load(path)

    def restore_latest(self):
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
                info = self._locate(path)
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

    def _locate(self, path) -> Resumed:
        root = self.root
        if path is not None:
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
                    f"{root} already holds {step_name(max(newer))}, newer than the chosen step "
                    f"{ck.step}; continuing "
                    ""
                    f"from step {ck.step} here would collide with published steps. Give another "
                    "--checkpoint-dir, "
                    f"or move the newer steps out of {root}",
                )
            r = Resumed(
                "chosen", ck.dir, ck.step, [f"# resumed from {ck.dir} at step {ck.step} (--resume-from)"]
            )
            r.sha = ck.manifest_sha256
            return r
        found = read_latest(root)
        steps = published_steps(root)
        if found is not None:
            k = step_of(os.path.basename(found[0]))
            if not steps or steps[-1] <= k:
                r = Resumed("latest", found[0], k, [f"# resumed from {found[0]} at step {k}"])
                r.sha = found[1]
                return r
            # A step newer than `latest`: a save was interrupted after publishing it, before it
            # moved `latest`. It is complete if it verifies; a broken one would collide later.
            ck, skipped = newest_verifying(root)
            if ck is not None and ck.step > k and not skipped:
                r = Resumed(
                    "newer",
                    ck.dir,
                    ck.step,
                    [
                        f"# {root}/latest names {step_name(k)}, but {step_name(ck.step)} is "
                        "complete (a save was "
                        f"interrupted before it moved latest): resuming from it",
                        f"# resumed from {ck.dir} at step {ck.step}",
                    ],
                )
                r.sha = ck.manifest_sha256
                return r
            broken = ", ".join(f"{step_name(s)} [{code}]" for s, code in skipped if s > k)
            raise CheckpointRefusal(
                "checkpoint-corrupt",
                f"{root} holds steps newer than the {step_name(k)} latest names that do not verify "
                f"({broken}); "
                f"a run from step {k} would collide with them. Move them out of {root} and resume again",
                path=root,
            )
        if not steps:
            return Resumed("none", None, 0, [f"# no checkpoint in {root}: starting at step 0"])
        ck, skipped = newest_verifying(root)
        broken = ", ".join(f"{step_name(k)} [{code}]" for k, code in skipped)
        if ck is None:
            raise CheckpointRefusal(
                "checkpoint-corrupt",
                f"{root} has no {os.path.basename('latest')} pointer and none of its steps "
                f"verifies ({broken}); "
                f"nothing to resume from. Move them out of {root} to start over",
                path=root,
            )
        if skipped:
            raise CheckpointRefusal(
                "checkpoint-corrupt",
                f"{root} has no latest pointer; its newest steps do not verify ({broken}); the "
                "newest that does is "
                f"{ck.dir}. Move the broken steps out of {root} and resume again, or pass "
                f"--resume-from {ck.dir} "
                f"with another --checkpoint-dir",
                path=root,
            )
        r = Resumed(
            "fallback",
            ck.dir,
            ck.step,
            [
                f"# {root}/latest is missing: resuming from the newest step that verifies, {ck.dir}",
                f"# resumed from {ck.dir} at step {ck.step}",
            ],
        )
        r.sha = ck.manifest_sha256
        return r

    def _load(self, path: str, expected=None) -> str:
        failure, ck, state, adopted, changes = None, None, None, None, []
        try:
            ck = Checkpoint(path, expected)
            m = ck.manifest
            missing = [k for k in schema.LEARNER_FIELDS if k not in m]
            if missing:
                raise CheckpointRefusal(
                    "checkpoint-manifest", f"{ck.dir} is not a learner checkpoint: it lacks {missing}"
                )
            adopted = check_compatible(m, self.learner, self.adopt_contract)
            changes = self._compare_config(m)
            self._compare_data(m)
            read = getattr(self.learner, "checkpoint_read", None)
            state = read(ck) if read is not None else None
        except Refusal as e:
            failure = e
        self._all(failure)
        try:  # every rank read everything it needs: install it
            if state is not None:
                self.learner.checkpoint_apply(state)
            else:
                self.learner.load_checkpoint(ck)
        except Refusal as e:
            failure = e
        self._all(failure)
        m = ck.manifest
        self.history = list(m.get("contract_history", [])) + ([adopted] if adopted else [])
        self.resume_history = list(m.get("resume_history", [])) + changes
        return ck.dir

    def _compare_config(self, m: dict) -> list:
        saved, now = m.get("config", {}), self.cfg
        optimizer = saved.get("optimizer", now.get("optimizer"))
        diffs, changes = [], []
        for k in SAME_ON_RESUME:
            if k in now and k not in saved and saved:
                diffs.append(f"{k}: the checkpoint's config does not record it, now {now[k]!r}")
                continue
            if k not in saved or k not in now or saved[k] == now[k]:
                continue
            if k == "momentum" and optimizer != "sgd":
                continue
            if k == "data" and "sha256" in m.get("data", {}) and "sha256" in self.data:
                continue  # the data's content is compared (_compare_data), not the path it was read from
            if k == "lr" and self.adopt_lr:
                changes.append({"at_step": m["step"], "field": "lr", "from": saved[k], "to": now[k]})
                continue
            hint = (
                "; resume with the saved --lr or pass --adopt-lr to continue with the new one"
                if k == "lr"
                else ""
            )
            diffs.append(f"{k}: saved {saved[k]!r}, now {now[k]!r}{hint}")
        hyper = m.get("scalars", {}).get("optimizer_hyper")
        live = getattr(getattr(self.learner, "opt", None), "lr", None)
        if isinstance(hyper, dict) and live is not None and hyper.get("lr") != live and "lr" not in now:
            if not self.adopt_lr:
                diffs.append(
                    f"lr: saved {hyper.get('lr')!r}, now {live!r}; pass adopt_lr=True to continue with it"
                )
            else:
                changes.append({"at_step": m["step"], "field": "lr", "from": hyper.get("lr"), "to": live})
        if diffs:
            raise CheckpointRefusal("checkpoint-config-mismatch", "; ".join(diffs))
        if "steps" in saved and "steps" in now and saved["steps"] != now["steps"]:
            changes.append(
                {"at_step": m["step"], "field": "steps", "from": saved["steps"], "to": now["steps"]}
            )
        return changes

    def _compare_data(self, m: dict) -> None:
        saved = m.get("data", {})
        diffs = [
            f"{k}: saved {str(saved[k])[:20]}, now {str(self.data[k])[:20]}"
            for k in ("samples", "sha256")
            if k in saved and k in self.data and saved[k] != self.data[k]
        ]
        if diffs:
            raise CheckpointRefusal(
                "checkpoint-data-mismatch",
                f"the checkpoint was trained on other data ({'; '.join(diffs)}; saved source "
                f"{str(saved.get('source'))[:80]!r}); its stream position means nothing for this data",
            )
