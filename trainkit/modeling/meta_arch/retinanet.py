"""detectron2's RetinaNet detector: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["RetinaNet", "RetinaNetHead", "permute_to_N_HWA_K"]

_ADVICE = "register a model of your own with @META_ARCH_REGISTRY.register()"

RetinaNet = detection_only("RetinaNet", __name__, "a one-stage dense box detector", _ADVICE)
RetinaNetHead = detection_only("RetinaNetHead", __name__, "the head of the RetinaNet detector")
permute_to_N_HWA_K = detection_only(
    "permute_to_N_HWA_K", __name__, "reshaping per-anchor outputs of the RetinaNet head"
)
