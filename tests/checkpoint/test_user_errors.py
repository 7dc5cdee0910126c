"""Weights files a user must act on raise UsageErrors that keep their builtin types."""

import pytest
import torch
from torch import nn

from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    PeriodicCheckpointer,
    UntrustedCheckpointError,
    read_checkpoint_file,
)
from trainkit.config import ConfigError
from trainkit.utils import UsageError
from trainkit.utils.errors import MissingFileError


def test_checkpoint_errors_are_usage_errors_and_still_runtime_errors():
    for cls in (CheckpointError, CorruptCheckpointError, UntrustedCheckpointError):
        assert issubclass(cls, UsageError) and issubclass(cls, RuntimeError)


def test_missing_weights_file_is_a_missing_file_error_naming_it(tmp_path):
    missing = str(tmp_path / "model_final.pth")
    with pytest.raises(MissingFileError, match=r"model_final\.pth.*MODEL\.WEIGHTS") as info:
        Checkpointer(nn.Linear(2, 1)).load(missing)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(MissingFileError, match=r"model_final\.pth not found"):
        read_checkpoint_file(missing, trust_pickle=False)


def test_weights_of_another_shape_are_a_usage_error_naming_the_file_and_key(tmp_path):
    path = str(tmp_path / "other.pth")
    torch.save({"model": nn.Linear(2, 3).state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"other\.pth does not fit the model") as info:
        Checkpointer(nn.Linear(2, 1), allow_shape_mismatch=False).load(path)
    assert isinstance(info.value, UsageError)
    assert "MODEL.WEIGHTS_ALLOW_SHAPE_MISMATCH" in str(info.value)


def test_corrupt_weights_file_is_a_usage_error_naming_it(tmp_path):
    path = tmp_path / "broken.pth"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CorruptCheckpointError, match=r"broken\.pth") as info:
        Checkpointer(nn.Linear(2, 1)).load(str(path))
    assert isinstance(info.value, UsageError)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"period": -1}, "SOLVER.CHECKPOINT_PERIOD"),
        ({"period": 1, "max_to_keep": -1}, "SOLVER.MAX_TO_KEEP"),
    ],
)
def test_periodic_checkpointer_settings_are_config_errors_naming_the_key(tmp_path, kwargs, key):
    checkpointer = Checkpointer(nn.Linear(2, 1), str(tmp_path))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        PeriodicCheckpointer(checkpointer, **kwargs)


def test_programming_mistakes_stay_plain_errors(tmp_path):
    checkpointer = Checkpointer(nn.Linear(2, 1), str(tmp_path))
    with pytest.raises(ValueError) as info:
        checkpointer.save("sub/dir")
    assert not isinstance(info.value, UsageError)
