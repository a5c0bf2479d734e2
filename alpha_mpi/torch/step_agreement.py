"""What the ranks must agree on in a step, carried in the step's own payload: `StepFacts`.

A step is one global batch trained under one set of settings on every rank. When one rank's
script differs (a forgotten `set_epoch`, a resume without `start`, a data set one sample longer,
another global batch length, another `DataParallel(seed=)`, `module.eval()` left on, `no_sync()`
forgotten, the whole batch where the share was meant), its slots are computed from other data or
under other rules, and the combine would add them in without a sound: the gradient is wrong and
nothing says so. So each step's payload carries, per slot, a few words that every rank must have
alike, and after the combine every rank checks them: equal, or every rank refuses the step by
name, naming the first field (in FIELDS order) that differs. Nothing is applied; the next step
works.

The fields (FIELDS, in the order they are named; each a 32-bit value on every rank):

| field | code | what it is on a rank |
|---|---|---|
| seed | step-mismatch | `DataParallel(seed=)` |
| training | step-mismatch | digest of `m.training` over `module.modules()` |
| accumulate | step-mismatch | 0 overwrite `.grad`, 1 add (`accumulate=True`), 2 carry (`no_sync()`) |
| loss scale | step-mismatch | CRC-32 of the GradScaler's scale (`scaler=`; 0 without) |
| batch source | batch-mismatch | `step`, `step_local` (a SlotSampler's batch, or `sizes=`), `step_slots` |
| cut | slot-cut-mismatch | digest of `sizes=` (0: the even cut) |
| data set length | batch-mismatch | the SlotSampler's `len(dataset)` (0 without one) |
| global batch length | slot-cut-mismatch | `len(y)` (step), the sampler's window or `sum(sizes)` (step_local) |
| epoch | batch-mismatch | the SlotSampler's epoch (`set_epoch`) |
| batch index | batch-mismatch | the batch's place in its epoch (`set_epoch(epoch, start)` on a resume) |
| batch digest | batch-mismatch | CRC-32 of the sample indices (SlotSampler) or of the batch's contents (step) |

How equal values travel in a sum (the combine only adds): a value v is split into two 16-bit
halves h, l and each slot writes three words, h, l and h² + l². Every slot contributes, so after
the combine over S slots a field holds A = Σh, B = Σl, Q = Σ(h² + l²), all integers below 2^53
(S < 2^20), so exact in binary64 in any order. By Lagrange's identity
S·Q − A² − B² = Σ_{s<t} (h_s − h_t)² + (l_s − l_t)², which is 0 exactly when every slot wrote
the same value: every rank decides from the same combined words, so every rank refuses alike and
names the same field. Cost: 3 words per field, 33 words per slot payload, and nothing else (no
extra round).

With `audit_slots` the audit's digest differences travel in the same combine (after these
words, alpha_mpi.learning.audit) and the step compares these words first: a rank that differs by
its settings is refused by the field, never called a faulty host (`sdc-detected`).

`BatchNotes`: how a SlotSampler tells the step which global batch a rank's share belongs to. The
sampler pushes one `BatchNote` per batch it yields (the DataLoader iterates it in the main
process and returns batches in that order); `step_local` takes the oldest. A new iteration of a
sampler starts a new queue (an epoch left early leaves nothing behind).
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..refusals import Refusal
from ._env import require_torch

torch = require_torch()

__all__ = [
    "FIELDS",
    "WORDS",
    "MAX_SLOTS",
    "BatchNote",
    "BatchNotes",
    "StepFacts",
    "content_digest",
    "step_facts",
    "check_combined",
]


@dataclass(frozen=True)
class Field:
    """One value the ranks must share in a step: its name, the refusal, and what it means."""

    name: str
    code: str
    what: str


FIELDS = (
    Field("seed", "step-mismatch", "DataParallel(seed=)"),
    Field("training", "step-mismatch", "the modules' training flags (module.train() / module.eval())"),
    Field("accumulate", "step-mismatch", "what the step does with .grad (no_sync(), accumulate=)"),
    Field("loss scale", "step-mismatch", "the GradScaler's scale (step(..., scaler=))"),
    Field("batch source", "batch-mismatch", "how the batch was given (step, step_local, step_slots)"),
    Field("cut", "slot-cut-mismatch", "the slot sizes given with sizes="),
    Field("data set length", "batch-mismatch", "the SlotSampler's len(dataset)"),
    Field("global batch length", "slot-cut-mismatch", "the samples of the step's global batch"),
    Field("epoch", "batch-mismatch", "the SlotSampler's epoch (sampler.set_epoch(epoch))"),
    Field(
        "batch index",
        "batch-mismatch",
        "the batch's place in its epoch (set_epoch(epoch, start) on a resume)",
    ),
    Field(
        "batch digest", "batch-mismatch", "the global batch's sample indices (SlotSampler) or contents (step)"
    ),
)
"""The fields, in the order a refusal names the first that differs."""

MAX_SLOTS = 2**20
"""The most slots a DataParallel takes: below it every field's combined words are exact."""

WORDS = 3 * len(FIELDS)
"""Payload words per slot: three per field (the module docstring says why)."""

SOURCES = {"step": 1, "step_local (SlotSampler)": 2, "step_local (sizes=)": 3, "step_slots": 4}
"""The `batch source` values."""


def word32(v: int) -> int:
    """v itself where it fits 32 bits unsigned, else its CRC-32 (a seed of 2^40, say)."""
    return v if 0 <= v < 2**32 else zlib.crc32(str(v).encode())


@dataclass(frozen=True)
class BatchNote:
    """What a SlotSampler knows about the global batch a rank's share belongs to."""

    n: int  # len(dataset)
    length: int  # samples in the global batch
    epoch: int
    index: int  # the batch's place in its epoch
    digest: int  # CRC-32 of the global batch's sample indices (int64, little-endian)


class BatchNotes:
    """The notes of the batches a SlotSampler has yielded and `step_local` has not yet taken."""

    def __init__(self) -> None:
        self._queue: collections.deque[BatchNote] = collections.deque()

    def restart(self) -> None:
        """A new iteration of the sampler: the notes of the last one are dropped."""
        self._queue.clear()

    def push(self, note: BatchNote) -> None:
        """The sampler yielded the share of this note's batch."""
        self._queue.append(note)

    def take(self) -> BatchNote | None:
        """The oldest note not yet taken (None: no SlotSampler batch is pending)."""
        return self._queue.popleft() if self._queue else None


def indices_digest(indices: np.ndarray) -> int:
    """CRC-32 of sample indices as little-endian int64."""
    return zlib.crc32(np.ascontiguousarray(indices, dtype="<i8").tobytes())


WHOLE = 4 << 20
"""A tensor or array up to this many bytes is digested whole; a larger one by BLOCKS blocks of
4 KiB spread evenly over it (4 MiB), so `step`'s batch digest costs at most a few milliseconds
per tensor: a rank given other samples differs in every block, one differing sample may not."""
BLOCKS = 1024


def _sampled(b: np.ndarray) -> np.ndarray:
    """`b` (uint8) itself up to WHOLE bytes, else BLOCKS blocks of 4 KiB spread evenly over it."""
    if b.size <= WHOLE:
        return b
    step = (b.size - 4096) // (BLOCKS - 1)  # block k starts at k * step; the last ends in b
    return np.lib.stride_tricks.as_strided(b, shape=(BLOCKS, 4096), strides=(step, 1), writeable=False)


def _tensor_bytes(t) -> np.ndarray:
    """The bytes of a CPU tensor (any dtype, bfloat16 too) as uint8, sampled (`_sampled`)."""
    flat = t.detach().contiguous().reshape(-1)
    return _sampled(flat.view(torch.uint8).numpy())


def _device_checksum(t) -> int:
    """A checksum of a tensor's bytes computed where it lies (one scalar crosses to the host):
    Σ (byte + 1) · (position mod 65521 + 1) in int64, wrapping. Integer sums are exact and
    associative (mod 2^64), so the value does not depend on the device's reduction order."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    w = torch.arange(b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return int(((b + 1) * w).sum()) & (2**64 - 1)


def _fold(v, crc: int) -> int:
    if v is None:
        return zlib.crc32(b"None", crc)
    if isinstance(v, Mapping):
        for k in sorted(v, key=str):
            crc = _fold(v[k], zlib.crc32(str(k).encode(), crc))
        return crc
    if isinstance(v, torch.Tensor):
        crc = zlib.crc32(f"{tuple(v.shape)}{v.dtype}".encode(), crc)
        if v.device.type == "cpu":
            return zlib.crc32(memoryview(np.ascontiguousarray(_tensor_bytes(v))), crc)
        return zlib.crc32(_device_checksum(v).to_bytes(8, "little"), crc)
    if isinstance(v, np.ndarray) and v.dtype != object:
        crc = zlib.crc32(f"{v.shape}{v.dtype.str}".encode(), crc)
        raw = np.ascontiguousarray(v).reshape(-1).view(np.uint8)
        return zlib.crc32(memoryview(np.ascontiguousarray(_sampled(raw))), crc)
    if isinstance(v, (list, tuple)):
        for x in v:
            crc = _fold(x, crc)
        return crc
    return zlib.crc32(repr(v).encode(), crc)


def content_digest(*parts) -> int:
    """A CRC-32 over a batch's contents (tensors, arrays, mappings and lists of them; each
    tensor's shape, dtype and bytes, sampled beyond WHOLE), what `step` compares across ranks:
    every rank holds the same global batch, so the same bytes."""
    crc = 0
    for v in parts:
        crc = _fold(v, crc)
    return crc


@dataclass(frozen=True)
class StepFacts:
    """This rank's values of FIELDS for one step, and how a message shows each."""

    values: tuple[int, ...]
    shown: tuple[str, ...]

    def words(self, out: np.ndarray) -> None:
        """The WORDS payload words of one slot (h, l, h² + l² per field)."""
        for k, v in enumerate(self.values):
            h, lo = v >> 16, v & 0xFFFF
            out[3 * k : 3 * k + 3] = (h, lo, h * h + lo * lo)


def step_facts(
    *,
    seed: int,
    module,
    accumulate: int,
    loss_scale: float | None,
    source: str,
    sizes: list[int] | None,
    note: BatchNote | None,
    length: int,
    digest: int,
) -> StepFacts:
    """This rank's StepFacts (`length`: the global batch's samples, 0 where unknown;
    `accumulate`: alpha_mpi.torch.accumulation's OVERWRITE, ADD or CARRY)."""
    flags = [m.training for m in module.modules()]
    cut = 0 if sizes is None else indices_digest(np.asarray(sizes))
    n, epoch, index = (note.n, note.epoch, note.index) if note is not None else (0, 0, 0)
    values = (
        word32(seed),
        zlib.crc32(bytes(flags)),
        int(accumulate),
        0 if loss_scale is None else zlib.crc32(repr(float(loss_scale)).encode()),
        SOURCES[source],
        cut,
        word32(n),
        word32(length),
        word32(epoch),
        word32(index),
        digest & 0xFFFFFFFF,
    )
    shown = (
        str(seed),
        f"{sum(flags)} of {len(flags)} modules in training mode",
        ("overwrites .grad", "adds into .grad", "carries its sums (inside no_sync())")[int(accumulate)],
        "no GradScaler" if loss_scale is None else repr(loss_scale),
        source,
        "the even cut" if sizes is None else f"sizes {list(sizes)[:8]}{' ...' if len(sizes) > 8 else ''}",
        str(n) if note is not None else "no SlotSampler",
        str(length),
        str(epoch) if note is not None else "no SlotSampler",
        str(index) if note is not None else "no SlotSampler",
        f"{digest & 0xFFFFFFFF:08x}",
    )
    return StepFacts(values, shown)


def _refuse(k: int, mine: StepFacts) -> Refusal:
    f = FIELDS[k]
    return Refusal(
        f.code,
        f"the ranks disagree on the step's {f.name} ({f.what}); this rank: {mine.shown[k]}; "
        "nothing was applied",
        field=f.name,
    )


def check_combined(words: np.ndarray, slots: int, mine: StepFacts) -> None:
    """Refuse by the first field whose combined words show that the slots wrote different
    values (the same verdict on every rank: it reads only the combined words)."""
    for k in range(len(FIELDS)):
        a, b, q = (int(x) for x in words[3 * k : 3 * k + 3])
        if slots * q != a * a + b * b:
            raise _refuse(k, mine)
