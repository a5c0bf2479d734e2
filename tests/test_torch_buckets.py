"""Buckets in one process: how parameters are grouped, what `bucket_mb` refuses, and that the
hooks leave a user's own backward alone. Skips without torch."""

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402
from alpha_mpi.torch.overlap import bucket_ranges  # noqa: E402


def test_buckets_hold_whole_parameters_from_the_last_to_the_first():
    offsets = [(0, 10), (10, 12), (12, 40), (40, 41)]
    assert bucket_ranges(offsets, 3) == [[3, 2], [1, 0]]
    assert bucket_ranges(offsets, 1) == [[3], [2], [1], [0]]
    assert bucket_ranges(offsets, 1000) == [[3, 2, 1, 0]]


def comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


@pytest.mark.parametrize("bad", [0, -1.0, "25", True, float("nan")])
def test_bucket_mb_that_is_no_positive_size_is_refused(bad):
    with pytest.raises(Refusal) as e:
        DataParallel(torch.nn.Linear(3, 2), comm(), slots=2, bucket_mb=bad)
    assert e.value.code == "usage"


def test_buckets_and_the_audit_are_refused_together():
    with pytest.raises(Refusal) as e:
        DataParallel(torch.nn.Linear(3, 2), comm(), slots=2, bucket_mb=1, audit_slots=1)
    assert e.value.code == "options-conflict" and "audit" in e.value.message
    assert e.value.matches("usage")  # the old name, an alias until 0.3.0


def test_the_hooks_leave_the_users_own_backward_alone():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    dp = DataParallel(m, comm(), slots=2, bucket_mb=1e-5)
    x = torch.randn(4, 3)
    m(x).sum().backward()  # outside a step: .grad as torch computes it
    want = torch.autograd.grad(m(x).sum(), list(m.parameters()))
    assert all(torch.equal(p.grad, w) for p, w in zip(m.parameters(), want))
    dp.free()
