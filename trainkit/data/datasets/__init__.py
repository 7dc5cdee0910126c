"""Built-in datasets; importing this package registers the shapes splits and shapes_minival.

detectron2's COCO registration functions import from here as detection-only placeholders.
"""

from __future__ import annotations

from trainkit.data.catalog import DatasetCatalog, MetadataCatalog
from trainkit.data.datasets.coco import load_coco_json, register_coco_instances
from trainkit.data.datasets.sem_seg import load_sem_seg
from trainkit.data.datasets.shapes import (
    SHAPES_CLASSES,
    get_datasets_root,
    load_shapes,
    register_shapes,
)

__all__ = [
    "SHAPES_CLASSES",
    "get_datasets_root",
    "load_coco_json",
    "load_sem_seg",
    "load_shapes",
    "register_coco_instances",
    "register_shapes",
]

register_shapes()
# The first 200 validation images: quick evaluations for smoke runs and tests.
DatasetCatalog.register("shapes_minival", lambda: DatasetCatalog.get("shapes_val")[:200])
MetadataCatalog.get("shapes_minival").set(thing_classes=list(SHAPES_CLASSES))
