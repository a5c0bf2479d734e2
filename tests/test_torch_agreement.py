"""alpha_mpi.torch.step_agreement in one process: the words a step's ranks must share, combined
by addition, show any difference exactly (Lagrange's identity), also where plain sums agree; the
audit's table names the ranks; the batch digests see what they must; the sampler's notes queue
in order and restart with each iteration. The MPI cases are tests/test_torch_agreement_mpi.py's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch.step_agreement import (  # noqa: E402
    FIELDS,
    WORDS,
    BatchNote,
    BatchNotes,
    StepFacts,
    _device_checksum,
    check_combined,
    content_digest,
)


def facts(**values):
    """StepFacts with the named fields set (the others 0)."""
    names = [f.name for f in FIELDS]
    v = [0] * len(FIELDS)
    for k, x in values.items():
        v[names.index(k.replace("_", " "))] = x
    return StepFacts(tuple(v), tuple(str(x) for x in v))


def combined(per_slot):
    """The words after a combine: each slot's words added (exact here, as in the tree)."""
    out = np.zeros(WORDS)
    for f in per_slot:
        w = np.empty(WORDS)
        f.words(w)
        out += w
    return out


def verdict(per_slot):
    try:
        check_combined(combined(per_slot), len(per_slot), per_slot[0])
    except Refusal as e:
        return e.code, e.context["field"]
    return None


def test_equal_values_pass_and_the_first_differing_field_is_named():
    same = [facts(seed=7, epoch=3, batch_digest=0xDEADBEEF)] * 4
    assert verdict(same) is None
    odd = same[:3] + [facts(seed=7, epoch=4, batch_digest=0xDEADBEEE)]
    assert verdict(odd) == ("batch-mismatch", "epoch")  # epoch comes before the digest
    assert verdict(same[:3] + [facts(seed=8, epoch=3, batch_digest=0xDEADBEEF)]) == ("step-mismatch", "seed")


def test_differences_a_plain_sum_cannot_see_are_seen():
    """Slots writing {1, 3} and {2, 2} have the same sum; the squares word tells them apart; so
    do values that differ only in their high halves, or by 2^16 traded between the halves."""
    for a, b in [((1, 3), (2, 2)), ((0x10000, 0x30000), (0x20000, 0x20000)), ((0x10000, 0), (0, 0x10000))]:
        assert verdict([facts(global_batch_length=a[0]), facts(global_batch_length=a[1])]) == (
            "slot-cut-mismatch",
            "global batch length",
        )
        assert verdict([facts(global_batch_length=b[0]), facts(global_batch_length=b[1])]) == (
            None if b[0] == b[1] else ("slot-cut-mismatch", "global batch length")
        )
        # the plain sum of the values (what a one-word field would carry) is the same for both
        assert sum(a) == sum(b)


def test_the_largest_values_at_many_slots_stay_exact():
    slots = 1 << 12
    top = facts(batch_digest=0xFFFFFFFF)
    assert verdict([top] * slots) is None
    got = combined([top] * (slots - 1) + [facts(batch_digest=0xFFFFFFFE)])
    with pytest.raises(Refusal):
        check_combined(got, slots, top)


def test_content_digests_see_contents_shapes_types_and_keys():
    x, y = torch.arange(24.0).reshape(6, 4), torch.arange(6)
    d = content_digest(x, y)
    assert d == content_digest(x.clone(), y.clone())
    for other in [
        (x.flip(0), y),
        (x.reshape(4, 6), y),
        (x.double(), y),
        (x.bfloat16(), y),
        (x, y + 1),
        (x.numpy(), y),
    ]:
        assert content_digest(*other) != d
    m = {"input_ids": y, "labels": y}
    assert content_digest(m, None) == content_digest({"labels": y, "input_ids": y}, None)
    assert content_digest(m, None) != content_digest({"input_ids": y, "labels": y + 1}, None)


def test_a_large_tensor_is_digested_by_spread_blocks_and_other_halves_differ():
    x = torch.randn(64, 3, 64, 64)  # 3 MiB: whole
    big = torch.randn(256, 3, 64, 64)  # 12 MiB: sampled
    assert content_digest(x) == content_digest(x.clone())
    half = big.clone()
    half[128:] = torch.randn(128, 3, 64, 64)
    assert content_digest(half) != content_digest(big)
    one = x.clone()
    one.view(-1)[12345] += 1
    assert content_digest(one) != content_digest(x)  # whole below the limit: one element seen


def test_the_device_checksum_sees_one_byte_and_the_order():
    t = torch.arange(1000, dtype=torch.int64)
    c = _device_checksum(t)
    u = t.clone()
    u[500] += 1
    assert _device_checksum(u) != c
    assert _device_checksum(t.flip(0)) != c
    assert _device_checksum(t.clone()) == c


def test_notes_queue_in_order_and_restart():
    q = BatchNotes()
    a, b = BatchNote(10, 4, 0, 0, 1), BatchNote(10, 4, 0, 1, 2)
    q.push(a)
    q.push(b)
    assert q.take() == a
    q.restart()
    assert q.take() is None
    q.push(b)
    assert q.take() == b and q.take() is None
