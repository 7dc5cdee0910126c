"""SemanticSegmentor, SEM_SEG_HEADS_REGISTRY, SemSegFPNHead and sem_seg_postprocess."""

import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.modeling import (
    BACKBONE_REGISTRY,
    SEM_SEG_HEADS_REGISTRY,
    Backbone,
    SemanticSegmentor,
    build_model,
    build_sem_seg_head,
    sem_seg_postprocess,
)
from trainkit.modeling.meta_arch.semantic_seg import SemSegFPNHead
from trainkit.utils.errors import UnknownNameError


class _TwoLevelBackbone(Backbone):
    def __init__(self, cfg, input_shape):
        super().__init__()
        self.p2 = nn.Conv2d(input_shape.channels, 4, 3, stride=4, padding=1)
        self.p3 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self._out_features = ["p2", "p3"]
        self._out_feature_channels = {"p2": 4, "p3": 6}
        self._out_feature_strides = {"p2": 4, "p3": 8}

    @property
    def size_divisibility(self):
        return 8

    def forward(self, x):
        p2 = self.p2(x)
        return {"p2": p2, "p3": self.p3(p2)}


@pytest.fixture
def cfg():
    BACKBONE_REGISTRY.register(_TwoLevelBackbone)
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "SemanticSegmentor"
    cfg.MODEL.BACKBONE.NAME = "_TwoLevelBackbone"
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.PIXEL_MEAN = [0.0, 0.0, 0.0]
    cfg.MODEL.PIXEL_STD = [1.0, 1.0, 1.0]
    head = cfg.MODEL.SEM_SEG_HEAD
    head.NAME, head.IN_FEATURES, head.NUM_CLASSES = "SemSegFPNHead", ["p2", "p3"], 3
    head.CONVS_DIM, head.COMMON_STRIDE, head.NORM = 8, 4, ""
    try:
        yield cfg
    finally:
        BACKBONE_REGISTRY.remove("_TwoLevelBackbone")


def _record(h, w, label=1):
    return {
        "image": torch.rand(3, h, w) * 255,
        "sem_seg": torch.full((h, w), label, dtype=torch.long),
        "height": 2 * h,
        "width": 2 * w,
    }


def test_semantic_segmentor_trains_on_sem_seg_and_predicts_at_record_size(cfg):
    model = build_model(cfg)
    assert isinstance(model, SemanticSegmentor) and isinstance(model.sem_seg_head, SemSegFPNHead)
    losses = model([_record(30, 20), _record(24, 28)])  # padded to a multiple of 8
    assert set(losses) == {"loss_sem_seg"} and torch.isfinite(losses["loss_sem_seg"])
    losses["loss_sem_seg"].backward()
    assert model.sem_seg_head.predictor.weight.grad is not None
    model.eval()
    with torch.no_grad():
        outputs = model([{"image": torch.rand(3, 30, 20) * 255, "height": 60, "width": 40}])
    assert outputs[0]["sem_seg"].shape == (3, 60, 40)


def test_padding_is_ignored_by_the_loss(cfg):
    cfg.MODEL.SEM_SEG_HEAD.IGNORE_VALUE = 255
    model = build_model(cfg)
    seen = {}
    original = model.sem_seg_head.losses

    def spy(predictions, targets):
        seen["targets"] = targets
        return original(predictions, targets)

    model.sem_seg_head.losses = spy
    model([_record(30, 20, label=2)])
    targets = seen["targets"]
    assert targets.shape == (1, 32, 24)
    assert (targets[0, :30, :20] == 2).all()
    assert (targets[0, 30:, :] == 255).all() and (targets[0, :, 20:] == 255).all()


def test_sem_seg_head_registry_and_unknown_name(cfg):
    assert "SemSegFPNHead" in SEM_SEG_HEADS_REGISTRY
    cfg.MODEL.SEM_SEG_HEAD.NAME = "SemSegFPNHaed"
    with pytest.raises(UnknownNameError, match="MODEL.SEM_SEG_HEAD.NAME"):
        build_sem_seg_head(cfg, {})


def test_sem_seg_postprocess_crops_the_padding_then_resizes():
    scores = torch.zeros(2, 8, 8)
    scores[0, :4, :6] = 1.0  # the real image is 4 x 6; the rest is padding
    out = sem_seg_postprocess(scores, (4, 6), 8, 12)
    assert out.shape == (2, 8, 12)
    assert torch.allclose(out[0], torch.ones(8, 12))
    assert torch.allclose(out[1], torch.zeros(8, 12))
