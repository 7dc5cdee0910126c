"""detectron2's LVIS instance datasets: detection-only placeholders."""

from trainkit.data.datasets import get_lvis_instances_meta, load_lvis_json, register_lvis_instances

__all__ = ["get_lvis_instances_meta", "load_lvis_json", "register_lvis_instances"]

_PLACEHOLDER_MODULE = True
