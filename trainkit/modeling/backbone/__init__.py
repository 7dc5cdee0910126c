"""Backbones: the ``Backbone`` interface, ``BACKBONE_REGISTRY`` and ``build_backbone``."""

from trainkit.modeling.backbone.backbone import Backbone
from trainkit.modeling.backbone.build import BACKBONE_REGISTRY, build_backbone

__all__ = ["BACKBONE_REGISTRY", "Backbone", "build_backbone"]
