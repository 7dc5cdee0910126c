"""detectron2's RetinaNet meta-architecture, as a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["RetinaNet"]

RetinaNet = detection_only(
    "RetinaNet",
    __name__,
    "a one-stage dense box detector",
    "register a model of your own with @META_ARCH_REGISTRY.register()",
)
