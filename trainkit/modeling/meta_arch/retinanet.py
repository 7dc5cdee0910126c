"""detectron2's RetinaNet detector: detection-only placeholders."""

from trainkit.modeling.meta_arch import RetinaNet
from trainkit.utils.detection_only import detection_only

__all__ = ["RetinaNet", "RetinaNetHead", "permute_to_N_HWA_K"]

_PLACEHOLDER_MODULE = True

RetinaNetHead = detection_only("RetinaNetHead", __name__, "the head of the RetinaNet detector")
permute_to_N_HWA_K = detection_only(
    "permute_to_N_HWA_K", __name__, "reshaping per-anchor outputs of the RetinaNet head"
)
