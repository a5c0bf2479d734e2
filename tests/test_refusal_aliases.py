"""One meaning per refusal code (issue 37 item 4): the codes split off an overloaded one, their
old names kept as aliases for one release (alpha_mpi.refusals.FORMERLY), and each new code's
advice followed to a call that works.

    layout-missing             was contribution-shape      an Allreducer over a tree without layout=
    contributions-not-mapping  was contribution-shape      contributions (or pieces) that are not a dict
    frame-contract-mismatch    was frame-identity-mismatch a frame of this plan under another contract
    frame-sequence-mismatch    was frame-identity-mismatch a frame of another executor of this plan
    internal-error             was plan-simulation-failed  an invariant broken at run time (a bug)
    options-conflict           was usage                   two valid options that cannot go together
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from alpha_mpi.refusals import ADVICE, ALIAS_UNTIL, CLI_ADVICE, FORMERLY, USAGE_CODES, Refusal, cli_advice

SELF = MPI.COMM_SELF
SPLITS = {
    "layout-missing": "contribution-shape",
    "contributions-not-mapping": "contribution-shape",
    "frame-contract-mismatch": "frame-identity-mismatch",
    "frame-sequence-mismatch": "frame-identity-mismatch",
    "internal-error": "plan-simulation-failed",
    "options-conflict": "usage",
}


def test_the_aliases_are_registered_and_answer_to_the_old_name_for_one_release():
    assert FORMERLY == SPLITS and ALIAS_UNTIL == "0.3.0"
    for new, old in FORMERLY.items():
        assert new in ADVICE and old in ADVICE and new != old  # the old name keeps its own meaning
        e = Refusal(new, "what happened")
        assert e.code == new and e.former_code == old
        assert e.matches(new) and e.matches(old) and not e.matches("peer-refused")
        assert str(e).endswith(f"(formerly [{old}])")  # a log search on the old name finds it
    plain = Refusal("contribution-shape", "slot 0: 3 elements, the layout needs 5")
    assert plain.former_code is None and plain.matches("contribution-shape")
    assert not plain.matches("layout-missing") and "formerly" not in str(plain)
    with pytest.raises(ValueError):
        plain.matches("contribution-shap")  # a typo in a match is as loud as one in a raise


def test_the_errors_page_lists_each_alias_under_both_codes():
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    for new, old in FORMERLY.items():
        entry = page.split(f"{{#{new}}}", 1)[1].split("\n### ", 1)[0]
        assert f"raised as `{old}`" in entry and ALIAS_UNTIL in entry, new
        before = page.split(f"{{#{old}}}", 1)[1].split("\n### ", 1)[0]
        assert f"[`{new}`](#{new})" in before, old


def test_layout_missing_then_layout_given_works():
    from alpha_mpi.execution import Allreducer
    from alpha_mpi.model import pairwise

    tree = pairwise(range(2), 1)
    with pytest.raises(Refusal) as e:
        Allreducer(SELF, tree)
    assert e.value.code == "layout-missing" and e.value.matches("contribution-shape")
    assert "pass layout=" in e.value.advice
    a = Allreducer(SELF, tree, layout=3)  # what the advice says
    x0, x1 = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 1e-17])
    got = a.run({0: x0, 1: x1})
    assert np.array_equal(got, x0 + x1)
    a.free()


@pytest.mark.parametrize("given", [None, "x", {1, 2}])
def test_contributions_not_mapping_then_a_dict_works(given):
    from alpha_mpi.execution import Allreducer
    from alpha_mpi.model import pairwise

    a = Allreducer(SELF, pairwise(range(1), 1), layout=2)
    with pytest.raises(Refusal) as e:
        a.run(given)
    assert e.value.code == "contributions-not-mapping" and e.value.matches("contribution-shape")
    assert "{slot: array}" in e.value.advice
    x = np.array([3.0, 4.0])
    assert np.array_equal(a.run({0: x}), x)  # what the advice says; the executor is not broken
    a.free()


def test_assembler_pieces_not_a_dict_then_ranges_work():
    from alpha_mpi.execution import Assembler
    from alpha_mpi.planning.assembly import plan_assembly

    asm = Assembler(SELF, plan_assembly([(0, 0, 4)], 4, 1))
    x = np.arange(4.0)
    with pytest.raises(Refusal) as e:
        asm.run([x], out=np.empty(4))
    assert e.value.code == "contributions-not-mapping"
    assert "{(start, stop): array}" in e.value.advice
    assert np.array_equal(asm.run({(0, 4): x}, out=np.empty(4)), x)  # what the advice says


def test_internal_error_at_run_time_names_itself_and_the_next_call_works(monkeypatch):
    from alpha_mpi import arrays
    from alpha_mpi.arrays.exchange import Exchange

    x = np.array([1.0, 2.0, 3.0])
    with monkeypatch.context() as m:  # a merged summary that is not the root: a bug, simulated
        m.setattr(Exchange, "root", lambda self, n: None)
        with pytest.raises(Refusal) as e:
            arrays.sum(SELF, x, 0, 3)
    assert e.value.code == "internal-error" and e.value.matches("plan-simulation-failed")
    assert "not your input" in e.value.advice and "report it" in e.value.advice
    assert arrays.sum(SELF, x, 0, 3) == 6.0


def test_options_conflict_names_both_options_and_changing_one_works():
    from alpha_mpi.learning import MLP, DataParallelLearner, SlotStream

    with pytest.raises(Refusal) as e:
        SlotStream(10, 2, 3, 0)  # a batch of 2 cannot fill 3 slots
    assert e.value.code == "options-conflict" and e.value.matches("usage")
    assert "--batch 2" in e.value.message and "--slots 3" in e.value.message
    assert "change one of them" in e.value.advice
    SlotStream(10, 3, 3, 0)  # one of them changed
    with pytest.raises(Refusal) as e:  # audit_slots on one rank: the option and the rank count
        DataParallelLearner(SELF, MLP(4, 3, 3), slots=2, audit_slots=1)
    assert e.value.code == "options-conflict" and "at least 2 ranks" in e.value.message
    DataParallelLearner(SELF, MLP(4, 3, 3), slots=2, audit_slots=0)


def test_options_conflict_is_a_usage_error_on_the_command_line(capsys):
    from alpha_mpi.cli import main

    assert USAGE_CODES == {"usage", "options-conflict"}
    assert "options-conflict" in CLI_ADVICE and "--help" in cli_advice("options-conflict", "train")
    status = main(["train", "--audit-slots", "1", "--slots", "2", "--batch", "4", "--steps", "1"])
    err = capsys.readouterr().err  # audit_slots on one rank (the command runs without mpiexec)
    assert status == 2 and "[options-conflict]" in err and "(formerly [usage])" in err, err
    assert "what to do: two options that are each valid" in err
