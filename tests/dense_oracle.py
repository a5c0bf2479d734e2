"""Independent oracle for the dense kernels (csrc/kernel/dense.h): the declared orders in plain Python
floats. It imports nothing from alpha_mpi and shares no code with the kernel; it follows the
header's text and nothing else. Every `+`, `-`, `*`, `/` on two Python floats is one correctly
rounded binary64 operation (no fused multiply-add), so evaluating the declared order here gives
the declared bits. numpy arrays are turned into lists at the boundary (`tolist()`), nothing more.

    products   s = +0.0; s = s + a(i,l) * b(l,j) for ascending l; then s + bias[j]
    col_sum    +0.0 + A[0,j] + A[1,j] + ... (ascending rows)
    relu       z if z > 0 or z is NaN else +0.0;  backward: g if z > 0 else +0.0
    softmax cross-entropy   per row: first maximum, t = z - max, e = exp(t), s = sum of e
               ascending, loss_i = log(s) - t_y, grad = e / s (minus 1.0 at the label); the
               loss is +0.0 + loss_0 + loss_1 + ...
    exp, log   fdlibm's algorithms (e_exp.c, e_log.c; Sun Microsystems: "Permission to use,
               copy, modify, and distribute this software is freely granted, provided that
               this notice is preserved."), here on Python floats and bit patterns.
"""

from __future__ import annotations

import math
import struct

INF = float("inf")
NAN = float("nan")


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _float(u: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", u & 0xFFFFFFFFFFFFFFFF))[0]


# ----------------------------------------------------------------------------- products


def product_sum(terms_a, terms_b, bias=None) -> float:
    """+0.0 + a0*b0 + a1*b1 + ... (ascending), then + bias."""
    s = 0.0
    for x, y in zip(terms_a, terms_b):
        s = s + x * y
    return s if bias is None else s + bias


def matmul(A, B, bias=None) -> list:
    """C = A @ B (+ bias) for A (m x k), B (k x n) given as nested lists (or arrays)."""
    A, cols = _rows(A), _columns(B)
    bias = None if bias is None else [float(v) for v in _flat(bias)]
    return [
        [product_sum(row, col, None if bias is None else bias[j]) for j, col in enumerate(cols)] for row in A
    ]


def matmul_tn(A, B, bias=None) -> list:
    """C = A^T @ B, A (k x m)."""
    return matmul(_columns(A), B, bias)


def matmul_nt(A, B, bias=None) -> list:
    """C = A @ B^T, B (n x k): its rows are the columns of B^T."""
    A, cols = _rows(A), _rows(B)
    bias = None if bias is None else [float(v) for v in _flat(bias)]
    return [
        [product_sum(row, col, None if bias is None else bias[j]) for j, col in enumerate(cols)] for row in A
    ]


def col_sum(A) -> list:
    A = _rows(A)
    out = [0.0] * (len(A[0]) if A else 0)
    for row in A:
        out = [s + v for s, v in zip(out, row)]
    return out


def relu(z) -> list:
    return [v if (v > 0.0 or v != v) else 0.0 for v in _flat(z)]


def relu_backward(g, z) -> list:
    return [gv if zv > 0.0 else 0.0 for gv, zv in zip(_flat(g), _flat(z))]


def softmax_xent(logits, labels) -> tuple:
    """(loss, grad rows) in the declared order."""
    total = 0.0
    grad = []
    for z, y in zip(_rows(logits), [int(v) for v in _flat(labels)]):
        mx = z[0]
        for v in z[1:]:
            if v > mx:
                mx = v
        t = [v - mx for v in z]
        e = [exp(v) for v in t]
        s = 0.0
        for v in e:
            s = s + v
        total = total + (log(s) - t[y])
        g = [v / s if s != 0.0 else _div(v, s) for v in e]
        g[y] = g[y] - 1.0
        grad.append(g)
    return total, grad


def _div(a: float, b: float) -> float:
    """IEEE a / b where Python would raise (b == 0)."""
    if a != a or a == 0.0:
        return NAN
    return math.copysign(INF, a) * math.copysign(1.0, b)


# ----------------------------------------------------------------------------- exp, log

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_P = (
    1.66666666666666019037e-01,
    -2.77777777770155933842e-03,
    6.61375632143793436117e-05,
    -1.65339022054652515390e-06,
    4.13813679705723846039e-08,
)
_LG = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
    1.818357216161805012e-01,
    1.531383769920937332e-01,
    1.479819860511658591e-01,
)


def exp(x: float) -> float:
    x = float(x)
    u = _bits(x)
    hx = (u >> 32) & 0x7FFFFFFF
    neg = u >> 63
    if hx >= 0x40862E42:
        if hx >= 0x7FF00000:
            if u & 0x000FFFFFFFFFFFFF:
                return x  # NaN
            return 0.0 if neg else x
        if x > 7.09782712893383973096e02:
            return INF
        if x < -7.45133219101941108420e02:
            return 0.0
    hi = lo = 0.0
    k = 0
    if hx > 0x3FD62E42:
        if hx < 0x3FF0A2B2:
            hi, lo, k = (x + _LN2_HI, -_LN2_LO, -1) if neg else (x - _LN2_HI, _LN2_LO, 1)
        else:
            k = int(_INV_LN2 * x + (-0.5 if neg else 0.5))  # int() truncates, as C's cast
            t = float(k)
            hi = x - t * _LN2_HI
            lo = t * _LN2_LO
        x = hi - lo
    elif hx < 0x3E300000:
        return 1.0 + x
    p1, p2, p3, p4, p5 = _P
    t = x * x
    c = x - t * (p1 + t * (p2 + t * (p3 + t * (p4 + t * p5))))
    if k == 0:
        return 1.0 - ((x * c) / (c - 2.0) - x)
    y = 1.0 - ((lo - (x * c) / (2.0 - c)) - hi)
    if k >= -1021:
        return _float(_bits(y) + (k << 52))
    return _float(_bits(y) + ((k + 1000) << 52)) * 2.0**-1000


def log(x: float) -> float:
    x = float(x)
    u = _bits(x)
    hx = u >> 32
    if hx & 0x80000000:
        hx -= 1 << 32  # the high word as a signed 32-bit integer
    lx = u & 0xFFFFFFFF
    k = 0
    if hx < 0x00100000:
        if (hx & 0x7FFFFFFF) | lx == 0:
            return -INF
        if hx < 0:
            return NAN
        k -= 54
        x = x * 2.0**54
        u = _bits(x)
        hx = u >> 32
    if hx >= 0x7FF00000:
        return x + x
    k += (hx >> 20) - 1023
    hx &= 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000
    x = _float(((hx | (i ^ 0x3FF00000)) << 32) | (u & 0xFFFFFFFF))
    k += i >> 20
    f = x - 1.0
    dk = float(k)
    if (0x000FFFFF & (2 + hx)) < 3:
        if f == 0.0:
            return 0.0 if k == 0 else dk * _LN2_HI + dk * _LN2_LO
        r = f * f * (0.5 - 0.33333333333333333 * f)
        return f - r if k == 0 else dk * _LN2_HI - ((r - dk * _LN2_LO) - f)
    lg1, lg2, lg3, lg4, lg5, lg6, lg7 = _LG
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    j = (hx - 0x6147A) | (0x6B851 - hx)
    t1 = w * (lg2 + w * (lg4 + w * lg6))
    t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)))
    r = t2 + t1
    if j > 0:
        hfsq = 0.5 * f * f
        if k == 0:
            return f - (hfsq - s * (hfsq + r))
        return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    if k == 0:
        return f - s * (f - r)
    return dk * _LN2_HI - ((s * (f - r) - dk * _LN2_LO) - f)


# ----------------------------------------------------------------------------- helpers


def _rows(A) -> list:
    return A.tolist() if hasattr(A, "tolist") else [list(r) for r in A]


def _flat(x) -> list:
    return x.reshape(-1).tolist() if hasattr(x, "reshape") else list(x)


def _columns(A) -> list:
    """The columns of a matrix (an array keeps its column count when it has no rows)."""
    return A.T.tolist() if hasattr(A, "T") else [list(c) for c in zip(*A)]
