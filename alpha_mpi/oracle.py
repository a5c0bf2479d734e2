"""The independent binary64 oracle (DESIGN.md "Showing that the declared order ran").

Plain Python floats only: every `+`, `-`, `*`, `/` on two Python floats and every
`math.sqrt` is one correctly rounded IEEE-754 binary64 operation (round to nearest,
ties to even), so evaluating the declared order here gives the declared bits. This
module shares no code with the C kernel (csrc/), alpha_mpi.kernel or any planner, and
does no numpy arithmetic: numpy arrays are turned into lists at the boundary
(`tolist()`), nothing more.

Python raises where IEEE returns a value (x / 0.0 -> ZeroDivisionError, sqrt(-1) ->
ValueError); `_div` and `_sqrt` give the IEEE results instead, so refusal decisions
below are taken on the same values the kernel sees.

FiniteOrRefuse verdicts are exceptions of class `OracleRefusal` with
`code` ("non-finite-input" / "non-finite-output"), `index` and `array`, matching the
kernel's rule: scalars first; then the first element index at which anything is
non-finite; at that index inputs in argument order, then computed values in the
order they are computed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # annotations only: the oracle runs no code of the model either
    from .model.tree import Node

__all__ = [
    "OracleRefusal",
    "add",
    "chain",
    "evaluate",
    "adam",
    "adamw",
    "sgd",
    "widen",
    "narrow",
    "bits",
    "from_bits",
    "to_list",
]

_INF = float("inf")
_NAN = float("nan")
_isfinite = math.isfinite


class OracleRefusal(Exception):
    """The oracle's FiniteOrRefuse verdict (what the kernel must refuse)."""

    def __init__(self, code: str, array: str, index: int | None) -> None:
        self.code = code
        self.array = array
        self.index = index
        super().__init__(f"{code}: {array}[{index}]")


def to_list(x: float | Iterable[float]) -> list[float]:
    """Boundary conversion: a numpy array (or any iterable of numbers) -> list of floats."""
    tolist = getattr(x, "tolist", None)
    if tolist is not None:
        x = tolist()
    if isinstance(x, float):
        return [x]
    return [float(e) for e in x]


def _div(a: float, b: float) -> float:
    if b != 0.0:
        return a / b
    if a != a or a == 0.0:
        return _NAN
    sign = math.copysign(1.0, a) * math.copysign(1.0, b)
    return math.copysign(_INF, sign)


def _sqrt(x: float) -> float:
    if x != x or x < 0.0:
        return _NAN
    return math.sqrt(x)  # sqrt(-0.0) = -0.0, sqrt(inf) = inf


# ----------------------------------------------------------------------------- combines


def add(a: Iterable[float], b: Iterable[float]) -> list[float]:
    """[a[i] + b[i]]: one branch, left operand first."""
    a, b = to_list(a), to_list(b)
    if len(a) != len(b):
        raise ValueError(f"length mismatch {len(a)} != {len(b)}")
    return [x + y for x, y in zip(a, b)]


def chain(vectors: Iterable[Iterable[float]]) -> list[float]:
    """((x0 + x1) + x2) + ... coordinate by coordinate (the star chain)."""
    vectors = [to_list(v) for v in vectors]
    if not vectors:
        raise ValueError("chain of no vectors")
    acc = list(vectors[0])
    for v in vectors[1:]:
        if len(v) != len(acc):
            raise ValueError("length mismatch in chain")
        acc = [x + y for x, y in zip(acc, v)]
    return acc


def evaluate(tree: Node, leaf_values: Mapping[int, Iterable[float]]) -> list[float]:
    """Evaluate a tree duck-typed as Branch (.left, .right) / Leaf (.slot): each branch is
    left + right coordinate by coordinate, left operand first. `leaf_values` maps slot ->
    vector. Iterative (explicit stack), so chains thousands of leaves deep are fine."""
    # post-order without recursion: (node, visited?) frames and a value stack
    values = []
    stack = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if hasattr(node, "left") and hasattr(node, "right"):
            if expanded:
                right = values.pop()
                left = values.pop()
                values.append(
                    [x + y for x, y in zip(left, right)] if len(left) == len(right) else _mismatch()
                )
            else:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
        elif hasattr(node, "slot"):
            values.append(to_list(leaf_values[node.slot]))
        else:
            raise TypeError(f"not a Branch (.left/.right) or Leaf (.slot): {node!r}")
    (result,) = values
    return result


def _mismatch() -> NoReturn:
    raise ValueError("leaf vectors of different lengths")


# ----------------------------------------------------------------------------- updates


def adam(
    p: Iterable[float],
    m: Iterable[float],
    v: Iterable[float],
    g: Iterable[float],
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    b1t: float,
    b2t: float,
) -> tuple[list[float], list[float], list[float]]:
    """One Adam step in the kernel's declared order; returns (p', m', v') lists or raises
    OracleRefusal.

        c1 = 1 - b1; c2 = 1 - b2; bc1 = 1 - b1t; bc2 = 1 - b2t        (once)
        m' = b1*m + c1*g
        v' = b2*v + c2*(g*g)
        mhat = m'/bc1;  vhat = v'/bc2
        p' = p - (lr*mhat)/(sqrt(vhat) + eps)
    """
    for name, s in (("lr", lr), ("b1", b1), ("b2", b2), ("eps", eps), ("b1t", b1t), ("b2t", b2t)):
        if not _isfinite(s):
            raise OracleRefusal("non-finite-input", name, None)
    p, m, v, g = to_list(p), to_list(m), to_list(v), to_list(g)
    n = len(p)
    if not (len(m) == len(v) == len(g) == n):
        raise ValueError("length mismatch")
    lr, b1, b2, eps = float(lr), float(b1), float(b2), float(eps)
    c1 = 1.0 - b1
    c2 = 1.0 - b2
    bc1 = 1.0 - float(b1t)
    bc2 = 1.0 - float(b2t)
    po, mo, vo = [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(n):
        pi, mi, vi, gi = p[i], m[i], v[i], g[i]
        for name, x in (("p", pi), ("m", mi), ("v", vi), ("g", gi)):
            if not _isfinite(x):
                raise OracleRefusal("non-finite-input", name, i)
        m1 = b1 * mi + c1 * gi
        gg = gi * gi
        v1 = b2 * vi + c2 * gg
        mhat = _div(m1, bc1)
        vhat = _div(v1, bc2)
        den = _sqrt(vhat) + eps
        num = lr * mhat
        p1 = pi - _div(num, den)
        for name, x in (
            ("m_out", m1),
            ("intermediate", gg),
            ("v_out", v1),
            ("intermediate", mhat),
            ("intermediate", vhat),
            ("intermediate", den),
            ("intermediate", num),
            ("p_out", p1),
        ):
            if not _isfinite(x):
                raise OracleRefusal("non-finite-output", name, i)
        po[i], mo[i], vo[i] = p1, m1, v1
    return po, mo, vo


def adamw(
    p: Iterable[float],
    m: Iterable[float],
    v: Iterable[float],
    g: Iterable[float],
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    b1t: float,
    b2t: float,
    wd: float,
) -> tuple[list[float], list[float], list[float]]:
    """One AdamW step (decoupled weight decay, torch.optim.AdamW's order: decay, then Adam on
    the decayed parameter) in the kernel's declared order; returns (p', m', v') or raises
    OracleRefusal.

        c1 = 1 - b1; c2 = 1 - b2; bc1 = 1 - b1t; bc2 = 1 - b2t; dec = 1 - lr*wd     (once)
        pd = p*dec
        m' = b1*m + c1*g
        v' = b2*v + c2*(g*g)
        mhat = m'/bc1;  vhat = v'/bc2
        p' = pd - (lr*mhat)/(sqrt(vhat) + eps)
    """
    scalars = (("lr", lr), ("b1", b1), ("b2", b2), ("eps", eps), ("b1t", b1t), ("b2t", b2t), ("wd", wd))
    for name, s in scalars:
        if not _isfinite(s):
            raise OracleRefusal("non-finite-input", name, None)
    p, m, v, g = to_list(p), to_list(m), to_list(v), to_list(g)
    n = len(p)
    if not (len(m) == len(v) == len(g) == n):
        raise ValueError("length mismatch")
    lr, b1, b2, eps, wd = float(lr), float(b1), float(b2), float(eps), float(wd)
    c1 = 1.0 - b1
    c2 = 1.0 - b2
    bc1 = 1.0 - float(b1t)
    bc2 = 1.0 - float(b2t)
    dec = 1.0 - lr * wd
    po, mo, vo = [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(n):
        pi, mi, vi, gi = p[i], m[i], v[i], g[i]
        for name, x in (("p", pi), ("m", mi), ("v", vi), ("g", gi)):
            if not _isfinite(x):
                raise OracleRefusal("non-finite-input", name, i)
        pd = pi * dec
        m1 = b1 * mi + c1 * gi
        gg = gi * gi
        v1 = b2 * vi + c2 * gg
        mhat = _div(m1, bc1)
        vhat = _div(v1, bc2)
        den = _sqrt(vhat) + eps
        num = lr * mhat
        p1 = pd - _div(num, den)
        for name, x in (
            ("intermediate", pd),
            ("m_out", m1),
            ("intermediate", gg),
            ("v_out", v1),
            ("intermediate", mhat),
            ("intermediate", vhat),
            ("intermediate", den),
            ("intermediate", num),
            ("p_out", p1),
        ):
            if not _isfinite(x):
                raise OracleRefusal("non-finite-output", name, i)
        po[i], mo[i], vo[i] = p1, m1, v1
    return po, mo, vo


def sgd(
    p: Iterable[float], buf: Iterable[float] | None, g: Iterable[float], lr: float, momentum: float
) -> tuple[list[float], list[float] | None]:
    """One SGD step (PyTorch convention, no dampening); returns (p', buf') lists, buf' is
    None when momentum == 0 (p' = p - lr*g); raises OracleRefusal.

        buf' = momentum*buf + g;  p' = p - lr*buf'
    """
    for name, s in (("lr", lr), ("momentum", momentum)):
        if not _isfinite(s):
            raise OracleRefusal("non-finite-input", name, None)
    lr, mu = float(lr), float(momentum)
    p, g = to_list(p), to_list(g)
    mom = mu != 0.0
    buf = to_list(buf) if mom else None
    n = len(p)
    po = [0.0] * n
    bo = [0.0] * n if mom else None
    for i in range(n):
        if not _isfinite(p[i]):
            raise OracleRefusal("non-finite-input", "p", i)
        if mom and not _isfinite(buf[i]):
            raise OracleRefusal("non-finite-input", "buf", i)
        if not _isfinite(g[i]):
            raise OracleRefusal("non-finite-input", "g", i)
        b1 = mu * buf[i] + g[i] if mom else g[i]
        step = lr * b1
        p1 = p[i] - step
        if mom and not _isfinite(b1):
            raise OracleRefusal("non-finite-output", "buf_out", i)
        if not _isfinite(step):
            raise OracleRefusal("non-finite-output", "intermediate", i)
        if not _isfinite(p1):
            raise OracleRefusal("non-finite-output", "p_out", i)
        po[i] = p1
        if mom:
            bo[i] = b1
    return po, bo


# ----------------------------------------------------------------------------- conversions


def widen(x32_bits: Iterable[int]) -> list[float]:
    """binary32 bit patterns (ints < 2**32) -> exact binary64 values."""
    x32_bits = [int(b) for b in (x32_bits.tolist() if hasattr(x32_bits, "tolist") else x32_bits)]
    return list(struct.unpack(f"<{len(x32_bits)}f", struct.pack(f"<{len(x32_bits)}I", *x32_bits)))


def narrow(x: Iterable[float]) -> list[int]:
    """binary64 values -> binary32 bit patterns, nearest-even. A non-finite input raises
    OracleRefusal('non-finite-input'); a finite value that rounds beyond binary32's range
    raises OracleRefusal('non-finite-output') (struct refuses to pack it)."""
    x = to_list(x)
    out = []
    for i, xi in enumerate(x):
        if not _isfinite(xi):
            raise OracleRefusal("non-finite-input", "x64", i)
        try:
            out.append(struct.unpack("<I", struct.pack("<f", xi))[0])
        except OverflowError:
            raise OracleRefusal("non-finite-output", "out32", i) from None
    return out


def bits(values: Iterable[float]) -> list[int]:
    """binary64 values -> their uint64 bit patterns (ints)."""
    values = to_list(values)
    return list(struct.unpack(f"<{len(values)}Q", struct.pack(f"<{len(values)}d", *values)))


def from_bits(patterns: Iterable[int]) -> list[float]:
    """uint64 bit patterns -> binary64 values."""
    patterns = [int(b) for b in patterns]
    return list(struct.unpack(f"<{len(patterns)}d", struct.pack(f"<{len(patterns)}Q", *patterns)))
