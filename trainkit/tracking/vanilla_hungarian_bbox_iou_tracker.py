"""detectron2's Hungarian box-IoU tracker: a detection-only placeholder."""

from trainkit.tracking import VanillaHungarianBBoxIOUTracker

__all__ = ["VanillaHungarianBBoxIOUTracker"]

_PLACEHOLDER_MODULE = True
