"""The α–β–γ cost model that `auto` chooses realizations by (pure).

    T = rounds·α + (messages per rank − rounds)·α_msg + bytes moved per rank·β + bytes added·γ

Two latencies: α, the fixed cost of a round (the Python of one executor round and its first
message), and α_msg, the cost of each further message a rank posts in a round (MPI). β: seconds
per byte moved, γ: seconds per byte added by the kernel. A calibration without α_msg (0.1
files) charges each further message like a round (α_msg = α), as the one-latency model did.
Built-in defaults were measured on the development machine (2-core KVM guest, MPICH 5.0.2);
`alpha-mpi bench calibrate --out FILE` measures all four on yours, and
ALPHA_MPI_CALIBRATION=FILE makes every rank read that file. Every rank must choose the same
realization: give every rank the same file (a rank that chose differently is refused by name,
its frames naming another plan identity).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from ..refusals import Refusal
from .realize import REGISTRY

ENV = "ALPHA_MPI_CALIBRATION"


@dataclass(frozen=True)
class Calibration:
    # `alpha-mpi bench calibrate` at p = 2 on the development machine (2-core KVM guest, MPICH
    # 5.0.2); at p = 4 (oversubscribed) it measured alpha 53 us, beta 0.30 ns/B, gamma 0.28 ns/B.
    alpha: float = 18.5e-6  # s per message round (Python + MPI)
    beta: float = 0.18e-9  # s per byte moved (about 5.5 GB/s through shared memory)
    gamma: float = 0.17e-9  # s per byte added (about 6 GB/s for one fused add)
    alpha_msg: float = 18.5e-6  # s per further message in a round (not measured apart here: = alpha)
    source: str = "built-in defaults (development machine)"

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "alpha_msg": self.alpha_msg,
            "beta": self.beta,
            "gamma": self.gamma,
            "source": self.source,
        }


def load_calibration(path: str | None = None) -> Calibration:
    """The calibration in `path`, else in $ALPHA_MPI_CALIBRATION, else the built-in defaults."""
    path = path if path is not None else os.environ.get(ENV) or None
    if path is None:
        return Calibration()
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read for ever
        raise Refusal("calibration-invalid", f"{path!r} is not a regular file")
    try:
        with open(path) as f:
            d = json.load(f)
        values = [float(d[k]) for k in ("alpha", "beta", "gamma")]
        values.append(float(d.get("alpha_msg", values[0])))  # a 0.1 file: one latency
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise Refusal("calibration-invalid", f"cannot read a calibration from {path!r}: {e}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise Refusal(
            "calibration-invalid",
            f"{path!r}: alpha, beta, gamma and alpha_msg must be finite and >= 0, got {values}",
        )
    alpha, beta, gamma, alpha_msg = values
    return Calibration(alpha, beta, gamma, alpha_msg, source=str(path))


def estimate(tp, name: str, cal: Calibration, mode: str = "allreduce") -> float:
    """Modelled seconds of one run of realization `name` of tree plan `tp`."""
    if tp.size == 1:
        return tp.layout.nbytes * cal.gamma
    return REGISTRY[name].estimate(tp, cal, mode)  # each realization's module models itself


# Ties (equal estimates) go to the realization with the simplest per-rank program.
PREFERENCE = ("butterfly", "halving", "replicate", "tree", "scatter")


def choose(tp, names, cal: Calibration, mode: str = "allreduce"):
    """(best name, {name: estimate}) among the applicable `names`."""
    est = {name: estimate(tp, name, cal, mode) for name in names}
    return min(est, key=lambda k: (est[k], PREFERENCE.index(k))), est


__all__ = ["Calibration", "load_calibration", "estimate", "choose", "ENV"]
