"""Built-in datasets; importing this package registers the shapes splits and shapes_minival.

detectron2's registration functions of detection datasets (COCO, LVIS, Pascal VOC) import
from here as detection-only placeholders, made in this file; their modules
(``data.datasets.coco``, ``.lvis``, ...) re-export them and load only when imported by their
own path.
"""

from __future__ import annotations

from trainkit.data.catalog import DatasetCatalog, MetadataCatalog
from trainkit.data.datasets.sem_seg import load_sem_seg
from trainkit.data.datasets.shapes import (
    SHAPES_CLASSES,
    get_datasets_root,
    load_shapes,
    register_shapes,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "SHAPES_CLASSES",
    "convert_to_coco_json",
    "get_datasets_root",
    "get_lvis_instances_meta",
    "load_coco_json",
    "load_lvis_json",
    "load_sem_seg",
    "load_shapes",
    "load_voc_instances",
    "register_coco_instances",
    "register_coco_panoptic",
    "register_coco_panoptic_separated",
    "register_lvis_instances",
    "register_pascal_voc",
    "register_shapes",
]

_ADVICE = "register your records with DatasetCatalog.register(name, func) instead"

load_coco_json = detection_only(
    "load_coco_json", __name__, "reading COCO instance annotations into records", _ADVICE
)
register_coco_instances = detection_only(
    "register_coco_instances", __name__, "registering a COCO instance dataset", _ADVICE
)
convert_to_coco_json = detection_only(
    "convert_to_coco_json", __name__, "writing instance records as a COCO json file"
)
register_coco_panoptic = detection_only(
    "register_coco_panoptic", __name__, "registering a COCO panoptic dataset", _ADVICE
)
register_coco_panoptic_separated = detection_only(
    "register_coco_panoptic_separated", __name__, "registering a COCO panoptic dataset", _ADVICE
)
load_lvis_json = detection_only(
    "load_lvis_json", __name__, "reading LVIS instance annotations into records", _ADVICE
)
register_lvis_instances = detection_only(
    "register_lvis_instances", __name__, "registering an LVIS instance dataset", _ADVICE
)
get_lvis_instances_meta = detection_only(
    "get_lvis_instances_meta", __name__, "the category metadata of LVIS"
)
load_voc_instances = detection_only(
    "load_voc_instances", __name__, "reading Pascal VOC box annotations into records", _ADVICE
)
register_pascal_voc = detection_only(
    "register_pascal_voc", __name__, "registering a Pascal VOC detection dataset", _ADVICE
)

register_shapes()
# The first 200 validation images: quick evaluations for smoke runs and tests.
DatasetCatalog.register("shapes_minival", lambda: DatasetCatalog.get("shapes_val")[:200])
MetadataCatalog.get("shapes_minival").set(thing_classes=list(SHAPES_CLASSES))
