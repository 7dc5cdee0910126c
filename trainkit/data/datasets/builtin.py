"""detectron2's registration of its built-in datasets: placeholders.

detectron2 registers COCO, LVIS, Cityscapes, Pascal VOC and ADE20k under ``$DETECTRON2_DATASETS``
when this module is imported; trainkit registers only its own ``shapes`` datasets
(``trainkit.data.datasets``). Importing this module registers nothing.
"""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "register_all_ade20k",
    "register_all_cityscapes",
    "register_all_cityscapes_panoptic",
    "register_all_coco",
    "register_all_lvis",
    "register_all_pascal_voc",
]

_PLACEHOLDER_MODULE = True

_ADVICE = "register your records with DatasetCatalog.register(name, func) instead"

register_all_coco = detection_only(
    "register_all_coco", __name__, "registering COCO's instance and panoptic splits", _ADVICE
)
register_all_lvis = detection_only(
    "register_all_lvis", __name__, "registering LVIS's instance splits", _ADVICE
)
register_all_cityscapes = detection_only(
    "register_all_cityscapes", __name__, "registering Cityscapes' instance splits", _ADVICE
)
register_all_cityscapes_panoptic = detection_only(
    "register_all_cityscapes_panoptic", __name__, "registering Cityscapes' panoptic splits", _ADVICE
)
register_all_pascal_voc = detection_only(
    "register_all_pascal_voc", __name__, "registering Pascal VOC's detection splits", _ADVICE
)
register_all_ade20k = detection_only(
    "register_all_ade20k",
    __name__,
    "",
    "register the splits with DatasetCatalog.register(name, lambda: load_sem_seg(gt_root, "
    "image_root)) from trainkit.data.datasets",
    reason="not in trainkit (trainkit registers no third-party dataset under a fixed root)",
)
