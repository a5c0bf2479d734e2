"""Where a rank's P (post a receive) and D (complete a send) ops go among its logical ops (pure).

`schedule` is what every realization's per-rank builder (builder.py) calls last: the receive
posted as early as its region allows, the send completed just before its region is written.
"""

from __future__ import annotations

from .program import Op


def schedule(logical: list, regions: dict) -> tuple:
    """Insert P and D ops into a logical op sequence (S, W, E, C, F) of one rank.

    P(m) goes right after the last op before W(m) that touches m's receive region (or first),
    D(m) right before the first op that writes a region m's send still reads (a W writes its
    receive region; a P writes nothing), and at the end
    for every send still in flight. `regions` maps a message index to its Region on this rank
    (None for a header-only frame); `logical` holds (Op, reads, writes) triples, reads/writes
    being tuples of Regions (S and W ops need not list their message's region).
    """
    by_buf: dict = {}  # buffer -> indices of the ops touching it (for the backward scans)
    for i, (op, reads, writes) in enumerate(logical):
        touched = list(reads) + list(writes)
        if op.kind in "SW" and regions.get(op.index) is not None:
            touched.append(regions[op.index])
        for t in touched:
            by_buf.setdefault(t.buf, []).append((i, t))
    # 1. Where each receive may be posted.
    post_after = {}
    for i, (op, _, _) in enumerate(logical):
        if op.kind != "W":
            continue
        region = regions.get(op.index)
        last = -1
        if region is not None:
            for j, t in reversed(by_buf.get(region.buf, ())):
                if j < i and region.overlaps(t):
                    last = j
                    break
        post_after.setdefault(last, []).append(op.index)

    def posted(m):
        return (Op("P", m), (), ((regions[m],) if regions.get(m) is not None else ()))

    seq = [posted(m) for m in post_after.get(-1, [])]
    for i, item in enumerate(logical):
        seq.append(item)
        seq.extend(posted(m) for m in post_after.get(i, []))
    # 2. Sends complete before their region is written; the rest at the end. A receive writes
    # its region at W, not at P: the engine matches and receives a frame at W (size-safe
    # receives, execution/inbound.py) and P posts nothing, so a send from a reused buffer need
    # only complete before the W that fills it. Completing it before P instead would make two
    # ranks that exchange from reused buffers each wait for the other's W: a deadlock.
    # The sends in flight are kept by the buffer they read, so an op looks only at those its
    # writes could touch (a rank with thousands of sends in flight, a star's hub, stays linear);
    # the D ops of one write come in send order, as a scan of every send in flight gives them.
    out: list = []
    inflight: dict = {}  # message -> its position in send order, for every send in flight
    by_src: dict = {}  # buffer -> the messages in flight from it
    for pos, (op, _reads, writes) in enumerate(seq):
        if op.kind == "P":
            writes = ()
        elif op.kind == "W" and regions.get(op.index) is not None:
            writes = (*writes, regions[op.index])
        if writes and inflight:
            done = {m for w in writes for m in by_src.get(w.buf, ()) if regions[m].overlaps(w)}
            for m in sorted(done, key=inflight.__getitem__):
                out.append(Op("D", m))
                del inflight[m]
                by_src[regions[m].buf].remove(m)
        out.append(op)
        if op.kind == "S":
            inflight[op.index] = pos
            if regions.get(op.index) is not None:
                by_src.setdefault(regions[op.index].buf, []).append(op.index)
    out.extend(Op("D", m) for m in inflight)
    return tuple(out)


__all__ = ["schedule"]
