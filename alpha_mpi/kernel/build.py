"""cffi (API mode) build of the C kernel `alpha_mpi.kernel._alpha_kernel` from csrc/.

setup.py names this file (`cffi_modules=["alpha_mpi/kernel/build.py:ffi"]`); for a
development build run `python alpha_mpi/kernel/build.py` from the repository root.

The compile flags live HERE and nowhere else: `BASE_CFLAGS` is also what the
instruction-set conformance driver (tests/test_isa_conformance.py) is built with.

    -O3                              optimise and vectorise (SIMD lanes round exactly like
                                     scalar code, and nothing is reassociated)
    -ffp-contract=off                no fused multiply-add: b1*m + c1*g rounds twice
    -fno-fast-math                   IEEE semantics; fast-math is never used (refused)
    -fno-unsafe-math-optimizations  no reassociation, no reciprocal approximations
    -fexcess-precision=standard      no hidden extended precision (x86-64 uses SSE2
                                     anyway, so there is no x87 excess precision)
    -fno-math-errno                  sqrt may be the bare IEEE instruction (sqrtsd/fsqrt)
                                     instead of a call that also sets errno; this changes
                                     no value, it lets the Adam loop vectorise
    -std=c11
    -Wall -Wextra                    every warning is fixed: the build prints none

Environment knob:
    ALPHA_MPI_CFLAGS   extra flags appended to BASE_CFLAGS (e.g. "-march=native -g").
                       Flags that change floating-point results are refused with
                       `fast-math-refused` (see FORBIDDEN_FLAGS) and the build stops;
                       the same check applies to $CFLAGS, which setuptools passes too.
                       -march=native is allowed: it may enable FMA instructions, but
                       -ffp-contract=off still forbids contracting a*b + c into one.
    ALPHA_MPI_SANITIZE=1   a sanitizer build (SANITIZE_FLAGS: AddressSanitizer and
                       UndefinedBehaviorSanitizer) of this kernel and of the engine's round
                       (execution/native.py, cached under its own key). The interpreter is not
                       built with ASan: run with the runtime preloaded, as .ci/sanitize.sh does
                       (LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0).
                       The flags change no floating-point result and enter build_id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

BASE_CFLAGS = [
    "-O3",
    "-ffp-contract=off",
    "-fno-fast-math",  # never fast-math
    "-fno-unsafe-math-optimizations",
    "-fexcess-precision=standard",
    "-fno-math-errno",
    "-std=c11",
    "-Wall",  # every warning is fixed, not silenced: the builds print none
    "-Wextra",
]

ENV_CFLAGS = "ALPHA_MPI_CFLAGS"
ENV_SANITIZE = "ALPHA_MPI_SANITIZE"
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]

# Refused extra flags (they would break bit reproducibility): exact spellings, and
# prefixes (a flag refused if it starts with one of these).
FORBIDDEN_FLAGS = frozenset(
    {
        "-ffast-math",  # refused
        "-Ofast",  # refused
        "-ffp-contract=fast",  # refused
        "-ffp-contract=on",
        "-funsafe-math-optimizations",  # refused
        "-freciprocal-math",
        "-ffinite-math-only",
        "-fassociative-math",
        "-fno-signed-zeros",
        "-fexcess-precision=fast",
        "-mdaz-ftz",
        "-mrecip",
        "-fapprox-func",
        "-ffp-model=fast",
        "-ffp-model=aggressive",
        "-mfpmath=387",
        "-mfpmath=sse+387",
        "-mfpmath=both",
        "-fcx-limited-range",
    }
)
FORBIDDEN_PREFIXES = ("-mlow-precision-", "-mrecip=", "-ffp-contract=fast", "-ffast-math")  # refused

_HERE = Path(__file__).resolve().parent  # alpha_mpi/kernel
ROOT = _HERE.parents[1]  # the repository (or sdist) root, which holds csrc/
CSRC = ROOT / "csrc"  # kernel/ (this build), round/ (the engine's round: execution/native.py), verify/
KERNEL_DIR = CSRC / "kernel"
KERNEL_SOURCES = ("alpha_kernel.c", "pairwise.c", "dense.c", "frame.c", "kernel_table.c", "vectors.c")
KERNEL_HEADERS = (
    "abi.h",
    "alpha_kernel.h",
    "pairwise.h",
    "dense.h",
    "frame.h",
    "kernel_table.h",
    "vectors.h",
)
# Included by a source, declaring nothing for Python (dense.c includes it once per ISA path).
KERNEL_INCLUDES = ("dense_path.inc",)


def _refusal(message: str, **context) -> Exception:
    """A KernelRefusal('fast-math-refused'); also works when cffi exec()s this file
    outside the package (setup.py build), by loading refusals.py by path."""
    try:
        from alpha_mpi.refusals import KernelRefusal
    except ImportError:  # pragma: no cover - only in a bare setup.py build
        import importlib.util

        spec = importlib.util.spec_from_file_location("_alpha_mpi_refusals", _HERE.parent / "refusals.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        KernelRefusal = mod.KernelRefusal
    return KernelRefusal("fast-math-refused", message, **context)


def forbidden(flags) -> list:
    """The flags among `flags` that would break bit reproducibility."""
    return [f for f in flags if f in FORBIDDEN_FLAGS or any(f.startswith(p) for p in FORBIDDEN_PREFIXES)]


def validate_extra_cflags(text: str | None, variable: str = ENV_CFLAGS) -> list:
    """Split ALPHA_MPI_CFLAGS-style text into flags; raise fast-math-refused on a bad one."""
    if not text:  # the usual case: no shlex to import (a program's first reduction passes here)
        return []
    import shlex

    extra = shlex.split(text)
    bad = forbidden(extra)
    if bad:
        raise _refusal(
            f"{variable} asks for {' '.join(bad)}, which would let the compiler change "
            "floating-point results (fused multiply-add, reassociation, reciprocal "
            f"approximations, flush-to-zero, excess precision); the kernel is built with "
            f"{' '.join(BASE_CFLAGS)} and nothing that undoes it",
            flags=bad,
        )
    return extra


def sanitize_flags(env=None) -> list:
    """SANITIZE_FLAGS when ALPHA_MPI_SANITIZE is set (not "" or "0"), else none."""
    env = os.environ if env is None else env
    return list(SANITIZE_FLAGS) if env.get(ENV_SANITIZE, "") not in ("", "0") else []


def cflags(env=None) -> list:
    """BASE_CFLAGS plus validated extra flags from ALPHA_MPI_CFLAGS (and ALPHA_MPI_SANITIZE's)."""
    env = os.environ if env is None else env
    # setuptools also passes $CFLAGS to the compiler (before ours, which mostly override
    # it, but "mostly" is not a contract): refuse the same flags there.
    validate_extra_cflags(env.get("CFLAGS"), "CFLAGS")
    return BASE_CFLAGS + validate_extra_cflags(env.get(ENV_CFLAGS)) + sanitize_flags(env)


def build_id(flags) -> str:
    """sha256 over the kernel C sources and headers and the compile flags: the identity
    that conformance evidence names."""
    import hashlib  # here: a program's first reduction imports this module and hashes nothing

    h = hashlib.sha256()
    for name in sorted(KERNEL_SOURCES + KERNEL_HEADERS + KERNEL_INCLUDES):
        h.update(name.encode() + b"\0")
        h.update((KERNEL_DIR / name).read_bytes())
        h.update(b"\0")
    h.update("\0".join(flags).encode())
    return h.hexdigest()


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _source_path(name: str) -> str:
    """Relative to the current directory when building from the repository root (what
    pip and setuptools expect), absolute otherwise."""
    p = KERNEL_DIR / name
    rel = os.path.relpath(p)
    return rel if not rel.startswith("..") else str(p)


# What Python sees of the kernel is read from its headers, so a declaration lives in one place:
# cffi wants `#define NAME ...` for constants and no include guards, includes or comments. (The
# patterns are compiled where a build uses them, not at import: a program's first reduction
# imports this module for the build's identity only.)
_COMMENT = r"/\*.*?\*/|//[^\n]*"
_DEFINE = r"#define\s+(\w+)\s+\S"
# Defined in the generated module (make_ffi), not in a header: they name this build.
_BUILD_CDEF = "const char *ak_build_flags(void);\nconst char *ak_build_id(void);\n"


def header_cdef(text: str) -> str:
    """A C header's declarations as cffi's cdef reads them: comments dropped, `#define NAME
    value` as `#define NAME ...` (cffi then takes the value from the compiled header), the
    include guard and #include/#ifndef/#endif lines dropped, and an `#ifdef NAME` ... `#endif`
    part whole (not nested: csrc/round/native.h's part for its own C files)."""
    out = []
    skipping = False
    for line in re.sub(_COMMENT, "", text, flags=re.S).splitlines():
        s = line.strip()
        if skipping or s.startswith("#ifdef"):
            skipping = not s.startswith("#endif")
            continue
        if not s or s.startswith(("#ifndef", "#endif", "#include")):
            continue
        if s.startswith("#define"):
            m = re.match(_DEFINE, s)
            if m:  # a constant (the guard's `#define NAME` has no value)
                out.append(f"#define {m.group(1)} ...")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def cdef() -> str:
    """The cdef of every kernel header, plus the build-identity functions."""
    return "".join(header_cdef((KERNEL_DIR / h).read_text()) for h in KERNEL_HEADERS) + _BUILD_CDEF


def make_ffi(flags=None):
    import cffi
    import numpy

    flags = cflags() if flags is None else list(flags)
    try:
        bid = build_id(flags)
    except OSError:  # sources not next to the package (installed wheel): not buildable
        bid = "unknown"
    ffi = cffi.FFI()
    ffi.cdef(cdef())
    ffi.set_source(
        "alpha_mpi.kernel._alpha_kernel",
        "".join(f'#include "{h}"\n' for h in KERNEL_HEADERS)
        + f"const char *ak_build_flags(void) {{ return {_c_string(' '.join(flags))}; }}\n"
        f"const char *ak_build_id(void) {{ return {_c_string(bid)}; }}\n",
        sources=[_source_path(s) for s in KERNEL_SOURCES],
        depends=[
            _source_path(h) for h in KERNEL_HEADERS + KERNEL_INCLUDES
        ],  # rebuild on header change; sdist
        # vectors.c reads NumPy's array objects through NumPy's own accessors (no API table)
        include_dirs=[_source_path("."), numpy.get_include()],
        extra_compile_args=flags,
        extra_link_args=[f for f in flags if f.startswith("-fsanitize")],  # the sanitizers' runtimes
        libraries=["m"],
    )
    return ffi


if __name__ == "__main__":  # development build: python alpha_mpi/kernel/build.py
    # Through setup.py (the cffi_modules hook below): the packages are declared there, and
    # ffi.compile() would have setuptools discover them from the flat layout and refuse it.
    import subprocess
    import sys

    sys.exit(subprocess.call([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT))
elif __name__ == "__cffi__":  # exec'd by cffi's setuptools hook (setup.py cffi_modules)
    ffi = make_ffi()
else:

    def __getattr__(name):  # imported as a module: build the FFI object only on demand
        if name == "ffi":
            return make_ffi()
        raise AttributeError(name)
