"""Conformance suites and evidence: what lets a BoundedDifference contract execute (layer 3).

A suite is seeded data plus the operation it measures. `measure_evidence(name)` RUNS it: every
case goes through the same kernel path the executor uses (the conversion sites of the contract,
then the fixed-order binary64 tree in the C kernel), and is compared with the independent oracle's
binary64 result for the same tree on the unconverted data. The largest ulp and absolute
differences, the suite's size and the kernel build id are recorded as ConformanceEvidence.

Each case is also checked bit for bit against the oracle evaluating the *converted* order
(oracle.narrow, oracle.widen, then the tree): the kernel must run exactly the declared
conversion-then-tree; only the conversion may make the result differ from binary64.

Suite `binary32-contributions-v1` (the contributions of a combine narrowed to binary32 at an
explicit RoundBinary64 site, then widened): 60 cases, 2..16 slots, star / hierarchy:2 /
hierarchy:3 trees, 64 coordinates per slot, values in its domain: |x| < 2**6, mixed signs over
15 binades, a quarter of them exactly representable in binary32. Within that domain each
narrowing errs by at most 2**-19, so a 16-slot sum differs from the binary64 tree by less than
2**-15 (plus the binary64 roundings of the partial sums, below 2**-40).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import kernel, oracle
from ..model import hierarchy, star
from ..model.profile import ContractRefusal
from ..model.relation import DEFAULT_SUITE, ConformanceEvidence
from ..model.tree import Leaf, Node, postorder
from ..refusals import Refusal
from .conversion import convert_contribution
from .oracle_check import OracleMismatch, differences

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "ConformanceSuite",
    "SUITES",
    "suite",
    "measure_evidence",
    "kernel_build_id",
    "kernel_tree",
    "oracle_convert",
]

_F32 = np.dtype(np.float32)


def oracle_convert(kinds: Iterable[str], x: np.ndarray) -> list[float]:
    """The oracle's reading of the same conversion site (plain Python, struct-based)."""
    kinds = tuple(kinds)
    if kinds == ("KeepFormat",):
        return oracle.to_list(x)
    if kinds == ("WidenBinary32",):
        return oracle.widen(np.asarray(x, dtype=_F32).view(np.uint32))
    if kinds == ("RoundBinary64", "WidenBinary32"):
        return oracle.widen(oracle.narrow(x))
    raise ContractRefusal("numerical-contract-invalid", f"conversion sequence {kinds} is not executable")


def kernel_tree(tree: Node, leaves: Mapping[int, ArrayLike]) -> np.ndarray:
    """The whole tree in one fused kernel pass (postfix program over the leaves, in order)."""
    inputs, program, index = [], [], {}
    for node in postorder(tree):
        if isinstance(node, Leaf):
            if node.slot not in index:
                index[node.slot] = len(inputs)
                inputs.append(np.ascontiguousarray(leaves[node.slot], dtype=np.float64))
            program.append(index[node.slot])
        else:
            program.append(kernel.OP_ADD)
    out = np.empty(inputs[0].size)
    kernel.tree_eval(out, inputs, np.asarray(program, dtype=np.int32))
    return out


# ---------------------------------------------------------------------------------- suites


@dataclass(frozen=True)
class ConformanceSuite:
    """A registered suite: seeded data over 2..max_slots slots (`sample`, `case`) and the
    conversion sequence it measures; `run_case(i)` runs case i on the kernel and the oracle."""

    name: str
    size: int  # cases
    seed: int
    min_slots: int
    max_slots: int
    n: int  # coordinates per slot
    exponents: tuple  # values are uniform(-1, 1) * 2**e, e in range(*exponents)
    conversions: tuple  # the conversion sequence at the contribution site
    description: str = ""

    def sample(self, nslots: int, n: int, seed: int | Sequence[int]) -> dict[int, np.ndarray]:
        """slot -> float64 vector drawn from the suite's domain (also for tests and demos)."""
        if nslots > self.max_slots:
            raise Refusal(
                "data-invalid",
                f"suite {self.name!r} covers at most {self.max_slots} slots, asked for {nslots}",
            )
        rng = np.random.default_rng(seed)
        lo, hi = self.exponents
        out = {}
        for s in range(nslots):
            x = rng.uniform(-1.0, 1.0, n) * np.exp2(rng.integers(lo, hi, n).astype(np.float64))
            exact = rng.random(n) < 0.25
            x[exact] = x[exact].astype(np.float32).astype(np.float64)
            out[s] = x
        return out

    def case(self, i: int) -> tuple[Node, dict[int, np.ndarray]]:
        """Case i: (tree, data). Trees cycle star / hierarchy:2 / hierarchy:3 over 2..max slots."""
        span = self.max_slots - self.min_slots + 1
        nslots = self.min_slots + (i % span)
        shape = i % 3
        tree = star(range(nslots)) if shape == 0 else hierarchy(range(nslots), None, shape + 1)
        return tree, self.sample(nslots, self.n, [self.seed, i])

    def run_case(self, i: int) -> tuple[np.ndarray, list[float]]:
        """(candidate float64 array, binary64 oracle list) for case i, the candidate checked
        bit for bit against the oracle of the converted order."""
        tree, data = self.case(i)
        converted = {s: convert_contribution(self.conversions, x)[0] for s, x in data.items()}
        got = kernel_tree(tree, converted)
        declared = oracle.evaluate(tree, {s: oracle_convert(self.conversions, x) for s, x in data.items()})
        coords, _, _ = differences(got, declared)
        if coords:
            raise OracleMismatch(
                f"suite {self.name!r} case {i}: the kernel's conversion-then-tree differs from the oracle's "
                f"at {len(coords)} coordinate(s), first {coords[:8]}",
                coordinates=coords,
            )
        reference = oracle.evaluate(tree, {s: x.tolist() for s, x in data.items()})
        return got, reference


SUITES: dict[str, ConformanceSuite] = {
    DEFAULT_SUITE: ConformanceSuite(
        name=DEFAULT_SUITE,
        size=60,
        seed=0x5EED32,
        min_slots=2,
        max_slots=16,
        n=64,
        exponents=(-8, 7),
        conversions=("RoundBinary64", "WidenBinary32"),
        description=(
            "combine contributions narrowed to binary32 (nearest-even) and widened, vs the binary64 tree"
        ),
    ),
}


_BUILD_ID = None


def kernel_build_id() -> str:
    """`kernel.build_info()["build_id"]`, read once: the build conformance evidence names."""
    global _BUILD_ID
    if _BUILD_ID is None:
        _BUILD_ID = kernel.build_info()["build_id"]
    return _BUILD_ID


def suite(name: str) -> ConformanceSuite:
    """The registered suite `name`; refuses an unknown one (`conformance-suite-unknown`)."""
    s = SUITES.get(name)
    if s is None:
        raise ContractRefusal(
            "conformance-suite-unknown",
            f"suite {name!r} is not registered (known: {', '.join(sorted(SUITES))})",
        )
    return s


def measure_evidence(suite_name: str = DEFAULT_SUITE) -> ConformanceEvidence:
    """Run the named suite on this kernel build and record the largest differences from the
    binary64 oracle (ulp and absolute), the suite's size and the kernel build id."""
    s = suite(suite_name)
    kernel.fpenv_check()
    max_ulp, max_abs, coords = 0, 0.0, 0
    for i in range(s.size):
        got, reference = s.run_case(i)
        _, u, a = differences(got, reference)
        max_ulp, max_abs = max(max_ulp, u), max(max_abs, a)
        coords += len(reference)
    return ConformanceEvidence(s.name, s.size, kernel_build_id(), max_ulp, max_abs, coords)
