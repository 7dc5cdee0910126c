"""detectron2's COCO-format instance datasets, detection-only placeholders.

``load_sem_seg``, which detectron2 keeps in this module too, is general: it lives in
``trainkit.data.datasets.sem_seg`` and is importable here at detectron2's path.
"""

from trainkit.data.datasets import convert_to_coco_json, load_coco_json, register_coco_instances
from trainkit.data.datasets.sem_seg import load_sem_seg
from trainkit.utils.detection_only import detection_only

__all__ = [
    "convert_to_coco_dict",
    "convert_to_coco_json",
    "load_coco_json",
    "load_sem_seg",
    "register_coco_instances",
]

_PLACEHOLDER_MODULE = True

convert_to_coco_dict = detection_only(
    "convert_to_coco_dict", __name__, "converting instance records to a COCO json dict"
)
