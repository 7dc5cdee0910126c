"""detectron2's base of instance trackers and their registry: detection-only placeholders."""

from trainkit.tracking import TRACKER_HEADS_REGISTRY, BaseTracker, build_tracker_head

__all__ = ["BaseTracker", "TRACKER_HEADS_REGISTRY", "build_tracker_head"]

_PLACEHOLDER_MODULE = True
