"""Distributed checkpoints: logical shards, manifest trees, immutable publication, path-only restore."""

from .checkpointer import Checkpointer
from .reader import Checkpoint, open_checkpoint

__all__ = ["Checkpointer", "Checkpoint", "open_checkpoint"]
