"""Buckets: the step's combine started while the last owned slot's backward still runs.

`DataParallel(..., bucket_mb=M)` cuts the binary64 payload's gradient words into buckets of
about M MiB, each a contiguous range of whole parameters, taken from the last parameter to the
first (the order a backward produces their gradients in, as DDP's buckets). Each bucket is
combined by its own `Allreducer` over the same slot tree, so every coordinate is still the
tree's sum in the declared order: the bits are those of one combine over the whole payload
(the combine is coordinatewise; which words travel together changes nothing). The words after
the gradients (buffers, used flags, slot sizes, mass, loss, inf, stop, the agreement words) are
the tail, combined last.

Protocol of one step, on every rank:
- `begin(payloads, out)` hands the worker thread the step; it walks the buckets in one fixed
  order (the same on every rank, so the ranks' combines pair up), each as soon as it is ready.
- The slots before the last owned one run as without buckets. During the last one's backward,
  a tensor hook per parameter widens its gradient into the slot's payload (`arm`); a bucket is
  ready when all its parameters' gradients are in. The combine of a ready bucket then runs on
  the worker thread while the backward computes earlier layers (torch releases the GIL there).
- `disarm(grads)` after the backward: the words no hook wrote (a parameter unused by the slot)
  are written, every bucket is ready; `finish()` makes the tail ready and waits for the worker.
- A refusal on this rank before or during the slots (`refuse(e)`) makes every bucket not yet
  started run flagged, so every rank refuses in the same bucket, as in the one-combine step.

MPI calls come from the worker thread only while a step is in flight and from the main thread
otherwise (never both at once): MPI_THREAD_SERIALIZED is enough (mpi4py asks for MULTIPLE).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..execution import Allreducer
from ..model import ReplicateAll
from ..planning import plan
from ..refusals import Refusal
from .convert import into64

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["Buckets", "bucket_ranges", "check_bucket_mb"]


def check_bucket_mb(bucket_mb: object, audit_slots: int, fault_hook: object) -> None:
    """`bucket_mb`: None (one combine after the slots) or a number of MiB > 0; not with the
    audit, whose digests must be compared before anything is combined; and MPI initialised with
    a thread level that lets a second thread run the combine (`mpi-thread-level`)."""
    if bucket_mb is None:
        return
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise Refusal("usage", f"bucket_mb must be None or a number of MiB > 0, got {bucket_mb!r}")
    if audit_slots or fault_hook is not None:
        raise Refusal(
            "options-conflict",
            "bucket_mb starts the combine during the last slot's backward, but audit_slots "
            "(and its fault_hook) compare digests before anything is combined: choose one",
        )
    _check_thread_level()


def bucket_ranges(offsets: list[tuple[int, int]], bucket_words: int) -> list[list[int]]:
    """Parameter indices of each bucket, from the last parameter to the first: a bucket closes
    once it holds `bucket_words` words or more (a parameter is never split)."""
    out: list[list[int]] = []
    cur: list[int] = []
    words = 0
    for i in reversed(range(len(offsets))):
        cur.append(i)
        words += offsets[i][1] - offsets[i][0]
        if words >= bucket_words:
            out.append(cur)
            cur, words = [], 0
    if cur:
        out.append(cur)
    return out


def _check_thread_level() -> None:
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise Refusal(
            "mpi-thread-level",
            "bucket_mb runs the combine on a second thread, which needs MPI initialised with "
            f"MPI_THREAD_SERIALIZED or more; this process has level {MPI.Query_thread()}",
        )


class Buckets:
    """The bucketed combine of one DataParallel (built on every rank, collectively)."""

    def __init__(
        self,
        comm: MPI.Comm,
        tree,
        params: list,
        offsets: list[tuple[int, int]],
        total: int,
        *,
        bucket_mb: float,
        timeout: float | None,
        contract: str,
        realization: str,
    ) -> None:
        n = offsets[-1][1] if offsets else 0
        words = max(1, int(bucket_mb * 2**20) // 8)
        self.members = bucket_ranges(offsets, words)
        # Each bucket's coordinates: from its first (lowest) parameter to its last, contiguous.
        self.ranges = [(offsets[m[-1]][0], offsets[m[0]][1]) for m in self.members] + [(n, total)]
        size = comm.Get_size()
        self.reducers = [
            Allreducer(
                comm,
                plan(tree, ReplicateAll(), b - a, size=size),
                timeout=timeout,
                contract=contract,
                realization=realization,
            )
            for a, b in self.ranges
        ]
        self.bucket_of = {i: k for k, m in enumerate(self.members) for i in m}
        self.params, self.offsets = params, offsets
        self.ready = [threading.Event() for _ in self.ranges]
        self.done = threading.Event()
        self._pending: list[int] = []
        self._wrote: list[bool] = []
        self._buf: np.ndarray | None = None
        self._scale = 1.0
        self._refused: Refusal | None = None
        self._error: BaseException | None = None
        self._job = None
        self._out = np.empty(0)
        self._wake = threading.Condition()
        self._closed = False
        self._handles = [p.register_hook(self._hook_for(i)) for i, p in enumerate(params)]
        self._thread = threading.Thread(target=self._serve, name="alpha_mpi-buckets", daemon=True)
        self._thread.start()

    # --- main thread ----------------------------------------------------------------------
    def begin(self, payloads: dict, out: np.ndarray) -> None:
        """Start a step's bucket walk on the worker (nothing is ready yet)."""
        for e in self.ready:
            e.clear()
        self.done.clear()
        self._pending = [len(m) for m in self.members]
        self._refused, self._error = None, None
        self._out = out
        with self._wake:
            self._job = (payloads, out)
            self._wake.notify()

    def arm(self, buf: np.ndarray, scale: float = 1.0) -> None:
        """The next backward is the last owned slot's: its hooks widen into `buf`, times `scale`
        (the loss's, alpha_mpi.torch.losses) in binary64."""
        self._wrote = [False] * len(self.params)
        self._buf, self._scale = buf, scale

    def disarm(self, grads) -> None:
        """After the last slot's backward: write what no hook wrote, every bucket ready."""
        buf, self._buf = self._buf, None
        for i, g in enumerate(grads):
            if not self._wrote[i]:
                a, b = self.offsets[i]
                if g is None:
                    buf[a:b] = 0.0
                else:
                    self._widen(buf[a:b], g)
        for k in range(len(self.members)):
            self.ready[k].set()

    def refuse(self, e: Refusal) -> None:
        """This rank refuses the step: the buckets not yet started run flagged."""
        self._buf = None
        self._refused = e
        for ev in self.ready:
            ev.set()

    def finish(self, refused: Refusal | None = None) -> np.ndarray:
        """The tail is ready (after `refused`, this rank's refusal of the step, if any); wait
        for the walk. Returns the combined payload or raises the first bucket's refusal."""
        if refused is not None:
            self.refuse(refused)
        self.ready[-1].set()
        self.done.wait()
        if self._error is not None:
            raise self._error
        return self._out

    @contextlib.contextmanager
    def walk(self) -> Iterator[None]:
        """Around the slots: whatever escapes them (an interrupt) still ends the walk on this
        rank, flagged, so the worker is idle for the next step and the peers are not left
        waiting for a bucket."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.finish(Refusal("torch-slot-failed", "the step was interrupted on this rank"))
            raise

    def free(self) -> None:
        """Stop the worker, remove the hooks, free the reducers (collective)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
        for h in self._handles:
            h.remove()
        for r in self.reducers:
            r.free()

    # --- hooks (main thread, inside the backward) -------------------------------------------
    def _widen(self, out: np.ndarray, g) -> None:
        into64(out, g)
        if self._scale != 1.0:
            out *= self._scale

    def _hook_for(self, i: int):
        def hook(g):
            buf = self._buf
            if buf is None:  # not the last slot's backward (or the user's own backward)
                return None
            a, b = self.offsets[i]
            self._widen(buf[a:b], g)
            self._wrote[i] = True
            k = self.bucket_of[i]
            self._pending[k] -= 1
            if self._pending[k] == 0:
                self.ready[k].set()
            return None

        return hook

    # --- worker thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._wake:
                while self._job is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                payloads, out = self._job
                self._job = None
            try:
                for k, ((a, b), red) in enumerate(zip(self.ranges, self.reducers)):
                    self.ready[k].wait()
                    if self._refused is not None:
                        red.prepared.run_checked(None, out[a:b], refused=self._refused)
                    else:
                        red.run({s: v[a:b] for s, v in payloads.items()}, out=out[a:b])
            except BaseException as e:  # every rank stops at the same bucket: the flag is agreed
                self._error = e
            finally:
                self.done.set()
