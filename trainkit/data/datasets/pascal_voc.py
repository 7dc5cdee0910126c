"""detectron2's Pascal VOC detection datasets: detection-only placeholders."""

from trainkit.data.datasets import load_voc_instances, register_pascal_voc
from trainkit.utils.detection_only import detection_only

__all__ = ["CLASS_NAMES", "load_voc_instances", "register_pascal_voc"]

_PLACEHOLDER_MODULE = True

CLASS_NAMES = detection_only("CLASS_NAMES", __name__, "the 20 Pascal VOC detection classes")
