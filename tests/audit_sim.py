"""p simulated ranks of one audited step in one process (no MPI): every rank's `contribute`, the
audit's words summed as a combine sums them (a shuffled order), then every rank's `settle`, one
thread per rank meeting at a barrier for the referees' round. Faults: payload flips on chosen
ranks (several ranks: several faults), a flip of the words a rank carries, a flip on the way."""

import threading
import types

import numpy as np

from alpha_mpi.learning.audit import SlotAudit
from alpha_mpi.refusals import Refusal

N = 5  # gradient words; a payload is N + 2 digested words, the stop word, the audit's words


class _Round:
    """The referees' verdict round of p simulated ranks; `count` counts the rounds run."""

    def __init__(self, p):
        self.rows, self.barrier, self.count = [None] * p, threading.Barrier(p, timeout=30), 0

    def endpoint(self, rank):
        def verdict(words, local, what, timeout=None):
            self.rows[rank] = np.array(words, dtype=np.uint64)
            self.barrier.wait()
            table = np.stack(self.rows)
            if self.barrier.wait() == 0:
                self.count += 1
            return types.SimpleNamespace(words=table, raise_failures=lambda *a: None)

        return types.SimpleNamespace(verdict=verdict)


def _comm(p, rank, ep):
    return types.SimpleNamespace(Get_size=lambda: p, Get_rank=lambda: rank, Get_attr=lambda key: ep)


def _flip(words, element, bit):
    words.view(np.uint64)[element] ^= np.uint64(1) << np.uint64(bit)


def audited_step(p, k, slots, step, fault=None, faults=None, carried=None, on_the_way=None):
    """(the referees' rounds run, each rank's refusal or None, rank 0's SlotAudit).

    fault=(rank, element, bit): that rank computes every payload with the bit flipped; faults:
    {rank: (element, bit)}, several at once (the same flip on two ranks: wrong alike);
    carried=(rank, element, bit): a flip of the audit's words `rank` carries, after they are
    written (element: a word of the audit's 2A; on a rank with several slots, `slot` words of
    its second payload when element >= 2A); on_the_way=(element, bit): a flip of the combined words."""
    faults = dict(faults or {})
    if fault is not None:
        faults[fault[0]] = fault[1:]
    owner_of = [s * p // slots for s in range(slots)]
    rnd = _Round(p)
    audits = [
        SlotAudit(_comm(p, r, rnd.endpoint(r)), k, owner_of, timeout=None, contract="c") for r in range(p)
    ]
    w = audits[0].words

    def compute(rank):
        def run(s, out):
            out[:] = 0.0
            out[: N + 2] = np.arange(N + 2) * (s + 1) + 0.25
            if rank in faults:
                _flip(out, *faults[rank])

        return run

    def tamper(rank, _step, words):
        if carried is not None and carried[0] == rank and carried[1] < w:
            _flip(words, carried[1], carried[2])

    bufs = []
    for r, a in enumerate(audits):
        own = {s: np.zeros(N + 3 + w) for s in range(slots) if owner_of[s] == r}
        for s, buf in own.items():
            compute(r)(s, buf)
            buf[N + 2] = 1.0 if r == 0 else 0.0  # a stop word: never digested
        carrier = own[min(own)]
        a.contribute(
            step, own, compute(r), np.zeros(N + 3 + w), carrier[N + 3 :], words=N + 2, at=N + 3, tamper=tamper
        )
        if carried is not None and carried[0] == r and carried[1] >= w:  # another payload's zeros
            _flip(own[max(own)][N + 3 :], carried[1] - w, carried[2])
        bufs += [buf[N + 3 :] for buf in own.values()]
    order = np.random.default_rng(step).permutation(len(bufs))
    combined = np.zeros(w)
    for i in order:
        combined += bufs[i]
    if on_the_way is not None:
        _flip(combined, *on_the_way)
    got = [None] * p

    def settle(r):
        try:
            audits[r].settle(step, combined.copy(), compute(r), np.zeros(N + 3 + w), words=N + 2)
        except Refusal as e:
            got[r] = e

    threads = [threading.Thread(target=settle, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rnd.count, got, audits[0]
