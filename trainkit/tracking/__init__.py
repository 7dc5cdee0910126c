"""detectron2's trackers of detected instances across video frames: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "TRACKER_HEADS_REGISTRY",
    "BBoxIOUTracker",
    "BaseHungarianTracker",
    "BaseTracker",
    "IOUWeightedHungarianBBoxIOUTracker",
    "VanillaHungarianBBoxIOUTracker",
    "build_tracker_head",
    "create_prediction_pairs",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "tracking detected instances across video frames"


def _tracking(name: str, module: str = __name__) -> type:
    # Also used by this package's modules for the names only they export.
    return detection_only(name, module, _FEATURE)


TRACKER_HEADS_REGISTRY = _tracking("TRACKER_HEADS_REGISTRY")
BaseTracker = _tracking("BaseTracker")
build_tracker_head = _tracking("build_tracker_head")
BBoxIOUTracker = _tracking("BBoxIOUTracker")
BaseHungarianTracker = _tracking("BaseHungarianTracker")
IOUWeightedHungarianBBoxIOUTracker = _tracking("IOUWeightedHungarianBBoxIOUTracker")
VanillaHungarianBBoxIOUTracker = _tracking("VanillaHungarianBBoxIOUTracker")
create_prediction_pairs = _tracking("create_prediction_pairs")
