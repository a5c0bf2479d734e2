"""The engine's C round (csrc/round/: native.h and its C files): built by the MPI's own mpicc at first use, cached under a
key of the sources and the MPI, built once by concurrent first users, checked at load against
the MPI library mpi4py loaded, and refused by name when it cannot be built or loaded."""

import os
import stat
import subprocess
import sys

import pytest

from alpha_mpi import Refusal
from alpha_mpi.execution import native


def _code(fn):
    try:
        fn()
    except Refusal as e:
        return e.code, e.message
    return None, ""


def test_the_loaded_module_runs_on_the_mpi_mpi4py_loaded_and_another_is_refused():
    mod, b = native.load(), native.Build()
    native.check_library(mod, b)  # the one this process runs: no refusal
    assert b.libmpi and b.mpicc and b.path.exists()
    running = b.version.splitlines()[0]
    b.version = "Some MPI 9.9, another library"
    code, message = _code(lambda: native.check_library(mod, b))
    assert code == "native-mpi-mismatch"
    assert "Some MPI 9.9" in message and running in message and b.libmpi in message


def test_a_kernel_older_than_the_round_is_refused_at_load():
    """The round calls the kernel through its table of functions (kernel_table.h); a kernel
    built from older sources hands over a shorter one, which load() refuses instead of letting
    the round call past its end."""
    mod = native.load()
    native.check_kernel(mod)  # this build: the same table

    class Older:
        ffi = mod.ffi

        class lib:
            @staticmethod
            def an_kernel_table_size():
                return mod.lib.an_kernel_table_size() + 8  # the round expects one more entry

    with pytest.raises(ImportError, match="older than csrc/kernel/kernel_table.h"):
        native.check_kernel(Older)


def test_the_cache_key_names_the_mpi_and_the_sources(monkeypatch, tmp_path):
    """Another MPI library (its version string or its file) or another compiler is another
    module file: the MPICH and the Open MPI venv of one source tree never share one."""
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    b = native.Build()
    assert b.path.parent.parent == tmp_path
    keys = {
        b.key,
        native._key("Open MPI v5.0.11", b.libmpi, b.mpicc),
        native._key(b.version, "/elsewhere/libmpi.so.40", b.mpicc),
        native._key(b.version, b.libmpi, "/elsewhere/mpicc"),
    }
    assert len(keys) == 4


def test_every_c_file_of_the_round_is_built_and_keyed_and_its_own_part_stays_out_of_the_cdef():
    """csrc/round/ is native.h and its C files (split by concern): the build compiles each of
    them and the cache key reads each, so an edit to any is a new module; the part of native.h
    for those files alone (MPI types) is no part of the cffi declaration."""
    from alpha_mpi.kernel.build import header_cdef

    on_disk = {p.name for p in native.ROUND_DIR.glob("*.c")}
    assert on_disk == set(native.SOURCES) and len(on_disk) >= 4
    keyed = {p.name for p in native._files()}
    assert on_disk | {"native.h", "abi.h"} <= keyed
    text = (native.ROUND_DIR / "native.h").read_text()
    assert "an_state" in text and "MPI_Comm" in text
    cdef = header_cdef(text)
    assert "an_state" not in cdef and "MPI_" not in cdef and "an_run_state" in cdef
    lib = native.load().lib
    assert not hasattr(lib, "an_loop") and hasattr(lib, "an_run")


def test_no_mpi_compiler_is_refused_by_name_and_nothing_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv(native.ENV_MPICC, str(tmp_path / "no-such-mpicc"))
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    b = native.Build()
    code, message = _code(lambda: native.build(b))
    assert code == "native-build-failed" and "no-such-mpicc" in message
    assert not b.path.exists()


def test_a_compiler_that_fails_is_refused_with_its_output(monkeypatch, tmp_path):
    """The compiler's last lines are in the refusal; no partial module is left to be loaded."""
    fake = tmp_path / "mpicc"
    fake.write_text("#!/bin/sh\necho 'native.c:1: error: no mpi.h here' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(native.ENV_MPICC, str(fake))
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    b = native.Build()
    code, message = _code(lambda: native.build(b))
    assert code == "native-build-failed" and "no mpi.h here" in message and "exit 1" in message
    assert not b.path.exists() and not [p for p in b.path.parent.iterdir() if p.name.startswith(".build-")]


_FIRST_USE = (
    "from mpi4py import MPI\n"
    "from alpha_mpi.execution import native\n"
    "native.load()\n"
    "print(native.Build().path)\n"
)


def test_concurrent_first_uses_build_one_module_that_every_process_loads(tmp_path):
    """Three fresh interpreters load the C round at once from an empty cache (ranks starting on
    a node, or on several nodes of a shared file system): one builds under the lock, the
    others wait and load its file; no temporary file is left; all name the same module."""
    env = {**os.environ, native.ENV_CACHE: str(tmp_path)}
    procs = [
        subprocess.Popen(
            ["timeout", "-k", "5", "300", sys.executable, "-c", _FIRST_USE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    (path,) = paths
    assert os.path.isfile(path) and os.path.dirname(os.path.dirname(path)) == str(tmp_path)
    left = os.listdir(os.path.dirname(path))
    assert sorted(n for n in left if n != ".lock") == [os.path.basename(path)], left


def test_alpha_mpi_native_says_what_it_builds_with():
    r = subprocess.run(
        ["timeout", "-k", "5", "300", sys.executable, "-m", "alpha_mpi", "native", "--build"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for word in ("MPI ", "libmpi ", "mpicc ", "module ", "(built)"):
        assert word in r.stdout, r.stdout


@pytest.mark.parametrize("field", ["AK_FRAME_STEP_OFF", "AK_FLAG_REFUSED"])
def test_c_reads_the_header_offsets_frames_py_owns(field):
    """frames.py is the one owner of the wire format: the C constants are checked against its
    table at import (here: the check sees the kernel's values)."""
    from alpha_mpi.execution import frames as fr
    from alpha_mpi.kernel import lib

    assert getattr(lib, field) == fr._C_LAYOUT[field]


def test_the_shared_constants_are_written_once_and_checked_at_import():
    """csrc/kernel/abi.h is the one C place of every constant both languages read: the kernel
    and the engine's round carry the same values, Python's names for them match (checked at
    import), and a disagreement is an ImportError naming the constant."""
    from alpha_mpi.execution import native
    from alpha_mpi.execution.engine_build import OP_CODE
    from alpha_mpi.kernel import abi
    from alpha_mpi.kernel import lib as klib
    from alpha_mpi.planning.program import OP_KINDS

    shared = [k for k in dir(klib) if k.startswith(("AN_", "AK_FRAME_", "AK_FLAG_"))]
    assert {
        "AN_OP_MERGE",
        "AN_DONE",
        "AN_BAD_CRC",
        "AN_OP_SUMMARY",
        "AN_MERGE_INVALID",
        "AK_FLAG_VOTE",
    } <= set(shared)
    rnd = native.load().lib
    assert {k: getattr(rnd, k) for k in shared} == {k: getattr(klib, k) for k in shared}
    assert set(OP_CODE) == set(OP_KINDS) and all(getattr(klib, k) == v for k, v in abi.ROUND.items())
    with pytest.raises(ImportError, match="AN_OP_POST"):
        abi.check({"AN_OP_POST": OP_CODE["P"] + 1}, "a test")
