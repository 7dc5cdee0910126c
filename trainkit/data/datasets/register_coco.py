"""detectron2's older path of the COCO registration functions: detection-only placeholders."""

from trainkit.data.datasets import register_coco_instances, register_coco_panoptic_separated

__all__ = ["register_coco_instances", "register_coco_panoptic_separated"]

_PLACEHOLDER_MODULE = True
