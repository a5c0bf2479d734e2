"""Distributed checkpoints: logical shards, manifest trees, immutable publication, path-only restore."""

from .checkpointer import Checkpointer  # noqa: F401
from .reader import Checkpoint, open_checkpoint  # noqa: F401
