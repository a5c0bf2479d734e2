"""How an executor alone on its tag block receives its frames: matched first (size-safe) or
posted at the planned size.

The threat model (docs/design.md "Threat model"): any rank may send any frame on any tag of the
library's duplicate (a bug, a hostile rank), and no MPI may then write past a buffer. A receive
posted at the planned size is not enough for that: Open MPI 5's single-copy path
(mca_smsc_cma_copy_from) writes a longer message whole into the posted buffer before it reports
the truncation. A frame matched first (MPI_Improbe) is received (MPI_Mrecv) into the planned
buffer only when its size is the planned one, else whole into scratch (csrc/round/native.h), so
nothing a peer sends can reach past a buffer, under any MPI.

ALPHA_MPI_RECEIVES=posted: an executor alone on its tag block posts its receives at the planned
size, as before issue 45 (for measuring what matching costs; under Open MPI it gives the memory
safety up). Any other value, or none: matched.
"""

from __future__ import annotations

import os

ENV = "ALPHA_MPI_RECEIVES"

__all__ = ["ENV", "matched_first"]


def matched_first(shared_channel: bool) -> bool:
    """Whether the executor matches every frame before receiving it. `shared_channel`: user
    traffic or other executors can reach its tags (then always). A local choice: a sender
    neither knows nor cares how its frame is received, so ranks may differ."""
    return shared_channel or os.environ.get(ENV, "") != "posted"
