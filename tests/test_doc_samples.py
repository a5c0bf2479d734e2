"""Every digest in README.md and docs/*.md comes from a command CI runs (issue 32 item 6):
tools/doc_samples.py runs the marked samples' commands and rewrites their output in place; here
`--check` fails when a sample is stale. Samples that hold on every machine are always compared;
those that depend on the compute identity or the MPI library only on a machine with the key they
were produced under (the tool says which it skips). The torch samples: test_torch_doc_samples.py."""

import os
import subprocess
import sys

from conftest import ROOT, needs_mpiexec

TOOL = os.path.join(ROOT, "tools", "doc_samples.py")


def tool(*args, cwd=ROOT):
    return subprocess.run(
        ["timeout", "-k", "5", "900", sys.executable, TOOL, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_the_tool_writes_outputs_in_place_and_check_finds_a_stale_one(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "Text.\n\n<!-- doc-sample: holds=every-machine -->\n```text\n$ echo one; echo two\nold\n```\n\nMore.\n"
        "<!-- doc-sample: holds=this-machine -->\n```text\n$ printf 'x\\n'\n```\n"
    )
    r = tool(page)
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "$ echo one; echo two\none\ntwo\n```\n*Output of the commands above" in text
    assert "holds=this-machine machine=" in text and "$ printf 'x\\n'\nx\n```" in text
    assert "(same-bits.md)" in text
    assert tool("--check", page).returncode == 0  # idempotent: the same output again
    page.write_text(text.replace("\ntwo\n", "\nthree\n"))
    r = tool("--check", page)
    assert r.returncode == 1 and "stale: " in r.stdout
    assert "three" in page.read_text()  # --check writes nothing
    page.write_text(text.replace("machine=", "machine=0000"))
    r = tool("--check", page)
    assert r.returncode == 0 and "skipped: " in r.stdout and "produced on machine 0000" in r.stdout


@needs_mpiexec
def test_the_manual_s_samples_are_current():
    r = tool("--check", "--without", "torch")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
