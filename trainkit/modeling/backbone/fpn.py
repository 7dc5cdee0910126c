"""detectron2's feature pyramid network and its R-CNN builders: detection-only placeholders.

trainkit has the ``Backbone`` interface and ``BACKBONE_REGISTRY``, so a project's own
backbone registers and builds as in detectron2; detectron2's FPN exists only to feed its
detectors and is not ported.
"""

from trainkit.modeling.backbone import FPN
from trainkit.utils.detection_only import detection_only

__all__ = [
    "FPN",
    "LastLevelMaxPool",
    "LastLevelP6P7",
    "build_resnet_fpn_backbone",
    "build_retinanet_resnet_fpn_backbone",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "the feature pyramid network of detectron2's detectors"
_ADVICE = "write the pyramid as your own Backbone registered in BACKBONE_REGISTRY"

LastLevelMaxPool = detection_only("LastLevelMaxPool", __name__, _FEATURE, _ADVICE)
LastLevelP6P7 = detection_only("LastLevelP6P7", __name__, _FEATURE, _ADVICE)
build_resnet_fpn_backbone = detection_only("build_resnet_fpn_backbone", __name__, _FEATURE, _ADVICE)
build_retinanet_resnet_fpn_backbone = detection_only(
    "build_retinanet_resnet_fpn_backbone", __name__, _FEATURE, _ADVICE
)
