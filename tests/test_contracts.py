"""Numerical contracts: data, digest, compatibility, authorization, evidence; FiniteOrRefuse.

Single-process tests first (every contract refusal by name, round trips, the pinned digest, the
formula text against the kernel header); then MPI tests (run under `mpiexec -n 2` and `-n 5`
with --with-mpi): the contract digest travels in every frame and a peer with another contract is
refused, a BoundedDifference combine (binary32 contributions at an explicit RoundBinary64 site)
runs only with conformance evidence and lands within its tolerance, and FiniteOrRefuse holds end
to end through a conversion site and for DeliverTo.
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from alpha_mpi import Branch, DeliverTo, Layout, Leaf, Refusal, hierarchy, kernel, oracle, plan, star
from alpha_mpi.model.formulas import assignments
from alpha_mpi.numerics import (
    ADAM_V1,
    DEFAULT_SUITE,
    SGD_MOMENTUM_V1,
    BitIdentical,
    BoundedDifference,
    CombineOrder,
    ConformanceEvidence,
    Contract,
    Formula,
    KeepFormat,
    NumericalContract,
    Profile,
    RoundBinary64,
    Tolerance,
    Unchecked,
    WidenBinary32,
    authorize,
    claim_equal,
    contract_for_plan,
    kernel_build_id,
    numerical_compatibility,
)
from alpha_mpi.numerics.evidence import SUITES, measure_evidence
from alpha_mpi.numerics.oracle_check import OracleMismatch, ulp_distance
from alpha_mpi.refusals import NumericalOrderMismatch, NumericalProfileMismatch
from alpha_mpi_verify.fpenv import ftz_daz

from conftest import ROOT, agree, bits, slot_data

SMALL_ORDER = "7c2cfacf099eb0e7c288e720c5e6bb01a2e937c60737cba62abb55713e436c74"  # star(range(3)), 4 coords
SMALL_DIGEST = "8f34c3095228948e4d6ec888bd42e564b3e156932817a08bd4def580115c624a"
WEIGHTED_ADAM_DIGEST = "b3ad840aa78f9a3738c1d9620660b34ea93b7100452b35dc5ccd5291eb024b4a"
# The same two contracts in format version 1 (combines keyed `order_id`), as 0.1 and early 0.2 stored them.
SMALL_DIGEST_V1 = "56bf33eddcc73ae510316a824f22f9a5fb8b90adff8d1de03a5e70fccd74e216"
WEIGHTED_ADAM_DIGEST_V1 = "15a0da009f7d97b32dc1af65b3dc307f9b3f01d083aff24bf0ca51dd20340c50"
TOL = Tolerance(max_abs=2.0**-13)  # the suite's domain bounds the error by 2**-15


def small_plan():
    return plan(star(range(3)), None, 4, size=1)


def code_of(fn, *a, **k):
    try:
        fn(*a, **k)
    except Refusal as e:
        return e.code, e
    return None, None


@pytest.fixture(scope="module")
def evidence():
    return measure_evidence(DEFAULT_SUITE)


def bounded(p, tol=TOL, ev=None):
    c = contract_for_plan(p, contributions="binary32", relation=BoundedDifference(tol))
    return c if ev is None else c.with_evidence(ev)


# -------------------------------------------------------------------------- data and digest


def test_standard_contract_of_a_small_plan_has_the_pinned_digest():
    p = small_plan()
    assert p.layout_order_id == SMALL_ORDER, (
        "the plan's order id changed (planner/tree digest), not the contract"
    )
    c = contract_for_plan(p)
    assert c == NumericalContract(Profile(), (CombineOrder(SMALL_ORDER),), BitIdentical())
    assert c.digest == SMALL_DIGEST
    assert c.profile == Profile(
        ("binary64",), "nearest-even", "preserved", "FiniteOrRefuse", (KeepFormat("contribution"),)
    )
    q = plan(hierarchy(range(4), 2, 2), None, Layout.weighted(2), size=2)
    d = contract_for_plan(q, "adam-v1")
    assert [getattr(op, "formula_id", "combine") for op in d.operations] == [
        "combine",
        "normalize-once",
        "adam-v1",
    ]
    assert d.digest == WEIGHTED_ADAM_DIGEST


def test_format_1_keys_the_combine_order_id_and_still_reads_with_its_own_digest():
    small = contract_for_plan(small_plan())
    weighted = contract_for_plan(plan(hierarchy(range(4), 2, 2), None, Layout.weighted(2), size=2), "adam-v1")
    assert small.to_dict(version=1)["operations"] == [{"kind": "combine", "order_id": SMALL_ORDER}]
    assert small.to_dict()["operations"] == [{"kind": "combine", "layout_order_id": SMALL_ORDER}]
    for c, v1 in ((small, SMALL_DIGEST_V1), (weighted, WEIGHTED_ADAM_DIGEST_V1)):
        old = c.to_dict(version=1)
        back = Contract.from_dict(json.loads(json.dumps(old)))
        assert back == c and back.digest == c.digest and back.to_dict(version=1) == old
        assert c.digest_in(1) == v1 != c.digest == c.digest_in(2)


def test_digest_is_stable_across_processes_and_hash_seeds():
    code = (
        "from alpha_mpi import plan, star; from alpha_mpi.numerics import contract_for_plan;"
        "print(contract_for_plan(plan(star(range(3)), None, 4, size=1)).digest)"
    )
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == SMALL_DIGEST


def test_contracts_are_frozen_and_hashable():
    c = contract_for_plan(small_plan())
    with pytest.raises(FrozenInstanceError):
        c.relation = Unchecked()
    assert len({c, contract_for_plan(small_plan()), replace(c, relation=Unchecked())}) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda p: contract_for_plan(p),
        lambda p: contract_for_plan(p, "sgd"),
        lambda p: contract_for_plan(p, "adam-v1", normalize=True, relation=Unchecked()),
        lambda p: bounded(p),
        lambda p: bounded(
            p, Tolerance(max_ulp=7, max_abs=0.1), ConformanceEvidence("s", 3, "ab" * 32, 5, 2.0**-20 * 3, 12)
        ),
        lambda p: NumericalContract(
            Profile(("binary64", "binary32"), conversions=(WidenBinary32("contribution"),)),
            (CombineOrder(p.layout_order_id),),
        ),
    ],
)
def test_to_dict_from_dict_round_trip_is_exact(make):
    c = make(small_plan())
    d = c.to_dict()
    back = Contract.from_dict(json.loads(json.dumps(d)))
    assert back == c and back.digest == c.digest and back.to_dict() == d
    assert NumericalContract.from_json(c.to_json()).to_dict() == d


def test_evidence_travels_in_to_dict_but_not_in_the_digest(evidence):
    c = bounded(small_plan())
    e = c.with_evidence(evidence)
    assert e.digest == c.digest and e == c
    assert e.to_dict()["relation"]["evidence"]["max_abs"] == evidence.max_abs.hex()
    assert Contract.from_dict(e.to_dict()).relation.evidence == evidence
    # What the contract means does change the digest.
    assert bounded(small_plan(), Tolerance(max_abs=2.0**-12)).digest != c.digest
    assert (
        contract_for_plan(small_plan(), relation=Unchecked()).digest != contract_for_plan(small_plan()).digest
    )


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(version=3),
        lambda d: d.update(version=True),
        lambda d: d.update(extra=1),
        lambda d: d["relation"].update(kind="Approximately"),
        lambda d: d["operations"].append({"kind": "combine", "layout_order_id": "xyz"}),
        lambda d: d["operations"][0].update(
            order_id=d["operations"][0].pop("layout_order_id")
        ),  # v1 key in v2
        lambda d: d.update(version=1),  # v2's key in v1
        lambda d: d["profile"].update(formats=["binary64", "binary32"]),  # binary32 with no site
        lambda d: d["profile"].update(conversions=[{"kind": "RoundBinary64", "site": "contribution"}]),
        lambda d: d["profile"].update(rounding="stochastic"),
        lambda d: d.update(operations=[]),
    ],
)
def test_malformed_contract_dicts_are_refused(mutate):
    d = contract_for_plan(small_plan()).to_dict()
    mutate(d)
    code, _ = code_of(Contract.from_dict, d)
    assert code == "numerical-contract-invalid"


def test_formulas_are_the_kernel_headers_text():
    header = open(os.path.join(ROOT, "csrc", "kernel", "alpha_kernel.h")).read()

    def squash(s):
        return re.sub(r"\s+", "", s)

    adam = squash(header.split("ADAM EVALUATION ORDER")[1].split("SGD WITH MOMENTUM")[0])
    steps = assignments(ADAM_V1)
    pos = 0
    for a in steps[:-2]:  # scalars and the per-element lines, in the header's order
        i = adam.find(a, pos)
        assert i >= 0, f"{a!r} is not in the header's Adam order (after position {pos})"
        pos = i + len(a)
    assert steps[-2:] == ["b1t*=b1", "b2t*=b2"] and "(b1t*=b1),neverwithpow()" in adam
    sgd = squash(header.split("SGD WITH MOMENTUM")[1].split("FiniteOrRefuse")[0])
    pos = 0
    for a in assignments(SGD_MOMENTUM_V1):
        i = sgd.find(a, pos)
        assert i >= 0, f"{a!r} is not in the header's SGD order"
        pos = i + len(a)


def test_contract_for_plan_options():
    p = small_plan()
    assert contract_for_plan(p, "adam").operations[-1] == Formula.named("adam-v1")
    assert contract_for_plan(p, "sgd-momentum-v1").operations[-1].expression == SGD_MOMENTUM_V1
    code, _ = code_of(contract_for_plan, p, "lamb")
    assert code == "numerical-contract-invalid"
    b = contract_for_plan(p, contributions="binary32")
    assert b.profile.site("contribution") == ("RoundBinary64", "WidenBinary32")
    assert b.profile.formats == ("binary64", "binary32")


# ---------------------------------------------------------------------------- compatibility


def test_compatible_contracts_return_none_and_relation_alone_does_not_matter():
    a = contract_for_plan(small_plan(), "adam-v1")
    assert numerical_compatibility(a, a) is None
    assert numerical_compatibility(a, a.to_dict()) is None  # a checkpoint's stored dict
    assert numerical_compatibility(a, replace(a, relation=Unchecked())) is None


@pytest.mark.parametrize(
    "profile, field",
    [
        (Profile(subnormals="flush-to-zero"), "subnormals"),
        (Profile(rounding="toward-zero"), "rounding"),
        (Profile(exceptional="Propagate"), "exceptional"),
        (
            Profile(
                ("binary64", "binary32"),
                conversions=(RoundBinary64("contribution"), WidenBinary32("contribution")),
            ),
            "formats",
        ),
    ],
)
def test_profile_mismatch_names_the_field(profile, field):
    a = contract_for_plan(small_plan())
    b = replace(a, profile=profile)
    with pytest.raises(NumericalProfileMismatch) as e:
        numerical_compatibility(a, b.to_dict(), theirs_name="the checkpoint")
    assert e.value.code == "numerical-profile-mismatch"
    assert field in e.value.context["fields"] and f"{field}: this run" in e.value.message
    assert "the checkpoint" in e.value.message


def test_order_mismatch_names_the_operation():
    s = plan(star(range(10), 2), None, 8, size=2)
    h = plan(hierarchy(range(10), 2, 2), None, 8, size=2)
    with pytest.raises(NumericalOrderMismatch) as e:
        numerical_compatibility(contract_for_plan(s), contract_for_plan(h))
    assert e.value.code == "numerical-order-mismatch" and "operation #0" in e.value.message
    assert "tree shape" in e.value.message
    with pytest.raises(NumericalOrderMismatch) as e:
        numerical_compatibility(contract_for_plan(s, "adam"), contract_for_plan(s, "sgd"))
    assert "adam-v1" in e.value.message and "sgd-momentum-v1" in e.value.message and "#1" in e.value.message
    with pytest.raises(NumericalOrderMismatch) as e:
        numerical_compatibility(contract_for_plan(s, "adam"), contract_for_plan(s))
    assert "nothing" in e.value.message
    # Same formula id, other evaluation order: also another order.
    other = Formula("adam-v1", ADAM_V1.replace("(lr*mhat)/(sqrt(vhat)+eps)", "lr*(mhat*rsqrt(vhat))"))
    with pytest.raises(NumericalOrderMismatch):
        numerical_compatibility(contract_for_plan(s, "adam"), contract_for_plan(s, other))
    # Placement is not order: the same tree on 1 or 2 ranks is one contract.
    one = plan(star(range(10), 1), None, 8, size=1)
    assert contract_for_plan(one).digest == contract_for_plan(s).digest


# ---------------------------------------------------------------------------- authorization


def test_bit_identical_authorizes_and_checks_plan_order():
    p = small_plan()
    c = contract_for_plan(p)
    assert authorize(c, plan=p) is c
    other = plan(hierarchy(range(3), None, 1), None, 4, size=1)  # x0+(x1+x2)
    code, e = code_of(authorize, c, plan=other)
    assert code == "numerical-order-mismatch" and e.message.startswith("the plan combines in order")


def test_a_profile_this_process_cannot_execute_is_refused():
    c = replace(contract_for_plan(small_plan()), profile=Profile(subnormals="flush-to-zero"))
    code, e = code_of(authorize, c)
    assert code == "numerical-profile-mismatch" and "subnormals" in e.message


def test_an_off_profile_fp_environment_is_refused():
    c = contract_for_plan(small_plan())
    with ftz_daz(ftz=True, daz=True):
        code, e = code_of(authorize, c)
    assert code == "fp-environment-off-profile"
    assert authorize(c) is c


def test_bounded_difference_without_evidence_is_refused():
    code, e = code_of(authorize, bounded(small_plan()))
    assert code == "bounded-difference-without-evidence" and "tolerance alone" in e.message


def test_bounded_difference_with_evidence_authorizes(evidence):
    c = bounded(small_plan(), ev=evidence)
    assert authorize(c) is c


def test_evidence_outside_the_tolerance_is_refused(evidence):
    tight = Tolerance(max_abs=evidence.max_abs / 2)
    code, e = code_of(authorize, bounded(small_plan(), tight, evidence))
    assert code == "evidence-outside-tolerance" and "max abs error" in e.message
    code, e = code_of(authorize, bounded(small_plan(), Tolerance(max_ulp=evidence.max_ulp - 1), evidence))
    assert code == "evidence-outside-tolerance" and "max ulp" in e.message
    assert authorize(
        bounded(small_plan(), Tolerance(max_ulp=evidence.max_ulp, max_abs=evidence.max_abs), evidence)
    )


def test_evidence_for_another_kernel_build_is_refused(evidence):
    stale = replace(evidence, build_id="0" * 64)
    code, e = code_of(authorize, bounded(small_plan(), ev=stale))
    assert code == "evidence-build-mismatch" and e.context["live"] == kernel_build_id()


def test_evidence_from_another_suite_or_a_part_of_it_is_refused(evidence):
    code, e = code_of(authorize, bounded(small_plan(), ev=replace(evidence, suite="other-suite")))
    assert code == "bounded-difference-without-evidence" and "other-suite" in e.message
    code, e = code_of(authorize, bounded(small_plan(), ev=replace(evidence, suite_size=3)))
    assert code == "bounded-difference-without-evidence" and "whole suite" in e.message
    unknown = contract_for_plan(
        small_plan(),
        contributions="binary32",
        relation=BoundedDifference(TOL, "no-such-suite", replace(evidence, suite="no-such-suite")),
    )
    code, _ = code_of(authorize, unknown)
    assert code == "conformance-suite-unknown"


def test_unchecked_runs_but_is_never_claimed_equal():
    c = contract_for_plan(small_plan(), relation=Unchecked())
    assert authorize(c) is c
    x = np.arange(4.0)
    code, _ = code_of(claim_equal, c, x, x.copy())  # even when the bits are equal
    assert code == "unchecked-claimed-equal"


def test_the_0_1_methods_say_where_they_moved():
    c = contract_for_plan(small_plan())
    for name, moved in (
        ("authorize", "authorize"),
        ("claim_equal", "claim_equal"),
        ("assert_equal", "claim_equal"),
    ):
        with pytest.raises(AttributeError, match=f"alpha_mpi.numerics.{moved}"):
            getattr(c, name)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        c.nonsense  # noqa: B018


def test_bit_identical_claim_names_the_coordinates_that_differ():
    c = contract_for_plan(small_plan())
    x = np.array([1.0, 2.0, 3.0, 4.0])
    claim_equal(c, x, x.tolist())
    y = x.copy()
    y[2] = np.nextafter(3.0, 4.0)
    with pytest.raises(OracleMismatch) as e:
        claim_equal(c, y, x)
    assert (
        e.value.code == "oracle-mismatch" and e.value.coordinates == [2] and e.value.context["max_ulp"] == 1
    )


def test_bounded_claim_needs_evidence_and_checks_the_tolerance(evidence):
    x = np.array([1.0, -2.0, 0.5, 8.0])
    near = x + 2.0**-20
    code, _ = code_of(claim_equal, bounded(small_plan()), near, x)
    assert code == "bounded-difference-without-evidence"
    c = bounded(small_plan(), ev=evidence)
    claim_equal(c, near, x)
    code, e = code_of(claim_equal, c, x + 2.0**-10, x)
    assert code == "oracle-mismatch" and "outside the tolerance" in e.message


def test_ulp_distance():
    tiny = np.nextafter(0.0, 1.0)
    assert ulp_distance([1.0, 0.0, tiny, 1.0], [np.nextafter(1.0, 2.0), -0.0, -tiny, 1.0]).tolist() == [
        1,
        0,
        2,
        0,
    ]
    assert int(ulp_distance([2.0], [1.0])[0]) == 1 << 52


# ---------------------------------------------------------------------------------- evidence


def test_measure_evidence_runs_the_named_suite(evidence):
    s = SUITES[DEFAULT_SUITE]
    assert evidence.suite == s.name and evidence.suite_size == s.size == 60
    assert evidence.build_id == kernel.build_info()["build_id"]
    assert evidence.coordinates == sum(len(s.case(i)[1][0]) for i in range(s.size))
    # The narrowing is observable (a non-zero error), and within the domain's bound 2**-15.
    assert 0.0 < evidence.max_abs < 2.0**-15 and evidence.max_ulp > 0
    assert measure_evidence(DEFAULT_SUITE) == evidence  # seeded: the same measurement again
    code, _ = code_of(measure_evidence, "no-such-suite")
    assert code == "conformance-suite-unknown"


def test_suite_cases_are_checked_against_the_oracle_of_the_converted_order():
    s = SUITES[DEFAULT_SUITE]
    tree, data = s.case(7)
    got, reference = s.run_case(7)
    converted = {k: oracle.widen(oracle.narrow(v)) for k, v in data.items()}
    assert np.array_equal(bits(got), bits(np.array(oracle.evaluate(tree, converted))))
    assert not np.array_equal(bits(got), bits(np.array(reference)))


# ======================================================================================= MPI

SHORT = 5.0


def run_and_catch(c, contributions, out=None):
    try:
        return c.run(contributions, out=out), None
    except Refusal as e:
        return None, e


@pytest.mark.mpi(min_size=2)
def test_a_peer_with_another_contract_is_refused_on_every_rank_at_build(world):
    from alpha_mpi.execution import Combiner

    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), 8, size=size)
    ours = contract_for_plan(p)
    theirs = replace(ours, relation=Unchecked())  # same order, another contract
    data = slot_data(2, 8)
    mine = {s: data[s] for s in p.slots_of(rank)}
    # Control: the same contract on both sides combines.
    c = Combiner(world, p, timeout=SHORT, contract=ours.digest)
    got, err = run_and_catch(c, mine)
    want = np.array(oracle.evaluate(p.tree, {s: v.tolist() for s, v in data.items()}))
    agree(world, err is None and (rank != 0 or np.array_equal(bits(got), bits(want))), f"control: {err}")
    c.free()
    # Another contract on one rank: the build agreement refuses it on every rank, by name,
    # before any frame is sent (it used to be refused only where rank 1's frame landed).
    err = None
    try:
        Combiner(world, p, timeout=SHORT, contract=(theirs if rank == size - 1 else ours).digest).free()
    except Refusal as e:
        err = e
    ok = err is not None and err.code == "executor-identity-mismatch" and "another contract" in err.message
    agree(world, ok, f"rank {rank}: {err}")
    # The next executor, with the same contract everywhere, works.
    c = Combiner(world, p, timeout=SHORT, contract=ours.digest)
    got, err = run_and_catch(c, mine)
    agree(world, err is None and (rank != 0 or np.array_equal(bits(got), bits(want))), f"after: {err}")
    c.free()


def suite_plan(size, n=64):
    slots = 2 * size  # <= 16 slots: inside the suite's domain
    return plan(hierarchy(range(slots), size, 2), None, n, size=size), slots


@pytest.mark.mpi(min_size=2)
def test_bounded_difference_combine_runs_with_evidence_and_lands_within_tolerance(world, evidence):
    from alpha_mpi.execution import ContractCombiner

    size, rank = world.Get_size(), world.Get_rank()
    p, slots = suite_plan(size)
    c = bounded(p, ev=evidence)
    data = SUITES[DEFAULT_SUITE].sample(slots, 64, seed=[2024, size])
    cc = ContractCombiner(world, p, c, timeout=SHORT)
    got, err = run_and_catch(cc, {s: data[s] for s in p.slots_of(rank)})
    ok, why = err is None and got is not None, f"run: {err}"
    if ok:
        full = np.array(oracle.evaluate(p.tree, {s: v.tolist() for s, v in data.items()}))
        declared = np.array(
            oracle.evaluate(p.tree, {s: oracle.widen(oracle.narrow(v)) for s, v in data.items()})
        )
        try:
            claim_equal(c, got, full)  # within the tolerance of the binary64 oracle
        except Refusal as e:
            ok, why = False, f"claim: {e}"
        # It ran exactly the declared conversion-then-tree, and the narrowing shows.
        ok = ok and np.array_equal(bits(got), bits(declared)) and not np.array_equal(bits(got), bits(full))
        why += f"; bits declared={np.array_equal(bits(got), bits(declared))}"
    agree(world, ok, why)
    cc.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["no-evidence", "outside-tolerance", "other-build"])
def test_bounded_difference_combine_refuses_before_any_communication(world, evidence, case):
    from alpha_mpi.execution import ContractCombiner

    p, _ = suite_plan(world.Get_size())
    c, want = {
        "no-evidence": (bounded(p), "bounded-difference-without-evidence"),
        "outside-tolerance": (
            bounded(p, Tolerance(max_abs=2.0**-40), evidence),
            "evidence-outside-tolerance",
        ),
        "other-build": (bounded(p, ev=replace(evidence, build_id="f" * 64)), "evidence-build-mismatch"),
    }[case]
    code, _ = code_of(ContractCombiner, world, p, c, timeout=SHORT)
    agree(world, code == want, f"{case}: {code}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("poison", [np.nan, 1e39])  # 1e39 is finite but beyond binary32
def test_finite_or_refuse_through_a_conversion_site_refuses_on_every_receiver(world, evidence, poison):
    from alpha_mpi.execution import ContractCombiner

    size, rank = world.Get_size(), world.Get_rank()
    p, slots = suite_plan(size)
    cc = ContractCombiner(world, p, bounded(p, ev=evidence), timeout=10)
    data = SUITES[DEFAULT_SUITE].sample(slots, 64, seed=3)
    bad = slots - 1
    data[bad][9] = poison
    out = np.full(64, -3.5)
    _, err = run_and_catch(cc, {s: data[s] for s in p.slots_of(rank)}, out=out)
    owner = bad in p.slots_of(rank)
    want = "non-finite-contribution" if owner else "non-finite-combined"
    ok = err is not None and err.code == want and np.all(out == -3.5)
    if ok and owner and poison == 1e39:
        ok = "RoundBinary64" in err.message and "element 9" in err.message
    agree(world, ok, f"rank {rank}: {err}")
    # Communication completed: the next step runs cleanly.
    clean = SUITES[DEFAULT_SUITE].sample(slots, 64, seed=4)
    got, err = run_and_catch(cc, {s: clean[s] for s in p.slots_of(rank)})
    agree(world, err is None and got is not None, f"next step: {err}")
    cc.free()


@pytest.mark.mpi(min_size=2)
def test_finite_or_refuse_with_deliver_to_leaves_every_output_as_it_was(world):
    from alpha_mpi.execution import Combiner

    size, rank = world.Get_size(), world.Get_rank()
    slots = 2 * size + 1
    target = size - 1
    p = plan(hierarchy(range(slots), size, 2), DeliverTo(target), 32, size=size)
    c = Combiner(world, p, timeout=10, contract=contract_for_plan(p).digest)
    data = slot_data(slots, 32, seed=8)
    data[0][5] = np.inf  # slot 0 lives on rank 0, the root
    out = np.full(32, 7.25)
    got, err = run_and_catch(c, {s: data[s] for s in p.slots_of(rank)}, out=out)
    if rank == p.root_rank:
        ok = err is not None and err.code == "non-finite-contribution"
    else:  # the target, and (issue 45) every rank that only sends: the flag rounds name it there too
        ok = err is not None and err.code == "non-finite-combined"
    agree(world, ok and np.all(out == 7.25), f"rank {rank}: {err}, out intact {np.all(out == 7.25)}")
    clean = slot_data(slots, 32, seed=9)
    got, err = run_and_catch(c, {s: clean[s] for s in p.slots_of(rank)}, out=out)
    want = np.array(oracle.evaluate(p.tree, {s: v.tolist() for s, v in clean.items()}))
    ok = err is None and (np.array_equal(bits(out), bits(want)) if rank == target else got is None)
    agree(world, ok, f"next step rank {rank}: {err}")
    c.free()


def test_order_id_means_the_tree_and_layout_order_id_the_combine_old_names_warn():
    """One meaning per name: a contract's combine, a learner and DataParallel name the layout
    order id; their 0.1 `order_id` still answers, with a DeprecationWarning; the stored form of
    a contract keys it `layout_order_id` (format 2; format 1's `order_id` is still read)."""
    import warnings

    from alpha_mpi.model import ReplicateAll, build

    tree = build("pairwise", 4, 1)
    p = plan(tree, ReplicateAll(), 8, size=1)
    op = CombineOrder(p.layout_order_id)
    c = NumericalContract(Profile(), (op,), BitIdentical())
    assert c.layout_order_ids == (p.layout_order_id,) and p.tree_order_id == tree.order_id
    assert op.to_dict() == {"kind": "combine", "layout_order_id": p.layout_order_id}
    assert op.to_dict(version=1) == {"kind": "combine", "order_id": p.layout_order_id}
    assert NumericalContract.from_dict(c.to_dict()) == c
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert op.order_id == p.layout_order_id and c.order_ids == c.layout_order_ids
    assert [x.category for x in w] == [DeprecationWarning] * 2
