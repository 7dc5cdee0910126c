"""detectron2's checkpointer behaviour, through ``trainkit.checkpoint.DetectionCheckpointer``."""

import pytest
import torch
from torch import nn

from trainkit.checkpoint import Checkpointer, DetectionCheckpointer


def _model():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(2, 2))


def test_detection_checkpointer_is_the_checkpointer():
    assert DetectionCheckpointer is Checkpointer


@pytest.mark.parametrize(
    ("wrap_trained", "wrap_fresh"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_resume_from_the_last_checkpoint_across_data_parallel_wrappers(
    tmp_path, wrap_trained, wrap_fresh
):
    trained, fresh = _model(), _model()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)
    trained_wrapped = nn.DataParallel(trained) if wrap_trained else trained
    fresh_wrapped = nn.DataParallel(fresh) if wrap_fresh else fresh
    DetectionCheckpointer(trained_wrapped, save_dir=str(tmp_path)).save("checkpoint_file")

    checkpointer = DetectionCheckpointer(fresh_wrapped, save_dir=str(tmp_path))
    assert checkpointer.has_checkpoint()
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "checkpoint_file.pth")
    checkpointer.resume_or_load(None)
    for (_, trained_p), (_, fresh_p) in zip(trained.named_parameters(), fresh.named_parameters()):
        assert torch.equal(trained_p, fresh_p)


def _qat_model():
    model = nn.Sequential(nn.Conv2d(2, 2, 1))
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    return torch.ao.quantization.prepare_qat(model)


def test_quantization_observer_buffers_load_despite_their_expected_shape_changes(tmp_path):
    calibrated, fresh = _qat_model(), _qat_model()
    calibrated(torch.randn(4, 2, 4, 4))  # per-channel observers grow their buffers
    DetectionCheckpointer(calibrated, save_dir=str(tmp_path), allow_shape_mismatch=False).save("q")
    DetectionCheckpointer(fresh, save_dir=str(tmp_path), allow_shape_mismatch=False).resume_or_load(
        None
    )
    for (name, a), (_, b) in zip(calibrated.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
