"""The tests' own helpers: the kind of a test (tests/kinds.py) and the one digest parser
(conftest.printed_digest). Pure: reads source files and strings."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from kinds import kind

from conftest import printed_digest, printed_digests

HERE = Path(__file__).resolve().parent
HEX = "0123456789abcdef" * 4


def test_the_digest_lines_of_every_printer_parse():
    text = "\n".join(
        [
            "final loss 0.33  accuracy 0.67",
            f"state digest: {HEX}",
            f"digest: {HEX[::-1]}",
            f"ddp digest: {'f' * 64}",
            f"# digest alpha_mpi after 20 steps: {'a' * 64}",
            f"# digest DDP after 20 steps:       {'d' * 64}",
        ]
    )
    assert printed_digest(text) == HEX
    assert printed_digest(text, "digest") == HEX[::-1]  # not the ddp line, not the state line
    assert printed_digest(text, "ddp digest") == "f" * 64
    assert printed_digest(text, "digest alpha_mpi") == "a" * 64
    assert printed_digest(text, "digest DDP") == "d" * 64
    assert printed_digests(f"state digest: {HEX}\nstate digest: {HEX}\r\n") == [HEX, HEX]


def test_a_missing_or_repeated_digest_fails_unless_allowed():
    assert printed_digest("no digest here", required=False) is None
    with pytest.raises(AssertionError, match="expected one 'state digest' line, found 0"):
        printed_digest("no digest here")
    with pytest.raises(AssertionError, match="found 2"):
        printed_digest(f"state digest: {HEX}\nstate digest: {HEX}")
    assert printed_digest(f"state digest: {HEX[:63]}", required=False) is None  # short: not one


def test_kinds_of_the_suites_own_files():
    assert kind(str(HERE / "test_planning.py"), "test_anything", False) == "pure"
    assert kind(str(HERE / "test_combine_mpi.py"), "test_anything", True) == "mpi"
    launching = [
        (HERE / "test_launch_mpi.py", "test_"),
        (HERE / "test_train_cli.py", "test_same_digest_on_1_2_4_ranks"),
        (HERE / "test_cg_example.py", "test_cg_digest_is_the_same_on_every_rank_count"),
    ]
    for path, name in launching:
        names = [n for n in _test_names(path) if n.startswith(name)]
        assert names and all(kind(str(path), n, False) == "launcher" for n in names), (path, names)


def test_a_launch_is_seen_through_helpers_and_fixtures(tmp_path):
    module = tmp_path / "test_fake.py"
    module.write_text(
        textwrap.dedent(
            """
            import subprocess
            import pytest
            from conftest import run_mpi

            def helper():
                return run_mpi(2, "x.py")

            def indirect():
                return helper()

            @pytest.fixture
            def started():
                return subprocess.run(["true"])

            def test_direct():
                run_mpi(2, "x.py")

            def test_through_helpers():
                indirect()

            def test_through_a_fixture(started):
                pass

            def test_plain():
                assert sum([1, 2]) == 3
            """
        )
    )
    got = {n: kind(str(module), n, False) for n in _test_names(module)}
    assert got == {
        "test_direct": "launcher",
        "test_through_helpers": "launcher",
        "test_through_a_fixture": "launcher",
        "test_plain": "pure",
    }


def _test_names(path):
    import ast

    tree = ast.parse(Path(path).read_text())
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def test_every_slow_entry_names_a_test_that_exists():
    """A renamed slow test would silently join the quick stage: the list must name real tests."""
    from kinds import SLOW

    for filename, names in SLOW.items():
        assert set(names) <= set(_test_names(HERE / filename)), (
            filename,
            set(names) - set(_test_names(HERE / filename)),
        )
