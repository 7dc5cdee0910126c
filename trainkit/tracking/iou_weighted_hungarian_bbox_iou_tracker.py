"""detectron2's IoU-weighted Hungarian box tracker: a detection-only placeholder."""

from trainkit.tracking import IOUWeightedHungarianBBoxIOUTracker

__all__ = ["IOUWeightedHungarianBBoxIOUTracker"]

_PLACEHOLDER_MODULE = True
