"""The build agreement's key (endpoint.py): the words every rank says when it builds an
executor, and the refusal that names how the ranks differ when they do not all say the same."""

from __future__ import annotations

import struct

from ..refusals import Refusal
from . import frames as fr
from . import verdict as vd

ANSWERING = 2**64 - 1  # the message-count word of a rank answering a build from a warm call (answer_build)


def build_key(identity: str, sequence: int, base: int) -> list[int]:
    """The words every rank must say alike: digests of the identity's plan part (before the
    first "|") and of the rest (contract, payload check), the sequence, the allocator's
    position."""
    plan, _, rest = identity.partition("|")
    return [
        struct.unpack("<Q", fr.short_digest(plan, 8))[0],
        struct.unpack("<Q", fr.short_digest(rest, 8))[0],
        sequence,
        base,
    ]


# The parts of a build key, in the order they are compared: what differs, and how a group of
# ranks that said `k` is shown.
_KEY_PARTS = (
    ("another plan (tree, placement, delivery, layout, realization, kind)", lambda k: f"plan {k[0]:016x}"),
    ("the same plan under another contract or ALPHA_MPI_PAYLOAD_CHECK setting", lambda k: f"{k[1]:016x}"),
    (
        "another executor number on this communicator (a rank built one more or one fewer executor)",
        lambda k: f"executor #{k[2]}",
    ),
    (
        "another position of the tag allocator (a rank freed an executor the others keep, or the reverse)",
        lambda k: f"tag {k[3]}",
    ),
)


def refuse_different(v: vd.Verdicts, what: str) -> None:
    """executor-identity-mismatch on every rank unless every rank said the same key: the
    first differing part, every group of ranks and what it said (the largest group first;
    ties: the group of the lowest rank), the ranks outside the largest group in `ranks`."""
    groups: dict = {}
    for r, row in enumerate(v.words):
        groups.setdefault(tuple(int(x) for x in row[:4]), []).append(r)
    if len(groups) == 1:
        return
    # A rank that answered from a warm call (answer_build) sent frames of that call that no
    # peer will take: the channel holds them until a reset.
    answered = [r for r, row in enumerate(v.words) if len(row) > 4 and int(row[4]) == ANSWERING]
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    ref, other = ordered[0][0], ordered[1][0]
    part, fmt = next(_KEY_PARTS[i] for i in range(4) if ref[i] != other[i])
    shown = "; ".join(f"{vd.ranks_text(rs)}: {fmt(k)}" for k, rs in ordered)
    # every rank answered from a call: none builds, they ran different executors at once
    verb = "run" if len(answered) == len(v.words) else "build"
    raise Refusal(
        "executor-identity-mismatch",
        f"the ranks {verb} different {what}s: {part} ({shown}); no rank built it"
        + (
            f" ({vd.ranks_text(answered)} ran a call of the other meanwhile: reset before the next)"
            if answered
            else ""
        ),
        ranks=tuple(sorted(r for _, rs in ordered[1:] for r in rs)),
        # every rank finished the round: the channel holds nothing of it, unless a rank answered
        # from a call whose frames are left
        in_flight=bool(answered),
    )


__all__ = ["ANSWERING", "build_key", "refuse_different"]
