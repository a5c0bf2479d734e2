"""alpha_mpi.arrays when a peer never comes: a bounded wait, a named refusal, a broken channel,
and a job that ends (aborted at exit, never hung). Launches its own mpiexec under `timeout`."""

import os
import textwrap

from conftest import needs_mpiexec, run_mpi

pytestmark = needs_mpiexec

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from mpi4py import MPI
    from alpha_mpi import arrays
    from alpha_mpi.refusals import Refusal

    w = MPI.COMM_WORLD
    r, n = w.Get_rank(), 10
    x = np.arange(5.0) + 5 * r
    print(f"r{r} first {arrays.sum(w, x, 5 * r, n)}", flush=True)
    if r == 0:
        for attempt in range(2):
            try:
                arrays.sum(w, x, 0, n, timeout=1.0)
            except Refusal as e:
                print(f"r0 refused [{e.code}]", flush=True)
    else:
        time.sleep(4)  # never calls: rank 0 must give up on its own
    w.Barrier()
    print(f"r{r} done", flush=True)
    """
)


def test_a_missing_peer_is_a_named_timeout_then_a_broken_channel(tmp_path):
    script = tmp_path / "arrays_timeout.py"
    script.write_text(SCRIPT)
    r, _ = run_mpi(2, script, limit=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    assert "r0 first 45.0" in out and "r1 first 45.0" in out, out
    assert "r0 refused [peer-timeout]" in out, out
    assert "r0 refused [combiner-broken]" in out, out
    # frames of the abandoned step may still be in flight: the job is aborted at exit, not hung
    assert r.returncode == 70, out  # alpha_mpi aborts the job at exit (ABORT_STATUS) rather than hang


REMEMBERED = textwrap.dedent(
    """
    import time
    import numpy as np
    from mpi4py import MPI
    from alpha_mpi import arrays
    from alpha_mpi.arrays import fast
    from alpha_mpi.refusals import Refusal

    w = MPI.COMM_WORLD
    r, n = w.Get_rank(), 10
    x = np.arange(5.0) + 5 * r
    for _ in range(2):  # the second time: the one C call (arrays/fast.py)
        first = arrays.sum(w, x, 5 * r, n)
    print(f"r{r} first {first} remembered {fast.lookup(w, 'sum', x, None, 5 * r, n) is not None}", flush=True)
    if r == 0:
        for attempt in range(2):
            try:
                arrays.sum(w, x, 0, n)  # the C call, waiting under the default bound (1 s here)
            except Refusal as e:
                print(f"r0 refused [{e.code}]", flush=True)
    else:
        time.sleep(4)  # never calls: rank 0 must give up on its own
    w.Barrier()
    print(f"r{r} done", flush=True)
    """
)


def test_a_missing_peer_of_a_remembered_call_is_a_named_timeout_then_a_broken_channel(tmp_path):
    """The same from the one C call: it returns to Python every wait slice, the bound ends the
    wait by name, the channel is broken and the next call says so (the ordinary path)."""
    script = tmp_path / "arrays_timeout_remembered.py"
    script.write_text(REMEMBERED)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", ALPHA_MPI_TIMEOUT="1.0")
    r, _ = run_mpi(2, script, limit=60, env=env)
    out = r.stdout + r.stderr
    assert "r0 first 45.0 remembered True" in out and "r1 first 45.0 remembered True" in out, out
    assert "r0 refused [peer-timeout]" in out, out
    assert "r0 refused [combiner-broken]" in out, out
    assert r.returncode == 70, out
