"""detectron2's base of Hungarian-matching trackers: a detection-only placeholder."""

from trainkit.tracking import BaseHungarianTracker

__all__ = ["BaseHungarianTracker"]

_PLACEHOLDER_MODULE = True
