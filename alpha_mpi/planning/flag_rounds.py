"""The flag rounds after a program: every rank learns every rank's flags (pure).

With the payload check on (ALPHA_MPI_PAYLOAD_CHECK=1) a bad frame found in a rank's last receive
reaches no other rank by frame; these rounds carry it. With a delivery to one rank (DeliverTo)
they always run (`needs_flag_rounds`): the ranks off the delivery path receive no frame after
their own sends, so without them a rank that only sends returned as after a clean run while the
target refused it (a peer's bad input, a non-finite sum, a bad frame: issue 45). After the program, ⌈log2 p⌉ rounds of
header-only frames (phase "f") disseminate the flags (round k: send to r + 2^k, receive from
r − 2^k), so every rank ends with the OR of every rank's flags and, by the executor's rule for
these frames (the lowest refusing rank wins, csrc/round/frames.c), the same refusing rank and code.
They are part of the program the executor runs (the same C call), not a round of their own.

Numbering, with no knowledge of other ranks' programs: a flag frame's index is FLAG_INDEX_BASE +
k·p + sender (above any program's own messages), and its seq is FLAG_SEQ: it travels on the
executor's flag tag (the last of its tag block, execution/endpoint.py). The distances 2^k < p
are distinct, so every ordered pair of ranks has at most one flag frame per run, and MPI keeps
one sender's messages with one tag in order across runs.
"""

from __future__ import annotations

from ..model.delivery import DeliverTo
from .program import FLAG_SEQ, Message, Op, Program, RankProgram

FLAG_INDEX_BASE = 1 << 30  # flag frames' indices (the header's edge field) start here


def distances(size: int) -> list:
    """The distances of the rounds: 1, 2, 4, ... below `size`."""
    out, d = [], 1
    while d < size:
        out.append(d)
        d *= 2
    return out


def needs_flag_rounds(program: Program, payload_check: bool) -> bool:
    """Whether an executor runs the flag rounds after `program`: with the payload check, and for
    a delivery to one rank, whose outcome no frame carries to the ranks off its path (the
    module docstring). A function of the program and of what the build agreement holds equal,
    so every rank decides alike."""
    return payload_check or delivers_to_one(program)


def delivers_to_one(program: Program) -> bool:
    """The result goes to one rank only (DeliverTo): the other ranks learn the outcome from the
    flag rounds alone."""
    return isinstance(program.delivery, DeliverTo)


def with_flag_rounds(program: Program) -> Program:
    """`program` followed by the flag rounds (the module docstring), with the same identity
    (what runs them, the payload check, is held equal on every rank by the build agreement)."""
    size = program.size
    base = program.builder

    def build(r: int) -> RankProgram:
        return _append(base(r), r, size)

    rounds = len(distances(size))
    details = {**program.details, "flag_rounds": rounds}
    return program.replace(builder=build, rounds=program.rounds + rounds, details=details)


def _append(rp: RankProgram, r: int, size: int) -> RankProgram:
    if any(i >= FLAG_INDEX_BASE for i in rp.messages):  # pragma: no cover - 2^30 messages
        raise ValueError("a program with message indices from 2^30 on has no room for flag rounds")
    messages, regions = dict(rp.messages), dict(rp.regions)
    posts, ops, dones = [], [], []
    for k, d in enumerate(distances(size)):
        to, frm = (r + d) % size, (r - d) % size
        out = Message(FLAG_INDEX_BASE + k * size + r, "f", r, to, FLAG_SEQ, 0, f"flags|{k}")
        into = Message(FLAG_INDEX_BASE + k * size + frm, "f", frm, r, FLAG_SEQ, 0, f"flags|{k}")
        messages[out.index], messages[into.index] = out, into
        regions[out.index] = regions[into.index] = None
        posts.append(Op("P", into.index))
        ops += [Op("S", out.index), Op("W", into.index)]
        dones.append(Op("D", out.index))
    return rp.replace(messages=messages, regions=regions, ops=(*rp.ops, *posts, *ops, *dones))


__all__ = ["with_flag_rounds", "needs_flag_rounds", "delivers_to_one", "distances", "FLAG_INDEX_BASE"]
