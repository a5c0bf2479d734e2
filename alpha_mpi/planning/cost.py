"""The α–β–γ cost model that `auto` chooses realizations by (pure).

    T = α0 + rounds·α + (messages per rank − rounds)·α_msg + bytes moved per rank·β + bytes added·γ

Three latencies: α0, the fixed cost of one run (the call into the executor: binding the
caller's arrays, the one call into the C round; the same for every realization, so it never
changes the choice, only the modelled time), α, the cost of a round (its first message through
MPI and the C round's header work), and α_msg, the cost of each further message a rank posts in
a round. β: seconds per byte moved, γ: seconds per byte added by the kernel. A calibration
without α_msg (0.1 files) charges each further message like a round (α_msg = α), as the
one-latency model did; one without α0 (0.1 and 0.2 files, whose α held the Python of a round)
has α0 = 0.
Built-in defaults were measured on the development machine (2-core KVM guest, MPICH 5.0.2);
`alpha-mpi bench calibrate --out FILE` measures all four on yours, and
ALPHA_MPI_CALIBRATION=FILE makes every rank read that file. Every rank must choose the same
realization: give every rank the same file (a rank that chose differently is refused by name,
its frames naming another plan identity).
"""

from __future__ import annotations

import math
import os

from .._record import Record
from ..refusals import Refusal
from .realize import REGISTRY

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

ENV = "ALPHA_MPI_CALIBRATION"
# The built-in calibration (Calibration's defaults), seconds: see Calibration.
CAL_ALPHA0, CAL_ALPHA, CAL_ALPHA_MSG = 3.0e-6, 0.7e-6, 1.0e-6
CAL_BETA, CAL_GAMMA = 0.18e-9, 0.17e-9


class Calibration(Record):
    __slots__ = ("alpha", "beta", "gamma", "alpha_msg", "source", "alpha0")

    def __init__(
        self,
        alpha: float = CAL_ALPHA,  # s per message round (MPI and the C round's header work)
        beta: float = CAL_BETA,  # s per byte moved (shared memory)
        gamma: float = CAL_GAMMA,  # s per byte added (one fused add)
        alpha_msg: float = CAL_ALPHA_MSG,  # s per further message in a round
        source: str = "built-in defaults (development machine)",
        alpha0: float = CAL_ALPHA0,  # s per run: the call into the executor (every realization alike)
    ) -> None:
        _set(self, "alpha", alpha)
        _set(self, "beta", beta)
        _set(self, "gamma", gamma)
        _set(self, "alpha_msg", alpha_msg)
        _set(self, "source", source)
        _set(self, "alpha0", alpha0)

    def to_dict(self) -> dict:
        return {
            "alpha0": self.alpha0,
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
    import json  # here: only a calibration file needs it (start-up, issue 42)

    try:
        with open(path) as f:
            d = json.load(f)
        values = [float(d[k]) for k in ("alpha", "beta", "gamma")]
        values.append(float(d.get("alpha_msg", values[0])))  # a 0.1 file: one latency
        values.append(float(d.get("alpha0", 0.0)))  # 0.1 and 0.2 files: no fixed cost apart
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise Refusal("calibration-invalid", f"cannot read a calibration from {path!r}: {e}") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise Refusal(
            "calibration-invalid",
            f"{path!r}: alpha, beta, gamma, alpha_msg and alpha0 must be finite and >= 0, got {values}",
        )
    alpha, beta, gamma, alpha_msg, alpha0 = values
    return Calibration(alpha, beta, gamma, alpha_msg, source=str(path), alpha0=alpha0)


def estimate(tp, name: str, cal: Calibration, mode: str = "allreduce") -> float:
    """Modelled seconds of one run of realization `name` of tree plan `tp`."""
    if tp.size == 1:
        return cal.alpha0 + tp.layout.nbytes * cal.gamma
    return cal.alpha0 + REGISTRY[name].estimate(tp, cal, mode)  # each realization models its rounds


# Ties (equal estimates) go to the realization with the simplest per-rank program.
PREFERENCE = ("butterfly", "halving", "replicate", "tree", "scatter")


def choose(tp, names, cal: Calibration, mode: str = "allreduce"):
    """(best name, {name: estimate}) among the applicable `names`."""
    est = {name: estimate(tp, name, cal, mode) for name in names}
    return min(est, key=lambda k: (est[k], PREFERENCE.index(k))), est


__all__ = ["Calibration", "load_calibration", "estimate", "choose", "ENV"]
