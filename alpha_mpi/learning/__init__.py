"""Learning layer: data-parallel learners over declared-order combines."""

from .checkpoints import restore, save  # noqa: F401
from .learner import MODES, DataParallelLearner  # noqa: F401
from .mlp import MLP  # noqa: F401
from .protocol import Model, check_model, model_from_spec  # noqa: F401
from .slicing import SlotStream, slice_batch, slice_indices, slot_ranges, stream_batch  # noqa: F401
from .trainer import PREEMPTED, TrainConfig, digest, train  # noqa: F401
