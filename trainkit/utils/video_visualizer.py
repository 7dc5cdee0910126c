"""detectron2's ``VideoVisualizer`` of tracked instances: a detection-only placeholder.

For frames of semantic segmentation, draw each frame with
:class:`trainkit.utils.visualizer.Visualizer`.
"""

from trainkit.utils.detection_only import detection_only

__all__ = ["VideoVisualizer"]

_PLACEHOLDER_MODULE = True

VideoVisualizer = detection_only(
    "VideoVisualizer",
    __name__,
    "drawing instance predictions with colours kept across video frames",
    "draw each frame with trainkit.utils.visualizer.Visualizer",
)
