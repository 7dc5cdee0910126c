"""detectron2's keypoints: detection-only placeholders."""

from trainkit.structures import Keypoints, heatmaps_to_keypoints

__all__ = ["Keypoints", "heatmaps_to_keypoints"]

_PLACEHOLDER_MODULE = True
