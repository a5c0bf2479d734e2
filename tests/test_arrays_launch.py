"""alpha_mpi.arrays when a peer never comes: a bounded wait, a named refusal, a broken channel,
and a job that ends (aborted at exit, never hung). Launches its own mpiexec under `timeout`."""

import os
import textwrap

import pytest

from conftest import needs_mpiexec, run_mpi

pytestmark = needs_mpiexec

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from mpi4py import MPI
    from alpha_mpi import arrays
    from alpha_mpi.arrays import fast
    from alpha_mpi.refusals import Refusal

    # "timeout": one call (its geometry remembered, arrays/fast.py), then calls with
    # timeout=1.0 (never the C call: the ordinary path); "remembered": the call three times
    # (the second and third are the one C call), then the C call again, waiting under the
    # default bound (ALPHA_MPI_TIMEOUT=1.0 in the environment)
    remembered = sys.argv[1] == "remembered"
    w = MPI.COMM_WORLD
    r, n = w.Get_rank(), 10
    x = np.arange(5.0) + 5 * r
    for _ in range(3 if remembered else 1):
        first = arrays.sum(w, x, 5 * r, n)
    print(f"r{r} first {first} remembered {fast.lookup(w, 'sum', x, None, 5 * r, n) is not None}", flush=True)
    if r == 0:
        for attempt in range(2):
            try:
                arrays.sum(w, x, 0, n, **({} if remembered else {"timeout": 1.0}))
            except Refusal as e:
                print(f"r0 refused [{e.code}]", flush=True)
    else:
        time.sleep(4)  # never calls: rank 0 must give up on its own
    w.Barrier()
    print(f"r{r} done", flush=True)
    """
)


@pytest.mark.parametrize("how", ["timeout", "remembered"])
def test_a_missing_peer_is_a_named_timeout_then_a_broken_channel(tmp_path, how):
    """With timeout= (the ordinary path) and from the one C call (which returns to Python every
    wait slice): the bound ends the wait by name, the channel is broken and the next call says
    so; frames of the abandoned step may still be in flight, so the job is aborted at exit."""
    script = tmp_path / "arrays_timeout.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if how == "remembered":
        env["ALPHA_MPI_TIMEOUT"] = "1.0"
    r, _ = run_mpi(2, script, how, limit=60, env=env)
    out = r.stdout + r.stderr
    assert "r0 first 45.0 remembered True" in out and "r1 first 45.0 remembered True" in out, out
    assert "r0 refused [peer-timeout]" in out, out
    assert "r0 refused [combiner-broken]" in out, out
    assert r.returncode == 70, out  # alpha_mpi aborts the job at exit (ABORT_STATUS) rather than hang
