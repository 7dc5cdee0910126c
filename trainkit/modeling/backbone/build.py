"""The backbone registry and ``build_backbone`` (MODEL.BACKBONE.NAME)."""

from __future__ import annotations

from trainkit.config import CfgNode
from trainkit.layers import ShapeSpec
from trainkit.modeling.backbone.backbone import Backbone
from trainkit.utils.errors import UnknownNameError
from trainkit.utils.registry import Registry

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]

BACKBONE_REGISTRY = Registry("BACKBONE")
BACKBONE_REGISTRY.__doc__ = """Registry of backbones (networks from images to feature maps).

A registered object is called as ``obj(cfg, input_shape)`` (a :class:`ShapeSpec` of the
input) and returns a :class:`~trainkit.modeling.backbone.Backbone`.
"""

# detectron2's registered backbone builders (its default MODEL.BACKBONE.NAME is the first).
_DETECTRON2_BACKBONES = frozenset(
    {
        "build_resnet_backbone",
        "build_resnet_fpn_backbone",
        "build_retinanet_resnet_fpn_backbone",
        "build_regnet_backbone",
    }
)


def build_backbone(cfg: CfgNode, input_shape: ShapeSpec | None = None) -> Backbone:
    """Build the backbone registered as ``cfg.MODEL.BACKBONE.NAME``.

    Args:
        cfg: the config.
        input_shape: the input's shape; ``None`` means ``len(MODEL.PIXEL_MEAN)`` channels.

    Returns:
        The backbone.

    Raises:
        UnknownNameError: A ``KeyError``: if MODEL.BACKBONE.NAME is not registered (the
            message lists those that are).
        TypeError: If the registered object does not return a :class:`Backbone`.
    """
    if input_shape is None:
        input_shape = ShapeSpec(channels=len(cfg.MODEL.PIXEL_MEAN))
    name = cfg.MODEL.BACKBONE.NAME
    if name not in BACKBONE_REGISTRY:
        message = BACKBONE_REGISTRY.unknown_name_message(name, key="MODEL.BACKBONE.NAME")
        if name in _DETECTRON2_BACKBONES:
            message += (
                f" ({name} is one of detectron2's built-in backbones, which trainkit does not "
                "ship: register your own, or port that one.)"
            )
        raise UnknownNameError(message)
    backbone = BACKBONE_REGISTRY.get(name)(cfg, input_shape)
    if not isinstance(backbone, Backbone):
        raise TypeError(
            f"BACKBONE_REGISTRY entry {name!r} built a {type(backbone).__name__}, not a "
            "trainkit.modeling.backbone.Backbone"
        )
    return backbone
