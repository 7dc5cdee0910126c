"""detectron2's box-IoU tracker: a detection-only placeholder."""

from trainkit.tracking import BBoxIOUTracker

__all__ = ["BBoxIOUTracker"]

_PLACEHOLDER_MODULE = True
