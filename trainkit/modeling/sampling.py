"""detectron2's sampling of foreground and background proposals: a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["subsample_labels"]

_PLACEHOLDER_MODULE = True

subsample_labels = detection_only(
    "subsample_labels", __name__, "sampling foreground and background proposals for training"
)
