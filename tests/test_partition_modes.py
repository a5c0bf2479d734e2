"""Partition modes are objects chosen once (alpha_mpi/learning/partition.py): the learning layer
never tests a mode's name after construction, and the registry is the one place that reads it."""

import ast
from pathlib import Path

import pytest

from alpha_mpi.learning import MODES
from alpha_mpi.learning.partition import partition_mode
from alpha_mpi.refusals import Refusal

LEARNING = Path(__file__).resolve().parent.parent / "alpha_mpi" / "learning"


def _mode_names(node: ast.AST) -> list[str]:
    """The partition-mode names a comparison operand spells: a constant, or a tuple/list/set of them."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in MODES]


def _names_a_mode(node: ast.AST) -> bool:
    """Whether an operand is a variable or attribute that holds a mode (`partition`, `self.partition`,
    `mode`, `self.partition_saved` ...)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "partition" in name or name == "mode"


def string_dispatch(source: str) -> list[int]:
    """Lines of `source` that compare a mode-holding variable with a partition mode's name
    (`partition == "state"`, `self.partition in ("none", "state")`, `!= "params"`) or with MODES."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        spelled = any(_mode_names(o) or (isinstance(o, ast.Name) and o.id == "MODES") for o in operands)
        if spelled and any(_names_a_mode(o) for o in operands):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_detector_sees_the_dispatch_it_forbids():
    src = 'if partition == "state": pass\nif self.partition in ("none", "grads"): pass\nif mode not in MODES: pass\n'
    assert string_dispatch(src) == [1, 2, 3]
    assert string_dispatch('if optimizer == "adam": pass\nif found.how != "none": pass\n') == []


def test_no_string_dispatch_on_partition_modes_in_learning():
    found = {
        f.name: lines for f in sorted(LEARNING.glob("*.py")) if (lines := string_dispatch(f.read_text()))
    }
    assert found == {}, f"partition modes tested by name (file: lines): {found}"


def test_every_mode_is_in_the_registry_and_a_typo_is_refused_by_name():
    assert MODES == ("none", "state", "grads", "params")
    assert [partition_mode(m).name for m in MODES] == list(MODES)
    assert [partition_mode(m).replicated for m in MODES] == [
        "parameters and optimizer state",
        "parameters",
        "parameters",
        None,
    ]
    for bad in ("zero3", "State", None, 3):
        with pytest.raises(Refusal) as e:
            partition_mode(bad)
        assert e.value.code == "usage" and "none, state, grads, params" in str(e.value)
