"""Shared helpers. MPI tests run under `mpiexec -n N python -m pytest --with-mpi`.

pytest-mpi has no deadlock protection, so every assertion that could fail on one rank is
gathered (`agree`) and fails on all, and every MPI test builds combiners with a short timeout.
"""

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import settings
from kinds import kind, slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Hypothesis profiles (docs/getting-started.md, "Property tests"). The default, `derandomized`,
# draws the same examples on every run and in every checkout and keeps no example database: a
# failure it shows is a failure of the code at hand, never of a draw some earlier run made and
# stored in .hypothesis/ (which made the README's test command fail in one checkout and pass in
# a fresh clone). A failure the `random` profile finds is kept as an explicit `@example` on the
# test, so the derandomized runs hold it from then on. HYPOTHESIS_PROFILE=random draws new
# examples each run (and keeps what fails in .hypothesis/ to replay it); CI runs the default.
settings.register_profile("derandomized", derandomize=True, database=None, print_blob=True)
settings.register_profile("random", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "derandomized")


def mpiexec():
    """The launcher beside the interpreter (the venv's mpich wheel), else the one on PATH, else None."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else shutil.which("mpiexec")


EXAMPLES = os.path.join(ROOT, "examples")

#: For tests that launch their own jobs (`run_mpi`).
needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH or beside the interpreter")


def launch(*argv, n=None, limit=120, env=None, cwd=None):
    """The one way the tests start a process: `python ARGV...` in a fresh interpreter (`n` None)
    or on `n` ranks under the launcher, always under a hard `timeout -k 5 LIMIT`, so that a hang
    fails the test instead of the suite. `env`: the whole environment (default: this one's).
    Returns the CompletedProcess, with text output."""
    cmd = [sys.executable, *map(str, argv)]
    if n is not None:
        cmd = [mpiexec(), "-n", str(n), *cmd]
    return subprocess.run(
        ["timeout", "-k", "5", str(limit), *cmd], capture_output=True, text=True, env=env, cwd=cwd
    )


def alpha_command(*args, n=None, limit=120, env=None, cwd=None):
    """`python -m alpha_mpi ARGS` (the `alpha-mpi` command), through `launch`."""
    return launch("-m", "alpha_mpi", *args, n=n, limit=limit, env=env, cwd=cwd)


def run_mpi(n, *argv, limit=120, env=None, cwd=None):
    """`launch` on `n` ranks, timed: (CompletedProcess with text output, seconds it took)."""
    t0 = time.monotonic()
    r = launch(*argv, n=n, limit=limit, env=env, cwd=cwd)
    return r, time.monotonic() - t0


def run_example(n, args, limit=300, cwd=EXAMPLES):
    """`python ARGS` on `n` ranks with examples/ importable and one BLAS thread per rank; fails
    the test (with the command and the output's tail) unless it exits 0. Returns its stdout."""
    path = os.pathsep.join(p for p in (EXAMPLES, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=path)
    r, _ = run_mpi(n, *args, limit=limit, env=env, cwd=cwd)
    assert r.returncode == 0, f"{n} ranks: {' '.join(map(str, args))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def printed_digests(text, label="state digest"):
    """Every digest a run printed under `label`, in order: lines `LABEL: <64 hex>` or
    `LABEL (WHAT IT COVERS): <64 hex>` (the train command's `state digest (params, optimizer,
    step, rng):`, the examples' `digest:` and `ddp digest:`), also `# LABEL after N steps: <hex>`
    (bench torch's `# digest alpha_mpi after 20 steps:`). The one parser of the tests."""
    pattern = rf"^\s*#? ?{re.escape(label)}(?: \([^)]*\))?(?: after \d+ steps)?:\s+([0-9a-f]{{64}})\s*$"
    return re.findall(pattern, text, re.M)


def printed_digest(text, label="state digest", required=True):
    """The one digest a run printed under `label`. Fails the test (with the output's tail) unless
    there is exactly one; with `required=False` returns None when there is none."""
    found = printed_digests(text, label)
    if not found and not required:
        return None
    assert len(found) == 1, f"expected one {label!r} line, found {len(found)}:\n{text[-1500:]}"
    return found[0]


def order_sensitive(rng, n):
    """Values spread over ~120 binades with mixed signs: a different add order changes bits."""
    mant = 1.0 + rng.random(n)
    exps = rng.integers(-60, 61, n).astype(np.float64)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return sign * mant * np.exp2(exps)


def slot_data(nslots, n, seed=0):
    rng = np.random.default_rng(seed)
    return {s: order_sensitive(rng, n) for s in range(nslots)}


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def misaligned(a, offset=1):
    """A writeable copy of `a` whose elements start `offset` bytes past an aligned address."""
    a = np.asarray(a)
    raw = np.zeros(a.nbytes + 16, dtype=np.uint8)
    v = np.frombuffer(raw, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
    v[...] = a
    assert not v.flags.aligned and v.flags.writeable and v.flags.c_contiguous
    return v


@pytest.fixture
def self_comm():
    """MPI.COMM_SELF: the API's real code path on one rank, without mpiexec."""
    from mpi4py import MPI

    return MPI.COMM_SELF


def refusal_code(fn):
    """The code of the Refusal `fn()` raises, or None when it returns."""
    from alpha_mpi import Refusal

    try:
        fn()
    except Refusal as e:
        return e.code
    return None


def agree(comm, ok, what=""):
    """Fail on every rank if the check failed on any rank (test-side: collectives are fine here)."""
    from mpi4py import MPI

    oks = MPI.COMM_WORLD.allgather((bool(ok), what))  # never the spy: this is the test's channel
    bad = [(r, w) for r, (o, w) in enumerate(oks) if not o]
    if bad:
        pytest.fail(f"failed on ranks {bad}")


def groups(world, sizes=(2, 4)):
    """Sub-communicators of the first k ranks of `world` (and the rest), for each k < its size:
    the same test on fewer ranks inside one job (collective: every rank takes part)."""
    for k in sizes:
        if k < world.Get_size():
            yield world.Split(0 if world.Get_rank() < k else 1, world.Get_rank())


def pytest_collection_modifyitems(config, items):
    """Mark every test with its kind (`pure`, `launcher`; `mpi` is written on the test), decided
    in tests/kinds.py: `-m pure` runs the single-process tests that start nothing."""
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        found = kind(str(item.path), name, item.get_closest_marker("mpi") is not None)
        if found != "mpi":
            item.add_marker(found)
        if slow(str(item.path), name):
            item.add_marker("slow")


@pytest.fixture(scope="session", autouse=True)
def _no_abort_at_exit():
    """The MPI tests provoke failures on purpose and catch them; the job must still end with
    pytest's verdict, not alpha_mpi's abort-at-exit (the launch tests check that policy)."""
    try:
        from alpha_mpi.execution.abort import set_abort_at_exit
    except ImportError:  # no MPI here: nothing to turn off
        yield
        return
    set_abort_at_exit(False)
    yield


@pytest.fixture
def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def python():
    return sys.executable


def random_tree(slots, size, seed):
    """A random binary tree over `slots` in order, leaves and branches on random ranks."""
    import random

    from alpha_mpi import Branch, Leaf

    rng = random.Random(seed)
    nodes = [Leaf(s, rng.randrange(size)) for s in slots]
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        a, b = nodes[i], nodes[i + 1]
        nodes[i : i + 2] = [Branch(a, b, rng.choice([a.owner, b.owner]))]
    return nodes[0]


def topologies():
    """name -> builder(slots, ranks): the specification's shapes, pairwise, and a random tree."""
    from alpha_mpi import hierarchy, pairwise, star

    return {
        "star": lambda s, p: star(range(s), p),
        "hierarchy:2": lambda s, p: hierarchy(range(s), p, 2),
        "hierarchy:3": lambda s, p: hierarchy(range(s), p, 3),
        "pairwise": lambda s, p: pairwise(range(s), p),
        "random": lambda s, p: random_tree(range(s), p, seed=7 * s + p),
    }
