"""`peer-failed`'s advice leads somewhere (issue 37 item 4): it once said "the peer process died",
and a new user went looking for a dead process while the peer had stopped on an error of its own
(a traceback or a refusal in its output) and exited. The advice now names that cause first and
a death second. (The checkpoint advice and `model-nondeterministic`'s are followed in
tests/test_cli.py and tests/test_model_api.py.)"""

from __future__ import annotations

from alpha_mpi.refusals import ADVICE, cli_advice


def test_peer_failed_advice_covers_a_peer_that_stopped_on_its_own_error_and_one_that_died():
    for advice in (ADVICE["peer-failed"], cli_advice("peer-failed", "train")):
        assert "the peer process died" not in advice
        assert "stopped on an error of its own" in advice and "traceback or a refusal" in advice
        assert "did it die" in advice and "interconnect" in advice
        # the cause to look for comes before the death
        assert advice.index("stopped on an error of its own") < advice.index("did it die")
