"""Instruction-set conformance (DESIGN.md "Instruction sets"): the same kernel sources,
built with the same flags for x86-64 (native) and AArch64 (static, run under
qemu-user), give the same output bits on >= 1e6 generated elements per function.

Negative controls prove that the comparison can see a difference:
  - the AArch64 driver built with -ffp-contract=fast (fused multiply-add) differs;
  - a reciprocal-square-root Adam (driver-only macro) differs from the baseline.

Needs: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user (Debian/Ubuntu names);
skipped with the reason where they are absent. About 15-30 s on two cores.
"""

from __future__ import annotations

import pytest

from alpha_mpi_verify import isa as conf

pytestmark = pytest.mark.cross

# status / which codes from csrc/alpha_kernel.h
AK_ERR_NONFINITE_INPUT, AK_ERR_NONFINITE_OUTPUT = 3, 4
AK_W_P, AK_W_G, AK_W_INTERMEDIATE = 0, 3, 6


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tools, why = conf.toolchain()
    if tools is None:
        pytest.skip(why)
    return conf.run_conformance(tmp_path_factory.mktemp("isa"))


def test_aarch64_bits_equal_x86_64(report):
    n = report["n"]
    assert n >= 1_000_000
    res = report["targets"]["aarch64"]
    differing = {name: r["differ"] for name, r in res.items() if r["differ"]}
    assert not differing, f"AArch64 differs from x86-64 in {differing}"
    for name in conf.FLOAT_SECTIONS:
        assert res[name]["elements"] == n, name
    # NaNs did occur (Inf - Inf in the combines) and were compared by class
    assert sum(r["nan"] for r in res.values()) > 0
    outs = report["outputs"]
    for target in ("x86_64", "aarch64"):
        assert int(outs[target]["fpenv_flags"][0]) == 0, f"{target} ran off profile"


def test_refusals_agree_and_say_what_they_should(report):
    r = report["outputs"]["x86_64"]["refusals"].astype("int64").tolist()
    n = report["n"]
    assert r[0:3] == [AK_ERR_NONFINITE_INPUT, n // 3, AK_W_G]  # NaN in g
    assert r[3:6] == [AK_ERR_NONFINITE_OUTPUT, n // 3, AK_W_INTERMEDIATE]  # g*g overflows
    assert r[6:8] == [AK_ERR_NONFINITE_OUTPUT, n // 3]  # rounds beyond binary32
    assert r[8:11] == [AK_ERR_NONFINITE_INPUT, n - 1, AK_W_P]  # -Inf in p
    assert r[11] == n - 1
    assert report["targets"]["aarch64"]["refusals"]["differ"] == 0


def test_negative_control_fma_contraction_is_seen(report):
    res = report["targets"]["aarch64_fma"]
    # b1*m + (1-b1)*g contracts into one fused multiply-add: other bits, often
    for name in ("adam_m", "adam_v", "adam_p"):
        assert res[name]["differ"] > 1000, (name, res[name])
    # the additions-only paths have nothing to contract
    for name in ("add", "tree_eval", "fold", "chain_prog", "round_binary64", "widen_binary32"):
        assert res[name]["differ"] == 0, (name, res[name])


def test_negative_control_rsqrt_is_seen(report):
    res = report["targets"]["x86_64_rsqrt"]
    assert res["adam_p"]["differ"] > 1000, res["adam_p"]
    assert res["adam_m"]["differ"] == 0 and res["adam_v"]["differ"] == 0


def test_evidence_names_the_built_kernel(report):
    """The conformance report names the kernel by build_id (sources + flags); it is the
    installed extension's build_id whenever that was built with the base flags."""
    assert len(report["build_id"]) == 64
    kernel = pytest.importorskip("alpha_mpi.kernel")
    info = kernel.build_info()
    if info["flags"] != report["flags"]:
        pytest.skip(f"the installed kernel was built with extra flags {info['flags']}")
    assert info["build_id"] == report["build_id"]


def test_crc32c_and_the_header_patch_agree_across_instruction_sets(report):
    """CRC32C by the SSE4.2 instruction on x86-64 and by the ARMv8 CRC32 instruction on
    AArch64 (under qemu), each beside its own table path, over lengths that reach every path
    (bytes, 8-byte steps, three streams): one value everywhere; the same for a header written
    by ak_frame_patch."""
    res = report["targets"]["aarch64"]
    for name in ("crc32c", "frame_patch"):
        assert res[name]["differ"] == 0 and res[name]["elements"] > 0, (name, res[name])
    crcs = report["outputs"]["x86_64"]["crc32c"]
    assert (crcs[0::2] == crcs[1::2]).all()  # instruction == table on x86-64
    aarch = report["outputs"]["aarch64"]["crc32c"]
    assert (aarch[0::2] == aarch[1::2]).all()  # and on AArch64
