"""detectron2's Instances: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["Instances"]

Instances = detection_only("Instances", __name__, "per-image detected or annotated instances")
