"""detectron2's keypoints: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["Keypoints", "heatmaps_to_keypoints"]

Keypoints = detection_only("Keypoints", __name__, "per-instance keypoints")
heatmaps_to_keypoints = detection_only(
    "heatmaps_to_keypoints", __name__, "keypoint heatmap decoding"
)
