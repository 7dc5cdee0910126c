"""detectron2's wrappers of mmdetection models: placeholders (trainkit does not use mmdetection)."""

from trainkit.modeling import MMDetBackbone, MMDetDetector

__all__ = ["MMDetBackbone", "MMDetDetector"]

_PLACEHOLDER_MODULE = True
