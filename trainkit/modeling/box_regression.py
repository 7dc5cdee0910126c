"""detectron2's box-regression encodings: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["Box2BoxTransform", "Box2BoxTransformLinear", "Box2BoxTransformRotated"]

_PLACEHOLDER_MODULE = True

_FEATURE = "encoding boxes as regression targets"

Box2BoxTransform = detection_only("Box2BoxTransform", __name__, _FEATURE)
Box2BoxTransformRotated = detection_only("Box2BoxTransformRotated", __name__, _FEATURE)
Box2BoxTransformLinear = detection_only("Box2BoxTransformLinear", __name__, _FEATURE)
