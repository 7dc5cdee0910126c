"""detectron2's base of one-stage detectors: detection-only placeholders."""

from trainkit.modeling.meta_arch import DenseDetector
from trainkit.utils.detection_only import detection_only

__all__ = ["DenseDetector", "permute_to_N_HWA_K"]

_PLACEHOLDER_MODULE = True

permute_to_N_HWA_K = detection_only(
    "permute_to_N_HWA_K", __name__, "reshaping per-anchor outputs of a dense detector's head"
)
