"""Learning layer: data-parallel learners over declared-order combines."""

from .checkpoints import restore, save
from .learner import MODES, DataParallelLearner
from .mlp import MLP
from .protocol import Model, check_model, model_from_spec
from .slicing import SlotStream, slice_batch, slice_indices, slot_ranges, stream_batch
from .trainer import PREEMPTED, TrainConfig, digest, train

__all__ = [
    "DataParallelLearner",
    "MODES",
    "Model",
    "check_model",
    "model_from_spec",
    "MLP",
    "SlotStream",
    "slice_batch",
    "slice_indices",
    "slot_ranges",
    "stream_batch",
    "TrainConfig",
    "train",
    "digest",
    "PREEMPTED",
    "save",
    "restore",
]
