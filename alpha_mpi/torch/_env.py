"""The torch side of the bits: import with a named refusal, fixed threads, deterministic kernels.

Defined in alpha_mpi.learning.torch_model (the learning layer wraps modules too); re-exported here.
"""

from ..learning.torch_model import check_environment, environment, fix_environment, require_torch  # noqa: F401
