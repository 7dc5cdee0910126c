"""detectron2's Panoptic FPN: detection-only placeholders."""

from trainkit.modeling.meta_arch import PanopticFPN
from trainkit.utils.detection_only import detection_only

__all__ = ["PanopticFPN", "combine_semantic_and_instance_outputs"]

_PLACEHOLDER_MODULE = True

combine_semantic_and_instance_outputs = detection_only(
    "combine_semantic_and_instance_outputs",
    __name__,
    "merging instance and semantic predictions into a panoptic one",
)
