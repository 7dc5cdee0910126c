"""Atomic, weights_only-safe checkpoints of the bare model and every stateful object."""

from trainkit.checkpoint._background import CheckpointWriteError
from trainkit.checkpoint._files import (
    CheckpointError,
    CorruptCheckpointError,
    UntrustedCheckpointError,
    find_unsafe_value,
    read_checkpoint_file,
)
from trainkit.checkpoint.checkpointer import Checkpointable, Checkpointer
from trainkit.checkpoint.model_state import (
    ShapeMismatchError,
    find_shape_mismatches,
    is_sharded,
    shape_changing_state_keys,
    shape_mismatch_message,
    unwrap_model,
)
from trainkit.checkpoint.periodic import PeriodicCheckpointer
from trainkit.checkpoint.sharded import (
    check_parameter_names,
    is_checkpoint_dir,
    optimizer_parameter_names,
    read_sharded_checkpoint,
    read_unsharded_part,
    shard_like,
    shard_optimizer_state,
)

# detectron2's name for the same class: its detection-specific weight-name matching (Caffe2
# and pycls models) is out of scope, so there is nothing for a subclass to add.
DetectionCheckpointer = Checkpointer

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointable",
    "Checkpointer",
    "CorruptCheckpointError",
    "DetectionCheckpointer",
    "PeriodicCheckpointer",
    "ShapeMismatchError",
    "UntrustedCheckpointError",
    "check_parameter_names",
    "find_shape_mismatches",
    "find_unsafe_value",
    "is_checkpoint_dir",
    "is_sharded",
    "optimizer_parameter_names",
    "read_checkpoint_file",
    "read_sharded_checkpoint",
    "read_unsharded_part",
    "shape_changing_state_keys",
    "shape_mismatch_message",
    "shard_like",
    "shard_optimizer_state",
    "unwrap_model",
]
