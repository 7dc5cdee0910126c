"""detectron2's anchor generators: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "ANCHOR_GENERATOR_REGISTRY",
    "DefaultAnchorGenerator",
    "RotatedAnchorGenerator",
    "build_anchor_generator",
]

_FEATURE = "anchor boxes for region proposals and one-stage detectors"

ANCHOR_GENERATOR_REGISTRY = detection_only("ANCHOR_GENERATOR_REGISTRY", __name__, _FEATURE)
DefaultAnchorGenerator = detection_only("DefaultAnchorGenerator", __name__, _FEATURE)
RotatedAnchorGenerator = detection_only("RotatedAnchorGenerator", __name__, _FEATURE)
build_anchor_generator = detection_only("build_anchor_generator", __name__, _FEATURE)
