"""Learning layer: data-parallel learners over declared-order combines."""

from .checkpoints import restore, save
from .learner import MODES, DataParallelLearner
from .mlp import MLP, BlasMLP
from .preemption import PREEMPTED, Preemption
from .protocol import Model, check_model, model_from_spec
from .rng import slot_generator, slot_seed
from .slicing import SlotStream, slice_batch, slice_indices, slice_local, slot_ranges, stream_batch
from .trainer import TrainConfig, digest, train

__all__ = [
    "DataParallelLearner",
    "MODES",
    "Model",
    "check_model",
    "model_from_spec",
    "MLP",
    "BlasMLP",
    "SlotStream",
    "slice_batch",
    "slice_indices",
    "slice_local",
    "slot_ranges",
    "stream_batch",
    "TrainConfig",
    "train",
    "digest",
    "PREEMPTED",
    "Preemption",
    "slot_generator",
    "slot_seed",
    "save",
    "restore",
]
