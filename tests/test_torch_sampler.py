"""SlotSampler in one process: what it yields (the global batches on one rank, len = the steps
of an epoch) and what it refuses by name. Skips cleanly without torch."""

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, SlotSampler  # noqa: E402


@pytest.fixture(scope="module")
def dp():
    from mpi4py import MPI

    torch.manual_seed(0)
    return DataParallel(torch.nn.Linear(3, 2), MPI.COMM_SELF, slots=4)


def test_alone_a_rank_reads_every_global_batch_whole_and_epochs_differ(dp):
    s = SlotSampler(range(50), dp, batch_size=8, seed=1)
    first = list(s)
    assert len(s) == len(first) == 6 and first == list(s.global_batches())
    s.set_epoch(1)
    walked = list(s)
    again = sum(walked, [])
    assert walked != first and len(set(again)) == len(again) == 48 and set(again) <= set(range(50))
    kept = SlotSampler(range(52), dp, batch_size=8, drop_last=False, shuffle=False)
    assert len(kept) == 7 and list(kept)[-1] == [48, 49, 50, 51]


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"batch_size": 3}, "options-conflict"),  # fewer than the 4 slots
        ({"batch_size": 0}, "usage"),
        ({"batch_size": 8, "seed": -1}, "usage"),
        ({"batch_size": 8, "seed": 1.5}, "usage"),
        ({"batch_size": 64}, "data-invalid"),  # 50 samples hold no batch of 64
        ({"batch_size": 8, "drop_last": False, "n": 51}, "options-conflict"),  # a last batch of 3 < 4 slots
    ],
)
def test_what_cannot_fill_the_slots_is_refused_by_name(dp, kwargs, code):
    n = kwargs.pop("n", 50)
    with pytest.raises(Refusal) as e:
        SlotSampler(range(n), dp, **kwargs)
    assert e.value.code == code


def test_set_epoch_refuses_what_is_no_epoch_or_no_batch_of_it(dp):
    s = SlotSampler(range(50), dp, batch_size=8)
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(Refusal):
            s.set_epoch(bad)
    for bad in (-1, 6, 1.0, True):
        with pytest.raises(Refusal) as e:
            s.set_epoch(0, bad)
        assert e.value.code == "usage"


def test_set_epoch_start_resumes_mid_epoch_and_only_that_iteration_is_shorter(dp):
    s = SlotSampler(range(50), dp, batch_size=8, seed=4)
    s.set_epoch(2)
    whole = list(s)
    s.set_epoch(2, 4)
    assert len(s) == 2 and list(s) == whole[4:] and list(s.global_batches()) == whole[4:]
    assert s.steps_per_epoch == 6 and list(s.global_batches(2)) == whole
