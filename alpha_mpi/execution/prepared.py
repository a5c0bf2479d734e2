"""The one door to the executor: a prepared run (issue 42).

`Engine.prepare()` returns the PreparedRun of an executor, and every front end (the Allreducer,
`allreduce()` and `reduce_scatter()`, the assembly, the arrays, the learners' and torch's
combines) holds one and calls it; nothing else reaches the executor's state. A prepared run is
the compiled program and the wait policy, fixed when the executor was built, and the buffers,
bound per call: `run()` checks and binds this call's arrays, then is ONE call into C (an_run,
csrc/round/); the arrays bind their blocks and geometry (`bind`) and call `run_bound`,
the same one call; the C loop hands a run back to Python only for what Python must do
(engine_walk.py).

Keyed by geometry, never by identity. A front end finds its prepared run by what determines the
program (tree, realization, delivery, layout; the arrays: operation, offset, length, global
shape), never by the objects it is called with: new arrays of a known geometry are bound and
run, with no rebuild and no verdict round. What could make a call wrong is checked on every
call, the very same arrays included (one of them can change in place: `a.shape = ...`,
`a.strides = ...`, `a.resize(..., refcheck=False)` moves its data):
- each contribution: type, dtype, shape, contiguity (its strides) and alignment, as they are
  now (a 1-D contiguous aligned float64 array of the payload's length is bound as it is;
  anything else takes the full check, contributions.py): a misaligned or non-contiguous
  contribution is COPIED into an aligned contiguous array (the C round reads it through
  `double *`), never read through the old layout;
- its pointer: read whenever another array comes (in the steady state with the checks, in one
  C call that writes it into the C record: kernel/vectors.py), and held with the array (a
  strong reference: the memory cannot go while the C records point at it) and a weak
  reference, which pins it: NumPy refuses to resize an array that has one, so the data of the
  array bound now cannot move (`resize(refcheck=False)` raises instead) and the very array
  passed again keeps its pointer; once another array is bound in its place it may be resized,
  and is bound anew, where its data is then, when it comes back;
- `out`: type, dtype, size, C-contiguous, writeable, aligned (a misaligned `out` is refused,
  `out-invalid`), and where the result lands in `out` itself, its overlap with a contribution
  (then the result is computed in the engine's buffer and copied at the end).

Threads: one thread at a time runs a handle, and a run is never re-entered (`executor-reentrant`
is a check, not a lock). That thread need not be the main thread: torch's buckets
(torch/overlap.py) run their handles on their worker thread while the main thread computes the
slots, and the main thread never runs those handles meanwhile (it waits for the worker); MPI
must then be initialized with a thread level that lets that thread call it (mpi4py's default,
MPI_THREAD_MULTIPLE). Signals are handled by the main thread only: a run on another thread
returns to Python every wait slice all the same.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from ..kernel import vectors
from ..kernel.abi import STOP
from ..refusals import PlanRefusal, Refusal
from . import engine_bind as bind
from . import engine_walk as walk
from . import frames as fr
from .engine_bind import Chunk
from .engine_walk import RunState
from .waits import timeout_from_env

if TYPE_CHECKING:
    from .contributions import Contributions

_ND = np.ndarray
_F64 = np.dtype(np.float64)
_MISS = object()
_bind = vectors.bind


class PreparedRun:
    """The prepared run of one Engine (Engine.prepare): run it with `run` (contributions,
    checked here) or `run_checked` (leaves a front end checked itself: the assembly's pieces, a
    refused step). `step`: the frame step of the next run; `flags`: the frame flags the last
    run saw (frames.FLAG_*); `busy`: a run is in progress."""

    __slots__ = (
        "engine",
        "compiled",
        "step",
        "flags",
        "busy",
        "_state",
        "_binding",
        "_slots",
        "_zeros",
        "_unbound",
        "_steady",
        "_freed",
        "_an_run",
        "_ex",
        "_exrun",
        "_lib",
        "_ffi",
    )

    def __init__(self, engine) -> None:  # the Engine (engine.py imports this module, not back)
        c = self.compiled = engine.compiled
        self.engine = engine
        self.step = 0
        self.flags = 0
        self.busy = False
        self._state = RunState(engine.rank)
        self._binding = bind.Bound(c)
        # (slot, buffer number) of the contributions; None for programs whose leaves are pieces
        # of other lengths (the assembly binds through run_checked)
        self._slots = tuple(c.slot_base.items()) if not c.rp.inputs else None
        self._zeros = None
        # no contribution and no result in `out` (the arrays' exchanges): such a run binds nothing
        self._unbound = not c.rp.slots and c.internal_out is None and c.rp.result is None
        self._freed = False
        # run() has a shorter path for a small allreduce whose result C delivers (_run_steady)
        self._steady = (
            self._slots is not None and c.small and c.internal_out is not None and engine.program.mode.whole
        )
        self._lib, self._ffi = c.native.lib, c.native.ffi
        self._an_run = self._lib.an_run
        self._ex, self._exrun = c.ex, c.ex.run  # (each cdata field read makes a new proxy)

    def run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> np.ndarray | None:
        """Run once with this rank's contributions (slot -> float64 payload): the combined
        payload where the delivery reaches this rank, else None (`out`, if given, is then left
        as it was). Reduce-scatter mode: the values of this rank's chunk. `timeout` overrides
        the per-wait bound for this run. A bad contribution is refused on this rank and flagged
        to every rank (`peer-refused` there); the next run works."""
        if timeout is None and self._steady:
            got = self._run_steady(contributions, out)
            if got is not _MISS:
                return got
        leaves = local = None
        try:
            leaves = self._leaves(contributions)
        except Refusal as e:
            local = e
        return self.run_checked(leaves, out, refused=local, timeout=timeout)

    def _run_steady(self, contributions, out):
        """The steady state of a loop, as run_checked would run it, with fewer steps: a small
        allreduce (computed in the engine's buffer, copied to `out` by C) whose contributions
        and `out` are 1-D, C-contiguous, aligned float64 arrays of its length (`out` writeable).
        _MISS (nothing run) for anything else. The arrays bound now (pinned: their pointers
        hold) are checked here; any other is checked and bound by one C call (vectors.bind:
        the checks, and its pointer read from the array), then held and pinned, so the table
        never points at an array that is not held."""
        slots = self._slots
        if type(contributions) is not dict or len(contributions) != len(slots):
            return _MISS
        eng = self.engine
        if eng.broken is not None or self.busy:
            return _MISS  # run_checked refuses it by name (and a run in progress keeps its table)
        n = self.compiled.n
        bound = self._binding
        held = bound.held
        for slot, b in slots:
            v = contributions.get(slot)
            e = held[b]
            if e is not None and e[0] is v:
                if not (type(v) is _ND and v.dtype is _F64 and v.ndim == 1 and len(v) == n):
                    return _MISS
                f = v.flags
                if not (f.c_contiguous and f.aligned):
                    return _MISS
            elif _bind(id(v), n, 0, bound.addr[b]):
                return _MISS
            else:
                bound.adopt(b, v)
        if out is not None:
            d = bound.deliver
            if d is not None and d[0] is out:
                if not (type(out) is _ND and out.dtype is _F64 and out.ndim == 1 and len(out) == n):
                    return _MISS
                f = out.flags
                if not (f.c_contiguous and f.aligned and f.writeable):
                    return _MISS
            elif _bind(id(out), n, 1, bound.deliver_addr):
                return _MISS
            else:
                bound.adopt_delivery(out)
        # run_checked's steps, inlined: the Python calls are most of this path's cost
        self.busy = True
        c, st, step = self.compiled, self._state, self.step
        ex = c.ex
        try:
            e = held[0]
            if e is None or e[0] is not c.internal_out:
                bound.pin(0, c.internal_out, True)
            if out is None and bound.deliver is not None:
                bound.no_delivery()
            rc = self._an_run(ex, step, eng.timeout, 0, -1, 0)
            if not rc and not self._exrun.flags:
                st.clean()  # the run state is reset only for a run that goes on (as in run_bound)
                clean = True
            else:
                st.begin(step, None, None, 0)  # after the C call: C never reads the Python run state
                if rc:
                    self._go_on(rc, eng.timeout)
                else:
                    st.flags = self._exrun.flags
                    if st.flags & fr.FLAG_REFUSED:
                        walk.finish(c, st)
                clean = st.bad is None and not st.flags & (fr.FLAG_REFUSED | fr.FLAG_NONFINITE)
        finally:
            self.step = step + 1
            self.busy = False
            self.flags = st.flags
        if clean:
            # clean: C delivered the result into `out` at the end of the run (interpreter.c)
            if out is not None:
                return out
            return None if c.rp.result is None else c.internal_out.copy()
        return self._end(None, contributions, c.internal_out, out, step)

    def reduce_scatter_run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> Chunk:
        """Reduce-scatter programs only: run once and return Chunk(start, stop, values)."""
        if not self.engine.program.mode.scatters:
            raise PlanRefusal(
                "plan-delivery-mismatch",
                "this executor delivers the whole result; build it with mode='reduce-scatter'",
            )
        values = self.run(contributions, out=out, timeout=timeout)
        chunk = self.engine.chunk
        return Chunk(chunk[0], chunk[1], values)

    def _leaves(self, contributions) -> dict:
        """slot -> float64 vector for exactly this rank's slots: the caller's arrays where each
        is a 1-D, C-contiguous, aligned float64 array of the payload's length (checked here on
        every call), else the full check (which copies what C cannot read in place)."""
        slots = self._slots
        n = self.compiled.n
        if type(contributions) is dict and slots is not None and len(contributions) == len(slots):
            for slot, _ in slots:
                v = contributions.get(slot)
                if not (type(v) is _ND and v.dtype is _F64 and v.ndim == 1 and len(v) == n):
                    break
                f = v.flags
                if not (f.c_contiguous and f.aligned):
                    break
            else:
                return contributions
        c = self.compiled
        return bind.check_leaves(c, contributions, self.engine.rank, self.engine.program.layout)

    def run_checked(
        self,
        leaves: dict | None,
        out: np.ndarray | None = None,
        *,
        refused: Refusal | None = None,
        timeout: float | None = None,
        vote: int = 0,
        step: int | None = None,
    ) -> np.ndarray | None:
        """Run once with `leaves` the caller checked: slot -> C-contiguous aligned float64
        vector of its length, or None when `refused` is this rank's refusal of its inputs (the
        program then runs on zeros, flagged, and `refused` is raised at the end on this rank,
        `peer-refused` on every rank the flag reaches). `out`: the caller's, checked here.
        `vote` (0 or 1) rides on the frames; afterwards `flags` holds the frame flags this rank
        saw (frames.FLAG_VOTE: any rank voted). `step`: the frame step of this run where the
        front end numbers its calls itself (the arrays: one count per communicator); else the
        handle's own count."""
        self._enter()
        local = refused
        eng, c, st = self.engine, self.compiled, self._state
        step = self.step if step is None else step
        if timeout is not None and timeout != eng.timeout:  # checked before any communication
            try:  # (a bound equal to this executor's was checked when it was built; NaN is not)
                timeout = timeout_from_env(timeout)
            except Refusal as e:  # refused like a bad input
                local, leaves, timeout = local or e, None, None
        st.begin(step, timeout, local, vote)
        delivers = False
        try:
            if self._unbound and leaves is not None and out is None:
                outarr = None  # no contribution, no result buffer: nothing of the caller's to bind
            else:
                outarr, delivers = self._bind(c, st, leaves, out, local, vote)
                local = st.local
            who = st.who
            bound = eng.timeout if timeout is None else timeout
            if who is None:
                rc = self._an_run(c.ex, step, bound, st.flags, -1, 0)
            else:
                rc = self._an_run(
                    c.ex, step, bound, st.flags, who[0], int.from_bytes(fr.code_tag(who[1]), "little")
                )
            self._go_on(rc, bound)
        finally:
            self._leave()
        if delivers and not st.flags & (fr.FLAG_REFUSED | fr.FLAG_NONFINITE) and local is None:
            return out  # C copied the result into the caller's `out` (a clean run: no bad frame either)
        return self._end(local, leaves, outarr, out, step)

    def bind(self, name: str, a, make_pointer=None):
        """Bind the caller's array `a` to the program's buffer `name` (RankProgram.bound: the
        arrays' blocks and geometry words) for the runs to come, unless it is the array bound
        there now: held (strong reference) and pinned (weak reference, engine_bind.Bound) while
        bound. `make_pointer(a)`: the first element's address (a strided view has no contiguous
        buffer), called only when `a` is bound anew; else the pointer is made from a's buffer.
        `a` None: NULL there (an A op with no geometry bound does nothing: the caller wrote its
        part itself). Returns the pointer bound there."""
        b = self.compiled.bound_base[name]
        binding = self._binding
        e = binding.held[b]
        if a is None:
            if e is not None:
                binding.held[b] = None
                self.compiled.bases[b] = self._ffi.NULL
            return None
        if e is not None and e[0] is a and e[1] is not None:  # None: C wrote it (Bound.blocks)
            return e[1]
        pointer = binding.from_buffer("double[]", a) if make_pointer is None else make_pointer(a)
        binding.held[b] = (a, pointer, weakref.ref(a))
        self.compiled.bases[b] = pointer
        return pointer

    def bind_blocks(self, name_x: str, name_y: str | None, x, y, n: int) -> bool:
        """Bind 1-D blocks x (and y: a dot; None: a sum) of n elements to buffers name_x (name_y)
        (engine_bind.Bound.blocks); False, with nothing bound, where they do not fit."""
        bases = self.compiled.bound_base
        return self._binding.blocks(bases[name_x], None if y is None else bases[name_y], x, y, n)

    def bind_tile(self, name_x: str, name_y: str | None, x, y, nd: int, shape, strides) -> bool:
        """Bind N-d tiles x (and y) of the recorded shape and strides to buffers name_x (name_y)
        (engine_bind.Bound.tile); False, with nothing bound, where they do not fit."""
        bases = self.compiled.bound_base
        return self._binding.tile(
            bases[name_x], None if y is None else bases[name_y], x, y, nd, shape, strides
        )

    def run_bound(self, step: int, timeout: float) -> int:
        """Run once at frame step `step` with the buffers bound through `bind` (no contribution,
        no `out`): 0 when the run ended (the program's own words say how: the arrays' root
        check), or abi.STOP when an op stopped it before any message op ran (nothing was sent;
        the front end takes its own path, and the next run starts afresh). Refusals are
        raised here as by run_checked."""
        if self._freed or self.busy or self.engine.broken is not None:
            self._enter()  # raises the refusal that names why
        self.busy = True
        st = self._state
        try:
            rc = self._an_run(self._ex, step, timeout, 0, -1, 0)
            if not rc and not self._exrun.flags:
                # clean (a solver's every call): the run state is reset only for a run that goes on
                st.clean()
                return 0
            st.begin(step, None, None, 0)  # after the C call: C never reads the Python run state
            if rc == STOP:
                return rc
            self._go_on(rc, timeout)
        finally:
            self._leave()
        self._end(None, {}, None, None, step)
        return 0

    def _enter(self) -> None:
        if self._freed:  # its requests and tag block are gone: nothing may post on them again
            raise Refusal(
                "executor-freed",
                f"rank {self.engine.rank}: run() on an executor freed earlier; build a new one on every rank",
            )
        broken = self.engine.broken
        if broken is not None:
            self.engine.endpoint.settle()  # a peer's reset this rank met in a run: join it first
            raise Refusal(
                "combiner-broken",
                f"an earlier run failed with [{broken}]; this executor is broken: build a new one on every rank",
            )
        if self.busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self.busy = True

    def _leave(self) -> None:
        self.step += 1
        self.busy = False
        self.flags = self._state.flags

    def _go_on(self, rc: int, bound: float) -> None:
        """Drive the C run from status `rc` to its end (engine_walk), breaking the engine on a
        failure; afterwards the run state holds its flags and the refusal they name."""
        eng, c, st = self.engine, self.compiled, self._state
        try:
            if rc:
                walk.drive(c, st, rc, eng.send_hook, bound, eng.waiter, eng.comm, eng.watch)
            flags = st.flags = c.ex.run.flags
            if flags & fr.FLAG_REFUSED:
                walk.finish(c, st)
        except Refusal as e:
            raise eng.failed(e, st, st.timeout) from None
        except BaseException as e:  # a bug or an interrupt (KeyboardInterrupt): the channel state is unknown
            eng.fail(e)
            raise

    def _end(self, local, leaves, outarr, out, step):
        eng, st = self.engine, self._state
        bad = st.bad
        if bad is not None and bad.code != "frame-payload-corrupt" and not eng.pairs:
            # A frame of another program: every rank has named it by now, but that program may
            # have sent more than this one received, so the executor cannot run again.
            eng.fail(bad)
        try:
            return bind.finish(self.compiled, eng.program, eng.rank, step, st, local, leaves, outarr, out)
        except Refusal as e:
            raise eng.hint(e) from None

    def _bind(self, c, st, leaves, out, local, vote):
        """Bind this run's leaves (zeros in place of refused ones) and `out`: (the array the
        result buffer is bound to, whether C copies the result into `out` at the end). Records
        in `st.local` this rank's refusal (its inputs, or `out`)."""
        st.local = local
        if leaves is None:
            if self._zeros is None:
                self._zeros = bind.zeros_for(c)
            leaves = bind.zero_leaves(c, self._zeros)
        try:
            outarr, deliver = self._out(c, out, leaves)
        except Refusal as e:
            st.local = local = local or e
            st.begin(st.step, st.timeout, local, vote)
            outarr, deliver = bind.internal_result(c), None
        self._binding.bind(leaves, outarr, deliver)
        return outarr, deliver is not None

    def _out(self, c, out, leaves):
        """bind.bind_out, with `out`'s full check skipped where it is a 1-D, C-contiguous,
        aligned, writeable float64 array of the payload's length."""
        mode = self.engine.program.mode
        if (
            out is not None
            and type(out) is _ND
            and out.dtype is _F64
            and out.ndim == 1
            and len(out) == c.n
            and mode.whole
        ):
            f = out.flags
            if f.c_contiguous and f.aligned and f.writeable:
                return bind.bind_out(c, out, mode, leaves, True)
        return bind.bind_out(c, out, mode, leaves, False)

    def release(self) -> None:
        """Drop what the last run bound (the executor is freed): a later run is refused
        (`executor-freed`) instead of reaching the freed table."""
        self._binding.clear()
        self._steady = False
        self._freed = True


__all__ = ["PreparedRun"]
