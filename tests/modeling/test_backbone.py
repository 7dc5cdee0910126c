"""Backbone interface and build_backbone from MODEL.BACKBONE.NAME."""

import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.layers import ShapeSpec
from trainkit.modeling.backbone import BACKBONE_REGISTRY, Backbone, build_backbone
from trainkit.utils.errors import UnknownNameError


class _TinyBackbone(Backbone):
    def __init__(self, cfg, input_shape):
        super().__init__()
        self.input_shape = input_shape
        self.conv = nn.Conv2d(input_shape.channels, 4, 3, stride=2, padding=1)
        self._out_features = ["res2"]
        self._out_feature_channels = {"res2": 4}
        self._out_feature_strides = {"res2": 2}

    def forward(self, x):
        return {"res2": self.conv(x)}


@pytest.fixture
def registered():
    BACKBONE_REGISTRY.register(_TinyBackbone)
    try:
        yield
    finally:
        BACKBONE_REGISTRY.remove("_TinyBackbone")


def _cfg(name="_TinyBackbone"):
    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = name
    return cfg


def test_build_backbone_passes_the_input_shape_from_pixel_mean(registered):
    backbone = build_backbone(_cfg())
    assert isinstance(backbone, _TinyBackbone)
    assert backbone.input_shape == ShapeSpec(channels=len(get_cfg().MODEL.PIXEL_MEAN))
    assert backbone(torch.zeros(1, 3, 8, 8))["res2"].shape == (1, 4, 4, 4)
    explicit = build_backbone(_cfg(), ShapeSpec(channels=1))
    assert explicit.conv.in_channels == 1


def test_default_output_shape_size_divisibility_and_padding_constraints(registered):
    backbone = build_backbone(_cfg())
    assert backbone.output_shape() == {"res2": ShapeSpec(channels=4, stride=2)}
    assert backbone.size_divisibility == 0
    assert backbone.padding_constraints == {}


def test_backbone_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        Backbone()


def test_unknown_backbone_names_the_key(registered):
    with pytest.raises(UnknownNameError, match="MODEL.BACKBONE.NAME") as info:
        build_backbone(_cfg("_TinyBackbon"))
    assert "_TinyBackbone" in str(info.value)


def test_detectron2s_default_backbone_is_said_to_be_not_shipped():
    with pytest.raises(UnknownNameError, match="one of detectron2's built-in backbones"):
        build_backbone(get_cfg())


def test_a_builder_that_returns_no_backbone_is_a_type_error():
    BACKBONE_REGISTRY.register(_not_a_backbone)
    try:
        with pytest.raises(TypeError, match="not a trainkit.modeling.backbone.Backbone"):
            build_backbone(_cfg("_not_a_backbone"))
    finally:
        BACKBONE_REGISTRY.remove("_not_a_backbone")


def _not_a_backbone(cfg, input_shape):
    return nn.Identity()
