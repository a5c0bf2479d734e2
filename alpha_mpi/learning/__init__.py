"""Learning layer: data-parallel learners over declared-order combines."""

from .learner import MODES, DataParallelLearner  # noqa: F401
from .mlp import MLP  # noqa: F401
from .trainer import PREEMPTED, TrainConfig, digest, train  # noqa: F401
