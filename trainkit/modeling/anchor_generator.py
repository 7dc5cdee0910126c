"""detectron2's anchor generators: detection-only placeholders."""

from trainkit.modeling import ANCHOR_GENERATOR_REGISTRY, build_anchor_generator
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ANCHOR_GENERATOR_REGISTRY",
    "DefaultAnchorGenerator",
    "RotatedAnchorGenerator",
    "build_anchor_generator",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "anchor boxes for region proposals and one-stage detectors"

DefaultAnchorGenerator = detection_only("DefaultAnchorGenerator", __name__, _FEATURE)
RotatedAnchorGenerator = detection_only("RotatedAnchorGenerator", __name__, _FEATURE)
