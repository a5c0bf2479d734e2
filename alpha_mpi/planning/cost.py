"""The α–β–γ cost model that `auto` chooses realizations by (pure).

    T = rounds·α + bytes moved per rank·β + bytes added per rank·γ

α: seconds per message round (Python + MPI latency), β: seconds per byte moved, γ: seconds per
byte added by the kernel. Built-in defaults were measured on the development machine (2-core
KVM guest, MPICH 5.0.2); `alpha-mpi bench calibrate --out FILE` measures them on yours, and
ALPHA_MPI_CALIBRATION=FILE makes every rank read that file. Every rank must choose the same
realization: give every rank the same file (a rank that chose differently is refused by name,
its frames naming another plan identity).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass

from ..refusals import Refusal
from .operands import operands
from .ranktop import butterfly_rounds, halving_shape, top_of
from .realize import _tree_rounds

ENV = "ALPHA_MPI_CALIBRATION"


@dataclass(frozen=True)
class Calibration:
    # `alpha-mpi bench calibrate` at p = 2 on the development machine (2-core KVM guest, MPICH
    # 5.0.2); at p = 4 (oversubscribed) it measured alpha 53 us, beta 0.30 ns/B, gamma 0.28 ns/B.
    alpha: float = 18.5e-6  # s per message round (Python + MPI)
    beta: float = 0.18e-9  # s per byte moved (about 5.5 GB/s through shared memory)
    gamma: float = 0.17e-9  # s per byte added (about 6 GB/s for one fused add)
    source: str = "built-in defaults (development machine)"

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "source": self.source}


def load_calibration(path: str | None = None) -> Calibration:
    """The calibration in `path`, else in $ALPHA_MPI_CALIBRATION, else the built-in defaults."""
    path = path if path is not None else os.environ.get(ENV) or None
    if path is None:
        return Calibration()
    try:
        with open(path) as f:
            d = json.load(f)
        values = [float(d[k]) for k in ("alpha", "beta", "gamma")]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refusal("calibration-invalid", f"cannot read a calibration from {path!r}: {e}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise Refusal(
            "calibration-invalid", f"{path!r}: alpha, beta and gamma must be finite and >= 0, got {values}"
        )
    return Calibration(*values, source=str(path))


def estimate(tp, name: str, cal: Calibration, mode: str = "allreduce") -> float:
    """Modelled seconds of one run of realization `name` of tree plan `tp`."""
    p, nb = tp.size, tp.layout.nbytes
    a, b, g = cal.alpha, cal.beta, cal.gamma
    L = max(0, (p - 1).bit_length())
    if p == 1:
        return nb * g
    if name == "butterfly":
        top = top_of(tp.tree, p, name)
        late = any(r in tp.receivers for r in top.extra)
        return butterfly_rounds(top, late) * (a + nb * b + nb * g)
    if name == "halving":
        top = top_of(tp.tree, p, name)
        depth, rs_rounds = halving_shape(top)
        part = nb * (1 - 0.5**depth)  # a holder's share of the vector moved each way
        if mode == "allreduce":
            late = (1 << depth) < len(tp.receivers)  # ranks without a chunk get the whole result
            rounds = rs_rounds + depth + late
            return rounds * a + (2 * part + nb * late) * b + part * g
        return (rs_rounds + L) * a + part * b + part * g
    ops = operands(tp.tree)
    counts = Counter(o.owner for o in ops)
    k_max = max(counts.values(), default=1)
    if name == "replicate":
        return L * a + nb * (len(ops) - 1) * b + nb * (len(ops) - 1) * g
    if name == "scatter":
        part = nb * (p - 1) / p
        gather = part if mode == "allreduce" else 0.0
        return 2 * (p - 1) * a + (part * k_max + gather) * b + nb / p * (len(ops) - 1) * g
    # tree: the critical path hops, a full payload moved and added per hop
    hops = _tree_rounds(tp)
    return hops * (a + nb * b) + max(1, hops // 2) * nb * g


# Ties (equal estimates) go to the realization with the simplest per-rank program.
PREFERENCE = ("butterfly", "halving", "replicate", "tree", "scatter")


def choose(tp, names, cal: Calibration, mode: str = "allreduce"):
    """(best name, {name: estimate}) among the applicable `names`."""
    est = {name: estimate(tp, name, cal, mode) for name in names}
    return min(est, key=lambda k: (est[k], PREFERENCE.index(k))), est


__all__ = ["Calibration", "load_calibration", "estimate", "choose", "ENV"]
