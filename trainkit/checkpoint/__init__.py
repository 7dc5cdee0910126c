"""Atomic, weights_only-safe checkpoints of the bare model and every stateful object."""

from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    UntrustedCheckpointError,
)
from trainkit.checkpoint.checkpointer import (
    Checkpointable,
    Checkpointer,
    find_shape_mismatches,
    shape_mismatch_message,
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
    "find_shape_mismatches",
    "shape_mismatch_message",
    "unwrap_model",
]
