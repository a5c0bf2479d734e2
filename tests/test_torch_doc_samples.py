"""The manual's torch samples are current (tools/doc_samples.py --check --only-needs torch; see
test_doc_samples.py): run in the torch stage, where torch imports."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import ROOT, needs_mpiexec  # noqa: E402


@needs_mpiexec
def test_the_manual_s_torch_samples_are_current():
    r = subprocess.run(
        [
            "timeout",
            "-k",
            "5",
            "1200",
            sys.executable,
            os.path.join(ROOT, "tools", "doc_samples.py"),
            "--check",
        ]
        + ["--only-needs", "torch"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
