"""AdamW (decoupled weight decay in torch.optim.AdamW's order) and the optimizer registry, in one
process (issue 44 item 7).

- the kernel's `adamw_step` equals the independent oracle (`oracle.adamw`, plain Python floats)
  bit for bit, on data where the two other usual orders (decay after the Adam step; the decay
  term added inside the step, p - lr*(step + wd*p)) give other bits; at wd = 0 it is Adam's bits;
- FiniteOrRefuse: a non-finite wd, input or decayed parameter is refused by name, the state
  untouched, exactly where the oracle refuses;
- the learner with optimizer="adamw" equals the oracle learner (the declared tree over the slots'
  payloads, divide once, oracle.adamw) at every step, and the decay is seen in its bits;
- the registry: a typo names the known optimizers (`usage`), weight_decay is AdamW's only;
- the formula text is the kernel header's text.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from test_kernel import HP, adam_data, assert_bits, bias, u64

from alpha_mpi import kernel as K
from alpha_mpi import oracle as O
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.learning.optim import OPTIMIZERS, AdamW, make_optimizer, optimizer_class
from alpha_mpi.model import build
from alpha_mpi.model.formulas import ADAM_V1, ADAMW_V1, FORMULAS, assignments
from alpha_mpi.refusals import KernelRefusal, Refusal

from conftest import bits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WD = 0.1


def comm_self():
    from mpi4py import MPI

    return MPI.COMM_SELF


def _verdict(fn):
    try:
        fn()
    except O.OracleRefusal as r:
        return r
    return None


# ----------------------------------------------------------------------------- the kernel


def test_adamw_matches_the_oracle_and_not_the_other_orders():
    rng = np.random.default_rng(44)
    n = 50_000
    p, m, v, g = adam_data(rng, n)
    outs = [np.empty(n) for _ in range(3)]
    lr = 3e-2  # large enough that the decay term is not lost below p's last bit
    for t in (1, 9):
        b1t, b2t = bias(t)
        kw = dict(HP, lr=lr, b1t=b1t, b2t=b2t)
        K.adamw_step(p, m, v, g, *outs, wd=WD, **kw)
        wp, wm, wv = O.adamw(p, m, v, g, wd=WD, **kw)
        assert_bits(outs[0], wp)
        assert_bits(outs[1], wm)
        assert_bits(outs[2], wv)
    # Adam's moments are untouched by the decay; the parameters are not
    ap, am, av = (np.empty(n) for _ in range(3))
    K.adam_step(p, m, v, g, ap, am, av, **kw)
    assert np.array_equal(u64(am), u64(outs[1])) and np.array_equal(u64(av), u64(outs[2]))
    assert np.count_nonzero(u64(ap) != u64(outs[0])) > n // 2
    # the other orders a reader might expect give other bits on this data
    step = (lr * (outs[1] / (1 - b1t))) / (np.sqrt(outs[2] / (1 - b2t)) + HP["eps"])
    after = (p - step) * (1 - lr * WD)  # decay after the Adam step
    inside = p - lr * ((outs[1] / (1 - b1t)) / (np.sqrt(outs[2] / (1 - b2t)) + HP["eps"]) + WD * p)
    assert np.count_nonzero(u64(after) != u64(outs[0])) > 100
    assert np.count_nonzero(u64(inside) != u64(outs[0])) > 100


def test_adamw_at_zero_decay_is_adam_bit_for_bit():
    rng = np.random.default_rng(45)
    p, m, v, g = adam_data(rng, 20_000)
    b1t, b2t = bias(4)
    want = [np.empty_like(p) for _ in range(3)]
    got = [np.empty_like(p) for _ in range(3)]
    K.adam_step(p, m, v, g, *want, b1t=b1t, b2t=b2t, **HP)
    K.adamw_step(p, m, v, g, *got, b1t=b1t, b2t=b2t, wd=0.0, **HP)
    for a, b in zip(got, want):
        assert np.array_equal(u64(a), u64(b))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_adamw_refuses_a_nonfinite_weight_decay_by_name(bad):
    rng = np.random.default_rng(46)
    p, m, v, g = adam_data(rng, 100)
    before = [u64(a).copy() for a in (p, m, v, g)]
    kw = dict(HP, b1t=0.9, b2t=0.999, wd=bad)
    with pytest.raises(KernelRefusal) as e:
        K.adamw_step(p, m, v, g, *[np.empty(100) for _ in range(3)], **kw)
    assert e.value.code == "non-finite-input" and e.value.context["array"] == "wd"
    assert "wd" in e.value.message and all(np.array_equal(u64(a), b) for a, b in zip((p, m, v, g), before))
    r = _verdict(lambda: O.adamw(p, m, v, g, **kw))
    assert (r.code, r.array, r.index) == ("non-finite-input", "wd", None)


@pytest.mark.parametrize("arr", ["p", "m", "v", "g"])
def test_adamw_refuses_a_nonfinite_input_where_the_oracle_does(arr):
    rng = np.random.default_rng(47)
    p, m, v, g = adam_data(rng, 3_000)
    d = dict(p=p, m=m, v=v, g=g)
    d[arr][1_777] = np.nan
    before = {k: u64(a).copy() for k, a in d.items()}
    kw = dict(HP, b1t=0.9, b2t=0.999, wd=WD)
    with pytest.raises(KernelRefusal) as e:
        K.adamw_step(p, m, v, g, *[np.empty(3_000) for _ in range(3)], **kw)
    assert (e.value.code, e.value.context["array"], e.value.context["index"]) == (
        "non-finite-input",
        arr,
        1_777,
    )
    assert all(np.array_equal(u64(a), before[k]) for k, a in d.items())
    r = _verdict(lambda: O.adamw(p, m, v, g, **kw))
    assert (r.code, r.array, r.index) == ("non-finite-input", arr, 1_777)


def test_a_decayed_parameter_that_overflows_is_refused_as_the_intermediate():
    """pd = p * (1 - lr*wd) is computed first and checked: a (kernel-level) negative decay that
    sends it to Inf is refused at its element, as the oracle refuses it."""
    rng = np.random.default_rng(48)
    p, m, v, g = adam_data(rng, 2_000)
    p[1_234] = 1e300
    kw = dict(HP, lr=1.0, b1t=0.9, b2t=0.999, wd=-1e10)
    with pytest.raises(KernelRefusal) as e:
        K.adamw_step(p, m, v, g, *[np.empty(2_000) for _ in range(3)], **kw)
    assert (e.value.code, e.value.context["array"], e.value.context["index"]) == (
        "non-finite-output",
        "intermediate",
        1_234,
    )
    assert "p*(1-lr*wd)" in e.value.message
    r = _verdict(lambda: O.adamw(p, m, v, g, **kw))
    assert (r.code, r.array, r.index) == ("non-finite-output", "intermediate", 1_234)


def test_the_adamw_formula_is_the_kernel_headers_text():
    header = open(os.path.join(ROOT, "csrc", "kernel", "alpha_kernel.h")).read()
    text = re.sub(r"\s+", "", header.split("ADAMW EVALUATION ORDER")[1].split("SGD WITH MOMENTUM")[0])
    steps = assignments(ADAMW_V1)
    pos = 0
    for a in steps[:-2]:  # the scalars, then the per-element lines, in the header's order
        i = text.find(a, pos)
        assert i >= 0, f"{a!r} is not in the header's AdamW order (after position {pos})"
        pos = i + len(a)
    assert steps[-2:] == ["b1t*=b1", "b2t*=b2"]
    assert FORMULAS["adamw-v1"] == ADAMW_V1 != ADAM_V1


# ----------------------------------------------------------------------------- the registry


def test_every_optimizer_is_one_object_naming_its_formula_oracle_and_fields():
    assert list(OPTIMIZERS) == ["adam", "adamw", "sgd"]
    for name, cls in OPTIMIZERS.items():
        assert cls.name == name and cls.formula in FORMULAS and callable(getattr(O, cls.oracle))
        opt = make_optimizer(name, 4, lr=0.1, momentum=0.5)
        assert tuple(opt.hyper_values()) == cls.hyper and set(cls.adoptable) <= set(cls.hyper)
        st = opt.state()
        assert tuple(st["scalars"]) == cls.carried and tuple(st["arrays"]) == cls.arrays
    assert make_optimizer("adamw", 3, lr=1e-3).weight_decay == 0.01  # torch.optim.AdamW's default


@pytest.mark.parametrize("name", ["adamx", "AdamW", "", None])
def test_an_unknown_optimizer_is_a_usage_error_naming_the_known_ones(name):
    with pytest.raises(Refusal) as e:
        optimizer_class(name)
    assert e.value.code == "usage" and "adam, adamw, sgd" in e.value.message
    with pytest.raises(Refusal) as e:  # the learner refuses it so, before any contract is built
        DataParallelLearner(comm_self(), MLP(4, 3, 2), slots=2, optimizer=name)
    assert e.value.code == "usage" and "adam, adamw, sgd" in e.value.message


@pytest.mark.parametrize(
    "optimizer,wd,needle",
    [
        ("adam", 0.1, "only 'adamw' decays weights"),
        ("sgd", 0.1, "only 'adamw' decays weights"),
        ("adamw", -0.1, ">= 0"),
        ("adamw", float("nan"), ">= 0"),
        ("adamw", "0.1", ">= 0"),
    ],
)
def test_weight_decay_is_adamws_and_must_be_a_finite_non_negative_number(optimizer, wd, needle):
    with pytest.raises(Refusal) as e:
        DataParallelLearner(comm_self(), MLP(4, 3, 2), slots=2, optimizer=optimizer, weight_decay=wd)
    assert e.value.code == "usage" and needle in e.value.message, e.value.message


def test_adam_and_sgd_accept_weight_decay_zero():
    for name in ("adam", "sgd"):
        assert make_optimizer(name, 2, lr=0.1, weight_decay=0.0).name == name


# ----------------------------------------------------------------------------- the learner


def oracle_adamw_run(model, tree, p0, data, stream, slots, steps, lr, wd):
    """The learner in plain Python floats: the declared tree over each slot's payload, one
    division by the mass, oracle.adamw with the bias powers carried by multiplication."""
    n = model.n_params
    p, m, v = p0.tolist(), [0.0] * n, [0.0] * n
    b1, b2, eps = 0.9, 0.999, 1e-8
    b1t, b2t = b1, b2
    history = []
    for t in range(steps):
        params = np.array(p)
        payloads = {}
        for s in range(slots):
            idx = stream.indices(t, s)
            g = np.zeros(n)
            loss = model.loss_and_grad_sum(params, data.X[idx], data.y[idx], g)
            payloads[s] = g.tolist() + [float(len(idx)), loss]
        total = O.evaluate(tree, payloads)
        grad = [x / total[n] for x in total[:n]]
        p, m, v = O.adamw(p, m, v, grad, lr, b1, b2, eps, b1t, b2t, wd)
        b1t, b2t = b1t * b1, b2t * b2
        history.append(np.array(p))
    return history


@pytest.mark.parametrize("topology", ["pairwise", "hierarchy:3"])
def test_the_adamw_learner_equals_the_oracle_learner(topology):
    data = synthetic(3, n=512, n_eval=16, inputs=6, classes=3)
    model, slots, lr = MLP(6, 5, 3), 5, 2e-2
    learner = DataParallelLearner(
        comm_self(), model, slots=slots, topology=topology, optimizer="adamw", lr=lr, weight_decay=WD, seed=4
    )
    assert learner.contract.to_dict() and "adamw-v1" in str(learner.contract.to_dict())
    stream = SlotStream(len(data.y), 37, slots, 4)  # 8+8+7+7+7: unequal slots
    p0 = learner.params.copy()
    want = oracle_adamw_run(model, build(topology, slots, 1), p0, data, stream, slots, 5, lr, WD)
    adam = DataParallelLearner(
        comm_self(), model, slots=slots, topology=topology, optimizer="adam", lr=lr, seed=4
    )
    for t in range(5):
        batch = {s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in range(slots)}
        learner.train_step(batch)
        adam.train_step(batch)
        assert np.array_equal(bits(learner.params), bits(want[t])), f"step {t}"
    assert np.count_nonzero(bits(adam.params) != bits(learner.params)) > model.n_params // 2  # it decayed
    hyper = learner.checkpoint_scalars()["optimizer_hyper"]
    assert hyper == {"lr": lr, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": WD}


def test_adamw_state_is_adams_arrays_and_carried_powers():
    opt = AdamW(5, lr=1e-3, weight_decay=0.2)
    assert set(opt.state()["arrays"]) == {"m", "v"} and opt.state()["scalars"] == {
        "b1t": 0.9,
        "b2t": 0.999,
        "steps": 0,
    }


# ----------------------------------------------------------------------------- checkpoints


def _saved_adamw(root, cfg):
    from alpha_mpi.checkpoint import Checkpointer

    learner = DataParallelLearner(
        comm_self(), MLP(6, 5, 3), slots=2, optimizer="adamw", lr=1e-2, weight_decay=WD
    )
    data = synthetic(3, n=64, n_eval=8, inputs=6, classes=3)
    stream = SlotStream(len(data.y), 9, 2, 3)
    for t in range(2):
        learner.train_step({s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in (0, 1)})
    with Checkpointer(comm_self(), root, learner, cfg) as ck:
        ck.save()


@pytest.mark.parametrize(
    "edit,needle",
    [
        (  # the config says the same: only the derivation check sees it
            lambda m: [d.update(weight_decay=-0.1) for d in (m["config"], m["scalars"]["optimizer_hyper"])],
            "weight_decay -0.1 is negative",
        ),
        (lambda m: m["scalars"]["optimizer_hyper"].pop("weight_decay"), "missing ['weight_decay']"),
        (
            lambda m: m["scalars"]["optimizer_hyper"].update(weight_decay=0.2),
            "config.weight_decay 0.1 differs",
        ),
        (lambda m: m["scalars"]["optimizer_scalars"].update(b1t=0.9), "b1t 0.9 is not b1^(t+1)"),
        (
            lambda m: m.setdefault("resume_history", []).append(
                {"at_step": 1, "field": "weight_decay", "from": 0.1, "to": -1.0}
            ),
            "must be a weight decay >= 0",
        ),
    ],
)
def test_a_forged_adamw_manifest_is_refused_by_name(tmp_path, edit, needle):
    from ckpt_tools import edit_root

    from alpha_mpi.checkpoint import open_checkpoint

    root = str(tmp_path / "ck")
    cfg = {"slots": 2, "optimizer": "adamw", "lr": 1e-2, "weight_decay": WD}
    _saved_adamw(root, cfg)
    assert open_checkpoint(root).manifest["scalars"]["optimizer_hyper"]["weight_decay"] == WD
    edit_root(root, edit)
    with pytest.raises(Refusal) as e:
        open_checkpoint(root)
    assert e.value.code == "checkpoint-manifest" and needle in e.value.message, e.value.message
