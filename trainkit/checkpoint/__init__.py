"""Atomic, weights_only-safe checkpoints of the bare model and every stateful object."""

from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    UntrustedCheckpointError,
)
from trainkit.checkpoint.checkpointer import (
    Checkpointable,
    Checkpointer,
    unwrap_model,
)
from trainkit.checkpoint.periodic import PeriodicCheckpointer

__all__ = [
    "CheckpointError",
    "Checkpointable",
    "Checkpointer",
    "CorruptCheckpointError",
    "PeriodicCheckpointer",
    "UntrustedCheckpointError",
    "unwrap_model",
]
