"""ALPHA_MPI_SANITIZE=1 (issue 45 item 4): a sanitizer build of the kernel and of the engine's
round, under their own build identity and cache key, so a sanitized build never stands in for
the ordinary one (and the reverse). The stage that runs it: .ci/sanitize.sh."""

import pytest

from alpha_mpi.kernel import build as kb


def test_the_sanitize_variable_adds_the_sanitizers_to_the_kernels_flags_and_identity():
    plain = kb.cflags({})
    for off in ({"ALPHA_MPI_SANITIZE": ""}, {"ALPHA_MPI_SANITIZE": "0"}):
        assert kb.cflags(off) == plain
    flags = kb.cflags({"ALPHA_MPI_SANITIZE": "1"})
    assert flags[: len(kb.BASE_CFLAGS)] == kb.BASE_CFLAGS and "-fsanitize=address,undefined" in flags
    assert not kb.forbidden(flags)  # the sanitizers change no floating-point result
    assert kb.build_id(flags) != kb.build_id(plain)


def test_a_sanitized_kernel_links_the_sanitizers_runtimes():
    ffi = kb.make_ffi(kb.cflags({"ALPHA_MPI_SANITIZE": "1"}))
    link = ffi._assigned_source[3].get("extra_link_args", [])
    assert link == ["-fsanitize=address,undefined"]
    assert kb.make_ffi(kb.cflags({}))._assigned_source[3].get("extra_link_args", []) == []


def test_the_round_is_cached_apart_when_sanitized(monkeypatch):
    pytest.importorskip("mpi4py")
    from alpha_mpi.execution import native

    monkeypatch.delenv("ALPHA_MPI_SANITIZE", raising=False)
    b = native.Build()
    plain = native._key(b.version, b.libmpi, b.mpicc)
    monkeypatch.setenv("ALPHA_MPI_SANITIZE", "1")
    assert native._key(b.version, b.libmpi, b.mpicc) != plain
    assert "-fsanitize=address,undefined" in native.sanitize_flags()
