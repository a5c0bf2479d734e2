"""The public model API (numpy): the Model protocol and its named refusals, the slicing helpers,
save/restore, `alpha-mpi train --model`, and the numpy example on 1, 2 and 4 ranks."""

import os
import sys

import numpy as np
import pytest

from alpha_mpi.learning import (
    MLP,
    DataParallelLearner,
    Model,
    SlotStream,
    check_model,
    digest,
    model_from_spec,
    slice_batch,
    slice_indices,
    slot_ranges,
    stream_batch,
)
from alpha_mpi.refusals import Refusal

from conftest import ROOT, printed_digest, run_example

EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
from numpy_softmax import SoftmaxRegression  # noqa: E402


def probe(d=6, c=3, k=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, d)), rng.integers(0, c, k)


class NoParams:
    def init(self, seed):
        return np.zeros(3)

    def loss_and_grad_sum(self, params, X, y, grad_out):
        return 0.0


class NoInit:
    n_params = 3

    def loss_and_grad_sum(self, params, X, y, grad_out):
        return 0.0


class MeanLossWrongArity(SoftmaxRegression):
    def loss_and_grad_sum(self, params, X, y):  # forgot grad_out: returns a gradient instead
        return 0.0


class Float32Init(SoftmaxRegression):
    def init(self, seed):
        return super().init(seed).astype(np.float32)


class Noisy(SoftmaxRegression):
    """Adds run-to-run noise to its gradient: what a model with a racy reduction looks like."""

    calls = 0

    def loss_and_grad_sum(self, params, X, y, grad_out):
        loss = super().loss_and_grad_sum(params, X, y, grad_out)
        Noisy.calls += 1
        grad_out[0] += 1e-3 * Noisy.calls
        return loss


class WritesParams(SoftmaxRegression):
    def loss_and_grad_sum(self, params, X, y, grad_out):
        loss = super().loss_and_grad_sum(params, X, y, grad_out)
        params[0] += 1.0
        return loss


def test_builtin_mlp_and_the_example_satisfy_the_protocol():
    for m in (MLP(6, 4, 3), SoftmaxRegression(6, 3)):
        assert isinstance(m, Model)
        assert check_model(m, probe=probe()) is m


@pytest.mark.parametrize(
    "model, member",
    [(NoParams(), "n_params"), (NoInit(), "init"), (MeanLossWrongArity(6, 3), "loss_and_grad_sum")],
)
def test_a_model_that_breaks_the_protocol_is_refused_by_name(model, member):
    with pytest.raises(Refusal) as e:
        check_model(model)
    assert e.value.code == "model-protocol"
    assert e.value.context["member"].startswith(member)
    assert type(model).__name__ in e.value.message


def test_the_learner_refuses_a_broken_model_before_any_combine():
    from mpi4py import MPI

    with pytest.raises(Refusal) as e:
        DataParallelLearner(MPI.COMM_SELF, NoInit(), slots=2)
    assert e.value.code == "model-protocol" and "init" in e.value.message


@pytest.mark.parametrize("n_params", [0, -1, 2.5, True, "7"])
def test_n_params_must_be_a_positive_int(n_params):
    m = SoftmaxRegression(6, 3)
    m.n_params = n_params
    with pytest.raises(Refusal, match="n_params") as e:
        check_model(m)
    assert e.value.code == "model-protocol"


def test_the_probe_checks_dtype_determinism_and_read_only_params():
    with pytest.raises(Refusal, match="float64") as e:
        check_model(Float32Init(6, 3), probe=probe())
    assert e.value.code == "model-protocol"
    with pytest.raises(Refusal) as e:
        check_model(Noisy(6, 3), probe=probe())
    assert e.value.code == "model-nondeterministic"
    with pytest.raises(Refusal, match="modified params") as e:
        check_model(WritesParams(6, 3), probe=probe())
    assert e.value.code == "model-protocol"


class GlobalDropout(SoftmaxRegression):
    """Dropout on the inputs drawn from np.random: the commonest cause of other bits per call."""

    def loss_and_grad_sum(self, params, X, y, grad_out):
        keep = np.random.random(X.shape) > 0.5
        return super().loss_and_grad_sum(params, X * keep, y, grad_out)


class SlotDropout(SoftmaxRegression):
    """The same dropout as the advice says: drawn from the generator the learner passes."""

    def loss_and_grad_sum(self, params, X, y, grad_out, rng=None):
        keep = rng.random(X.shape) > 0.5
        return super().loss_and_grad_sum(params, X * keep, y, grad_out)


def test_model_nondeterministic_names_the_global_generator_and_its_advice_works():
    """Issue 36 item 11: the advice named threads and kernels only, not the commonest cause,
    drawing from np.random instead of the slot's `rng`. The refusal says which global generator
    the model drew from, the advice says to take `rng`, and the model that does passes."""
    with pytest.raises(Refusal) as e:
        check_model(GlobalDropout(6, 3), probe=probe())
    assert e.value.code == "model-nondeterministic" and "drew from np.random" in e.value.message
    assert "np.random" in e.value.advice and "`rng`" in e.value.advice
    check_model(SlotDropout(6, 3), probe=probe())  # what the advice says to do
    with pytest.raises(Refusal) as e:
        check_model(Noisy(6, 3), probe=probe())
    assert e.value.code == "model-nondeterministic" and "drew from" not in e.value.message


# -------------------------------------------------------------------------------------- slicing
def test_slot_ranges_cut_the_batch_contiguously_with_the_remainder_first():
    assert slot_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert slot_ranges(6, 3, sizes=[1, 2, 3]) == [(0, 1), (1, 3), (3, 6)]
    for bad, code in (
        ((3, 4, None), "options-conflict"),
        ((6, 3, [1, 1, 1]), "usage"),
        ((6, 0, None), "usage"),
    ):
        with pytest.raises(Refusal) as e:
            slot_ranges(*bad)
        assert e.value.code == code, bad


def test_every_rank_count_gets_the_same_samples_in_each_slot():
    X = np.arange(23 * 2, dtype=np.float64).reshape(23, 2)
    y = np.arange(23)
    whole = slice_batch(X, y, 5, range(5))
    for owned in ([0, 1], [2], [3, 4]):
        part = slice_batch(X, y, 5, owned)
        assert sorted(part) == owned
        for s in owned:
            assert np.array_equal(part[s][0], whole[s][0]) and np.array_equal(part[s][1], whole[s][1])
    assert np.array_equal(np.concatenate([whole[s][1] for s in range(5)]), y)
    idx = slice_indices(np.arange(100, 123), 5, [4])
    assert np.array_equal(idx[4], np.arange(100, 123)[slot_ranges(23, 5)[4][0] :])
    with pytest.raises(Refusal) as e:
        slice_batch(X, y, 5, [5])
    assert e.value.code == "slot-invalid"


def test_stream_batch_is_the_cli_data_order():
    stream = SlotStream(50, 12, 4, seed=3)
    X, y = np.arange(50.0)[:, None], np.arange(50)
    b = stream_batch(stream, 7, [1, 3], X, y)
    for s in (1, 3):
        assert np.array_equal(b[s][1], stream.indices(7, s))


# ------------------------------------------------------------------------------ save / restore
def _train(learner, stream, data, until):
    while learner.step < until:
        learner.train_step(stream_batch(stream, learner.step, learner.my_slots, data.X, data.y))


def test_save_then_restore_into_a_fresh_learner_continues_with_the_same_bits(tmp_path):
    from mpi4py import MPI

    from alpha_mpi.learning.data import synthetic

    data = synthetic(4, n=300, n_eval=10, inputs=6, classes=3)
    model = SoftmaxRegression(6, 3)
    stream = SlotStream(len(data.y), 40, 4, 1)
    straight = DataParallelLearner(MPI.COMM_SELF, model, slots=4, lr=1e-2, seed=1)
    _train(straight, stream, data, 12)
    first = DataParallelLearner(MPI.COMM_SELF, model, slots=4, lr=1e-2, seed=1)
    _train(first, stream, data, 5)
    cfg = {"slots": 4, "batch": 40, "seed": 1}
    where = first.save(str(tmp_path / "ck"), cfg)
    assert where.endswith("5") and os.path.isdir(where)
    second = DataParallelLearner(MPI.COMM_SELF, model, slots=4, lr=1e-2, seed=1)
    assert second.restore(str(tmp_path / "ck"), cfg) is not None and second.step == 5
    _train(second, stream, data, 12)
    assert digest(second.final_params()) == digest(straight.final_params())
    empty = DataParallelLearner(MPI.COMM_SELF, model, slots=4, lr=1e-2, seed=1)
    assert empty.restore(str(tmp_path / "none"), missing_ok=True) is None
    with pytest.raises(Refusal) as e:
        empty.restore(str(tmp_path / "none"))
    assert e.value.code == "checkpoint-missing"
    other = DataParallelLearner(MPI.COMM_SELF, model, slots=4, lr=1e-2, seed=1)
    with pytest.raises(Refusal) as e:
        other.restore(str(tmp_path / "ck"), config={"slots": 4, "batch": 41, "seed": 1})
    assert e.value.code == "checkpoint-config-mismatch"


# ------------------------------------------------------------------------------- --model spec
def test_model_from_spec_refuses_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_models.py").write_text(
        "from numpy_softmax import SoftmaxRegression\n"
        "def good(inputs, classes):\n    return SoftmaxRegression(inputs, classes)\n"
        "def bad(inputs, classes):\n    return object()\n"
        "not_callable = 3\n"
    )
    assert isinstance(model_from_spec("user_models:good", 6, 3), SoftmaxRegression)
    for spec, code in [
        ("user_models", "model-factory"),
        ("no_such_module_xyz:f", "model-factory"),
        ("user_models:missing", "model-factory"),
        ("user_models:not_callable", "model-factory"),
        ("user_models:bad", "model-protocol"),
    ]:
        with pytest.raises(Refusal) as e:
            model_from_spec(spec, 6, 3)
        assert e.value.code == code, spec


def _run(n, args, cwd=EXAMPLES, timeout=240):
    return run_example(n, args, limit=timeout, cwd=cwd)


def _digest(out, label="digest"):  # the examples print `digest:`, the command `state digest:`
    return printed_digest(out, label)


def test_cli_trains_a_protocol_model_from_module_factory_with_partitions_and_resume(tmp_path):
    cli = [
        "-m",
        "alpha_mpi",
        "train",
        "--model",
        "numpy_softmax:factory",
        "--steps",
        "16",
        "--slots",
        "4",
        "--batch",
        "48",
        "--log-every",
        "100",
    ]
    one = _digest(_run(1, cli), "state digest")
    assert _digest(_run(2, cli + ["--partition", "params"]), "state digest") == one
    ck = str(tmp_path / "ck")
    half = cli + ["--checkpoint-dir", ck, "--checkpoint-every", "8"]
    half[half.index("16")] = "8"
    _run(2, half + ["--partition", "grads"])
    assert _digest(_run(1, cli + ["--checkpoint-dir", ck, "--resume"]), "state digest") == one


def test_numpy_example_prints_one_digest_on_1_2_4_ranks_and_across_a_resume_4_to_2(tmp_path):
    script = os.path.join(EXAMPLES, "numpy_softmax.py")
    args = [script, "--steps", "24"]
    digests = {n: _digest(_run(n, args)) for n in (1, 2, 4)}
    assert len(set(digests.values())) == 1, digests
    assert _digest(_run(4, args + ["--partition", "state"])) == digests[1]
    ck = str(tmp_path / "ck")
    _run(4, args + ["--stop-after", "10", "--checkpoint-dir", ck, "--partition", "params"])
    assert _digest(_run(2, args + ["--resume", "--checkpoint-dir", ck])) == digests[1]
