"""detectron2's Instances: a detection-only placeholder."""

from trainkit.structures import Instances

__all__ = ["Instances"]

_PLACEHOLDER_MODULE = True
