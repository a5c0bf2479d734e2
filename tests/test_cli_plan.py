"""`alpha-mpi plan` from the installed package: output checked, refusals exit 3 with a code."""

import json

from conftest import alpha_command


def run(*args):
    return alpha_command(*args, limit=60)


def test_plan_text_output():
    r = run("plan", "--slots", "10", "--ranks", "4", "--topology", "hierarchy:2", "--deliver-to", "3")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "topology      hierarchy:2   delivery DeliverTo(3)" in out
    assert "r3: P8 C0 S1 C1 S3 W8 C2 D1 D3" in out  # its two leaves up, the result from rank 1
    assert "root rank     0   receivers [3]" in out
    assert "  total           9          72" in out


def test_plan_json_and_dot():
    r = run(
        "plan",
        "--slots",
        "7",
        "--ranks",
        "7",
        "--topology",
        "star",
        "--format",
        "json",
        "--elements",
        "4",
        "--mass",
    )
    d = json.loads(r.stdout)
    assert d["topology"] == "star" and d["layout"] == "numerator:4,mass:1"
    assert sum(d["traffic"]["sent_msgs"]) == 12  # 6 leaves up, 6 results down
    r = run("plan", "--format", "dot")
    assert r.returncode == 0 and r.stdout.startswith("digraph")


def test_plan_refusal_prints_code_and_advice():
    r = run("plan", "--topology", "ring")
    assert r.returncode == 3
    assert "[topology-invalid]" in r.stderr and "what to do:" in r.stderr
    r = run("plan", "--slots", "4", "--ranks", "4", "--deliver-to", "7")
    assert r.returncode == 3 and "[delivery-target-not-owner]" in r.stderr


def test_help_and_unknown_command():
    r = run("--help")
    assert r.returncode == 0 and "plan" in r.stdout
    r = run("frobnicate")
    assert r.returncode == 2 and "[usage]" in r.stderr
