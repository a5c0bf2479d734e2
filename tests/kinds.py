"""The kind of every test, decided in this one place (tests/conftest.py applies it at collection).

Three kinds, each a marker (`pytest -m pure`, `-m launcher`, `-m mpi`):

- `mpi`: runs inside an MPI job, `mpiexec -n N python -m pytest --with-mpi -m mpi` (pytest-mpi's
  own marker, written on the test: `@pytest.mark.mpi(min_size=N)`);
- `launcher`: a single-process test that starts processes of its own: `mpiexec` jobs, the
  `alpha-mpi` command, a fresh interpreter (conftest's `run_mpi`/`run_example`, `subprocess`),
  or a Slurm job;
- `pure`: every other single-process test (one process, no launch).

And `slow`, beside the kind: the pure tests listed in SLOW, which take tens of seconds each
(thousands of generated trees, plans over 1024 ranks). `tests/run-all.sh` runs the pure tests
but the slow ones by default, and the slow ones with the launchers in its `long` stage
(`STAGES=all`, what CI runs).

A test is a launcher when its body, a fixture it takes or a module-level function either calls
(followed transitively, in the test's own module) names one of LAUNCHING — read from the source
with ast, so a new launching test is labelled without anyone remembering to. A test marked both
`mpi` and launching is an MPI test that also launches; it stays `mpi` (it runs in the MPI stages).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

#: Names whose use means "starts a process": conftest's launch helpers, subprocess, Slurm.
LAUNCHING = frozenset(
    {"launch", "alpha_command", "run_mpi", "run_example", "subprocess", "Popen", "mpiexec", "slurm"}
)


#: Pure tests that take tens of seconds each (measured with --durations on the 2-core development
#: machine): file -> test functions (every parametrization of each).
SLOW = {
    "test_plan_properties.py": {
        "test_malformed_trees_are_refused_by_name",
        "test_random_valid_trees_plan_and_simulate_clean",
    },
    "test_realizations.py": {"test_1024_ranks_on_paper", "test_replicate_at_256_ranks_any_tree"},
    "test_plan_scale.py": {"test_programs_and_counts_at_33_and_64_ranks"},
    "test_checkpoint_trust.py": {
        "test_every_bit_flip_of_root_manifest_seal_and_latest_is_refused_by_verify_and_resume"
    },
}


def slow(path: str, function: str) -> bool:
    """Whether test `function` of `path` is listed in SLOW."""
    return function in SLOW.get(Path(path).name, ())


@cache
def _module_functions(path: str) -> dict[str, set[str]]:
    """Function or method name -> the names it uses (and the fixtures it takes)."""
    tree = ast.parse(Path(path).read_text())
    uses: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {a.arg for a in node.args.args}  # fixtures it takes
            uses.setdefault(node.name, set()).update(names)
    return uses


@cache
def launching_functions(path: str) -> frozenset[str]:
    """The functions of the module at `path` that launch, directly or through its functions."""
    uses = _module_functions(path)
    launching = {name for name, names in uses.items() if names & LAUNCHING}
    grew = True
    while grew:
        more = {name for name, names in uses.items() if names & launching} - launching
        launching |= more
        grew = bool(more)
    return frozenset(launching)


def kind(path: str, function: str, marked_mpi: bool) -> str:
    """'mpi', 'launcher' or 'pure' for test `function` (its name without parameters) of `path`."""
    if marked_mpi:
        return "mpi"
    return "launcher" if function in launching_functions(path) else "pure"
