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

Words per rank: per item, its length and its sha256 as four 64-bit words. The round carries each
rank's status too: a rank whose checks refused (or whose model raised something else) still takes
part, so the others refuse at once (`peer-refused`, naming it and its code) instead of waiting
for it until the time bound.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..execution import Endpoint
from ..execution.verdict import ranks_text
from ..refusals import Refusal

if TYPE_CHECKING:
    from mpi4py import MPI

    from .protocol import Model

__all__ = ["Item", "agree", "start_params", "probe_model"]

ITEM_WORDS = 5  # the length, then sha256 as four 64-bit words


@dataclass(frozen=True)
class Item:
    """One thing every rank must hold with the same bits: a label for messages (`"the initial
    parameters"`), this rank's values (None when a local failure left nothing to hash) and the
    refusal code raised when ranks differ."""

    label: str
    values: np.ndarray | None
    code: str


def _words(values: np.ndarray | None) -> list[int]:
    if values is None:
        return [0] * ITEM_WORDS
    raw = np.ascontiguousarray(values, dtype="<f8").tobytes()
    digest = hashlib.sha256(raw).digest()
    return [len(raw) // 8] + [int.from_bytes(digest[i : i + 8], "little") for i in range(0, 32, 8)]


def _hex(words: Sequence[int]) -> str:
    return b"".join(int(w).to_bytes(8, "little") for w in words[1:]).hex()


def agree(
    comm: MPI.Comm,
    items: Sequence[Item],
    *,
    what: str,
    local: BaseException | None = None,
    timeout: float | None = None,
) -> None:
    """Collective: return when every rank of `comm` holds every item with the same bits.

    Otherwise every rank raises the same refusal: a rank with a `local` failure re-raises it and
    the others raise `peer-refused` naming it (lowest such rank first); else, for the first item
    that differs, `item.code` naming the ranks outside the largest group of equal digests (ties:
    the group holding the lowest rank), with `ranks=` those ranks. `what` says what the round is
    for ("building the learner"). Every rank passes the same number of items, in the same order.
    """
    size = comm.Get_size()
    mine = [w for item in items for w in _words(item.values)]
    if size > 1:
        table = Endpoint.of(comm, timeout).verdict(mine, local, what, timeout=timeout)
        table.raise_failures(local, what)
        words = table.words
    else:
        if local is not None:
            raise local
        words = np.array([mine], dtype=np.uint64)
    for i, item in enumerate(items):
        cols = slice(i * ITEM_WORDS, (i + 1) * ITEM_WORDS)
        groups: dict[tuple, list[int]] = {}
        for r in range(size):
            groups.setdefault(tuple(int(x) for x in words[r, cols]), []).append(r)
        if len(groups) == 1:
            continue
        ref_key, ref = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
        differ = sorted(r for key, ranks in groups.items() if key != ref_key for r in ranks)
        shown = "; ".join(
            f"{ranks_text(ranks)} {'holds' if len(ranks) == 1 else 'hold'} sha256 {_hex(key)[:16]}… "
            f"({int(key[0])} values)"
            for key, ranks in list(groups.items())[:4]
        ) + ("; ..." if len(groups) > 4 else "")
        raise Refusal(
            item.code,
            f"{item.label} differ across ranks while {what}: {ranks_text(differ)} differ from "
            f"{ranks_text(ref)} ({shown})",
            ranks=differ,
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
    comm: MPI.Comm, model: Model, *, seed: int, init_params=None, timeout: float | None = None
) -> np.ndarray:
    """Collective: the initial parameter vector (`init_params`, else `model.init(seed)`), checked
    on this rank (float64, shape (n_params,), finite: `model-protocol` / `usage`) and then equal
    on every rank (`initial-params-mismatch` naming the ranks that differ)."""
    full, local = None, None
    try:
        full = _initial(model, seed, init_params)
    except Exception as e:  # it travels to every rank, then is re-raised here
        local = e
    agree(
        comm,
        [Item("the initial parameters", full, "initial-params-mismatch")],
        what="building the learner",
        local=local,
        timeout=timeout,
    )
    return full


def probe_model(
    comm: MPI.Comm,
    model: Model,
    probe: tuple[np.ndarray, np.ndarray],
    *,
    seed: int = 0,
    timeout: float | None = None,
) -> None:
    """Collective: `check_model(model, probe=probe, seed=seed)` on every rank (the protocol, and
    the same bits on a second call: `model-nondeterministic`), then `init(seed)` and the probe
    slot's gradient and loss from it compared across ranks (`initial-params-mismatch`, then
    `model-rank-dependent`, naming the ranks that differ). `probe` = (X, y) is one small slot, the same on every rank."""
    from .protocol import check_model

    params, grad, loss, local = None, None, None, None
    try:
        check_model(model, probe=probe, seed=seed)
        params, grad = model.init(seed), np.empty(int(model.n_params))
        loss = np.array([model.loss_and_grad_sum(params, probe[0], probe[1], grad)], dtype=np.float64)
    except Exception as e:  # it travels to every rank, then is re-raised here
        local = e
    agree(
        comm,
        [
            Item(
                "the initial parameters", params, "initial-params-mismatch"
            ),  # else the gradients differ too
            Item("the probe slot's gradients", grad, "model-rank-dependent"),
            Item("the probe slot's losses", loss, "model-rank-dependent"),
        ],
        what="probing the model",
        local=local,
        timeout=timeout,
    )
