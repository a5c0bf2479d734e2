"""Data-parallel learning over declared-order combines (layer 5).

The global batch is cut into logical slots; the combine tree is over slots, not ranks, so the same
run on 1, 2, 4 or 8 ranks gives the same bits. Each leaf carries (Σ gradients, Σ samples, Σ loss)
of one slot; after the combine the learner divides once, Σg / Σn.

Partition modes, each bit for bit equal to the replicated learner (every coordinate goes through
the same tree and the same kernel formula; only where it is computed and stored changes):

    none    gradients combined to every rank; every rank updates all parameters.
    state   gradients combined to every rank; each rank keeps optimizer state for its coordinate
            range only and updates that range; parameters are assembled by selection.
    grads   each range's gradient is combined only to its owner (DeliverTo): reduced gradients
            exist only at their owner; update and assembly as in `state`.
    params  as `grads`, and parameters themselves are sharded: the full vector is assembled for
            the forward pass and dropped after the step.

Every step ends with a two-number control combine (refused?, stop requested?) so that an update
refused on any rank (FiniteOrRefuse) is refused on all ranks before any rank commits, and a
preemption signal stops every rank after the same step.
"""

from __future__ import annotations

import time

import numpy as np

from ..execution import Assembler, Combiner
from ..model import DeliverTo, Layout, ReplicateAll, build, star
from ..planning import plan
from ..planning.assembly import even_ranges, plan_assembly
from ..refusals import KernelRefusal, Refusal
from .optim import make_optimizer

MODES = ("none", "state", "grads", "params")


def _weighted(n: int) -> Layout:
    return Layout(("numerator", n), ("mass", 1), ("loss", 1))


class DataParallelLearner:
    def __init__(self, comm, model, *, slots: int, topology: str = "hierarchy:2", optimizer: str = "adam",
                 lr: float = 1e-3, momentum: float = 0.9, partition: str = "none", seed: int = 0,
                 timeout=None, init_params=None):
        if partition not in MODES:
            raise Refusal("usage", f"unknown partition {partition!r}; use one of {', '.join(MODES)}")
        self.comm, self.model = comm, model
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        if slots < self.size:
            raise Refusal(
                "placement-invalid",
                f"{slots} slots on {self.size} ranks leaves ranks without a contribution; use --slots >= ranks",
            )
        self.partition, self.topology, self.optimizer_name = partition, topology, optimizer
        self.slots = slots
        n = self.n = model.n_params
        self.tree = build(topology, slots, self.size)
        self.ranges = even_ranges(n, self.size)
        a, b = self.own = next(((a, b) for r, a, b in self.ranges if r == self.rank), (0, 0))
        full = model.init(seed) if init_params is None else np.array(init_params, dtype=np.float64)
        self.params = full if partition != "params" else full[a:b].copy()
        self._p_next = np.empty(b - a)
        self.opt = make_optimizer(optimizer, n if partition == "none" else b - a, lr=lr, momentum=momentum)
        if partition == "none":
            self._p_next = np.empty(n)

        # Plans and executors, built once. Their order ids are what the contract names.
        self.full_plan = plan(self.tree, ReplicateAll(), _weighted(n), size=self.size)
        self.my_slots = self.full_plan.slots_of(self.rank)
        from ..numerics import contract_for_plan

        # The learner's numerical contract: the combine order, normalise-once, the optimizer formula.
        self.contract = contract_for_plan(self.full_plan, optimizer=optimizer)
        cd = self.contract.digest
        self.payloads = {s: np.zeros(n + 2) for s in self.my_slots}
        if partition in ("none", "state"):
            self.combiners = [Combiner(comm, self.full_plan, timeout=timeout, contract=cd)]
            self.reduced = np.empty(n + 2)
        else:
            self.range_plans = [plan(self.tree, DeliverTo(r), _weighted(hi - lo), size=self.size) for r, lo, hi in self.ranges]
            self.combiners = [Combiner(comm, p, timeout=timeout, contract=cd) for p in self.range_plans]
            self.range_payloads = [{s: np.zeros(hi - lo + 2) for s in self.my_slots} for r, lo, hi in self.ranges]
            self.reduced = np.empty(b - a + 2)
        self.assembler = None
        if partition != "none":
            self.assembler = Assembler(comm, plan_assembly(self.ranges, n, self.size), timeout=timeout, contract=cd)
        self.control = Combiner(comm, plan(star(range(self.size), self.size), ReplicateAll(), 2, size=self.size), timeout=timeout)
        self.step = 0
        self.times = {"compute": 0.0, "combine": 0.0, "update": 0.0}
        self.order_id = self.full_plan.order_id

    # ------------------------------------------------------------------------------------------
    def full_params(self) -> np.ndarray:
        """The whole parameter vector on this rank (assembled in `params` mode)."""
        if self.partition != "params":
            return self.params
        return self.assembler.run({self.own: self.params})

    def train_step(self, batch: dict, stop: bool = False):
        """One step over this rank's slots: `batch[slot] = (X, y)`. Returns (mean loss, stop?)."""
        n, (a, b) = self.n, self.own
        t0 = time.perf_counter()
        params = self.full_params()
        for s in self.my_slots:
            X, y = batch[s]
            buf = self.payloads[s]
            buf[n + 1] = self.model.loss_and_grad_sum(params, X, y, buf[:n])
            buf[n] = float(len(y))
        t1 = time.perf_counter()
        failure = None
        try:
            if self.partition in ("none", "state"):
                self.combiners[0].run(self.payloads, out=self.reduced)
                num = self.reduced[:n] if self.partition == "none" else self.reduced[a:b]
                mass, loss = self.reduced[n], self.reduced[n + 1]
            else:
                for (r, lo, hi), comb, pays in zip(self.ranges, self.combiners, self.range_payloads):
                    for s in self.my_slots:
                        src, dst = self.payloads[s], pays[s]
                        dst[: hi - lo] = src[lo:hi]
                        dst[hi - lo :] = src[n:]
                    try:
                        comb.run(pays, out=self.reduced if r == self.rank else None)
                    except KernelRefusal as e:  # the combiner stays usable; finish the other ranges
                        if not e.code.startswith("non-finite"):
                            raise
                        failure = failure or e
                num = self.reduced[: b - a]
                mass, loss = self.reduced[b - a], self.reduced[b - a + 1]
        except KernelRefusal as e:
            if not e.code.startswith("non-finite"):
                raise
            failure = e
        t2 = time.perf_counter()
        if failure is None:
            g = num / mass  # normalised once, after the combine
            p = self.params if self.partition in ("none", "params") else self.params[a:b]
            try:
                self.opt.propose(p, g, self._p_next)
            except KernelRefusal as e:
                failure = e
        verdict = self.control.run({self.rank: np.array([1.0 if failure else 0.0, 1.0 if stop else 0.0])})
        if verdict[0] > 0:
            if failure is not None:
                raise failure
            raise Refusal("peer-failed", f"another rank refused its update at step {self.step}; no rank applied it")
        self.opt.commit()
        if self.partition in ("none", "params"):
            self.params, self._p_next = self._p_next, self.params
        else:
            self.params = self.assembler.run({self.own: self._p_next}, out=self.params)
        t3 = time.perf_counter()
        self.times["compute"] += t1 - t0
        self.times["combine"] += t2 - t1
        self.times["update"] += t3 - t2
        self.step += 1
        return loss / mass, verdict[1] > 0

    def final_params(self):
        """The full parameters on every rank (assembled in `params` mode: every rank calls)."""
        return self.full_params()

    # -- checkpoints: every component is a logical vector of length n, saved by coordinate range --
    def checkpoint_pieces(self) -> dict:
        """name -> (length, [(start, stop, values)]) for the range this rank writes."""
        n, (a, b) = self.n, self.own
        if b <= a:
            return {}
        p = self.params if self.partition == "params" else self.params[a:b]
        out = {"params": (n, [(a, b, p)])}
        for name, arr in self.opt.state()["arrays"].items():
            out[f"optimizer.{name}"] = (n, [(a, b, arr if self.partition != "none" else arr[a:b])])
        return out

    def checkpoint_scalars(self) -> dict:
        return {"step": self.step, "optimizer": self.optimizer_name, "optimizer_scalars": self.opt.state()["scalars"],
                "partition_saved": self.partition}

    def load_checkpoint(self, ck) -> None:
        """Read exactly the ranges this rank now owns, whatever the rank count was at save time."""
        n, (a, b) = self.n, self.own
        if ck.length("params") != n:
            raise Refusal("checkpoint-config-mismatch", f"checkpoint has {ck.length('params')} parameters, this model {n}")
        sc = ck.manifest["scalars"]
        if sc.get("optimizer") != self.optimizer_name:
            raise Refusal("checkpoint-config-mismatch", f"checkpoint optimizer {sc.get('optimizer')!r}, now {self.optimizer_name!r}")
        if self.partition == "params":
            self.params[...] = ck.read_range("params", a, b)
        else:
            self.params[...] = ck.read_range("params", 0, n)
        lo, hi = (0, n) if self.partition == "none" else (a, b)
        arrays = {name: ck.read_range(f"optimizer.{name}", lo, hi) for name in self.opt.state()["arrays"]}
        self.opt.load(arrays, sc["optimizer_scalars"])
        self.step = int(sc["step"])

    def memory(self) -> dict:
        """Bytes this rank holds per kind of state (frames and transport buffers excluded)."""
        n, (a, b) = self.n, self.own
        grads = sum(p.nbytes for p in self.payloads.values()) + self.reduced.nbytes
        if self.partition in ("grads", "params"):
            grads += sum(p.nbytes for pays in self.range_payloads for p in pays.values())
        params = self.params.nbytes + self._p_next.nbytes + (8 * n if self.partition == "params" else 0)
        return {"params": params, "optimizer": self.opt.nbytes, "gradients": grads}
