"""Optimizer state over one coordinate range, updated by the C kernel with FiniteOrRefuse.

`propose` computes the next state into separate buffers (the kernel never writes its inputs),
`commit` swaps them in. Between the two, the learner asks every rank whether its proposal was
refused, so either every rank commits or none does: no partial update anywhere.
The bias corrections b1^t, b2^t are carried and multiplied once per step, never pow().
"""

from __future__ import annotations

import numpy as np

from .. import kernel


class Adam:
    """Adam over n coordinates, formula `adam-v1` (csrc/kernel/alpha_kernel.h ADAM EVALUATION ORDER);
    the bias powers b1^t, b2^t are carried and multiplied once per step."""

    name = "adam"

    def __init__(self, n: int, *, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = float(lr), float(b1), float(b2), float(eps)
        self.m, self.v = np.zeros(n), np.zeros(n)
        self._m, self._v = np.zeros(n), np.zeros(n)
        self.b1t, self.b2t = self.b1, self.b2  # b1^t, b2^t for the next step t = steps + 1
        self.steps = 0

    def propose(self, p, g, p_out) -> None:
        kernel.adam_step(
            p,
            self.m,
            self.v,
            g,
            p_out,
            self._m,
            self._v,
            lr=self.lr,
            b1=self.b1,
            b2=self.b2,
            eps=self.eps,
            b1t=self.b1t,
            b2t=self.b2t,
        )

    def commit(self) -> None:
        self.m, self._m = self._m, self.m
        self.v, self._v = self._v, self.v
        self.b1t *= self.b1
        self.b2t *= self.b2
        self.steps += 1

    def state(self) -> dict:
        """Arrays by name (coordinate-ranged) and scalars, for checkpoints."""
        return {
            "arrays": {"m": self.m, "v": self.v},
            "scalars": {"b1t": self.b1t, "b2t": self.b2t, "steps": self.steps},
        }

    def load(self, arrays: dict, scalars: dict) -> None:
        np.copyto(self.m, arrays["m"])
        np.copyto(self.v, arrays["v"])
        self.b1t, self.b2t, self.steps = float(scalars["b1t"]), float(scalars["b2t"]), int(scalars["steps"])

    @property
    def nbytes(self) -> int:
        return self.m.nbytes + self.v.nbytes + self._m.nbytes + self._v.nbytes


class SGD:
    """SGD with momentum over n coordinates, formula `sgd-momentum-v1` (csrc/kernel/alpha_kernel.h)."""

    name = "sgd"

    def __init__(self, n: int, *, lr: float, momentum: float = 0.9):
        self.lr, self.momentum = float(lr), float(momentum)
        self.buf = np.zeros(n) if self.momentum else None
        self._buf = np.zeros(n) if self.momentum else None
        self.steps = 0

    def propose(self, p, g, p_out) -> None:
        kernel.sgd_step(p, self.buf, g, p_out, self._buf, lr=self.lr, momentum=self.momentum)

    def commit(self) -> None:
        if self.buf is not None:
            self.buf, self._buf = self._buf, self.buf
        self.steps += 1

    def state(self) -> dict:
        arrays = {"buf": self.buf} if self.buf is not None else {}
        return {"arrays": arrays, "scalars": {"steps": self.steps}}

    def load(self, arrays: dict, scalars: dict) -> None:
        if self.buf is not None:
            np.copyto(self.buf, arrays["buf"])
        self.steps = int(scalars["steps"])

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes + self._buf.nbytes


def make_optimizer(name: str, n: int, *, lr: float, momentum: float = 0.9):
    if name == "adam":
        return Adam(n, lr=lr)
    if name == "sgd":
        return SGD(n, lr=lr, momentum=momentum)
    from ..refusals import Refusal

    raise Refusal("usage", f"unknown optimizer {name!r}; use adam or sgd")
