"""The optimizers of the numpy learner: one small class per optimizer, in one registry.

Each class is everything the rest of the package needs to know about its optimizer, read from
its class attributes (no instance needed) or from the state it holds over one coordinate range:

    name        the public name (`DataParallelLearner(optimizer=...)`, `alpha-mpi train --optimizer`)
    formula     the formula id the numerical contract names (alpha_mpi.model.formulas; its
                evaluation order is csrc/kernel/alpha_kernel.h's text)
    oracle      the name of the independent oracle's function that the tests hold it to
                (alpha_mpi.oracle)
    hyper       the hyperparameters a checkpoint records (`scalars.optimizer_hyper`)
    adoptable   those of them a resume may change with consent (the Checkpointer compares them:
                `adopt_lr`, `adopt_weight_decay`); the others must be the saved ones
    carried     the scalars carried from step to step (`scalars.optimizer_scalars`)
    arrays      the state buffers (checkpoint components `optimizer.<name>`, by coordinate range)
    default_lr  the command line's learning rate when --lr is not given

`propose` computes the next state into separate buffers by the C kernel (which never writes its
inputs: FiniteOrRefuse), `commit` swaps them in. Between the two, the learner asks every rank
whether its proposal was refused, so either every rank commits or none does: no partial update
anywhere. `optimizer_class(name)` reads the public string once (a typo is `usage`, naming the
known optimizers), `options(...)` checks the learner's options against it (`usage`), and the
class builds the state over n coordinates: `cls(n, **options)` (`make_optimizer`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import kernel
from ..refusals import Refusal

__all__ = ["Adam", "AdamW", "SGD", "OPTIMIZERS", "optimizer_class", "make_optimizer", "bias_power"]


def bias_power(b: float, steps: int) -> float:
    """b^(steps+1) as Adam carries it: b, then multiplied by b once per step (never pow())."""
    x = b
    for _ in range(steps):
        x *= b
    return x


def _no_weight_decay(name: str, weight_decay: float | None) -> None:
    if weight_decay:
        raise Refusal(
            "usage",
            f"weight_decay={weight_decay!r} with optimizer={name!r}: only 'adamw' decays weights "
            "(decoupled, torch.optim.AdamW's order); use optimizer='adamw' or leave weight_decay unset",
        )


class Adam:
    """Adam over n coordinates, formula `adam-v1` (csrc/kernel/alpha_kernel.h ADAM EVALUATION ORDER);
    the bias powers b1^t, b2^t are carried and multiplied once per step."""

    name, formula, oracle = "adam", "adam-v1", "adam"
    hyper = ("lr", "b1", "b2", "eps")
    adoptable = ("lr",)
    carried = ("b1t", "b2t", "steps")
    arrays = ("m", "v")
    default_lr = 2e-3

    def __init__(self, n: int, *, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = float(lr), float(b1), float(b2), float(eps)
        self.m, self.v = np.zeros(n), np.zeros(n)
        self._m, self._v = np.zeros(n), np.zeros(n)
        self.b1t, self.b2t = self.b1, self.b2  # b1^t, b2^t for the next step t = steps + 1
        self.steps = 0

    @classmethod
    def options(cls, *, lr: float, momentum: float, weight_decay: float | None) -> dict:
        """The constructor's keywords from the learner's options, or `usage` for one it does
        not take (checked before any collective, so the refusal travels to every rank)."""
        _no_weight_decay(cls.name, weight_decay)
        return {"lr": lr}

    def propose(self, p, g, p_out) -> None:
        kernel.adam_step(p, self.m, self.v, g, p_out, self._m, self._v, **self._kernel_scalars())

    def _kernel_scalars(self) -> dict:
        return {
            "lr": self.lr,
            "b1": self.b1,
            "b2": self.b2,
            "eps": self.eps,
            "b1t": self.b1t,
            "b2t": self.b2t,
        }

    def commit(self) -> None:
        self.m, self._m = self._m, self.m
        self.v, self._v = self._v, self.v
        self.b1t *= self.b1
        self.b2t *= self.b2
        self.steps += 1

    def hyper_values(self) -> dict:
        """The hyperparameters by name (`hyper`), as a checkpoint records them."""
        return {k: getattr(self, k) for k in self.hyper}

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

    @classmethod
    def saved_problem(cls, hyper: dict, carried: dict, step: int) -> str | None:
        """What is wrong with a checkpoint's (validated numbers) hyper and carried scalars at
        `step`, or None: the bias powers must be b^(step+1) by repeated multiplication."""
        for k, base in (("b1t", "b1"), ("b2t", "b2")):
            want = bias_power(hyper[base], step)
            if type(carried[k]) is not float or carried[k] != want:
                return (
                    f"scalars.optimizer_scalars.{k} {carried[k]!r} is not {base}^(t+1) = {want!r} at step "
                    f"{step} (carried by repeated multiplication)"
                )
        return None

    @property
    def nbytes(self) -> int:
        return self.m.nbytes + self.v.nbytes + self._m.nbytes + self._v.nbytes


class AdamW(Adam):
    """AdamW over n coordinates, formula `adamw-v1` (csrc/kernel/alpha_kernel.h ADAMW EVALUATION
    ORDER): decoupled weight decay in torch.optim.AdamW's order, p * (1 - lr*wd) first, then
    Adam's step on it. `weight_decay` defaults to torch's 0.01; Adam's state and carried powers."""

    name, formula, oracle = "adamw", "adamw-v1", "adamw"
    hyper = ("lr", "b1", "b2", "eps", "weight_decay")
    adoptable = ("lr", "weight_decay")
    default_weight_decay = 0.01  # torch.optim.AdamW's

    def __init__(self, n: int, *, lr: float, weight_decay: float = default_weight_decay, **adam):
        super().__init__(n, lr=lr, **adam)
        self.weight_decay = float(weight_decay)

    @classmethod
    def options(cls, *, lr: float, momentum: float, weight_decay: float | None) -> dict:
        wd = cls.default_weight_decay if weight_decay is None else weight_decay
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not (math.isfinite(wd) and wd >= 0):
            raise Refusal("usage", f"weight_decay must be a finite number >= 0 (torch's rule), got {wd!r}")
        return {"lr": lr, "weight_decay": wd}

    def propose(self, p, g, p_out) -> None:
        kernel.adamw_step(
            p, self.m, self.v, g, p_out, self._m, self._v, wd=self.weight_decay, **self._kernel_scalars()
        )

    @classmethod
    def saved_problem(cls, hyper: dict, carried: dict, step: int) -> str | None:
        if hyper["weight_decay"] < 0:
            return f"scalars.optimizer_hyper.weight_decay {hyper['weight_decay']!r} is negative"
        return super().saved_problem(hyper, carried, step)


class SGD:
    """SGD with momentum over n coordinates, formula `sgd-momentum-v1` (csrc/kernel/alpha_kernel.h)."""

    name, formula, oracle = "sgd", "sgd-momentum-v1", "sgd"
    hyper = ("lr", "momentum")
    adoptable = ("lr",)
    carried = ("steps",)
    arrays = ("buf",)  # absent at momentum 0 (state() then holds no array)
    default_lr = 0.05

    def __init__(self, n: int, *, lr: float, momentum: float = 0.9):
        self.lr, self.momentum = float(lr), float(momentum)
        self.buf = np.zeros(n) if self.momentum else None
        self._buf = np.zeros(n) if self.momentum else None
        self.steps = 0

    @classmethod
    def options(cls, *, lr: float, momentum: float, weight_decay: float | None) -> dict:
        _no_weight_decay(cls.name, weight_decay)
        return {"lr": lr, "momentum": momentum}

    def propose(self, p, g, p_out) -> None:
        kernel.sgd_step(p, self.buf, g, p_out, self._buf, lr=self.lr, momentum=self.momentum)

    def commit(self) -> None:
        if self.buf is not None:
            self.buf, self._buf = self._buf, self.buf
        self.steps += 1

    def hyper_values(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum}

    def state(self) -> dict:
        arrays = {"buf": self.buf} if self.buf is not None else {}
        return {"arrays": arrays, "scalars": {"steps": self.steps}}

    def load(self, arrays: dict, scalars: dict) -> None:
        if self.buf is not None:
            np.copyto(self.buf, arrays["buf"])
        self.steps = int(scalars["steps"])

    @classmethod
    def saved_problem(cls, hyper: dict, carried: dict, step: int) -> str | None:
        if not 0 <= hyper["momentum"] < 1:
            return f"scalars.optimizer_hyper.momentum {hyper['momentum']!r} is outside [0, 1)"
        return None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes + self._buf.nbytes


OPTIMIZERS: dict = {cls.name: cls for cls in (Adam, AdamW, SGD)}
"""name -> optimizer class, in the order the docs list them (defined once, never mutated)."""


def optimizer_class(name: str) -> type:
    """The optimizer named `name` ("adam", "adamw", "sgd"), or `usage` naming the known ones."""
    cls = OPTIMIZERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise Refusal("usage", f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    return cls


def make_optimizer(name: str, n: int, *, lr: float, momentum: float = 0.9, weight_decay: float | None = None):
    """The optimizer `name` over n coordinates (`usage` for an unknown name or an option it
    does not take: weight_decay is AdamW's only)."""
    cls = optimizer_class(name)
    return cls(n, **cls.options(lr=lr, momentum=momentum, weight_decay=weight_decay))
