"""detectron2's ``Matcher`` of predicted to ground-truth boxes: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["Matcher"]

_PLACEHOLDER_MODULE = True

Matcher = detection_only("Matcher", __name__, "matching predicted to ground-truth boxes by IoU")
