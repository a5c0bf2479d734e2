"""Training data and its deterministic cut into logical slots (micro-batch shards).

The global batch of step t is a fixed window of a seeded permutation stream; slot s of that batch
is a fixed sub-window. Every rank computes the same cut, whatever the rank count, so a slot holds
the same samples on 1, 2, 4 or 8 ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from .. import ops
from ..refusals import Refusal


class Dataset:
    def __init__(self, X, y, X_eval, y_eval, classes: int, name: str):
        self.X, self.y, self.X_eval, self.y_eval = X, y, X_eval, y_eval
        self.classes, self.name = classes, name

    @property
    def inputs(self) -> int:
        return self.X.shape[1]


def synthetic(seed: int, n: int = 8192, n_eval: int = 2048, inputs: int = 128, classes: int = 10) -> Dataset:
    """A deterministic classification task: labels from a random linear teacher on a nonlinear
    feature (|x| mixed in), 5% of labels flipped at random.

    The same data on every machine: the teacher's products are alpha_mpi's fixed-order kernel
    (`ops.matmul`; with BLAS a label near a tie could flip with the CPU), `+`, `np.abs` and
    argmax are exact or one rounding per element; the normal draws are as machine-independent
    as `MLP.init`'s (see there)."""
    rng = np.random.default_rng([seed, 0x5EED])
    X = rng.standard_normal((n + n_eval, inputs))
    T1 = rng.standard_normal((inputs, classes))
    T2 = rng.standard_normal((inputs, classes)) * 0.5
    y = np.argmax(ops.matmul(X, T1) + ops.matmul(np.abs(X), T2), axis=1)
    flip = rng.random(n + n_eval) < 0.05
    y[flip] = rng.integers(0, classes, int(flip.sum()))
    return Dataset(X[:n], y[:n], X[n:], y[n:], classes, f"synthetic(seed={seed})")


MAX_CLASSES = 1 << 16  # labels 0..C-1; a label of 10^9 would make the output layer gigabytes


def load_npz(path: str, eval_fraction: float = 0.2) -> Dataset:
    """User data: an .npz with X (n, d) real numbers and y (n,) integer labels 0..C-1.

    Refused by name (`data-invalid`), before anything is allocated for the model: a file that is
    not an .npz archive (an .npy array, text), missing arrays, object arrays (never unpickled),
    complex, boolean or string X, no feature column, NaN/Inf, non-integer or negative labels, and
    labels whose range would need more than MAX_CLASSES output classes.
    """
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block np.load for ever
        raise Refusal("data-invalid", f"{path} is not a regular file")
    try:
        f = np.load(path, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise Refusal(
                "data-invalid",
                f"{path} is a single .npy array, not an .npz archive with arrays X and y "
                f"(save it with np.savez(path, X=X, y=y))",
            )
        with f:
            if "X" not in f.files or "y" not in f.files:
                raise Refusal("data-invalid", f"{path} has arrays {sorted(f.files)[:10]}, needs X and y")
            X, y = np.asarray(f["X"]), np.asarray(f["y"])
    except Refusal:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise Refusal("data-invalid", f"cannot read {path} as an .npz archive: {str(e)[:200]}")
    except Exception as e:  # zipfile.BadZipFile and friends: still named
        raise Refusal(
            "data-invalid", f"cannot read {path} as an .npz archive ({type(e).__name__}: {str(e)[:160]})"
        )
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y) or len(y) < 2:
        raise Refusal(
            "data-invalid", f"{path}: X must be (n, d) and y (n,) with n >= 2, got {X.shape} and {y.shape}"
        )
    if X.shape[1] < 1:
        raise Refusal("data-invalid", f"{path}: X has no feature column (shape {X.shape}); it needs d >= 1")
    if np.iscomplexobj(X):
        raise Refusal(
            "data-invalid",
            f"{path}: X is complex ({X.dtype}); give real numbers (the imaginary part would be dropped)",
        )
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)) or X.dtype == np.bool_:
        raise Refusal("data-invalid", f"{path}: X must hold real numbers (float or integer), found {X.dtype}")
    if not np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        raise Refusal("data-invalid", f"{path}: y must hold integer labels, found {y.dtype}")
    if y.min() < 0:
        raise Refusal("data-invalid", f"{path}: y holds the negative label {int(y.min())}; labels are 0..C-1")
    top = int(y.max())
    if top >= MAX_CLASSES:
        raise Refusal(
            "data-invalid",
            f"{path}: y holds the label {top}, so the model would need {top + 1} output "
            f"classes (more than {MAX_CLASSES}); relabel to 0..C-1",
        )
    X = X.astype(np.float64)
    if not np.all(np.isfinite(X)):
        raise Refusal("data-invalid", f"{path}: X holds NaN or Inf")
    k = max(1, int(len(y) * eval_fraction))
    return Dataset(X[k:], y[k:].astype(np.int64), X[:k], y[:k].astype(np.int64), top + 1, path)


def fingerprint(data: Dataset) -> dict:
    """What a checkpoint records about its data, compared on resume: sample count, a sha256 over
    the arrays (training and held-out, as little-endian float64 / int64) and the source name."""
    import hashlib

    h = hashlib.sha256(b"alpha-mpi/data/v1\0")
    for a, dt in ((data.X, "<f8"), (data.y, "<i8"), (data.X_eval, "<f8"), (data.y_eval, "<i8")):
        a = np.ascontiguousarray(a, dtype=dt)
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    return {"samples": int(len(data.y)), "sha256": h.hexdigest(), "source": str(data.name)[:4096]}


def slot_sizes(batch: int, slots: int) -> list:
    """Samples per slot: batch // slots, the first batch % slots slots one more (unequal allowed)."""
    base, extra = divmod(batch, slots)
    return [base + (1 if s < extra else 0) for s in range(slots)]


class SlotStream:
    """Which samples slot s reads at step t; identical on every rank."""

    def __init__(self, n: int, batch: int, slots: int, seed: int, sizes: Iterable[int] | None = None) -> None:
        if batch < slots:
            raise Refusal(
                "options-conflict",
                f"--batch {batch} is smaller than --slots {slots}: every slot needs a sample",
            )
        self.n, self.batch, self.seed = n, batch, seed
        self.sizes = list(sizes) if sizes is not None else slot_sizes(batch, slots)
        if sum(self.sizes) != batch:
            raise Refusal("usage", f"slot sizes {self.sizes} do not add up to the batch {batch}")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self._perms = {}

    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            if len(self._perms) >= 2:  # a batch spans at most two epochs
                self._perms.pop(min(self._perms))
            p = self._perms[epoch] = np.random.default_rng([self.seed, 0xDA7A, epoch]).permutation(self.n)
        return p

    def indices(self, step: int, slot: int) -> np.ndarray:
        start = step * self.batch + int(self.offsets[slot])
        count = self.sizes[slot]
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, pos = divmod(start + done, self.n)
            take = min(count - done, self.n - pos)
            out[done : done + take] = self._perm(epoch)[pos : pos + take]
            done += take
        return out
