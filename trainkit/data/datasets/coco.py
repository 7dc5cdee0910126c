"""detectron2's COCO-format instance datasets, detection-only placeholders.

``load_sem_seg``, which detectron2 keeps in this module too, is general: it lives in
``trainkit.data.datasets.sem_seg`` and is importable here at detectron2's path.
"""

from trainkit.data.datasets.sem_seg import load_sem_seg
from trainkit.utils.detection_only import detection_only

__all__ = ["load_coco_json", "load_sem_seg", "register_coco_instances"]

_ADVICE = "register your records with DatasetCatalog.register(name, func) instead"

load_coco_json = detection_only(
    "load_coco_json", __name__, "reading COCO instance annotations into records", _ADVICE
)
register_coco_instances = detection_only(
    "register_coco_instances", __name__, "registering a COCO instance dataset", _ADVICE
)
