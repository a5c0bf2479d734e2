"""Steps: one rank's protocol as frozen data with a short string form that round-trips.

rR3<1:80   reduce phase, receive edge 3 from rank 1, 80 payload bytes
rS3>0:80   reduce phase, send edge 3 to rank 0
E2         evaluate local group 2 (a whole local subtree in one fused kernel pass)
dR3<0:80   deliver phase, receive edge 3 from rank 0
aS5>2:16   assemble phase, send edge 5 to rank 2
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..refusals import PlanRefusal

PHASES = {"r": "reduce", "d": "deliver", "a": "assemble"}


def parse_or_refuse(regex, text: str, what: str):
    """The match of `regex` on `text` (stripped), refused as `step-parse-error` naming `what`."""
    m = regex.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise PlanRefusal("step-parse-error", f"cannot read {what} {text!r}")
    return m


_STEP_RE = re.compile(
    r"^(?:E(?P<group>\d+)|(?P<phase>[rda])(?P<kind>[RS])(?P<edge>\d+)(?P<arrow>[<>])(?P<peer>\d+):(?P<nbytes>\d+))$"
)


@dataclass(frozen=True)
class Step:
    kind: str  # "R" receive, "S" send, "E" evaluate
    index: int  # edge index for R/S, group index for E
    phase: str = ""  # "r", "d" or "a" for R/S
    peer: int = -1
    nbytes: int = 0

    def __str__(self):
        if self.kind == "E":
            return f"E{self.index}"
        arrow = "<" if self.kind == "R" else ">"
        return f"{self.phase}{self.kind}{self.index}{arrow}{self.peer}:{self.nbytes}"

    @staticmethod
    def parse(text: str) -> Step:
        m = parse_or_refuse(_STEP_RE, text, "step")
        if m.group("group") is not None:
            return Step("E", int(m.group("group")))
        kind, arrow = m.group("kind"), m.group("arrow")
        if (kind == "R") != (arrow == "<"):
            raise PlanRefusal("step-parse-error", f"step {text!r}: receives use '<', sends use '>'")
        return Step(
            kind, int(m.group("edge")), m.group("phase"), int(m.group("peer")), int(m.group("nbytes"))
        )


@dataclass(frozen=True)
class Edge:
    """One planned message: `phase` frame number `index` from `src` to `dst`."""

    index: int
    phase: str
    src: int
    dst: int
    nbytes: int
