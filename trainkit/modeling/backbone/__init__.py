"""Backbones: the ``Backbone`` interface, ``BACKBONE_REGISTRY`` and ``build_backbone``.

detectron2's own backbones (ResNet, RegNet, ViT, MViT, Swin, the FPN of its detectors) are not
shipped: the names it exports here are placeholders made in this file, re-exported by their
modules (``backbone.resnet``, ``backbone.vit``, ...), which load only when imported by their
own path. Building one says to register a backbone of your own.
"""

from trainkit.modeling.backbone.backbone import Backbone
from trainkit.modeling.backbone.build import BACKBONE_REGISTRY, build_backbone
from trainkit.utils.detection_only import detection_only

__all__ = [
    "BACKBONE_REGISTRY",
    "FPN",
    "MViT",
    "Backbone",
    "BasicStem",
    "BottleneckBlock",
    "RegNet",
    "ResNet",
    "ResNetBlockBase",
    "SimpleFeaturePyramid",
    "SwinTransformer",
    "ViT",
    "build_backbone",
    "build_resnet_backbone",
    "get_vit_lr_decay_rate",
    "make_stage",
]

_ADVICE = (
    "register your own backbone in BACKBONE_REGISTRY (e.g. wrapping a torchvision or timm "
    "model in trainkit.modeling.Backbone)"
)


def _not_shipped(name: str, backbone: str, module: str = __name__) -> type:
    # Also used by this package's placeholder modules for the names only they export.
    reason = f"one of detectron2's {backbone} backbone parts, which trainkit does not ship"
    return detection_only(name, module, "", _ADVICE, reason=reason)


BasicStem = _not_shipped("BasicStem", "ResNet")
BottleneckBlock = _not_shipped("BottleneckBlock", "ResNet")
ResNet = _not_shipped("ResNet", "ResNet")
ResNetBlockBase = _not_shipped("ResNetBlockBase", "ResNet")
build_resnet_backbone = _not_shipped("build_resnet_backbone", "ResNet")
make_stage = _not_shipped("make_stage", "ResNet")
RegNet = _not_shipped("RegNet", "RegNet")
ViT = _not_shipped("ViT", "ViT")
SimpleFeaturePyramid = _not_shipped("SimpleFeaturePyramid", "ViT")
get_vit_lr_decay_rate = _not_shipped("get_vit_lr_decay_rate", "ViT")
MViT = _not_shipped("MViT", "MViT")
SwinTransformer = _not_shipped("SwinTransformer", "Swin")
FPN = detection_only(
    "FPN",
    __name__,
    "the feature pyramid network of detectron2's detectors",
    "write the pyramid as your own Backbone registered in BACKBONE_REGISTRY",
)
