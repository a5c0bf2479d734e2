"""The model protocol: what a numpy model gives a data-parallel learner, and what it must guarantee.

A model is any object with these members (duck typing; no base class to inherit):

    n_params: int                                         number of float64 parameters
    init(seed) -> np.ndarray                              initial parameters, shape (n_params,)
    loss_and_grad_sum(params, X, y, grad_out) -> float    Σ_i loss_i; writes Σ_i ∇loss_i
        (optionally with a keyword `rng`: the slot's numpy Generator, from (seed, step, slot))
    predict(params, X) -> np.ndarray                      optional: labels, for accuracy
    machine_independent: bool                             optional: True declares that the slot
        results (loss and gradient bits) do not depend on the compute identity

`check_model(model)` refuses an object that breaks the protocol by name (`model-protocol`),
saying which member is missing or wrong; `check_model(model, probe=(X, y))` also runs one probe
slot twice and refuses a model whose gradient is not the same bits both times
(`model-nondeterministic`). `DataParallelLearner` checks the members when it is built.

`model_from_spec("module:factory", inputs, classes)` is how `alpha-mpi train --model` finds a
user's model: `module` is imported from the working directory or PYTHONPATH and
`factory(inputs, classes)` returns a Model or a `torch.nn.Module` (wrapped in
`alpha_mpi.torch.ModuleModel`, trained in binary64 with summed cross-entropy).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Protocol, cast, runtime_checkable

import numpy as np

from ..refusals import Refusal
from .rng import slot_generator

__all__ = ["Model", "check_model", "model_from_spec", "takes_rng", "REQUIRED_METHODS"]


@runtime_checkable
class Model(Protocol):
    """A numpy model for `DataParallelLearner`: parameters are one flat float64 vector.

    Guarantees the bits depend on (the learner checks what it can, see `check_model`):

    - `n_params`: an int >= 1, fixed for the model's lifetime.
    - `init(seed)`: a float64 array of shape (n_params,), a function of `seed` alone (every rank
      calls it and must get the same bits; use `np.random.default_rng([seed, ...])`).
    - `loss_and_grad_sum(params, X, y, grad_out)`: for one slot (a micro-batch shard) X (k, d),
      y (k,), write the SUM over the slot's k samples of each sample's loss gradient into
      `grad_out` (float64, shape (n_params,), overwrite every element, do not keep a reference)
      and return the sum of the losses as a float. Sums, not means: the learner combines
      (Σ gradients, Σ samples) over the slot tree and divides once, so unequal slots weigh right.
    - Reproducible per slot: the same (params, X, y) give the same bits on whichever rank runs
      the slot. Fix the BLAS threads while computing (`threadpoolctl.threadpool_limits(1)`),
      do not let shapes depend on the rank or the rank count, read no global random state.
      A model that needs random numbers (dropout, noise, augmentation) takes a keyword `rng` in
      `loss_and_grad_sum(params, X, y, grad_out, rng=None)` and draws from it only: the learner
      passes each slot `alpha_mpi.learning.slot_generator(seed, step, slot)`, whose state
      depends on nothing else, so the draws are the same on whichever rank runs the slot.
      Models without that keyword are called as before.
    - `params` must not be modified (the learner owns it); `grad_out` is the only output.
    - Optional `predict(params, X) -> labels` is used for the accuracy `alpha-mpi train` prints.
    - Optional `machine_independent: bool` (default False): True declares that the slot results
      (loss and gradient bits) do not depend on the compute identity (alpha_mpi.model.compute:
      numpy's version and SIMD targets, the BLAS library, kernel and threads, torch's kernels),
      because the model computes only with alpha_mpi's fixed-order functions. The learner's
      contract then says "machine-independent (declared by the model)", ranks of different
      identities train together and a checkpoint resumes under any identity (recorded). A model
      that calls BLAS (`X @ W`), numpy's exp/log or torch must not declare it: without it, ranks
      whose identities differ are refused at start (`compute-mismatch`) and a resume under another
      identity is refused (`compute-changed`) unless accepted. A declaration that does not hold is
      named by the audit (`compute-mismatch`, no rank blamed) where ranks of different identities
      recompute each other's slots.
    """

    n_params: int
    # `machine_independent: bool` is optional (absent reads as False), so it is not a member here:
    # a runtime_checkable Protocol would make isinstance() demand it.

    def init(self, seed: int) -> np.ndarray:
        """Initial parameters: float64, shape (n_params,), the same bits for the same seed."""
        ...

    def loss_and_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, grad_out: np.ndarray
    ) -> float:
        """Write Σ_i ∇loss_i of the slot (X, y) into grad_out; return Σ_i loss_i."""
        ...


#: The protocol's required methods and how many positional arguments each takes (besides self).
REQUIRED_METHODS = {"init": 1, "loss_and_grad_sum": 4}


def _refuse(model, what: str) -> Refusal:
    return Refusal(
        "model-protocol",
        f"{type(model).__name__} does not satisfy alpha_mpi.learning.Model: {what}",
        member=what.split(" ", 1)[0],
    )


def _check_arity(model, name: str, count: int) -> None:
    fn = getattr(model, name, None)
    if fn is None:
        raise _refuse(model, f"{name} is missing (needed: {name}{_SIGNATURES[name]})")
    if not callable(fn):
        raise _refuse(model, f"{name} is not callable (needed: {name}{_SIGNATURES[name]})")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: trust it, the probe checks it
        return
    try:
        sig.bind(*range(count))
    except TypeError:
        raise _refuse(model, f"{name}{sig} cannot be called as {name}{_SIGNATURES[name]}") from None


_SIGNATURES = {"init": "(seed)", "loss_and_grad_sum": "(params, X, y, grad_out)", "predict": "(params, X)"}


def takes_rng(model: object) -> bool:
    """Whether `model.loss_and_grad_sum` accepts the keyword `rng` (a parameter of that name, or
    **kwargs): then the learner passes each slot its generator."""
    fn = getattr(model, "loss_and_grad_sum", None)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "rng" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) or p.kind == p.VAR_KEYWORD
        for p in params
    )


def check_model(model: object, probe: tuple[np.ndarray, np.ndarray] | None = None, seed: int = 0) -> Model:
    """Return `model` if it satisfies `Model`, else refuse by name (`model-protocol`).

    Checks the members: `n_params` an int >= 1; `init(seed)` and
    `loss_and_grad_sum(params, X, y, grad_out)` callable with those arguments; `predict`, if
    present, callable as `predict(params, X)`; `machine_independent`, if present, a bool. With
    `probe=(X, y)` (one small slot) it also calls `init(seed)` (float64, shape (n_params,),
    finite) and `loss_and_grad_sum` twice on the same inputs: a float loss, finite gradients,
    params left unchanged, and the same bits both times (`model-nondeterministic` otherwise).
    """
    n = getattr(model, "n_params", None)
    if n is None:
        raise _refuse(model, "n_params is missing (needed: the number of float64 parameters, an int >= 1)")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise _refuse(model, f"n_params is {n!r}; it must be an int >= 1")
    for name, count in REQUIRED_METHODS.items():
        _check_arity(model, name, count)
    if getattr(model, "predict", None) is not None:
        _check_arity(model, "predict", 2)
    independent = getattr(model, "machine_independent", False)
    if not isinstance(independent, bool):
        raise _refuse(model, f"machine_independent is {independent!r}; it must be True or False")
    if probe is not None:
        _probe(model, int(n), probe, seed)
    return cast(Model, model)


def _probe(model, n: int, probe, seed: int) -> None:
    X, y = probe
    p = model.init(seed)
    if not isinstance(p, np.ndarray) or p.dtype != np.float64 or p.shape != (n,):
        raise _refuse(
            model,
            f"init({seed}) returned {type(p).__name__} "
            f"{getattr(p, 'dtype', '')} {getattr(p, 'shape', '')}; "
            f"it must be a float64 array of shape ({n},)",
        )
    if not np.all(np.isfinite(p)):
        raise _refuse(model, f"init({seed}) returned non-finite parameters")
    again = model.init(seed)
    if not np.array_equal(p.view(np.uint64), np.asarray(again, dtype=np.float64).view(np.uint64)):
        raise Refusal(
            "model-nondeterministic", f"{type(model).__name__}.init({seed}) gave other bits on a second call"
        )
    before = p.copy()
    grads, losses = [], []
    drawn = _global_draws()
    for _ in range(2):
        g = np.full(n, np.nan)
        extra = {"rng": slot_generator(seed, 0, 0)} if takes_rng(model) else {}  # the same both times
        loss = model.loss_and_grad_sum(p, X, y, g, **extra)
        if isinstance(loss, bool) or not isinstance(loss, (float, int, np.floating, np.integer)):
            raise _refuse(
                model,
                f"loss_and_grad_sum returned {type(loss).__name__}; "
                "it must return the slot's loss sum as a float",
            )
        if not np.all(np.isfinite(g)):
            raise _refuse(
                model,
                "loss_and_grad_sum left non-finite values in grad_out (it must overwrite every element)",
            )
        grads.append(g)
        losses.append(float(loss))
    if not np.array_equal(p.view(np.uint64), before.view(np.uint64)):
        raise _refuse(model, "loss_and_grad_sum modified params (it must only write grad_out)")
    if not np.array_equal(grads[0].view(np.uint64), grads[1].view(np.uint64)) or np.float64(losses[0]).view(
        np.uint64
    ) != np.float64(losses[1]).view(np.uint64):
        now = _global_draws()
        used = [name for name in drawn if drawn[name] != now.get(name)]
        raise Refusal(
            "model-nondeterministic",
            f"{type(model).__name__}.loss_and_grad_sum gave other bits for the same slot on a second call"
            + (f"; it drew from {' and '.join(used)} (the global generator)" if used else ""),
        )


def _global_draws() -> dict:
    """The global random states a model may draw from by mistake, by name: numpy's legacy
    generator and, when the program has loaded torch, torch's CPU generator (their commonest
    cause of `model-nondeterministic`: the probe says which one a model drew from)."""
    st = np.random.get_state()
    states = {"np.random": (st[1].tobytes(), st[2], st[3], st[4])}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        states["torch's global generator"] = torch.get_rng_state().numpy().tobytes()
    return states


def model_from_spec(spec: str, inputs: int, classes: int) -> Model:
    """Build the model `alpha-mpi train --model module:factory` names.

    `module` is imported with the working directory first on the path (then PYTHONPATH);
    `factory(inputs, classes)` must return a `Model` or a `torch.nn.Module` mapping a
    (batch, inputs) float tensor to (batch, classes) logits; a module is wrapped in
    `alpha_mpi.torch.ModuleModel` (binary64, summed cross-entropy; the one place the learning
    layer imports alpha_mpi.torch, deferred to this call). Refuses with `model-factory` or `model-protocol`.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise Refusal("model-factory", f"--model {spec!r} is not of the form module:factory")
    mod_name, attr = spec.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise Refusal("model-factory", f"cannot import {mod_name!r} from {cwd} or PYTHONPATH: {e}") from None
    factory = getattr(mod, attr, None)
    if factory is None or not callable(factory):
        raise Refusal("model-factory", f"{mod_name} has no callable {attr!r}")
    try:
        inspect.signature(factory).bind(inputs, classes)
    except TypeError:
        raise Refusal(
            "model-factory", f"{spec}{inspect.signature(factory)} cannot be called as {attr}(inputs, classes)"
        ) from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass
    model = factory(inputs, classes)
    if _is_torch_module(model):
        from ..torch.module_model import ModuleModel

        return ModuleModel(model)
    return check_model(model)


def _is_torch_module(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)
