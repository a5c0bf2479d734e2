"""Every rank starts from the same state: one digest round when a learner is built (and, for
`alpha-mpi train --model`, when the user's model is probed).

Why a round: a learner applies the one combined update to each rank's own copy of the
parameters, so ranks that start from different bits (a rank-dependent `Model.init`, `init_params`
read from a per-rank file) keep different parameters for ever and nothing else would notice; a
gradient that depends on the rank that computes it breaks rank-count independence as silently.
Each rank hashes what must agree (sha256 of its little-endian binary64 bytes) and the digests go
through the communicator's verdict round (alpha_mpi.execution.Endpoint.verdict: point to point,
no collective, no pickle), so every rank reaches the same verdict from the same data: all go on,
or all refuse by name, naming the ranks that differ.

The compute identity travels in the same round (learning/compute_check.py): one item per
compared field, so a refusal names the field (`compute-mismatch`), and with a machine-independence
declaration the same items are recorded, not refused: `agree` returns who holds what, and the
audit and the replica digests read it (an environment difference is never a fault).

Words per rank: per item, its length, its sha256 as four 64-bit words and its shown text as
eight 64-bit words (64 bytes of UTF-8, zero-padded). The round carries each rank's status too: a
rank whose checks refused (or whose model raised something else) still takes part, so the others
refuse at once (`peer-refused`, naming it and its code) instead of waiting for it until the time
bound.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..execution import Endpoint
from ..execution.verdict import ranks_text
from ..refusals import Refusal

if TYPE_CHECKING:
    from mpi4py import MPI

    from .protocol import Model

__all__ = ["Item", "Holding", "agree", "start_params", "probe_model"]

DIGEST_WORDS = 4  # sha256 as four 64-bit words
SHOWN_WORDS = 8  # an item's shown text: 64 bytes of UTF-8 as eight 64-bit words
ITEM_WORDS = 1 + DIGEST_WORDS + SHOWN_WORDS


@dataclass(frozen=True)
class Item:
    """One thing every rank must hold with the same bits: a label for messages (`"the initial
    parameters"`), this rank's values (None when a local failure left nothing to hash) and the
    refusal code raised when ranks differ, or None: the item is recorded, never refused (`agree`
    returns who holds what). `shown`: a short text naming this rank's value in messages (at most
    64 bytes travel), instead of its digest; `field`: the refusal's `field=` context."""

    label: str
    values: np.ndarray | None
    code: str | None
    shown: str | None = None
    field: str | None = None


@dataclass(frozen=True)
class Holding:
    """What `agree` learned of one item: `groups[r]`, the group of equal digests rank r is in
    (numbered from 0 in order of each group's lowest rank, so rank 0 is in group 0), `shown[r]`,
    the text rank r showed ("" when none), and `held[r]`, what rank r held as messages name it
    when it showed nothing (its digest's prefix and value count)."""

    groups: tuple[int, ...]
    shown: tuple[str, ...]
    held: tuple[str, ...]

    @property
    def uniform(self) -> bool:
        """Every rank holds the same bits."""
        return max(self.groups) == 0


def _words(item: Item) -> list[int]:
    text = (item.shown or "").encode("utf-8")[: 8 * SHOWN_WORDS].ljust(8 * SHOWN_WORDS, b"\0")
    shown = [int.from_bytes(text[i : i + 8], "little") for i in range(0, 8 * SHOWN_WORDS, 8)]
    if item.values is None:
        return [0] * (1 + DIGEST_WORDS) + shown
    raw = np.ascontiguousarray(item.values, dtype="<f8").tobytes()
    digest = hashlib.sha256(raw).digest()
    return [len(raw) // 8] + [int.from_bytes(digest[i : i + 8], "little") for i in range(0, 32, 8)] + shown


def _hex(words: Sequence[int]) -> str:
    return b"".join(int(w).to_bytes(8, "little") for w in words[1 : 1 + DIGEST_WORDS]).hex()


def _shown(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little") for w in words[1 + DIGEST_WORDS :])
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def text_values(text: str) -> np.ndarray:
    """A text as an Item's values: its UTF-8 bytes, zero-padded to whole binary64 words (the
    digest is taken over the bytes; the words are never computed with)."""
    raw = text.encode("utf-8")
    return np.frombuffer(raw.ljust(-(-len(raw) // 8) * 8 or 8, b"\0"), dtype="<f8")


class Compared(Protocol):
    """What the learners' first rounds take as `compute=`: learning/compute_check.py's
    ComputeCheck (items to compare first, what they showed recorded, a broken promise named)."""

    def items(self) -> list[Item]:
        """The items compared before everything else."""
        ...

    def record(self, held: Sequence[Holding]) -> None:
        """Learn from the items' holdings (in `items()` order)."""
        ...

    def alike(self, ranks: Sequence[int]) -> bool:
        """Whether `ranks` compute alike (after `record`)."""
        ...

    def broken_promise(self, ranks: Sequence[int], what: str) -> Refusal:
        """The refusal for results that differ between ranks that compute differently."""
        ...


def agree(
    comm: MPI.Comm,
    items: Sequence[Item],
    *,
    what: str,
    local: BaseException | None = None,
    timeout: float | None = None,
) -> list[Holding]:
    """Collective: return, per item, who holds what (`Holding`) when every rank of `comm` holds
    every refusing item (code not None) with the same bits.

    Otherwise every rank raises the same refusal: a rank with a `local` failure re-raises it and
    the others raise `peer-refused` naming it (lowest such rank first); else, for the first
    refusing item that differs, `item.code` naming the ranks outside the largest group of equal
    digests (ties: the group holding the lowest rank), with `ranks=` those ranks (see
    `refusal`). `what` says what the round is for ("building the learner"). Every rank passes the
    same number of items, in the same order.
    """
    size = comm.Get_size()
    mine = [w for item in items for w in _words(item)]
    if size > 1:
        table = Endpoint.of(comm, timeout).verdict(mine, local, what, timeout=timeout)
        table.raise_failures(local, what)
        words = table.words
    else:
        if local is not None:
            raise local
        words = np.array([mine], dtype=np.uint64)
    held = []
    for i, item in enumerate(items):
        cols = slice(i * ITEM_WORDS, (i + 1) * ITEM_WORDS)
        rows = [[int(x) for x in words[r, cols]] for r in range(size)]
        digests = [tuple(row[: 1 + DIGEST_WORDS]) for row in rows]
        first: dict[tuple, int] = {}
        for d in digests:
            first.setdefault(d, len(first))
        h = Holding(
            tuple(first[d] for d in digests),
            tuple(_shown(row) for row in rows),
            tuple(f"sha256 {_hex(d)[:16]}… ({d[0]} values)" for d in digests),
        )
        if not h.uniform and item.code is not None:
            raise refusal(item, h, what)
        held.append(h)
    return held


def refusal(item: Item, held: Holding, what: str, code: str | None = None) -> Refusal:
    """The refusal (`code`, default `item.code`) for an item whose ranks differ: it names the
    ranks outside the largest group of equal digests (ties: the group holding the lowest rank),
    and what each group holds (its shown text, else its digest's prefix)."""
    groups: dict[int, list[int]] = {}
    for r, g in enumerate(held.groups):
        groups.setdefault(g, []).append(r)
    ref_g, ref = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
    differ = sorted(r for g, ranks in groups.items() if g != ref_g for r in ranks)

    def holds(ranks):
        value = repr(held.shown[ranks[0]]) if held.shown[ranks[0]] else held.held[ranks[0]]
        return f"{ranks_text(ranks)} {'holds' if len(ranks) == 1 else 'hold'} {value}"

    shown = "; ".join(holds(ranks) for ranks in list(groups.values())[:4]) + (
        "; ..." if len(groups) > 4 else ""
    )
    context = {"ranks": differ} if item.field is None else {"ranks": differ, "field": item.field}
    return Refusal(
        code or item.code,
        f"{item.label} differ across ranks while {what}: {ranks_text(differ)} "
        f"{'differs' if len(differ) == 1 else 'differ'} from {ranks_text(ref)} ({shown})",
        **context,
    )


def _initial(model: Model, seed: int, init_params) -> np.ndarray:
    n = int(model.n_params)
    if init_params is not None:
        try:
            p = np.array(init_params, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise Refusal("usage", f"init_params must be {n} float64 values: {e}") from None
        if p.shape != (n,) or not np.all(np.isfinite(p)):
            raise Refusal("usage", f"init_params must be {n} finite float64 values, got shape {p.shape}")
        return p
    p = model.init(seed)
    if not isinstance(p, np.ndarray) or p.dtype != np.float64 or p.shape != (n,):
        raise Refusal(
            "model-protocol",
            f"{type(model).__name__}.init({seed}) returned {type(p).__name__} {getattr(p, 'dtype', '')} "
            f"{getattr(p, 'shape', '')}; it must be a float64 array of shape ({n},)",
            member="init",
        )
    if not np.all(np.isfinite(p)):
        raise Refusal(
            "model-protocol",
            f"{type(model).__name__}.init({seed}) returned non-finite parameters",
            member="init",
        )
    return p


def start_params(
    comm: MPI.Comm,
    model: Model,
    *,
    seed: int,
    init_params=None,
    timeout: float | None = None,
    compute: Compared | None = None,
    local: BaseException | None = None,
) -> np.ndarray:
    """Collective: the initial parameter vector (`init_params`, else `model.init(seed)`), checked
    on this rank (float64, shape (n_params,), finite: `model-protocol` / `usage`) and then equal
    on every rank (`initial-params-mismatch` naming the ranks that differ). With `compute` (the
    learner's ComputeCheck) the compute identities are compared first, in the same round
    (`compute-mismatch`, or recorded into `compute.ranks`). `local`: this rank's failure in the
    learner's own checks before this round: it travels in the round (every rank then raises:
    this one its own, the others `peer-refused` naming it) and nothing is initialised."""
    full = None
    if local is None:
        try:
            full = _initial(model, seed, init_params)
        except Exception as e:  # it travels to every rank, then is re-raised here
            local = e
    first = compute.items() if compute is not None else []
    held = agree(
        comm,
        [*first, Item("the initial parameters", full, "initial-params-mismatch")],
        what="building the learner",
        local=local,
        timeout=timeout,
    )
    if compute is not None:
        compute.record(held[: len(first)])
    return full


def probe_model(
    comm: MPI.Comm,
    model: Model,
    probe: tuple[np.ndarray, np.ndarray],
    *,
    seed: int = 0,
    timeout: float | None = None,
    compute: Compared | None = None,
) -> None:
    """Collective: `check_model(model, probe=probe, seed=seed)` on every rank (the protocol, and
    the same bits on a second call: `model-nondeterministic`), then with `compute` (a
    learning.compute_check.ComputeCheck) the compute identities (`compute-mismatch` naming the
    field, unless the model declares `machine_independent`), `init(seed)` and the probe slot's
    gradient and loss from it compared across ranks (`initial-params-mismatch`, then `model-rank-dependent`, naming the ranks that
    differ; `compute-mismatch` instead when the ranks that differ also compute differently: a
    machine-independence declaration that does not hold, not a model that reads the rank).
    `probe` = (X, y) is one small slot, the same on every rank."""
    from .protocol import check_model

    params, grad, loss, local = None, None, None, None
    try:
        check_model(model, probe=probe, seed=seed)
        params, grad = model.init(seed), np.empty(int(model.n_params))
        loss = np.array([model.loss_and_grad_sum(params, probe[0], probe[1], grad)], dtype=np.float64)
    except Exception as e:  # it travels to every rank, then is re-raised here
        local = e
    first = compute.items() if compute is not None else []
    results = [
        Item("the probe slot's gradients", grad, None),
        Item("the probe slot's losses", loss, None),
    ]
    held = agree(
        comm,
        # the initial parameters before the gradients: else the gradients differ too
        [*first, Item("the initial parameters", params, "initial-params-mismatch"), *results],
        what="probing the model",
        local=local,
        timeout=timeout,
    )
    if compute is not None:
        compute.record(held[: len(first)])
    for item, h in zip(results, held[len(first) + 1 :]):
        if h.uniform:
            continue
        differ = [r for r, g in enumerate(h.groups) if g != h.groups[0]]
        if compute is not None and not compute.alike([0, *differ]):
            raise compute.broken_promise([0, *differ], f"{item.label} (probing the model)")
        raise refusal(item, h, "probing the model", "model-rank-dependent")
